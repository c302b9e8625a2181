"""Operator settings: one table of flags with their environment variables and defaults.

Precedence is flag > environment > default (SPEC O1). Values are parsed and checked here,
before any cluster is touched; a bad value raises SettingsError, which the entry point
turns into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from krypton.decisions import oci, versions
from krypton.decisions.chartcrds import POLICIES as CHART_CRD_POLICIES
from krypton.decisions.errors import SettingsError
from krypton.decisions.kubeconfig import service_server

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


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return text
    return parse


def bind_address(text: str) -> str:
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
    Opt("chart_index_ttl", "How long a resolved range, or an OCI tag's digest, is used before "
        "the repository is asked again (looked at on the next pass after it)", 300.0, duration),
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
    Opt("crd_policy", "create: only create a missing CRD; upgrade: also replace an older one; "
        "skip: never read or write CRDs (they are applied beforehand)",
        "create", choice("create", "upgrade", "skip")),
    Opt("chart_crds", "The chart's crds/ directory, applied by krypton once per cluster and "
        "chart version before tenant releases (helm runs with --skip-crds): skip, create "
        "(only missing ones) or create-replace (also replace changed ones)", "create",
        choice(*CHART_CRD_POLICIES)),
    Opt("drift_detection", "repair: upgrade an in-sync release when an object of its manifest "
        "is gone (looked for once per --resync-period, with the workload's health); off: only "
        "release records count", "repair", choice("repair", "off")),
    Opt("max_concurrent_reconciles", "Tenants reconciled at once per cluster", 4, positive_int),
    Opt("max_concurrent_helm", "helm processes at once across all clusters", 4, positive_int),
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
    Opt("helm_timeout", "Timeout of one helm operation", 180.0, duration),
    Opt("helm_executable", "helm binary (name on PATH or path)", "helm"),
    Opt("helm_force_conflicts", "Helm 4: when another field manager (kubectl, an HPA) owns "
        "fields of the next apply, take them over (--force-conflicts) and name them in an "
        "Event; false: the run fails with FieldConflict naming them", True, boolean),
    Opt("helm_driver", "Helm release storage: secret (helm's default) or configmap", "secret",
        choice("secret", "configmap"), env=("HELM_DRIVER",)),
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

_ZERO_OK = {"health_probe_bind_address", "metrics_bind_address"}


def option(name: str) -> Opt:
    """The setting named `name` (a field of Settings)."""
    return next(o for o in OPTIONS if o.name == name)


def _default(name: str) -> Any:
    """A setting's default, from OPTIONS: the one place defaults are written."""
    return option(name).default


@dataclass(frozen=True)
class Settings:
    """Parsed operator settings; see OPTIONS for the meaning and default of each field."""

    chart_repo: str = _default("chart_repo")
    chart_name: str = _default("chart_name")
    chart_version: str = _default("chart_version")
    chart_digest: str = _default("chart_digest")
    chart_verify: bool = _default("chart_verify")
    chart_keyring: str = _default("chart_keyring")
    chart_cosign_key: str = _default("chart_cosign_key")
    chart_ca_file: str = _default("chart_ca_file")
    chart_plain_http: bool = _default("chart_plain_http")
    chart_credentials_secret: str = _default("chart_credentials_secret")
    chart_index_ttl: float = _default("chart_index_ttl")
    chart_values_file: tuple[str, ...] = _default("chart_values_file")
    allow_chart_skip: bool = _default("allow_chart_skip")
    namespace: str = _default("namespace")
    kubeconfig_label: str = _default("kubeconfig_label")
    kubeconfig_key: str = _default("kubeconfig_key")
    trust_kubeconfig_secrets: bool = _default("trust_kubeconfig_secrets")
    no_self_cluster: bool = _default("no_self_cluster")
    watch_kubeconfig: str = _default("watch_kubeconfig")
    watch_context: str = _default("watch_context")
    watch_kubeconfig_secret: str = _default("watch_kubeconfig_secret")
    watch_kubeconfig_secret_namespace: str = _default("watch_kubeconfig_secret_namespace")
    watch_kubeconfig_secret_key: str = _default("watch_kubeconfig_secret_key")
    ensure_watch_crds: bool = _default("ensure_watch_crds")
    watch_namespace: str = _default("watch_namespace")
    release_namespace: str = _default("release_namespace")
    crd_policy: str = _default("crd_policy")
    chart_crds: str = _default("chart_crds")
    drift_detection: str = _default("drift_detection")
    max_concurrent_reconciles: int = _default("max_concurrent_reconciles")
    max_concurrent_helm: int = _default("max_concurrent_helm")
    resync_period: float = _default("resync_period")
    max_retries: int = _default("max_retries")
    retry_backoff_max: float = _default("retry_backoff_max")
    api_timeout: float = _default("api_timeout")
    helm_wait: bool = _default("helm_wait")
    helm_timeout: float = _default("helm_timeout")
    helm_force_conflicts: bool = _default("helm_force_conflicts")
    helm_executable: str = _default("helm_executable")
    helm_driver: str = _default("helm_driver")
    allow_duplicate_clusters: bool = _default("allow_duplicate_clusters")
    chart_fetch_timeout: float = _default("chart_fetch_timeout")
    delete_namespace_on_uninstall: bool = _default("delete_namespace_on_uninstall")
    adopt_namespaces: bool = _default("adopt_namespaces")
    adopt_orphaned_objects: bool = _default("adopt_orphaned_objects")
    rollout_canary_clusters: str = _default("rollout_canary_clusters")
    rollout_max_parallel_clusters: int = _default("rollout_max_parallel_clusters")
    rollout_max_failures: str = _default("rollout_max_failures")
    rollout_failure_unit: str = _default("rollout_failure_unit")
    rollout_wave_deadline: float = _default("rollout_wave_deadline")
    rollout_wave_soak: float = _default("rollout_wave_soak")
    rollout_auto_revert: bool = _default("rollout_auto_revert")
    rollout_gate_prometheus: str = _default("rollout_gate_prometheus")
    rollout_gate_query: str = _default("rollout_gate_query")
    rollout_gate_interval: float = _default("rollout_gate_interval")
    rollout_gate_failures: int = _default("rollout_gate_failures")
    rollout_gate_credentials_secret: str = _default("rollout_gate_credentials_secret")
    rollout_gate_ca_file: str = _default("rollout_gate_ca_file")
    log_format: str = _default("log_format")
    log_level: str = _default("log_level")
    health_probe_bind_address: str = _default("health_probe_bind_address")
    metrics_bind_address: str = _default("metrics_bind_address")
    leader_elect: bool = _default("leader_elect")
    leader_election_namespace: str = _default("leader_election_namespace")
    leader_election_id: str = _default("leader_election_id")
    lease_duration: float = _default("lease_duration")
    renew_deadline: float = _default("renew_deadline")
    retry_period: float = _default("retry_period")
    shutdown_timeout: float = _default("shutdown_timeout")
    sharding: bool = _default("sharding")
    shard_identity: str = _default("shard_identity")
    shard_pin_label: str = _default("shard_pin_label")
    # derived at load time (krypton.app.config.load)
    chart_values: dict[str, Any] = field(default_factory=dict)
    helm_path: str = ""
    # the pod's, from its environment: its namespace (POD_NAMESPACE, a reserved namespace)
    # and the API server it reaches in-cluster (KUBERNETES_SERVICE_HOST/_PORT); "" outside one
    pod_namespace: str = ""
    pod_server: str = ""

    @property
    def lease_namespace(self) -> str:
        return self.watch_namespace or self.leader_election_namespace

    @property
    def shared_release_namespace(self) -> str | None:
        """The one namespace every release goes to (--release-namespace=watch), else None:
        each Tenant's release goes to the namespace named after it."""
        return self.watch_namespace if self.release_namespace == "watch" else None

    def release_namespace_for(self, tenant: str) -> str:
        """The namespace of the release of the Tenant named `tenant`."""
        return self.shared_release_namespace or tenant

    @functools.cached_property
    def reserved_namespaces(self) -> frozenset[str]:
        """The operator's own namespaces (discovery, Lease, watch Secret, its pod's): a
        Tenant of the same name would let krypton install into or delete them (SPEC R16).
        Worked out once: every pass asks."""
        names = {self.namespace, self.leader_election_namespace,
                 self.watch_kubeconfig_secret_namespace, self.pod_namespace}
        return frozenset(n for n in names if n)


assert {o.name for o in OPTIONS} | {"chart_values", "helm_path", "pod_namespace", "pod_server"} == \
    {f.name for f in fields(Settings)}


# --help topics, in order: (title, option-name prefixes or names); the first match wins
TOPICS = (
    ("chart", ("chart_repo", "chart_name", "chart_version", "chart_values_file",
               "allow_chart_skip", "chart_fetch_timeout", "chart_crds", "chart_digest",
               "chart_verify", "chart_keyring", "chart_cosign_key", "chart_ca_file",
               "chart_plain_http", "chart_credentials_secret", "chart_index_ttl")),
    ("clusters and discovery", ("namespace", "kubeconfig_", "trust_kubeconfig_secrets",
                                "no_self_cluster", "allow_duplicate_clusters")),
    ("watch cluster", ("watch_kubeconfig", "watch_kubeconfig_", "watch_context",
                       "ensure_watch_crds")),
    ("Tenants and namespaces", ("watch_namespace", "release_namespace", "crd_policy",
                                "delete_namespace_on_uninstall", "adopt_namespaces",
                                "adopt_orphaned_objects")),
    ("reconcile", ("drift_detection", "max_concurrent_", "resync_period", "api_timeout",
                   "max_retries", "retry_backoff_max")),
    ("helm", ("helm_",)),
    ("progressive rollout", ("rollout_",)),
    ("leader election, sharding and shutdown", ("leader_", "lease_duration", "renew_deadline",
                                                "retry_period", "shutdown_timeout", "sharding", "shard_")),
    ("logs, health and metrics", ("log_", "health_", "metrics_")),
)


def topic(name: str) -> str:
    """The --help topic of option `name`."""
    for title, keys in TOPICS:
        if any(name == k or (k.endswith("_") and name.startswith(k)) for k in keys):
            return title
    return "other"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option as a flag, grouped by topic for --help; defaults stay None so that
    env can fill the gaps."""
    groups = {title: parser.add_argument_group(f"{title} options") for title, _ in TOPICS}
    for opt in sorted(OPTIONS, key=lambda o: [t for t, _ in TOPICS].index(topic(o.name))
                      if topic(o.name) in groups else len(TOPICS)):
        target = groups.get(topic(opt.name), parser)
        envs = " or ".join(f"${e}" for e in opt.envs)
        default = ", ".join(opt.default) if isinstance(opt.default, tuple) else opt.default
        # argparse formats help with %: a literal one is written twice
        help_text = f"{opt.help} [env {envs}; default {default!r}]".replace("%", "%%")
        if opt.repeatable:
            target.add_argument(opt.flag, action="append", default=None, help=help_text,
                                metavar=opt.metavar)
        elif opt.parse is boolean:
            target.add_argument(opt.flag, nargs="?", const="true", default=None, help=help_text,
                                metavar="BOOL")
        else:
            target.add_argument(opt.flag, default=None, help=help_text, metavar=opt.metavar)


def given(opt: Opt, args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Any, str] | None:
    """What the flag, else the first environment variable, says of `opt` (a list for a
    repeatable one), and where it came from; None when neither says anything."""
    value = getattr(args, opt.name, None)
    if value is not None:
        return value, opt.flag
    for name in opt.envs:
        if env.get(name, "") != "":
            raw = env[name]
            return ([p for p in raw.split(",") if p] if opt.repeatable else raw), f"${name}"
    return None


def parse(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """Settings from parsed flags and the environment `env`, checked; raises SettingsError.
    Files and the helm executable are not looked at (krypton.app.config.load does that)."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        got = given(opt, args, env)
        if got is None:
            values[opt.name] = opt.default
            continue
        raw, source = got
        try:
            if opt.repeatable:
                values[opt.name] = tuple(opt.parse(v) for v in raw)
            elif opt.name in _ZERO_OK and raw == "0":
                values[opt.name] = "0"
            else:
                values[opt.name] = opt.parse(raw)
        except ValueError as exc:
            raise SettingsError(f"invalid {source}: {exc}") from exc
    settings = Settings(**values, pod_namespace=env.get("POD_NAMESPACE", ""),
                        pod_server=service_server(env))
    _check(settings)
    return settings


def _check(s: Settings) -> None:
    for name in ("chart_repo", "chart_name", "chart_version", "namespace", "kubeconfig_label",
                 "kubeconfig_key"):
        if not getattr(s, name).strip():
            raise SettingsError(f"invalid --{name.replace('_', '-')}: must not be empty")
    if not re.match(r"^(https?|oci)://\S+$", s.chart_repo):
        raise SettingsError(f"invalid --chart-repo: {s.chart_repo!r} is not an http(s):// or "
                            "oci:// URL")
    _check_chart_access(s)
    _check_gate(s)
    if s.release_namespace == "watch" and not s.watch_namespace:
        raise SettingsError("invalid --release-namespace: watch needs --watch-namespace")
    if s.renew_deadline >= s.lease_duration:
        raise SettingsError("invalid --renew-deadline: must be shorter than --lease-duration")
    if s.sharding and s.leader_elect:
        raise SettingsError("invalid --sharding: every replica works under --sharding; "
                            "--leader-elect is for one worker and standbys (the replica that "
                            "runs a progressive rollout is elected on the same Lease by itself)")


def _check_gate(s: Settings) -> None:
    """A metric gate (F7) needs its server, its query and a progressive rollout."""
    if bool(s.rollout_gate_prometheus) != bool(s.rollout_gate_query):
        raise SettingsError("invalid --rollout-gate-query: --rollout-gate-prometheus and "
                            "--rollout-gate-query go together")
    if not s.rollout_gate_query:
        return
    if not re.match(r"^https?://[^\s/]+(/\S*)?$", s.rollout_gate_prometheus):
        raise SettingsError(f"invalid --rollout-gate-prometheus: "
                            f"{s.rollout_gate_prometheus[:80]!r} is not an http(s):// URL")
    if not (s.rollout_canary_clusters.strip() or s.rollout_max_parallel_clusters > 0):
        raise SettingsError("invalid --rollout-gate-query: it gates the waves of a progressive "
                            "rollout (--rollout-canary-clusters or "
                            "--rollout-max-parallel-clusters)")


def _check_chart_access(s: Settings) -> None:
    """The supply-chain flags (SPEC R6b) fit the repository they are given for."""
    is_oci = s.chart_repo.startswith("oci://")
    if s.chart_digest:
        if not is_oci:
            raise SettingsError("invalid --chart-digest: only an oci:// --chart-repo has digests")
        oci.check_digest(s.chart_digest)
        if not versions.is_exact(s.chart_version):
            raise SettingsError("invalid --chart-digest: it pins one version, and "
                                f"--chart-version {s.chart_version!r} is a range")
    if s.chart_plain_http and not is_oci:
        raise SettingsError("invalid --chart-plain-http: it is for an oci:// --chart-repo "
                            "(an http:// repository is plain already)")
    key, flag = (s.chart_cosign_key, "--chart-cosign-key") if is_oci else \
        (s.chart_keyring, "--chart-keyring")
    if s.chart_verify and not key:
        raise SettingsError(f"invalid --chart-verify: {flag} is needed to verify "
                            f"{'an oci://' if is_oci else 'an http(s)'} chart")
    for given, name in ((s.chart_keyring, "--chart-keyring"),
                        (s.chart_cosign_key, "--chart-cosign-key")):
        if given and not s.chart_verify:
            raise SettingsError(f"invalid {name}: it is only read with --chart-verify")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="krypton run")
    add_arguments(parser)
    return parser.parse_args(list(argv))
