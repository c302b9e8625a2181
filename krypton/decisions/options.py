"""The table of krypton's settings (SPEC O1): each flag with its environment variables, its
default, its help text and the parser of its value. :mod:`krypton.decisions.settings` reads
flags and environment through it; the flag reference of the docs is generated from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from krypton.decisions.charts.chartcrds import POLICIES as CHART_CRD_POLICIES
from krypton.decisions.memory import quantity

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``1.5m``, ``2h`` or ``500ms``; must be positive."""
    m = _DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration (e.g. 30s, 5m, 1h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError(f"{text!r} must not be negative")
    return value


def failure_budget(text: str) -> str:
    """A wave's failure budget: a count (``2``) or a share of the wave (``25%``)."""
    value = text.strip()
    if value.endswith("%"):
        number = value[:-1].strip()
        try:
            share = float(number)
        except ValueError:
            raise ValueError(f"{text!r} is not a count or a percentage (e.g. 2, 25%)") from None
        if not 0 <= share <= 100:
            raise ValueError(f"{text!r} must be a percentage from 0% to 100%")
        return f"{share:g}%"
    return str(non_negative_int(value))


def choice(*options: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    """One of `options`, or an old name of one (`aliases`), given as its new name."""
    def parse(text: str) -> str:
        text = (aliases or {}).get(text, text)
        if text not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return text
    return parse


def bind_address(text: str) -> str:
    if text == "0":  # no listener
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. :8080), or 0 to disable")
    return text


def text_value(text: str) -> str:
    return text


@dataclass(frozen=True)
class Opt:
    """One setting: flag, environment variables (first wins), default, parser and help."""

    name: str
    help: str
    default: Any
    parse: Callable[[str], Any] = text_value
    env: tuple[str, ...] = ()
    repeatable: bool = False
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def envs(self) -> tuple[str, ...]:
        return self.env or ("KRYPTON_" + self.name.upper(),)


OPTIONS: tuple[Opt, ...] = (
    # chart (R6)
    Opt("chart_repo", "Chart repository URL, or an oci:// registry reference", "https://charts.jetstack.io"),
    Opt("chart_name", "Chart name in the repository", "cert-manager"),
    Opt("chart_version", "Exact chart version or semver range (newest match wins)", "1.19.1"),
    Opt("chart_values_file", "Values file deep-merged over the previous ones (repeatable)", (),
        repeatable=True, metavar="FILE"),
    Opt("chart_digest", "OCI only: the manifest digest (sha256:...) the --chart-version tag "
        "must name; part of the fingerprint", ""),
    Opt("chart_verify", "Install only a chart that verifies: Helm provenance against "
        "--chart-keyring (http/https), a cosign signature against --chart-cosign-key (oci)",
        False, boolean),
    Opt("chart_keyring", "GPG public keyring for --chart-verify of http(s) charts", "",
        metavar="FILE"),
    Opt("chart_cosign_key", "cosign public key (PEM) for --chart-verify of OCI charts", "",
        metavar="FILE"),
    Opt("chart_ca_file", "CA bundle for the chart repository's or registry's TLS "
        "(default: the system's)", "", metavar="FILE"),
    Opt("chart_plain_http", "OCI only: reach the registry over plain HTTP", False, boolean),
    Opt("chart_index_ttl", "How long a resolved range, an OCI tag's digest and the update "
        "notice (a newer version the settings do not take) are used before the repository is "
        "asked again (looked at on the next pass after it)", 300.0, duration),
    Opt("chart_credentials_secret", "Secret in --namespace with the registry's credentials "
        "(username and password keys, or a .dockerconfigjson)", ""),
    Opt("allow_chart_skip", "Chart load errors do not block phase Ready (re-queue after 120s)",
        False, boolean, env=("ALLOW_CHART_SKIP",)),
    # discovery (D1-D4)
    Opt("namespace", "Namespace of the kubeconfig Secrets on the watch cluster", "default"),
    Opt("kubeconfig_label", "Label key (value \"true\") selecting kubeconfig Secrets",
        "sigs.k8s.io/multicluster-runtime-kubeconfig"),
    Opt("kubeconfig_key", "Data key holding the kubeconfig in those Secrets", "kubeconfig"),
    Opt("trust_kubeconfig_secrets",
        "Allow exec/auth-provider users and file references in Secret kubeconfigs (unsafe)",
        False, boolean),
    Opt("no_self_cluster", "Do not create the self-cluster Secret at startup", False, boolean),
    # watch cluster (D7)
    Opt("watch_kubeconfig", "Kubeconfig file of the watch (home) cluster", "",
        env=("WATCH_KUBECONFIG", "WATCH_CLUSTER_KUBECONFIG")),
    Opt("watch_context", "Context in --watch-kubeconfig (default: its current-context)", "",
        env=("WATCH_CONTEXT",)),
    Opt("watch_kubeconfig_secret", "Secret holding the watch cluster's kubeconfig (preferred)",
        "", env=("WATCH_KUBECONFIG_SECRET",)),
    Opt("watch_kubeconfig_secret_namespace", "Namespace of that Secret (default: --namespace)",
        "", env=("WATCH_KUBECONFIG_SECRET_NAMESPACE",)),
    Opt("watch_kubeconfig_secret_key", "Data key in that Secret", "kubeconfig",
        env=("WATCH_KUBECONFIG_SECRET_KEY",)),
    Opt("ensure_watch_crds", "Create the Tenant CRD on the watch cluster at startup", False,
        boolean, env=("ENSURE_WATCH_CRDS",)),
    # reconcile (R2, R3, R9, R14)
    Opt("watch_namespace", "Only reconcile Tenants in this namespace (namespaced mode)", "",
        env=("WATCH_NAMESPACE",)),
    Opt("release_namespace", "Where a Tenant's release goes: tenant (a namespace named after "
        "the Tenant, created by krypton) or watch (the --watch-namespace itself; namespaced "
        "mode under a Role only)", "tenant", choice("tenant", "watch")),
    Opt("crd_policy", "create: create a missing CRD and replace krypton's own older revision "
        "(never a newer one); upgrade: also replace a CRD without krypton's revision "
        "annotation (the prototype's); skip: never read or write CRDs (they are applied "
        "beforehand)",
        "create", choice("create", "upgrade", "skip")),
    Opt("chart_crds", "The chart's crds/ directory, applied by krypton once per cluster and "
        "chart version before tenant releases (helm runs with --skip-crds): skip, create "
        "(only missing ones) or create-replace (also replace changed ones)", "create",
        choice(*CHART_CRD_POLICIES)),
    Opt("drift_detection", "repair: upgrade an in-sync release when an object of its manifest "
        "is gone (looked for once per --resync-period, with the workload's health); off: only "
        "release records count", "repair", choice("repair", "off")),
    Opt("max_concurrent_reconciles", "Tenants reconciled at once per cluster", 4, positive_int),
    Opt("max_concurrent_helm", "helm processes at once across all clusters (fewer where the "
        "pod's memory cannot hold that many: said at start)", 4, positive_int),
    Opt("memory_limit", "What the operator and its helm processes may use together where the "
        "pod's cgroup sets no memory limit (the cgroup's limit wins): each helm process is held "
        "to its share by the kernel (docs, Security model)", 1280 << 20, quantity,
        metavar="QUANTITY"),
    Opt("resync_period", "Re-queue every Tenant this often", 600.0, duration),
    Opt("max_retries", "Failed helm runs of one target (chart, values, Tenant generation) "
        "retried before the release is Stalled (RetriesExhausted) until the target changes or "
        "a retry is asked for; 0: none", 8, non_negative_int),
    Opt("retry_backoff_max", "Longest wait between two attempts of a failing helm run (the "
        "first retry 10s after the failure, then doubling, jittered)", 600.0, duration),
    Opt("api_timeout", "Timeout of one Kubernetes API call", 30.0, duration),
    Opt("helm_wait", "true: helm waits for the workload (--wait), holding its process and "
        "slot; false: helm returns once the objects are applied (hooks still complete) and "
        "krypton follows the workload's readiness with watches", False, boolean),
    Opt("health_check_expr", "YAML file of CEL health rules for the chart's custom "
        "resources, Flux-shaped: a list of {apiVersion, kind, current, inProgress, failed}; "
        "a rule that does not compile is exit 2", "", metavar="FILE"),
    Opt("cluster_profiles", "Also discover clusters from ClusterProfiles (sigs.k8s.io/"
        "cluster-inventory-api) in --cluster-profile-namespace, reached with the plugins of "
        "--cluster-profile-providers", False, boolean),
    Opt("cluster_profile_namespace", "Namespace of the ClusterProfiles (default: --namespace)",
        ""),
    Opt("cluster_profile_selector", "Label selector of the ClusterProfiles krypton takes "
        "(default: all of the namespace)", ""),
    Opt("cluster_profile_providers", "The credential providers file (KEP-5339: "
        "{\"providers\": [{name, execConfig}]}): the exec plugin of each access provider name; "
        "a profile whose providers it does not name is not engaged", "", metavar="FILE"),
    Opt("maintenance_window", "When clusters may be changed: '<cron> <duration> [<time "
        "zone>]' (e.g. '0 22 * * 1-5 6h Europe/Berlin'); outside it a cluster starts no "
        "upgrade, revert or uninstall. A cluster Secret's annotation "
        "mesh.openkcm.io/maintenance-window overrides it ('always': no window); empty: "
        "always open", ""),
    Opt("maintenance_window_first_install", "A new Tenant's first install does not wait for "
        "its cluster's maintenance window", True, boolean),
    Opt("helm_timeout", "Timeout of one helm operation", 180.0, duration),
    Opt("helm_executable", "helm binary (name on PATH or path)", "helm"),
    Opt("helm_engine", "How helm runs against a cluster: worker (Helm's library in a process "
        "of krypton's own per cluster with helm work, --helm-worker; Helm 4) or binary (the "
        "helm binary, one process per run, --helm-executable; Helm 3 runs only there; cli is "
        "its old name, still taken). Charts are pulled by the helm binary on both", "worker",
        choice("worker", "binary", aliases={"cli": "binary"})),
    Opt("helm_worker", "The helm worker binary (name on PATH or path)", "krypton-helmworker"),
    Opt("helm_force_conflicts", "Helm 4: when another field manager (kubectl, an HPA) owns "
        "fields of the next apply, take them over (--force-conflicts) and name them in an "
        "Event; false: the run fails with FieldConflict naming them", True, boolean),
    Opt("helm_driver", "Helm release storage: secret (helm's default) or configmap", "secret",
        choice("secret", "configmap"), env=("HELM_DRIVER",)),
    Opt("record_guard", "The guard of krypton's release records on each engaged cluster (a "
        "ValidatingAdmissionPolicy letting only krypton's user write them): install (and keep "
        "it), check (find one an admin installed) or off. A cluster without it is reported "
        "RecordsUnguarded", "install", choice("install", "check", "off")),
    Opt("helm_history_max", "Release records helm keeps per release (--history-max): helm "
        "reads and krypton judges every one of them at every run", 5, positive_int),
    Opt("allow_duplicate_clusters", "Engage Secrets that reach an already engaged API server "
        "(test beds that register one server under many names)", False, boolean),
    Opt("chart_fetch_timeout", "Deadline for downloading the chart repository's index.yaml",
        60.0, duration),
    Opt("delete_namespace_on_uninstall", "Delete the Tenant namespace after uninstalling "
        "(only a namespace krypton created)", False, boolean),
    Opt("adopt_namespaces", "Install into a Tenant namespace that exists but was not created "
        "by krypton (it is then never deleted)", False, boolean),
    Opt("adopt_orphaned_objects", "Let the first Tenant of a cluster take over the chart's "
        "shared objects (a CRD, an IngressClass) whose owning release no longer exists "
        "(helm --take-ownership), named in an Event", False, boolean),
    # progressive rollout (F1)
    Opt("rollout_canary_clusters", "Clusters that take a fleet-wide change first (comma list)",
        "", env=("KRYPTON_ROLLOUT_CANARY_CLUSTERS",)),
    Opt("rollout_max_parallel_clusters", "Clusters per wave after the canaries (0: no waves)",
        0, non_negative_int),
    Opt("rollout_max_failures", "Failures a wave may have before the rollout halts: a count "
        "(2) or a share of the wave (25%, rounded down), in --rollout-failure-unit", "0",
        failure_budget),
    Opt("rollout_failure_unit", "What --rollout-max-failures counts: releases (a failed or "
        "degraded release) or clusters (a cluster with one or more of them)", "releases",
        choice("releases", "clusters")),
    Opt("rollout_wave_deadline", "A wave not done within this counts as failed", 600.0, duration),
    Opt("rollout_wave_soak", "How long a finished wave must stay healthy before the next", 0.0,
        lambda t: 0.0 if t.strip() in ("0", "0s") else duration(t)),
    Opt("rollout_auto_revert", "Roll the failed releases of a halted wave back", False, boolean),
    Opt("rollout_approval", "Which waves wait for a person's approval before they open "
        "(krypton rollout approve): none, every-wave, or after-canaries (the first wave after "
        "the canaries')", "none", choice("none", "every-wave", "after-canaries")),
    Opt("rollout_gate_prometheus", "Prometheus-compatible server (http(s)://host:port[/path]) "
        "whose --rollout-gate-query a wave must pass during its soak", ""),
    Opt("rollout_gate_query", "PromQL that must return a non-empty result of non-zero values "
        "for each cluster of a soaking wave; $cluster is replaced by the cluster's name", ""),
    Opt("rollout_gate_interval", "How often the gate query is evaluated during a soak", 30.0,
        duration),
    Opt("rollout_gate_failures", "Failed evaluations of one cluster that fail its wave", 1,
        positive_int),
    Opt("rollout_gate_credentials_secret", "Secret in --namespace with the metrics server's "
        "credentials (username and password, or token)", ""),
    Opt("rollout_gate_ca_file", "CA bundle for the metrics server's TLS (default: the "
        "system's)", "", metavar="FILE"),
    # operating (O2-O4, O9)
    Opt("log_format", "json or console (default: console on a TTY, else json)", "",
        choice("", "json", "console")),
    Opt("log_level", "debug, info, warning or error", "info",
        choice("debug", "info", "warning", "error")),
    Opt("health_probe_bind_address", "Address of /healthz and /readyz (0 disables)", ":8081",
        bind_address),
    Opt("metrics_bind_address", "Address of the Prometheus metrics (0 disables)", ":8080",
        bind_address),
    Opt("web_address", "Address of the fleet page, a read-only web page of the fleet (docs: "
        "The fleet page); loopback only by default, 0 turns it off", "127.0.0.1:8082",
        bind_address),
    Opt("web_auth", "Who may see the fleet page: none (whoever reaches its port sees every "
        "Tenant) or kubernetes (a bearer token the home cluster takes, TokenReview; each "
        "Tenant shown where that identity may get Tenants in its namespace, "
        "SubjectAccessReview)", "none", choice("none", "kubernetes")),
    Opt("leader_elect", "Use a coordination.k8s.io Lease so that only one replica works", False,
        boolean),
    Opt("leader_election_namespace", "Namespace of the Lease (WATCH_NAMESPACE wins when set)",
        "default"),
    Opt("leader_election_id", "Name of the Lease", "krypton-leader"),
    Opt("lease_duration", "Lease duration", 15.0, duration),
    Opt("renew_deadline", "Leader gives up when it could not renew for this long", 10.0, duration),
    Opt("retry_period", "How often candidates try to acquire or renew the Lease", 2.0, duration),
    Opt("shutdown_timeout", "Time running helm operations get to finish on SIGTERM", 30.0,
        duration),
    Opt("sharding", "Split the clusters among every running replica (each holds a membership "
        "Lease and one Lease per cluster it serves) instead of one leader doing all", False,
        boolean),
    Opt("shard_identity", "This replica's name among the members (default: POD_NAME, else the "
        "host name)", ""),
    Opt("shard_pin_label", "Label of a cluster Secret naming the replica that should serve it",
        "krypton.openkcm.io/shard"),
)


def option(name: str) -> Opt:
    """The setting named `name` (a field of Settings)."""
    return next(o for o in OPTIONS if o.name == name)
