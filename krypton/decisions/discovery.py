"""Labelled kubeconfig Secrets -> the desired set of clusters (SPEC D1, D2, F3). Pure.

Each cluster is identified by its Secret's name and carries a hash of everything that
defines it (kubeconfig bytes, per-cluster values and maintenance window); the fleet
re-engages a cluster only when that hash changes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Any

from krypton.decisions import safeyaml, windows
from krypton.decisions.errors import KubeconfigRejected
from krypton.decisions.model import GROUP

VALUES_KEY = "values.yaml"
WINDOW_ANNOTATION = f"{GROUP}/maintenance-window"  # on a cluster's Secret (F8)

SELF_CLUSTER = "self-cluster"  # the Secret krypton writes for the cluster it runs in


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    uid: str
    kubeconfig: bytes | None  # None: the data key is missing or not base64
    values: bytes | None
    digest: str
    window: str = ""  # the maintenance-window annotation, as written ("": none)


def decode_data(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def secret_strings(secret: Any) -> dict[str, str]:
    """A Secret's data as text: the keys whose value is base64 of UTF-8, nothing else (a
    credentials Secret is written by whoever may write Secrets in that namespace)."""
    data = secret.get("data") if isinstance(secret, dict) else None
    out = {}
    for key, value in (data or {}).items() if isinstance(data, dict) else ():
        raw = decode_data(value)
        if isinstance(key, str) and raw is not None:
            try:
                out[key] = raw.decode()
            except UnicodeDecodeError:
                continue
    return out


LABEL_VALUE = "true"  # the only value of --kubeconfig-label that makes a Secret a cluster


def by_label(secrets: list[dict[str, Any]], label: str
             ) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """The Secrets whose `label` is exactly "true", and those carrying it with another value
    ("True", "yes", "1", ""), each with that value: not clusters, but worth saying so
    (issue 25.6), since a person who wrote one meant it to be."""
    accepted, ignored = [], []
    for secret in secrets:
        value = ((secret.get("metadata") or {}).get("labels") or {}).get(label)
        if value == LABEL_VALUE:
            accepted.append(secret)
        elif value is not None:
            ignored.append((secret, str(value)))
    return accepted, ignored


def desired_clusters(secrets: list[dict[str, Any]], key: str) -> dict[str, ClusterSpec]:
    """Cluster specs from Secret objects (plain dicts as the API returns them)."""
    out: dict[str, ClusterSpec] = {}
    for secret in secrets:
        meta = secret.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        data = secret.get("data") or {}
        kubeconfig, values = decode_data(data.get(key)), decode_data(data.get(VALUES_KEY))
        window = str((meta.get("annotations") or {}).get(WINDOW_ANNOTATION) or "")[:256]
        digest = hashlib.sha256((kubeconfig or b"<missing>") + b"\0" + (values or b"") +
                                b"\0" + window.encode()).hexdigest()
        out[meta["name"]] = ClusterSpec(meta["name"], meta.get("namespace", ""),
                                        meta.get("uid", ""), kubeconfig, values, digest, window)
    return out


def cluster_window(spec: ClusterSpec, default: str) -> windows.Window | None:
    """The cluster's maintenance window: its Secret's annotation, else `default` (the
    flag); KubeconfigRejected (MaintenanceWindowInvalid) when the annotation is not one."""
    try:
        return windows.parse(spec.window or default)
    except windows.WindowInvalid as exc:
        raise KubeconfigRejected(f"annotation {WINDOW_ANNOTATION}: {exc}",
                                 reason=exc.reason) from None


def cluster_values(spec: ClusterSpec) -> dict[str, Any]:
    """The per-cluster values.yaml stored in the cluster's Secret (empty without one);
    KubeconfigRejected (ValuesInvalid) when it is not a YAML mapping krypton accepts."""
    if not spec.values:
        return {}
    try:
        return safeyaml.load_values(spec.values, what="values.yaml in the Secret")
    except safeyaml.YamlRejected as exc:
        raise KubeconfigRejected(str(exc), reason="ValuesInvalid") from exc
