"""The operator's and the CLI's settings as read from this process's flags, environment and
files: the I/O around :func:`krypton.decisions.settings.parse`, which decides."""

from __future__ import annotations

import argparse
import os
import shutil
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from krypton.decisions.charts.fingerprint import deep_merge
from krypton.decisions.clusters.execplugins import Provider
from krypton.decisions.clusters.inventory import parse_providers
from krypton.decisions.errors import SettingsError
from krypton.decisions.readiness.celhealth import HealthRules, compile_rules
from krypton.decisions.readiness.health import WORKLOAD_KINDS
from krypton.decisions.settings import Settings, parse
from krypton.decisions.trust import safeyaml


def load(args: argparse.Namespace, env: Mapping[str, str] | None = None,
         *, check_helm: bool = True) -> Settings:
    """Settings from parsed flags and the environment (this process's unless `env` is
    given), with the central values files read and merged in order and the helm executable
    found on PATH (unless `check_helm` is false); raises SettingsError."""
    settings = parse(args, os.environ if env is None else env)
    merged: dict[str, Any] = {}
    for path in settings.chart_values_file:
        merged = deep_merge(merged, read_values_file(path))
    helm_path = resolve_helm(settings.helm_executable) if check_helm else settings.helm_executable
    worker_path = resolve_helm(settings.helm_worker, "--helm-worker") \
        if check_helm and settings.helm_engine == "worker" else settings.helm_worker
    return replace(settings, chart_values=merged, helm_path=helm_path,
                   helm_worker_path=worker_path,
                   health_rules=read_health_rules(settings.health_check_expr),
                   profile_providers=read_providers(settings.cluster_profile_providers))


CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))  # v1
NO_LIMIT = 1 << 60  # cgroup v1 says "none" as a number near 2**63


def cgroup_memory_limit(files: tuple[Path, ...] = CGROUP_LIMITS) -> int | None:
    """The memory limit of this process's cgroup (a pod's, in a container), None where it
    sets none or none can be read (SPEC S7)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < NO_LIMIT:
            return int(text)
        return None
    return None


def read_providers(path: str) -> dict[str, Provider]:
    """The exec plugins of --cluster-profile-providers (none without the flag)."""
    if not path:
        return {}
    what = f"invalid --cluster-profile-providers {path}"
    return parse_providers(_yaml_file(path, what), what)


def read_health_rules(path: str) -> HealthRules:
    """The CEL health rules of --health-check-expr, compiled (none without the flag)."""
    if not path:
        return HealthRules()
    what = f"invalid --health-check-expr {path}"
    return compile_rules(_yaml_file(path, what), what, WORKLOAD_KINDS)


def _yaml_file(path: str, what: str) -> Any:
    """The bounded YAML of an admin's file; SettingsError starting with `what` otherwise."""
    try:
        return safeyaml.load(Path(path).read_bytes(), safeyaml.VALUES, what=path)
    except OSError as exc:
        raise SettingsError(f"{what}: cannot read it: {exc.strerror}") from exc
    except safeyaml.YamlRejected as exc:
        raise SettingsError(f"{what}: {exc}") from exc


def read_values_file(path: str) -> dict[str, Any]:
    try:
        return safeyaml.load_values(Path(path).read_bytes(), what=path)
    except OSError as exc:
        raise SettingsError(f"invalid --chart-values-file: cannot read {path}: "
                            f"{exc.strerror}") from exc
    except safeyaml.YamlRejected as exc:
        raise SettingsError(f"invalid --chart-values-file: {exc}") from exc


def resolve_helm(executable: str, flag: str = "--helm-executable") -> str:
    """`executable` found on PATH, or else beside the krypton command (where `make install`
    puts the helm worker)."""
    found = shutil.which(executable) or shutil.which(executable, path=sysconfig.get_path("scripts"))
    if not found:
        raise SettingsError(f"helm executable {executable!r} not found "
                            f"(set {flag} or put it on PATH)")
    return found


def file_reader(base_dir: str) -> Callable[[str], bytes]:
    """Reads the files a kubeconfig in `base_dir` names (relative paths from there, ``~``
    expanded), for :func:`krypton.decisions.clusters.kubeconfig.inline_files`."""
    def read(path: str) -> bytes:
        return Path(os.path.expanduser(os.path.join(base_dir, path))).read_bytes()
    return read
