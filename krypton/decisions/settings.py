"""Operator settings: one table of flags with their environment variables and defaults.

Precedence is flag > environment > default (SPEC O1). Values are parsed and checked here,
before any cluster is touched; a bad value raises SettingsError, which the entry point
turns into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from krypton.decisions import windows
from krypton.decisions.charts import oci, versions
from krypton.decisions.clusters.execplugins import Provider
from krypton.decisions.clusters.incluster import service_server
from krypton.decisions.errors import SettingsError
from krypton.decisions.options import OPTIONS, Opt, boolean, duration, option
from krypton.decisions.readiness.celhealth import HealthRules

__all__ = ["OPTIONS", "Opt", "Settings", "SettingsError", "duration", "option", "parse",
           "parse_args"]

_ZERO_OK = {"health_probe_bind_address", "metrics_bind_address"}


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
    memory_limit: int = _default("memory_limit")
    web_address: str = _default("web_address")
    web_auth: str = _default("web_auth")
    resync_period: float = _default("resync_period")
    max_retries: int = _default("max_retries")
    retry_backoff_max: float = _default("retry_backoff_max")
    api_timeout: float = _default("api_timeout")
    helm_wait: bool = _default("helm_wait")
    health_check_expr: str = _default("health_check_expr")
    cluster_profiles: bool = _default("cluster_profiles")
    cluster_profile_namespace: str = _default("cluster_profile_namespace")
    cluster_profile_selector: str = _default("cluster_profile_selector")
    cluster_profile_providers: str = _default("cluster_profile_providers")
    maintenance_window: str = _default("maintenance_window")
    maintenance_window_first_install: bool = _default("maintenance_window_first_install")
    helm_timeout: float = _default("helm_timeout")
    helm_force_conflicts: bool = _default("helm_force_conflicts")
    helm_executable: str = _default("helm_executable")
    helm_engine: str = _default("helm_engine")
    helm_worker: str = _default("helm_worker")
    helm_driver: str = _default("helm_driver")
    record_guard: str = _default("record_guard")
    helm_history_max: int = _default("helm_history_max")
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
    rollout_approval: str = _default("rollout_approval")
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
    helm_worker_path: str = ""  # --helm-worker found on PATH (engine worker)
    health_rules: HealthRules = field(default_factory=HealthRules)  # --health-check-expr, compiled
    # --cluster-profile-providers, read: the exec plugin of each provider name
    profile_providers: dict[str, Provider] = field(default_factory=dict)
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


assert {o.name for o in OPTIONS} | {"chart_values", "helm_path", "helm_worker_path",
                                    "pod_namespace", "pod_server",
                                    "health_rules", "profile_providers"} == \
    {f.name for f in fields(Settings)}


# --help topics, in order: (title, option-name prefixes or names); the first match wins
TOPICS = (
    ("chart", ("chart_repo", "chart_name", "chart_version", "chart_values_file",
               "allow_chart_skip", "chart_fetch_timeout", "chart_crds", "chart_digest",
               "chart_verify", "chart_keyring", "chart_cosign_key", "chart_ca_file",
               "chart_plain_http", "chart_credentials_secret", "chart_index_ttl")),
    ("clusters and discovery", ("namespace", "kubeconfig_", "trust_kubeconfig_secrets",
                                "no_self_cluster", "allow_duplicate_clusters",
                                "cluster_profile")),
    ("watch cluster", ("watch_kubeconfig", "watch_kubeconfig_", "watch_context",
                       "ensure_watch_crds")),
    ("Tenants and namespaces", ("watch_namespace", "release_namespace", "crd_policy",
                                "delete_namespace_on_uninstall", "adopt_namespaces",
                                "adopt_orphaned_objects")),
    ("reconcile", ("drift_detection", "max_concurrent_", "resync_period", "api_timeout",
                   "max_retries", "retry_backoff_max", "health_check_expr")),
    ("helm", ("helm_",)),
    ("progressive rollout and maintenance windows", ("rollout_", "maintenance_window")),
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
    try:
        windows.parse(s.maintenance_window)
    except windows.WindowInvalid as exc:
        raise SettingsError(f"invalid --maintenance-window: {exc}") from None
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
