"""Labelled kubeconfig Secrets and ClusterProfiles -> the desired set of clusters (SPEC D1,
D2, D10, F3). Pure.

Each cluster is identified by its Secret's or its profile's name and carries a hash of
everything that defines it (kubeconfig bytes or the profile's access providers, per-cluster
values and maintenance window); the fleet re-engages a cluster only when that hash changes.
A Secret and a profile of one name are one name for two clusters: the Secret's is the one
engaged, and the profile is said to clash.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from krypton.decisions import windows
from krypton.decisions.errors import KubeconfigRejected
from krypton.decisions.model import GROUP
from krypton.decisions.trust import safeyaml

VALUES_KEY = "values.yaml"
WINDOW_ANNOTATION = f"{GROUP}/maintenance-window"  # on a cluster's Secret or profile (F8)
SECRET, PROFILE = "Secret", "ClusterProfile"  # where a cluster was found
PROFILE_API = "multicluster.x-k8s.io/v1alpha1"
MAX_PROFILE_ACCESS = 256 << 10  # bytes of a profile's access providers taken

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
    source: str = SECRET  # the kind of object it was found as
    profile: dict[str, Any] | None = None  # a ClusterProfile, as far as it is read (its access)

    @property
    def involved(self) -> dict[str, Any]:
        """The object its Events are about: its Secret or its ClusterProfile."""
        api = "v1" if self.source == SECRET else PROFILE_API
        return {"apiVersion": api, "kind": self.source, "name": self.name,
                "namespace": self.namespace, "uid": self.uid or None}


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
    (SPEC S2), since a person who wrote one meant it to be."""
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


def profile_fields(profile: dict[str, Any]) -> dict[str, Any]:
    """What krypton keeps of a ClusterProfile: the metadata it reads and the access
    providers of its status (nothing of its spec, conditions or properties)."""
    meta = profile.get("metadata") or {}
    status = profile.get("status")
    status = status if isinstance(status, dict) else {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                              "labels", "annotations", "deletionTimestamp")
                         if k in meta},
            "status": {k: status[k] for k in ("accessProviders", "credentialProviders")
                       if k in status}}


def desired_profiles(profiles: list[dict[str, Any]]) -> dict[str, ClusterSpec]:
    """Cluster specs from ClusterProfile objects: their name, their access providers (what
    :func:`krypton.decisions.clusters.inventory.profile_access` reads, at most MAX_PROFILE_ACCESS
    bytes of it) and their maintenance-window annotation."""
    out: dict[str, ClusterSpec] = {}
    for profile in profiles:
        meta = profile.get("metadata") or {}
        if meta.get("deletionTimestamp") or not isinstance(meta.get("name"), str):
            continue
        status = profile.get("status")
        status = status if isinstance(status, dict) else {}
        access = {k: status[k] for k in ("accessProviders", "credentialProviders")
                  if k in status}
        text = json.dumps(access, sort_keys=True)
        if len(text) > MAX_PROFILE_ACCESS:
            access, text = {}, f"<over {MAX_PROFILE_ACCESS} bytes>"
        window = str((meta.get("annotations") or {}).get(WINDOW_ANNOTATION) or "")[:256]
        digest = hashlib.sha256(f"{PROFILE}\0{text}\0{window}".encode()).hexdigest()
        out[meta["name"]] = ClusterSpec(meta["name"], meta.get("namespace", ""),
                                        meta.get("uid", ""), None, None, digest, window,
                                        PROFILE, {"status": access})
    return out


def combined(secrets: dict[str, ClusterSpec], profiles: dict[str, ClusterSpec]
             ) -> tuple[dict[str, ClusterSpec], list[ClusterSpec]]:
    """The clusters of both sources, and the profiles not taken because a Secret has their
    name (the Secret is the admin's own word for that name)."""
    clashes = [spec for name, spec in profiles.items() if name in secrets]
    return {**profiles, **secrets}, clashes


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
