"""The only module that imports `kubernetes`: a cluster's client configuration and transport.

Every cluster gets its own ``ApiClient`` of ``kubernetes.aio`` (one aiohttp session), built
from a validated kubeconfig, never the library's process-wide default configuration (it
silently leaks between clusters). Certificate material is written to a per-cluster directory
(mode 0700/0600) that the owner removes on disengage.

All I/O runs on the event loop: no thread per watch, no executor for requests, so a cluster
that never answers holds nothing but its own coroutine for at most ``timeout`` seconds.
Requests go through :meth:`Transport.request`, which reads the body as JSON into plain dicts and
translates every failure into krypton's error types, so callers never see the client's
exceptions.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import structlog
import yaml

from krypton import __version__
from krypton.adapters import metrics, packages, tlsconn
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
from krypton.decisions.model import GROUP, PLURAL, VERSION

tlsconn.install()  # less memory per TLS connection (see tlsconn)
import aiohttp  # noqa: E402

# The asyncio client's modules only, and of its configuration loaders the in-cluster one:
# the kubeconfig loader needs the generated API client, which brings pydantic and dateutil
# (about 8 MiB and 0.15 s of CPU at every start); it is imported when a kubeconfig needs it.
packages.without_init("kubernetes", "kubernetes.aio", "kubernetes.aio.config")
from kubernetes.aio.client.configuration import Configuration  # noqa: E402
from kubernetes.aio.client.exceptions import ApiException  # noqa: E402
from kubernetes.aio.client.rest import RESTClientObject  # noqa: E402
from kubernetes.aio.config.config_exception import ConfigException  # noqa: E402
from kubernetes.aio.config.incluster_config import load_incluster_config  # noqa: E402

Obj = dict[str, Any]
EventHandler = Callable[[str, Obj], None]
Query = dict[str, str | int | None]

log = structlog.get_logger("krypton.kube")

HELM_RELEASE_SELECTOR = "owner=helm"
DISCOVERY_TTL = 300.0  # seconds a group version's resource list is reused for object look-ups
PAGE_SIZE = 500  # list pages: a fleet of large clusters never loads one huge answer at once
SHORT_WATCH = 1.0  # seconds: a watch that ends sooner is resumed only after a backoff


@dataclass(frozen=True)
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


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


def _kube_config() -> Any:
    """The client library's kubeconfig loader (``kubernetes.aio.config.kube_config``),
    imported on first use: it brings the generated API client, pydantic and dateutil."""
    from kubernetes.aio.config import kube_config

    return kube_config


async def configuration_for(kc: kubeconfigs.Kubeconfig, workdir: Path, *,
                            trust: bool = False) -> Configuration:
    """A client Configuration for a validated kubeconfig; cert files go into `workdir`."""
    _private_dir(workdir)
    if kc.uses_plugins_or_files:
        if not trust:
            raise ValueError("kubeconfig with plugins or files needs trust")
        cfg = Configuration()
        loader = _kube_config().KubeConfigLoader(config_dict=kc.config, active_context=kc.context,
                                                 temp_file_path=str(workdir))
        await loader.load_and_set(cfg)
        return cfg
    cfg = Configuration(host=kc.server)
    cfg.verify_ssl = not kc.insecure
    if kc.ca_pem:
        cfg.ssl_ca_cert = _write_private(workdir / "ca.crt", kc.ca_pem)
    if kc.cert_pem and kc.key_pem:
        cfg.cert_file = _write_private(workdir / "client.crt", kc.cert_pem)
        cfg.key_file = _write_private(workdir / "client.key", kc.key_pem)
    if kc.token:
        cfg.api_key = {"authorization": f"Bearer {kc.token}"}
    elif kc.username and kc.password:
        cfg.username, cfg.password = kc.username, kc.password
        cfg.api_key = {"authorization": str(cfg.get_basic_auth_token())}
    if kc.tls_server_name:
        cfg.tls_server_name = kc.tls_server_name
    return cfg


async def configuration_from_file(path: str, context: str | None = None, *,
                                  what: str = "kubeconfig",
                                  workdir: Path | None = None) -> Configuration:
    """Configuration from a kubeconfig file trusted by the operator's owner (watch cluster).

    With a `workdir`, a file that krypton's own checks (:mod:`krypton.decisions.kubeconfig`)
    accept as self-contained, with its certificates and credentials inline, is set up as a
    cluster Secret's is, its certificates written into `workdir`. Any other file (credential
    plugins, file references, one those checks refuse) and every file without a `workdir`
    goes through the client library's loader, as kubectl would read it.

    Raises SettingsError with one line when the file is missing, unreadable or unusable.
    """
    if not os.path.isfile(path):
        raise SettingsError(f"{what} {path} does not exist")
    kc = _self_contained(path, context) if workdir is not None else None
    cfg = Configuration()
    try:
        if kc is not None and workdir is not None:
            return await configuration_for(kc, workdir, trust=True)
        await _kube_config().load_kube_config(config_file=path, context=context or None,
                                              client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, ValueError, TypeError, AttributeError,
            yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SettingsError(f"{what} {path} is not usable: {reason[:200]}") from exc
    return cfg


def _self_contained(path: str, context: str | None) -> kubeconfigs.Kubeconfig | None:
    """The file reduced to `context` when krypton's checks accept it (as trusted) and it
    needs no plugin and no other file; None for the library's loader to read it."""
    try:
        kc = kubeconfigs.parse(Path(path).read_bytes(), context=context or None, trust=True)
    except (KubeconfigRejected, OSError):
        return None
    return None if kc.uses_plugins_or_files else kc


def configuration_in_cluster() -> Configuration | None:
    """The pod's service-account configuration; the token file is re-read as it rotates."""
    try:
        cfg = Configuration()
        load_incluster_config(client_configuration=cfg, try_refresh_token=True)
        return cfg
    except ConfigException:
        return None


def bearer_token(cfg: Configuration) -> str:
    """The bearer token a configuration sends, "" when it sends none."""
    for key in ("authorization", "BearerToken"):
        value = str((cfg.api_key or {}).get(key) or "")
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token:
            return token
    return ""


def _path(*parts: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in parts)


def tenants_path(namespace: str | None = None) -> str:
    if namespace:
        return _path("apis", GROUP, VERSION, "namespaces", namespace, PLURAL)
    return _path("apis", GROUP, VERSION, PLURAL)


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

    def __init__(self, cfg: Configuration, *, name: str, timeout: float = 30.0,
                 limits: Limits = ENGAGED) -> None:
        cfg.connection_pool_maxsize = 16
        cfg.retries = None  # retries are krypton's decision (work queue backoff), not the client's
        # aiohttp's trust_env looks up the proxy variables and parses ~/.netrc on every
        # request, in a thread: taken only when a proxy is configured in the environment
        cfg.client_session_kwargs = {"trust_env": proxy_in_environment()}
        self.name = name
        self.timeout = timeout
        self.limits = limits
        self.config = cfg
        self.rest = RESTClientObject(cfg)  # its connection pool, made on first use
        self._discovery: dict[str, tuple[float, list[Obj]]] = {}  # api version -> resources

    async def close(self) -> None:
        try:
            await self.rest.close()
        except Exception:  # noqa: BLE001 - closing a pool must never fail a disengage
            pass

    async def _send(self, method: str, path: str, *, query: Query | None = None,
                    body: Any = None, content_type: str | None = None,
                    accept: str = "application/json",
                    timeout: float | None = None) -> aiohttp.ClientResponse:
        """One HTTP exchange on the client's connection pool, built here: the generated
        client's layers (serialising the body through its models, building the URL and
        headers) cost more CPU than the request itself. Credentials come from the
        client configuration exactly as that client takes them (its refresh hooks run),
        TLS from its SSL context."""
        cfg = self.config
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if content_type or body is not None:
            headers["Content-Type"] = content_type or "application/json"
        bearer: dict[str, Any] = dict((await cfg.auth_settings()).get("BearerToken") or {})
        if bearer.get("value"):
            headers["Authorization"] = str(bearer["value"])
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
        """The connection pool, made on first use (in the event loop). It keeps no cookies,
        as client-go keeps none: a server of a cluster krypton does not control could
        otherwise grow the jar with every answer and see every cookie back, and each
        request would pay for looking the jar through."""
        rest = self.rest
        if rest.pool_manager is None:
            self.config.client_session_kwargs = {**(self.config.client_session_kwargs or {}),
                                                 "cookie_jar": aiohttp.DummyCookieJar()}
            rest.pool_manager = rest._create_pool_manager()
        return rest.pool_manager  # type: ignore[no-any-return]

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
            except ApiException as exc:
                raise ClusterUnreachable(f"{what}: {_short(str(exc.reason))}") from exc
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
        if resp.status != 200:
            try:
                data = await resp.read()
            except TRANSPORT_ERRORS:
                data = b""
            finally:
                resp.release()
            raise _status_error(resp.status, data, what)
        return resp
