"""One cluster's API over HTTP: how krypton reaches it (:class:`ClientConfig`) and its
transport (:class:`Transport`).

krypton speaks to API servers with aiohttp, on the event loop, and builds its own requests:
every cluster gets its own connection pool, TLS context and credentials, built from a
validated kubeconfig (:mod:`krypton.decisions.kubeconfig`), never from a process-wide
default. Certificate files for the TLS context are written to a per-cluster directory
(mode 0700/0600) that the owner removes on disengage. Credentials are asked for before each
request: a fixed token, the pod's service-account token read again as it rotates, or a
trusted exec credential plugin's token, kept until it is nearly over
(:mod:`krypton.adapters.execcredentials`).

No thread per watch, no executor for requests, so a cluster that never answers holds nothing
but its own coroutine for at most ``timeout`` seconds. :meth:`Transport.request` reads the
body as JSON into plain dicts and translates every failure into krypton's error types.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import ssl
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import aiohttp
import structlog

from krypton import __version__
from krypton.adapters import metrics
from krypton.adapters.execcredentials import ExecCredentials
from krypton.adapters.http import read_answer
from krypton.decisions import kubeconfig as kubeconfigs
from krypton.decisions.errors import (
    AlreadyExists,
    APIError,
    ClusterUnreachable,
    Conflict,
    Forbidden,
    Gone,
    KubeconfigRejected,
    NotFound,
    SettingsError,
    TemporaryError,
)
from krypton.decisions.execplugins import PluginAccess
from krypton.decisions.model import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
EventHandler = Callable[[str, Obj], None]
Query = dict[str, str | int | None]

log = structlog.get_logger("krypton.kube")

HELM_RELEASE_SELECTOR = "owner=helm"
DISCOVERY_TTL = 300.0  # seconds a group version's resource list is reused for object look-ups
PAGE_SIZE = 500  # list pages: a fleet of large clusters never loads one huge answer at once
SHORT_WATCH = 1.0  # seconds: a watch that ends sooner is resumed only after a backoff


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much of a cluster's answers krypton takes, in bytes as they arrive (issue 46): an
    engaged cluster's API server is someone else's. The largest object etcd stores is about
    1.5 MiB; a list page holds PAGE_SIZE objects."""

    answer: int = 16 << 20  # one answer: an object, a list page
    watch_line: int = 4 << 20  # one watch event
    store: int = 32 << 20  # a whole list, and what one informer keeps of a collection


ENGAGED = Limits()
# the watch cluster: its cluster Secrets are the fleet administrators' (a kubeconfig and
# values of up to 1 MiB each, for every cluster of the fleet)
HOME = Limits(answer=64 << 20, store=1 << 30)
MERGE_PATCH = "application/merge-patch+json"
CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ONLY_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def _status_error(status: int, body: bytes | bytearray, what: str) -> APIError:
    detail = _api_message(body) or f"HTTP {status}"
    if status == 404:
        return NotFound(f"{what}: not found")
    if status == 409:
        kind = AlreadyExists if "already exists" in detail else Conflict
        return kind(f"{what}: {detail}")
    if status in (401, 403):
        return Forbidden(f"{what}: {'unauthorized' if status == 401 else 'forbidden'}: {detail}")
    if status == 410:
        return Gone(f"{what}: {detail}")
    return APIError(f"{what}: HTTP {status}: {detail}")


def _api_message(body: bytes | bytearray) -> str:
    try:
        message = json.loads(body or b"{}").get("message")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return _short(str(message)) if message else ""


def _short(text: str) -> str:
    return text if len(text) < 300 else text[:300] + "..."


def _transport_error(exc: BaseException, what: str) -> ClusterUnreachable:
    if isinstance(exc, TimeoutError):
        return ClusterUnreachable(f"{what}: no answer in time")
    return ClusterUnreachable(f"{what}: {type(exc).__name__}: {_short(str(exc))}")


TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError)


class Credentials(Protocol):
    async def authorization(self) -> str:
        """The Authorization header of the next request, "" for none."""
        ...

    def rejected(self) -> None:
        """The server answered 401 to what :meth:`authorization` gave: get a new one."""
        ...


@dataclasses.dataclass(frozen=True)
class Header:
    """A fixed Authorization header: a kubeconfig's token, or username and password."""

    value: str = ""

    async def authorization(self) -> str:
        return self.value

    def rejected(self) -> None:
        pass  # nothing else to send


MAX_TOKEN_FILE = 64 << 10  # bytes read of a token file


class TokenFile:
    """A bearer token from a file, read again once a minute: a projected service-account
    token is rotated on disk (client-go reads it as often). A read that fails keeps the
    token read before, if there is one."""

    REREAD = 60.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._token = ""
        self._read_at = float("-inf")

    async def authorization(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= self.REREAD:
            try:
                with open(self.path, "rb") as f:
                    self._token = f.read(MAX_TOKEN_FILE).decode().strip()
            except (OSError, UnicodeDecodeError) as exc:
                if not self._token:
                    raise ClusterUnreachable(f"cannot read the token file {self.path}: "
                                             f"{type(exc).__name__}") from None
            self._read_at = now
        return f"Bearer {self._token}" if self._token else ""

    def rejected(self) -> None:
        self._read_at = float("-inf")  # rotated since it was read: read it again


@dataclasses.dataclass
class ClientConfig:
    """How krypton reaches one cluster's API: where, over which TLS, as whom."""

    host: str
    ssl: ssl.SSLContext | bool = True  # True: the system's CAs
    credentials: Credentials = dataclasses.field(default_factory=Header)
    ca_pem: bytes = b""  # "" when the system's CAs are trusted
    cert_file: str | None = None
    key_file: str | None = None
    tls_server_name: str | None = None

    @property
    def token(self) -> str:
        """The fixed bearer token it sends, "" when it sends none or another kind."""
        header = self.credentials.value if isinstance(self.credentials, Header) else ""
        scheme, _, token = header.partition(" ")
        return token if scheme == "Bearer" else ""


def tls_context(ca_pem: bytes, cert_file: str | None, key_file: str | None, *,
                verify: bool = True) -> ssl.SSLContext:
    """A client TLS context trusting `ca_pem` (the system's CAs when empty), presenting the
    client certificate of `cert_file` and `key_file`; ValueError or OSError when they
    cannot be loaded."""
    if not verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif ca_pem:
        ctx = ssl.create_default_context(cadata=ca_pem.decode("ascii"))
    else:
        ctx = ssl.create_default_context()
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


def _authorization(kc: kubeconfigs.Kubeconfig, ca_pem: bytes, name: str,
                   base: Path) -> Credentials:
    if kc.plugin is not None:
        plugin = kc.plugin
        if "/" in plugin.command:  # as kubectl: a relative path from the kubeconfig's directory
            plugin = dataclasses.replace(plugin, command=str(base / plugin.command))
        return ExecCredentials(PluginAccess(kc.server, ca_pem, plugin), name)
    if kc.token_file:
        return TokenFile(str(base / kc.token_file))
    if kc.token:
        return Header(f"Bearer {kc.token}")
    if kc.username and kc.password:
        pair = f"{kc.username}:{kc.password}".encode("latin-1")
        return Header(f"Basic {base64.b64encode(pair).decode()}")
    return Header()


async def configuration_for(kc: kubeconfigs.Kubeconfig, workdir: Path, *, trust: bool = False,
                            name: str = "", base: Path | None = None) -> ClientConfig:
    """The client configuration of a validated kubeconfig; its certificates go into
    `workdir`. The files and plugin a trusted kubeconfig names (only with `trust`) are read
    and run here, relative paths from `base` (the kubeconfig's directory)."""
    if kc.uses_plugins_or_files and not trust:
        raise ValueError("kubeconfig with plugins or files needs trust")
    _private_dir(workdir)
    base = base or Path.cwd()
    ca = (base / kc.ca_file).read_bytes() if kc.ca_file else kc.ca_pem or b""
    cert_file = key_file = None
    if kc.cert_file or kc.cert_pem:
        cert_file = str(base / kc.cert_file) if kc.cert_file else \
            _write_private(workdir / "client.crt", kc.cert_pem or b"")
        key_file = str(base / kc.key_file) if kc.key_file else \
            _write_private(workdir / "client.key", kc.key_pem or b"")
    return ClientConfig(host=kc.server, ssl=tls_context(ca, cert_file, key_file,
                                                        verify=not kc.insecure),
                        credentials=_authorization(kc, ca, name or kc.context, base),
                        ca_pem=ca, cert_file=cert_file, key_file=key_file,
                        tls_server_name=kc.tls_server_name)


async def configuration_from_file(path: str, context: str | None = None, *, workdir: Path,
                                  what: str = "kubeconfig") -> ClientConfig:
    """Configuration from a kubeconfig file trusted by the operator's owner (the watch
    cluster's, the CLI user's): its plugin and files are followed as kubectl would, relative
    paths from the file's directory; certificates go into `workdir`.

    Raises SettingsError with one line when the file is missing, unreadable or unusable.
    """
    if not os.path.isfile(path):
        raise SettingsError(f"{what} {path} does not exist")
    try:
        kc = kubeconfigs.parse(Path(path).read_bytes(), context=context or None, trust=True)
        return await configuration_for(kc, workdir, trust=True,
                                       base=Path(path).resolve().parent)
    except (KubeconfigRejected, OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SettingsError(f"{what} {path} is not usable: {reason[:200]}") from exc


def configuration_in_cluster() -> ClientConfig | None:
    """The pod's service-account configuration (its token read again as it rotates); None
    outside a pod."""
    server = kubeconfigs.service_server(os.environ)
    if not server or not os.path.isfile(kubeconfigs.SA_TOKEN):
        return None
    try:
        ca = Path(kubeconfigs.SA_CA).read_bytes()
        return ClientConfig(host=server, ssl=tls_context(ca, None, None), ca_pem=ca,
                            credentials=TokenFile(kubeconfigs.SA_TOKEN))
    except (OSError, ValueError, ssl.SSLError):
        return None


def _path(*parts: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in parts)


def tenants_path(namespace: str | None = None) -> str:
    if namespace:
        return _path("apis", GROUP, VERSION, "namespaces", namespace, PLURAL)
    return _path("apis", GROUP, VERSION, PLURAL)


def profiles_path(namespace: str) -> str:
    """ClusterProfiles of a namespace (sigs.k8s.io/cluster-inventory-api, D10)."""
    return _path("apis", "multicluster.x-k8s.io", "v1alpha1", "namespaces", namespace,
                 "clusterprofiles")


def core_path(plural: str, namespace: str | None = None) -> str:
    """Path of a core (v1) collection, across namespaces when `namespace` is None."""
    if namespace:
        return _path("api", "v1", "namespaces", namespace, plural)
    return _path("api", "v1", plural)


def release_records_path(driver: str, namespace: str | None = None) -> str:
    """Helm release records (Secrets or ConfigMaps, as helm stores them)."""
    return core_path("configmaps" if driver == "configmap" else "secrets", namespace)


THROTTLED_RETRIES = 5  # a 429 is retried this often, after the Retry-After the server asks


def retry_after(header: str | None) -> float:
    """Seconds to wait before repeating a request answered 429: the Retry-After header's
    whole seconds, kept within 0.2-5 s; 1 s when absent or not a number."""
    try:
        seconds = float(header) if header is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.2), 5.0)


USER_AGENT = f"krypton/{__version__}"


def proxy_in_environment() -> bool:
    """Whether the operator's own environment names a proxy (HTTPS_PROXY, HTTP_PROXY, ...;
    NO_PROXY alone is none). A kubeconfig's proxy-url is refused (D4); the environment is
    the operator's own, so a proxy it names is used."""
    return any(scheme != "no" for scheme in urllib.request.getproxies_environment())


class Transport:
    """Requests, paged lists and watches of one cluster's API, bounded, with krypton's
    error types (the typed resource calls are :class:`krypton.adapters.kube.Kube`'s)."""

    def __init__(self, cfg: ClientConfig, *, name: str, timeout: float = 30.0,
                 limits: Limits = ENGAGED) -> None:
        self.name = name
        self.timeout = timeout
        self.limits = limits
        self.config = cfg
        self._pool: aiohttp.ClientSession | None = None  # made on first use
        self._discovery: dict[str, tuple[float, list[Obj]]] = {}  # api version -> resources

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        try:
            if pool is not None:
                await pool.close()
        except Exception:  # noqa: BLE001 - closing a pool must never fail a disengage
            pass

    async def _send(self, method: str, path: str, *, query: Query | None = None,
                    body: Any = None, content_type: str | None = None,
                    accept: str = "application/json",
                    timeout: float | None = None) -> aiohttp.ClientResponse:
        """One HTTP exchange on the cluster's connection pool, with its credentials and its
        TLS context."""
        cfg = self.config
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if content_type or body is not None:
            headers["Content-Type"] = content_type or "application/json"
        authorization = await cfg.credentials.authorization()
        if authorization:
            headers["Authorization"] = authorization
        url = cfg.host + path
        params = [(k, str(v)) for k, v in (query or {}).items() if v is not None]
        if params:
            url += "?" + urlencode(params, quote_via=quote)
        data = body if body is None or isinstance(body, (bytes, str)) else json.dumps(body)
        extra: dict[str, Any] = {}
        if cfg.tls_server_name:
            extra["server_hostname"] = cfg.tls_server_name
        return await self._session().request(
            method, url, headers=headers, data=data, allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout or self.timeout), **extra)

    def _session(self) -> aiohttp.ClientSession:
        """The connection pool, made on first use (in the event loop): up to 16 connections.
        It keeps no cookies, as client-go keeps none: a server of a cluster krypton does not
        control could otherwise grow the jar with every answer and see every cookie back.
        aiohttp's ``trust_env`` looks the proxy variables up and parses ~/.netrc on every
        request, in a thread: taken only when the environment names a proxy."""
        if self._pool is None:
            self._pool = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=16, ssl=self.config.ssl),
                cookie_jar=aiohttp.DummyCookieJar(), trust_env=proxy_in_environment())
        return self._pool

    async def request(self, what: str, method: str, path: str, *, query: Query | None = None,
                      body: Any = None, content_type: str | None = None,
                      accept: str = "application/json") -> Obj:
        """One API request, its JSON answer as plain dicts; failures as krypton errors.
        The whole exchange, connecting included, is bounded by the client timeout."""
        return (await self._request(what, method, path, query=query, body=body,
                                    content_type=content_type, accept=accept))[0]

    async def _request(self, what: str, method: str, path: str, *, query: Query | None = None,
                       body: Any = None, content_type: str | None = None,
                       accept: str = "application/json") -> tuple[Obj, int]:
        """:meth:`request`, with the size of the answer in bytes."""
        for attempt in range(THROTTLED_RETRIES + 1):
            metrics.API_REQUESTS.labels(self.name, what.split(" ", 1)[0].lower()).inc()
            try:
                resp = await self._send(method, path, query=query, body=body,
                                        content_type=content_type, accept=accept)
                try:
                    data = await read_answer(resp, self.limits.answer, what)
                finally:
                    resp.release()
            except TRANSPORT_ERRORS as exc:
                raise _transport_error(exc, what) from exc
            if resp.status == 401:
                self.config.credentials.rejected()
            if resp.status != 429 or attempt == THROTTLED_RETRIES:
                break
            # "Too many requests" (priority and fairness) or "storage is (re)initializing"
            # (a CRD just created): the server says when to come back; not an error yet.
            delay = retry_after(resp.headers.get("Retry-After"))
            log.debug("api throttled, retrying", cluster=self.name, what=what, delay=delay)
            await asyncio.sleep(delay)
        if not 200 <= resp.status < 300:
            raise _status_error(resp.status, data, what)
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            answer = None
        if not isinstance(answer, dict):  # not an API server's answer
            raise TemporaryError(f"{what}: the server's answer is not a Kubernetes API "
                                 "response", reason="BadResponse")
        return answer, len(data)

    async def get(self, what: str, path: str) -> Obj | None:
        try:
            return await self.request(what, "GET", path)
        except NotFound:
            return None

    async def list_all(self, what: str, path: str, *, label_selector: str | None = None,
                       field_selector: str | None = None, accept: str = "application/json",
                       page_size: int = PAGE_SIZE) -> Obj:
        """A whole collection, read in pages; a page token that expired (410) restarts the
        list, so the answer is always one consistent snapshot. The answer's ``size`` is the
        bytes received, at most the cluster's store limit (a server handing out pages without
        end is refused: TooManyObjects)."""
        while True:
            items: list[Obj] = []
            token: str | None = None
            size = 0
            try:
                while True:
                    page, received = await self._request(what, "GET", path, accept=accept, query={
                        "labelSelector": label_selector, "fieldSelector": field_selector,
                        "limit": page_size, "continue": token})
                    size += received
                    if size > self.limits.store:
                        raise TemporaryError(f"{what}: the list is over {self.limits.store} bytes",
                                             reason="TooManyObjects")
                    items += page.get("items") or []
                    meta = page.get("metadata") or {}
                    token = meta.get("continue") or None
                    if not token:
                        return {"metadata": meta, "items": items, "size": size}
            except Gone:
                if token is None:
                    raise
                continue

    async def watch(self, what: str, path: str, *, resource_version: str,
                    label_selector: str | None, accept: str, server_timeout: int,
                    field_selector: str | None = None) -> aiohttp.ClientResponse:
        """Open a watch from `resource_version`; the caller reads its lines and releases it."""
        metrics.API_REQUESTS.labels(self.name, "watch").inc()
        try:
            resp = await self._send("GET", path, accept=accept, timeout=server_timeout + 30,
                                    query={"watch": "true", "resourceVersion": resource_version,
                                           "allowWatchBookmarks": "true",
                                           "labelSelector": label_selector,
                                           "fieldSelector": field_selector,
                                           "timeoutSeconds": server_timeout})
        except TRANSPORT_ERRORS as exc:
            raise _transport_error(exc, what) from exc
        if resp.status == 401:
            self.config.credentials.rejected()
        if resp.status != 200:
            try:
                data = await resp.read()
            except TRANSPORT_ERRORS:
                data = b""
            finally:
                resp.release()
            raise _status_error(resp.status, data, what)
        return resp
