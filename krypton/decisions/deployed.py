"""The settings of a running operator, read from its Deployment, for the CLI. Pure.

``krypton status``, ``plan``, ``diff`` and ``register-cluster`` need the operator's chart,
discovery namespace, label and watch settings. Rather than making a user repeat them, they
are read from the operator's Deployment: the flags after ``run`` in its container's command
and args, and its literal environment variables. A values file the pod reads from a
ConfigMap or Secret volume is named here (volume kind, object, key) so that the caller can
fetch it. What the user types (flags, environment) still wins; see :func:`overlay`.
"""

from __future__ import annotations

import argparse
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from krypton.decisions import settings as settings_mod
from krypton.decisions.errors import SettingsError

# The label the chart puts on the operator's Deployment, by which the CLI finds it.
NAME_LABEL = "app.kubernetes.io/name=krypton"
CONTAINER = "krypton"
# Settings that only make sense inside the pod (paths, its own logging and ports).
NOT_INHERITED = frozenset({"helm_executable", "helm_engine", "helm_worker",
                           "watch_kubeconfig", "watch_context",
                           "log_format", "log_level", "health_probe_bind_address",
                           "metrics_bind_address"})
# Settings that widen what the CLI trusts: never taken from a Deployment, which anyone who
# may create one in that namespace writes (SPEC S2). Only the user's own flag sets them.
# The providers file names commands: the CLI runs only the plugins of the user's own file.
WIDENS_TRUST = frozenset({"trust_kubeconfig_secrets", "cluster_profile_providers"})
# Settings that name files the pod reads from its volumes: the CLI reads the same keys
MOUNTED = ("chart_values_file", "health_check_expr")


@dataclass(frozen=True)
class MountedFile:
    """A file the pod reads from a volume: the kind (configMap/secret), object and key."""

    kind: str
    name: str
    key: str


@dataclass(frozen=True)
class Deployed:
    """The operator settings found in a Deployment."""

    ref: str  # namespace/name
    raw: dict[str, Any] = field(default_factory=dict)  # option name -> flag text or list
    files: dict[str, MountedFile] = field(default_factory=dict)  # path in the pod -> source
    refused: tuple[str, ...] = ()  # settings it has that widen trust: not taken


def is_operator(deployment: Mapping[str, Any]) -> bool:
    """A Deployment that runs ``krypton run``."""
    return _container(deployment) is not None


def _container(deployment: Mapping[str, Any]) -> dict[str, Any] | None:
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec")
                  or {}).get("containers") or []
    runs = [c for c in containers if "run" in _argv(c)]
    named = [c for c in runs if c.get("name") == CONTAINER]
    return (named or runs or [None])[0]


def _argv(container: Mapping[str, Any]) -> list[str]:
    return [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]


def read(deployment: Mapping[str, Any]) -> Deployed:
    """The settings of the operator in `deployment`; SettingsError if it runs none."""
    meta = deployment.get("metadata") or {}
    ref = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    container = _container(deployment)
    if container is None:
        raise SettingsError(f"invalid --from-deployment: {ref} has no container running "
                            "`krypton run`")
    argv = _argv(container)
    flags = argv[argv.index("run") + 1:]
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    settings_mod.add_arguments(parser)
    try:
        parsed, _unknown = parser.parse_known_args(flags)
    except argparse.ArgumentError as exc:
        raise SettingsError(f"invalid --from-deployment: {ref}: {exc}") from exc
    env = {str(e.get("name")): str(e["value"]) for e in container.get("env") or []
           if isinstance(e, Mapping) and "value" in e}
    raw: dict[str, Any] = {}
    refused = []
    for opt in settings_mod.OPTIONS:
        got = settings_mod.given(opt, parsed, env)
        if got is None or opt.name in NOT_INHERITED:
            continue
        if opt.name in WIDENS_TRUST:
            refused.append(opt.name)
            continue
        raw[opt.name] = got[0]
    files = {path: _mounted(path, opt, container, deployment, ref)
             for opt in MOUNTED for path in _paths(raw.get(opt))}
    return Deployed(ref, raw, files, tuple(refused))


def _paths(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def _mounted(path: str, opt: str, container: Mapping[str, Any], deployment: Mapping[str, Any],
             ref: str) -> MountedFile:
    """Which ConfigMap or Secret key the pod sees at `path`."""
    volumes = {v.get("name"): v for v in (((deployment.get("spec") or {}).get("template")
                                           or {}).get("spec") or {}).get("volumes") or []}
    mounts = sorted(container.get("volumeMounts") or [],
                    key=lambda m: -len(str(m.get("mountPath", ""))))
    for mount in mounts:
        root = str(mount.get("mountPath", "")).rstrip("/")
        volume = volumes.get(mount.get("name")) or {}
        if mount.get("subPath"):
            if path != root:
                continue
            inner = str(mount["subPath"])
        elif path.startswith(root + "/"):
            inner = path[len(root) + 1:]
        else:
            continue
        for kind, name_field in (("configMap", "name"), ("secret", "secretName")):
            source = volume.get(kind)
            if source is None:
                continue
            key = posixpath.normpath(inner)
            for item in source.get("items") or []:
                if posixpath.normpath(str(item.get("path"))) == key:
                    key = str(item.get("key"))
            return MountedFile(kind, str(source.get(name_field)), key)
        break
    flag = "--" + opt.replace("_", "-")
    raise SettingsError(f"invalid --from-deployment: {ref} reads {flag} {path} "
                        "from no ConfigMap or Secret volume")


def overlay(args: argparse.Namespace, deployed: Deployed, env: Mapping[str, str],
            files: Mapping[str, str]) -> list[str]:
    """Fill the settings the user left unset (no flag, no environment variable) from the
    operator's, in place; `files` maps a path in the pod to the local copy of that file.
    Returns the names of the settings taken."""
    taken = []
    for opt in settings_mod.OPTIONS:
        if opt.name not in deployed.raw or settings_mod.given(opt, args, env) is not None:
            continue
        value = deployed.raw[opt.name]
        if opt.name in MOUNTED:
            value = files[value] if isinstance(value, str) else [files[p] for p in value]
        setattr(args, opt.name, value)
        taken.append(opt.name)
    return taken


def choose(deployments: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The one operator Deployment among `deployments`; None when there is none;
    SettingsError when several could be meant."""
    operators = [d for d in deployments if is_operator(d)]
    if len(operators) > 1:
        refs = ", ".join(sorted(f"{(d.get('metadata') or {}).get('namespace')}/"
                                f"{(d.get('metadata') or {}).get('name')}" for d in operators))
        raise SettingsError(f"several krypton operators found ({refs}): pick one with "
                            "--from-deployment NAMESPACE/NAME")
    return operators[0] if operators else None
