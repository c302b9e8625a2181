"""Checking and reducing kubeconfigs that arrive from Secrets (SPEC D3-D5). No network.

A kubeconfig written into a discovery Secret is untrusted input. By default it must be
self-contained: ``exec`` and ``auth-provider`` users and file references
(``certificate-authority``, ``client-certificate``, ``client-key``, ``tokenFile``) are
rejected, because honouring them would let whoever writes a Secret run commands in the
operator or send the operator's own files to a server of their choice.
``--trust-kubeconfig-secrets`` lifts that rule for ``exec`` and file references; the
references are then named by the reduced kubeconfig's fields for krypton's own client to
follow. ``auth-provider`` (client-go's built-in OIDC, GCP and Azure providers) is refused
even then: an exec credential plugin does the same job. Embedded certificates are parsed with
`cryptography`: malformed PEM, a key that does not match its certificate and an expired
client certificate are rejected; one expiring within 14 days yields a warning.

Messages name the field at fault and never contain credential material.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from krypton.decisions.clusters import execplugins, incluster
from krypton.decisions.clusters.execplugins import PluginAccess, Provider
from krypton.decisions.errors import KubeconfigRejected
from krypton.decisions.trust import safeyaml

EXPIRY_WARNING = dt.timedelta(days=14)
FILE_REFERENCES = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}
PLUGINS = ("exec", "auth-provider")
IMPERSONATION = ("as", "as-uid", "as-groups", "as-user-extra")
# a file reference and the inline data it stands beside: client-go takes the data
FILE_OR_DATA = (("cluster", "certificate-authority", "certificate-authority-data"),
                ("user", "client-certificate", "client-certificate-data"),
                ("user", "client-key", "client-key-data"))


@dataclass(frozen=True)
class Kubeconfig:
    """A validated kubeconfig reduced to one context."""

    context: str
    server: str
    config: dict[str, Any]
    ca_pem: bytes | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    username: str | None = None
    password: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    disable_compression: bool = False  # cluster.disable-compression: answers not gzipped
    uses_plugins_or_files: bool = False
    in_cluster: bool = False  # the pod's own service account against its own API server
    # what a trusted kubeconfig (or the in-cluster one) names instead of inline data
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token_file: str | None = None
    plugin: Provider | None = None  # user.exec
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False)


def for_profile(name: str, access: PluginAccess) -> Kubeconfig:
    """The kubeconfig of a ClusterProfile's cluster (D10), made from what krypton takes of
    the profile (its server and CA) and the admin's plugin for its provider: krypton's own
    client runs the plugin, and helm (client-go) runs it from this kubeconfig, never
    interactively."""
    provider = access.provider
    user: dict[str, Any] = {"exec": {
        "apiVersion": provider.api_version, "command": provider.command,
        "args": list(provider.args), "env": [{"name": k, "value": v} for k, v in provider.env],
        "provideClusterInfo": provider.provide_cluster_info, "interactiveMode": "Never"}}
    config = {"apiVersion": "v1", "kind": "Config", "current-context": name,
              "clusters": [{"name": name, "cluster": {
                  "server": access.server,
                  "certificate-authority-data": base64.b64encode(access.ca_pem).decode()}}],
              "users": [{"name": name, "user": user}],
              "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
    return Kubeconfig(name, access.server, config, ca_pem=access.ca_pem, plugin=provider)


def _reject(message: str) -> KubeconfigRejected:
    return KubeconfigRejected(message)


def _named(entries: Any, kind: str, name: str) -> dict[str, Any]:
    if not isinstance(entries, list):
        raise _reject(f"kubeconfig has no {kind}s list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(kind)
            if body is None:
                return {}
            if not isinstance(body, dict):
                raise _reject(f"{kind} {name!r} is not a mapping")
            return body
    raise _reject(f"{kind} {name!r} referenced by the context is not defined")


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise _reject(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _reject(f"{what} is not valid base64") from exc


def _certs(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise _reject(f"{what} is not a valid PEM certificate") from exc
    return certs


def ca_bundle(value: Any, what: str) -> bytes:
    """A base64 PEM bundle of CA certificates, checked; KubeconfigRejected naming `what`."""
    ca = _b64(value, what)
    _certs(ca, what)
    return ca


def _check_client_pair(cert_pem: bytes, key_pem: bytes, now: dt.datetime) -> list[str]:
    cert = _certs(cert_pem, "client-certificate-data")[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise _reject("client-key-data is not a valid unencrypted PEM private key") from exc
    fmt = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*fmt) != cert.public_key().public_bytes(*fmt):
        raise _reject("client-key-data does not match client-certificate-data")
    subject = cert.subject.rfc4514_string()
    if cert.not_valid_after_utc <= now:
        raise _reject(f"client certificate {subject!r} expired at "
                      f"{cert.not_valid_after_utc.isoformat()}")
    if cert.not_valid_before_utc > now:
        raise _reject(f"client certificate {subject!r} is not valid before "
                      f"{cert.not_valid_before_utc.isoformat()}")
    if cert.not_valid_after_utc - now < EXPIRY_WARNING:
        return [f"client certificate {subject!r} expires at "
                f"{cert.not_valid_after_utc.isoformat()}"]
    return []


def _mapping(data: str) -> dict[str, Any]:
    """The kubeconfig's YAML, bounded (safeyaml), as a mapping; KubeconfigRejected if not."""
    try:
        doc = safeyaml.load(data, safeyaml.KUBECONFIG, what="kubeconfig")
    except safeyaml.YamlRejected as exc:
        raise _reject(str(exc)) from exc
    if not isinstance(doc, dict):
        raise _reject("kubeconfig is not a YAML mapping")
    return doc


def expiry_warnings(kc: Kubeconfig, now: dt.datetime | None = None) -> list[str]:
    """What an engaged cluster's credentials deserve a warning for at `now` (they were valid
    when parsed): a client certificate that expires within EXPIRY_WARNING, or expired."""
    if not kc.cert_pem:
        return []
    now = now or dt.datetime.now(dt.UTC)
    cert = _certs(kc.cert_pem, "client-certificate-data")[0]
    subject = cert.subject.rfc4514_string()
    expires = cert.not_valid_after_utc.isoformat()
    if cert.not_valid_after_utc <= now:
        return [f"client certificate {subject!r} expired at {expires}"]
    if cert.not_valid_after_utc - now < EXPIRY_WARNING:
        return [f"client certificate {subject!r} expires at {expires}"]
    return []


def parse(
    data: bytes | str | None,
    *,
    context: str | None = None,
    trust: bool = False,
    allow_in_cluster: bool = False,
    pod_server: str = "",
    now: dt.datetime | None = None,
    base: str | None = None,
) -> Kubeconfig:
    """Validate `data` and reduce it to `context` (default: its current-context), read as
    client-go reads it or refused (:func:`_as_client_go_reads`). `base` is the directory of
    the file it was read from (relative file references are made absolute from there, so
    that krypton and helm read the same files); a kubeconfig from a Secret has none.
    With `allow_in_cluster`, the pod's service-account files may be named for the in-cluster
    API server: ``kubernetes.default.svc`` or `pod_server`, the one the pod's environment
    names (:func:`krypton.decisions.clusters.incluster.service_server`). Raises KubeconfigRejected
    with a precise, credential-free message.
    """
    now = now or dt.datetime.now(dt.UTC)
    chosen, ctx, cluster_name, user_name, cluster, user = _context(_document(data), context)
    cluster, user = _as_client_go_reads(cluster, user, str(cluster_name), base)
    server, risky, in_cluster = _reach(cluster, user, str(cluster_name), trust=trust,
                                       allow_in_cluster=allow_in_cluster, pod_server=pod_server)
    if user.get("auth-provider"):
        raise _reject("kubeconfig uses user.auth-provider, which krypton does not support; "
                      "use an exec credential plugin (user.exec) instead")
    plugin = _plugin(user, str(user_name))
    insecure = _boolean(cluster, "insecure-skip-tls-verify", "cluster")
    tls_server_name = _text(cluster, "tls-server-name", "cluster")
    disable_compression = _boolean(cluster, "disable-compression", "cluster")
    token = _text(user, "token", "user", header=True)
    username = _text(user, "username", "user", header=True)
    password = _text(user, "password", "user", header=True)
    if (username is None) != (password is None):
        raise _reject("user username and password must be given together")
    sends_secret = bool(token or password or user.get("client-key-data"))
    if server.startswith("http://") and sends_secret and not trust:
        raise _reject(f"cluster {cluster_name!r} server uses http://: its credentials would be "
                      "sent in clear; use https (--trust-kubeconfig-secrets allows http)")

    ca, cert, key, warnings = _certificates(cluster, user, now)
    reduced = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [{"name": user_name, "user": user}] if user_name else [],
        "contexts": [{"name": chosen, "context": ctx}], "current-context": chosen,
    }
    return Kubeconfig(
        context=chosen, server=server, config=reduced, ca_pem=ca, cert_pem=cert, key_pem=key,
        token=token, username=username, password=password, insecure=insecure,
        tls_server_name=tls_server_name, disable_compression=disable_compression,
        uses_plugins_or_files=bool(risky) and not in_cluster, in_cluster=in_cluster,
        warnings=tuple(warnings),
        ca_file=_text(cluster, "certificate-authority", "cluster"),
        cert_file=_text(user, "client-certificate", "user"),
        key_file=_text(user, "client-key", "user"),
        token_file=_text(user, "tokenFile", "user"),
        plugin=plugin,
    )


def _document(data: bytes | str | None) -> dict[str, Any]:
    """The kubeconfig's text as a mapping, or why not."""
    if data is None:
        raise _reject("kubeconfig data key is missing")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _reject("kubeconfig is not UTF-8 text") from exc
    if not data.strip():
        raise _reject("kubeconfig is empty")
    return _mapping(data)


def _context(doc: dict[str, Any], context: str | None) -> tuple[
        str, dict[str, Any], Any, Any, dict[str, Any], dict[str, Any]]:
    """The chosen context's name and entry, its cluster's and user's names and entries."""
    contexts = doc.get("contexts") or []
    if not isinstance(contexts, list):
        raise _reject("kubeconfig contexts is not a list")
    names = [c.get("name") for c in contexts if isinstance(c, dict)]
    chosen = context or doc.get("current-context") or (names[0] if len(names) == 1 else None)
    if not chosen:
        raise _reject("kubeconfig has no usable context (no current-context)")
    if not isinstance(chosen, str):
        raise _reject("kubeconfig current-context is not a string")
    ctx = _named(contexts, "context", chosen)
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if not cluster_name:
        raise _reject(f"context {chosen!r} names no cluster")
    cluster = _named(doc.get("clusters"), "cluster", cluster_name)
    user = _named(doc.get("users"), "user", user_name) if user_name else {}
    return chosen, ctx, cluster_name, user_name, cluster, user


def _reach(cluster: dict[str, Any], user: dict[str, Any], cluster_name: str, *, trust: bool,
           allow_in_cluster: bool, pod_server: str) -> tuple[str, list[str], bool]:
    """The server, the plugins and files the kubeconfig names, and whether it is the pod's
    own service account; refused when it names a proxy, or plugins or files untrusted."""
    risky = [f"user.{k}" for k in PLUGINS if user.get(k)]
    risky += [f"cluster.{k}" for k in FILE_REFERENCES["cluster"] if cluster.get(k)]
    risky += [f"user.{k}" for k in FILE_REFERENCES["user"] if user.get(k)]
    server = server_url(cluster, cluster_name)
    if cluster.get("proxy-url") is not None:
        # helm would go through the proxy and krypton's own client would not: two paths
        # to one cluster, and checks made on one of them (SPEC S2). Refused, trust or not.
        raise _reject(f"cluster {cluster_name!r} sets proxy-url, which krypton does not "
                      "support: its own client and helm would reach the server by different "
                      "paths; remove proxy-url (a server reached directly)")
    in_cluster = allow_in_cluster and incluster.uses_service_account(cluster, user, server,
                                                                     pod_server)
    if risky and not trust and not in_cluster:
        raise _reject(
            f"kubeconfig uses {', '.join(risky)}; only self-contained kubeconfigs are accepted "
            "from Secrets (--trust-kubeconfig-secrets allows them)"
        )
    return server, risky, in_cluster


def _certificates(cluster: dict[str, Any], user: dict[str, Any], now: dt.datetime
                  ) -> tuple[bytes | None, bytes | None, bytes | None, list[str]]:
    """The CA bundle, the client certificate and key, checked, and what they deserve a
    warning for."""
    ca = cert = key = None
    if cluster.get("certificate-authority-data"):
        ca = ca_bundle(cluster["certificate-authority-data"], "certificate-authority-data")
    warnings: list[str] = []
    if user.get("client-certificate-data") or user.get("client-key-data"):
        if not (user.get("client-certificate-data") and user.get("client-key-data")):
            raise _reject("client-certificate-data and client-key-data must be given together")
        cert = _b64(user["client-certificate-data"], "client-certificate-data")
        key = _b64(user["client-key-data"], "client-key-data")
        warnings += _check_client_pair(cert, key, now)
    return ca, cert, key, warnings


def _plugin(user: dict[str, Any], user_name: str) -> Provider | None:
    """The user's exec credential plugin, checked; None without one."""
    if not user.get("exec"):
        return None
    if not isinstance(user["exec"], dict):
        raise _reject("user.exec is not a mapping")
    try:
        return execplugins.exec_plugin(user_name, user["exec"], "user.exec")
    except ValueError as exc:
        raise _reject(str(exc)) from None


def _as_client_go_reads(cluster: dict[str, Any], user: dict[str, Any], name: str,
                        base: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cluster and user entries as client-go reads them, so that krypton's own client
    and helm (client-go) act alike, as one identity; what they would read differently is
    refused with the reason:

    - impersonation (``as``, ``as-uid``, ``as-groups``, ``as-user-extra``): helm would act
      as the impersonated user, krypton's checks as the kubeconfig's own;
    - a file reference beside its inline data: client-go takes the data, so the file is
      dropped; ``token`` beside ``tokenFile`` is refused (client-go takes the token, then
      lets the file's content win once read);
    - ``insecure-skip-tls-verify`` with a CA: client-go refuses it;
    - a relative file reference or exec command path: client-go resolves it from the
      kubeconfig's directory (`base`), made absolute here; without a directory (a Secret)
      it is refused."""
    where = f"user of cluster {name!r}"
    impersonating = [k for k in IMPERSONATION if user.get(k) not in (None, "", [], {})]
    if impersonating:
        raise _reject(f"{where} sets {', '.join(impersonating)} (impersonation), which krypton "
                      "does not support: helm would act as the impersonated user and krypton "
                      "as the kubeconfig's own; give the credentials of the identity krypton "
                      "should act as")
    if user.get("token") and user.get("tokenFile"):
        raise _reject(f"{where} sets both token and tokenFile: client-go reads either, at "
                      "different moments; keep one")
    entries = {"cluster": dict(cluster), "user": dict(user)}
    for kind, ref, data in FILE_OR_DATA:
        if entries[kind].get(ref) and entries[kind].get(data):
            del entries[kind][ref]
    cluster, user = entries["cluster"], entries["user"]
    if cluster.get("insecure-skip-tls-verify") is True and (
            cluster.get("certificate-authority") or cluster.get("certificate-authority-data")):
        raise _reject(f"cluster {name!r} sets insecure-skip-tls-verify with a CA, which "
                      "client-go refuses; keep one")
    if bool(user.get("client-certificate")) != bool(user.get("client-key")) and \
            (user.get("client-certificate") or user.get("client-key")):
        raise _reject(f"{where} gives its client certificate and key one as a file, one as "
                      "data; give both alike")
    refs = [(cluster, "certificate-authority"), (user, "client-certificate"),
            (user, "client-key"), (user, "tokenFile")]
    command = user.get("exec", {}).get("command") if isinstance(user.get("exec"), dict) else None
    for entry, key in refs:
        path = entry.get(key)
        if isinstance(path, str) and path and not path.startswith("/"):
            if base is None:
                raise _reject(f"{key} {path!r} is a relative path, and a kubeconfig from a "
                              "Secret has no directory to resolve it from; give an absolute "
                              "path")
            entry[key] = f"{base.rstrip('/')}/{path}"
    if isinstance(command, str) and "/" in command and not command.startswith("/"):
        if base is None:
            raise _reject(f"user.exec.command {command!r} is a relative path, and a kubeconfig "
                          "from a Secret has no directory to resolve it from; give an absolute "
                          "path or a name on PATH")
        user["exec"] = {**user["exec"], "command": f"{base.rstrip('/')}/{command}"}
    return cluster, user


def server_url(cluster: dict[str, Any], name: str) -> str:
    """The cluster's API server URL: http(s), a host, a valid port, nothing else.

    A path, query or fragment would be prefixed to every API path by the client; user info
    would be a credential in the URL. Both are refused rather than silently used.
    """
    server = cluster.get("server")
    if not isinstance(server, str) or not server.strip():
        raise _reject(f"cluster {name!r} has no server URL")
    if any(ch.isspace() or ord(ch) < 32 for ch in server):
        raise _reject(f"cluster {name!r} server URL contains whitespace or control characters")
    try:
        parts = urlsplit(server)
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise _reject(f"cluster {name!r} server URL cannot be parsed: {exc}") from exc
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise _reject(f"cluster {name!r} server URL must be http(s)://host[:port]")
    if parts.username is not None or parts.password is not None:
        raise _reject(f"cluster {name!r} server URL must not contain user information")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise _reject(f"cluster {name!r} server URL must not have a path, query or fragment "
                      "(krypton talks to the API server at its root)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def _boolean(entry: dict[str, Any], key: str, where: str) -> bool:
    """A YAML boolean; the string "false" is not one (it would read as true)."""
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise _reject(f"{where}.{key} must be a boolean (true or false, unquoted)")
    return value


def _text(entry: dict[str, Any], key: str, where: str, *, header: bool = False) -> str | None:
    """A string field; one that goes into an HTTP header must be one printable Latin-1 line."""
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _reject(f"{where}.{key} is not a string")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise _reject(f"{where}.{key} contains a newline or control character")
    if header:
        try:
            value.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise _reject(f"{where}.{key} contains characters an HTTP header cannot carry") \
                from exc
    return value


def inline_files(data: str, read_file: Callable[[str], bytes]) -> str:
    """Replace file references of a trusted kubeconfig by their content (SPEC D6, O7).

    Certificate and key paths become ``*-data`` fields, ``tokenFile`` becomes ``token``;
    `read_file` reads a referenced path (relative ones from the kubeconfig's directory) and
    raises OSError when it cannot. The result is self-contained.
    """
    doc = _mapping(data)

    def read(path: str) -> bytes:
        try:
            return read_file(path)
        except OSError as exc:
            raise _reject(f"cannot read {path}: {exc.strerror}") from exc

    for entry in doc.get("clusters") or []:
        cluster = entry.get("cluster") or {}
        if cluster.get("certificate-authority"):  # beside its data, the data wins
            path = cluster.pop("certificate-authority")
            if not cluster.get("certificate-authority-data"):
                cluster["certificate-authority-data"] = base64.b64encode(read(path)).decode()
    for entry in doc.get("users") or []:
        user = entry.get("user") or {}
        for ref, inline in (("client-certificate", "client-certificate-data"),
                            ("client-key", "client-key-data")):
            if user.get(ref):
                path = user.pop(ref)
                if not user.get(inline):
                    user[inline] = base64.b64encode(read(path)).decode()
        if user.get("tokenFile"):
            user["token"] = read(user.pop("tokenFile")).decode().strip()
    return str(yaml.safe_dump(doc, sort_keys=False))
