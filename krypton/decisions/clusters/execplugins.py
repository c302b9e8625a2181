"""Exec credential plugins (``client.authentication.k8s.io``): what one is, what it is told
and what krypton takes of its answer. Pure.

A plugin is named by someone krypton trusts to run commands in it: the operator's admin
(a trusted kubeconfig's ``user.exec``; a ClusterProfile provider of the admin's providers
file, D10), never by a Secret or a profile. It is told the cluster's server and CA when it
asks (``provideClusterInfo``) and answers an ``ExecCredential``; krypton takes its bearer
token and expiry, bounded in size, and says what is wrong with an answer without repeating
it.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from krypton.decisions.errors import TemporaryError

EXEC_API = "client.authentication.k8s.io/v1"
EXEC_APIS = (EXEC_API, "client.authentication.k8s.io/v1beta1")  # what kubectl still runs
MAX_OUTPUT = 64 << 10  # bytes of a plugin's answer


class CredentialPluginFailed(TemporaryError):
    reason = "CredentialPluginFailed"


@dataclass(frozen=True)
class Provider:
    """An exec credential plugin, as its ExecConfig names it."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    provide_cluster_info: bool = False
    api_version: str = EXEC_API  # of the ExecCredential it is given and answers


@dataclass(frozen=True)
class PluginAccess:
    """How krypton reaches a cluster by a plugin: its server and CA, and the plugin."""

    server: str
    ca_pem: bytes
    provider: Provider


def exec_plugin(name: str, config: dict[str, Any], where: str) -> Provider:
    """The plugin of an ExecConfig: a providers file's ``execConfig`` or a trusted
    kubeconfig's ``user.exec``; ValueError naming the field at fault."""
    api = config.get("apiVersion", EXEC_API)
    if api not in EXEC_APIS:
        raise ValueError(f"{where}.apiVersion must be one of {', '.join(EXEC_APIS)}")
    command, args, env = config.get("command"), config.get("args") or [], config.get("env") or []
    if not isinstance(command, str) or not command:
        raise ValueError(f"{where}.command is required")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{where}.args must be strings")
    pairs = []
    for e in env if isinstance(env, list) else [None]:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or \
                not isinstance(e.get("value"), str):
            raise ValueError(f"{where}.env must be name/value pairs")
        pairs.append((e["name"], e["value"]))
    return Provider(name, command, tuple(args), tuple(pairs),
                    bool(config.get("provideClusterInfo")), api)


def exec_info(access: PluginAccess) -> str:
    """``KUBERNETES_EXEC_INFO`` for the plugin: not interactive, and the cluster's server
    and CA when the provider asks for them (``provideClusterInfo``)."""
    spec: dict[str, Any] = {"interactive": False}
    if access.provider.provide_cluster_info:
        spec["cluster"] = {"server": access.server}
        if access.ca_pem:
            spec["cluster"]["certificate-authority-data"] = \
                base64.b64encode(access.ca_pem).decode()
    return json.dumps({"apiVersion": access.provider.api_version, "kind": "ExecCredential",
                       "spec": spec})


def credential(output: bytes, now: float, api: str = EXEC_API) -> tuple[str, float | None]:
    """The bearer token of a plugin's ExecCredential answer and when it expires (None: not
    said); CredentialPluginFailed saying what is wrong with the answer, never its content."""
    if len(output) > MAX_OUTPUT:
        raise CredentialPluginFailed(f"the plugin's answer is over {MAX_OUTPUT} bytes")
    try:
        doc = json.loads(output)
    except (ValueError, RecursionError):
        raise CredentialPluginFailed("the plugin's answer is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential" or \
            doc.get("apiVersion") != api:
        raise CredentialPluginFailed(f"the plugin's answer is not an {api} ExecCredential")
    status = _mapping(doc.get("status"))
    token = status.get("token")
    if not isinstance(token, str) or not token or len(token) > 16 << 10 or \
            any(c in token for c in "\r\n "):
        raise CredentialPluginFailed("the plugin's answer has no usable status.token (client "
                                     "certificates from plugins are not taken)")
    expiry = status.get("expirationTimestamp")
    if expiry is None:
        return token, None
    try:
        when = dt.datetime.fromisoformat(str(expiry).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise CredentialPluginFailed("the plugin's status.expirationTimestamp is not a "
                                     "time") from None
    if when <= now:
        raise CredentialPluginFailed("the plugin's token has expired already")
    return token, when


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
