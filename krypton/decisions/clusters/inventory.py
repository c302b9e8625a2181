"""Clusters from the Cluster Inventory API (D10, sigs.k8s.io/cluster-inventory-api). Pure.

A ``ClusterProfile`` (``multicluster.x-k8s.io/v1alpha1``) is written by whoever manages the
fleet; its status names *access providers*, each with the cluster's server and CA. The
operator's admin maps provider names to exec credential plugins in a providers file
(KEP-5339's format, ``{"providers": [{"name", "execConfig"}]}``). What krypton believes of a
profile is its server (an https URL) and its CA, never a command, an argument, an
environment variable, a file path, a proxy or a TLS override: those come from the admin's
file only, and a profile's own extensions for them are ignored (S2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krypton.decisions.clusters import kubeconfig
from krypton.decisions.clusters.execplugins import PluginAccess, Provider, exec_plugin
from krypton.decisions.errors import KubeconfigRejected, SettingsError

MAX_CA = 64 << 10  # bytes of a profile's CA bundle


def parse_providers(doc: Any, what: str) -> dict[str, Provider]:
    """The providers of the admin's file (parsed JSON or YAML); SettingsError otherwise."""
    items = doc.get("providers") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise SettingsError(f"{what}: expected {{\"providers\": [{{name, execConfig}}]}}")
    out: dict[str, Provider] = {}
    for i, item in enumerate(items):
        where = f"{what}: provider {i + 1}"
        name = item.get("name") if isinstance(item, dict) else None
        config = item.get("execConfig") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name or not isinstance(config, dict):
            raise SettingsError(f"{where}: name and execConfig are required")
        if name in out:
            raise SettingsError(f"{where}: a second provider named {name!r}")
        try:
            out[name] = exec_plugin(name, config, "execConfig")
        except ValueError as exc:
            raise SettingsError(f"{where} ({name}): {exc}") from None
    return out


def profile_access(profile: Mapping[str, Any], providers: Mapping[str, Provider]
                   ) -> PluginAccess:
    """How to reach the profile's cluster: the first of its access providers (those of
    ``status.accessProviders`` before the deprecated ``credentialProviders``) that the
    admin's file names. KubeconfigRejected, with the reason the profile's Event carries,
    when none is, or the server or CA is not one krypton takes."""
    status = _mapping(profile.get("status"))
    offered = [p for key in ("accessProviders", "credentialProviders")
               for p in _list(status.get(key)) if isinstance(p, dict)
               and isinstance(p.get("name"), str)]
    if not offered:
        raise KubeconfigRejected("it offers no access provider yet",
                                 reason="ClusterProfilePending")
    names = [p["name"][:64] for p in offered][:20]
    chosen = next((p for p in offered if p.get("name") in providers), None)
    if chosen is None:
        raise KubeconfigRejected(
            f"none of its access providers ({', '.join(names)}) is in the "
            f"providers file ({', '.join(sorted(providers)) or 'empty'})",
            reason="CredentialProviderUnknown")
    name = chosen["name"]
    cluster = _mapping(chosen.get("cluster"))
    server = cluster.get("server")
    try:
        if not isinstance(server, str) or not server.startswith("https://") or \
                len(server) > 2048:
            raise KubeconfigRejected("cluster.server must be an https:// URL")
        server = kubeconfig.server_url(cluster, name)
        ca_text = cluster.get("certificate-authority-data")
        if not isinstance(ca_text, str) or len(ca_text) > 2 * MAX_CA:
            raise KubeconfigRejected(f"cluster.certificate-authority-data must be a PEM CA "
                                     f"bundle of at most {MAX_CA} bytes, base64")
        ca = kubeconfig.ca_bundle(ca_text, "cluster.certificate-authority-data")
        if len(ca) > MAX_CA:
            raise KubeconfigRejected(f"cluster.certificate-authority-data must be a PEM CA "
                                     f"bundle of at most {MAX_CA} bytes, base64")
    except KubeconfigRejected as exc:
        raise KubeconfigRejected(f"access provider {name!r}: {exc}",
                                 reason="ClusterProfileInvalid") from None
    return PluginAccess(server, ca, providers[name])


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
