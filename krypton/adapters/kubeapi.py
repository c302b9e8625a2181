"""One cluster's API over HTTP: :class:`Transport`, its requests, paged lists and watches,
bounded and translated into krypton's error types (the typed resource calls are
:class:`krypton.adapters.kube.Kube`'s; how a cluster is reached is
:mod:`krypton.adapters.clientconfig`).

krypton speaks to API servers on the event loop, over HTTP/1.1 connections of its own
(:mod:`krypton.adapters.wire`), through the proxy the operator's environment names for the
cluster if any: every cluster gets its own connections, with its own TLS context and
credentials. No
thread per watch, no executor for requests, so a cluster that never answers holds nothing
but its own coroutine for at most ``timeout`` seconds. :meth:`Transport.request` reads the
body as JSON into plain dicts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import structlog

from krypton import __version__
from krypton.adapters import metrics, wire
from krypton.adapters.clientconfig import ClientConfig
from krypton.decisions.errors import (
    AlreadyExists,
    APIError,
    ClusterUnreachable,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    TemporaryError,
)
from krypton.decisions.model import GROUP, PLURAL, VERSION

Obj = dict[str, Any]
EventHandler = Callable[[str, Obj], None]
Query = dict[str, str | int | None]

log = structlog.get_logger("krypton.kube")

HELM_RELEASE_SELECTOR = "owner=helm"
DISCOVERY_TTL = 300.0  # seconds a group version's resource list is reused for object look-ups
PAGE_SIZE = 500  # list pages: a fleet of large clusters never loads one huge answer at once
MAX_PAGES = 100  # a list of more pages never completes (the store limit is reached long before)
LIST_RESTARTS = 2  # a list whose continued page expired (410) starts over this often
OBJECT_COST = 2048  # bytes an object kept costs beyond its JSON (its dicts, keys, strings)
SHORT_WATCH = 1.0  # seconds: a watch that ends sooner is resumed only after a backoff
CONNECTIONS = 16  # a cluster's requests under way at once; more wait for one to end
IDLE_CONNECTIONS = 4  # kept open, per cluster, for the next request or watch
IDLE_SECONDS = 30.0  # a kept connection unused this long is closed


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much of a cluster's answers krypton takes, in bytes as they arrive (SPEC S3): an
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


def cost(received: int, objects: int) -> int:
    """What keeping `objects` that came in `received` bytes costs, as the store limit counts
    it: many small objects cost more than their bytes (a Tenant of 185 bytes is 1 KiB decoded,
    and krypton keeps a record and a queue entry of each Tenant besides)."""
    return received + objects * OBJECT_COST


def _named(answer: Obj) -> bool:
    meta = answer.get("metadata")
    return isinstance(meta, dict) and isinstance(meta.get("name"), str)


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


def transport_error(exc: BaseException, what: str) -> ClusterUnreachable:
    if isinstance(exc, TimeoutError):
        return ClusterUnreachable(f"{what}: no answer in time")
    return ClusterUnreachable(f"{what}: {type(exc).__name__}: {_short(str(exc))}")


TRANSPORT_ERRORS = (OSError, TimeoutError, ValueError)


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


WRITES = ("POST", "PUT", "PATCH")
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


class Transport:
    """Requests, paged lists and watches of one cluster's API, bounded, with krypton's
    error types."""

    def __init__(self, cfg: ClientConfig, *, name: str, timeout: float = 30.0,
                 limits: Limits = ENGAGED) -> None:
        self.name = name
        self.timeout = timeout
        self.limits = limits
        self.config = cfg
        # decided once: looking scans the whole environment (0.14 ms here)
        self._proxy = wire.proxy_for(cfg.host)
        self._discovery: dict[str, tuple[float, list[Obj]]] = {}  # api version -> resources
        self._default_tls: ssl.SSLContext | None = None  # made on first use
        self._slots = asyncio.Semaphore(CONNECTIONS)
        # connections an answer that ended cleanly left open, newest last, each with the
        # timer that closes it
        self._idle: list[tuple[wire.Wire, asyncio.TimerHandle]] = []

    async def close(self) -> None:
        while self._idle:
            connection, timer = self._idle.pop()
            timer.cancel()
            connection.close()

    async def _headers(self, accept: str, content_type: str | None = None) -> dict[str, str]:
        """A request's headers: what it accepts, as whom, in which encoding."""
        headers = {"Accept": accept, "User-Agent": USER_AGENT}
        if not self.config.compress:  # as client-go with the kubeconfig's disable-compression
            headers["Accept-Encoding"] = "identity"
        if content_type:
            headers["Content-Type"] = content_type
        authorization = await self.config.credentials.authorization()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    def _url(self, path: str, query: Query | None) -> str:
        url = self.config.host + path
        params = [(k, str(v)) for k, v in (query or {}).items() if v is not None]
        return url + "?" + urlencode(params, quote_via=quote) if params else url

    async def _exchange(self, what: str, method: str, path: str, query: Query | None,
                        body: Any, content_type: str | None,
                        accept: str) -> tuple[int, str | None, bytearray]:
        """One HTTP exchange with the cluster's credentials and TLS context: the answer's
        status, its Retry-After and its body, read within the cluster's bounds. The whole
        of it, connecting included, is bounded by the client timeout."""
        if body is not None:
            content_type = content_type or "application/json"
        headers = await self._headers(accept, content_type)
        data = body if body is None or isinstance(body, bytes) else \
            (body if isinstance(body, str) else json.dumps(body)).encode()
        if self.config.compress:
            headers["Accept-Encoding"] = "gzip"  # as client-go asks, and only that
        async with self._slots, asyncio.timeout(self.timeout):
            status, answer_headers, answer = await wire.exchange(
                self._url(path, query), headers, self._tls(), self.config.tls_server_name,
                what, lifetime=self.timeout, method=method, body=data, idle=self._take(),
                keep=self._keep, proxy=self._proxy)
            try:
                return status, answer_headers.get("retry-after"), \
                    await answer.read(self.limits.answer)
            finally:
                answer.close()

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
                status, wait, data = await self._exchange(what, method, path, query, body,
                                                          content_type, accept)
            except TRANSPORT_ERRORS as exc:
                raise transport_error(exc, what) from exc
            if status == 401:
                self.config.credentials.rejected()
            if status != 429 or attempt == THROTTLED_RETRIES:
                break
            # "Too many requests" (priority and fairness) or "storage is (re)initializing"
            # (a CRD just created): the server says when to come back; not an error yet.
            delay = retry_after(wait)
            log.debug("api throttled, retrying", cluster=self.name, what=what, delay=delay)
            await asyncio.sleep(delay)
        if not 200 <= status < 300:
            raise _status_error(status, data, what)
        try:
            answer = json.loads(data)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            answer = None
        if not isinstance(answer, dict):  # not an API server's answer
            raise TemporaryError(f"{what}: the server's answer is not a Kubernetes API "
                                 "response", reason="BadResponse")
        if method in WRITES and not path.endswith("reviews") and not _named(answer):
            # a write is answered with the object written (a review's answer has no name)
            raise TemporaryError(f"{what}: the server's answer names no object",
                                 reason="BadResponse")
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
        list, so the answer is always one consistent snapshot. The answer's ``size`` is what
        its objects cost (:func:`cost`), at most the cluster's store limit: a server handing
        out pages without end is refused (TooManyObjects), and so is one that never lets a
        list complete (ListNeverCompletes: the same page token again, more than MAX_PAGES
        pages, or a 410 on every restart)."""
        for _restart in range(LIST_RESTARTS + 1):
            items: list[Obj] = []
            token: str | None = None
            tokens: set[str] = set()
            size = 0
            try:
                for _page in range(MAX_PAGES):
                    page, received = await self._request(what, "GET", path, accept=accept, query={
                        "labelSelector": label_selector, "fieldSelector": field_selector,
                        "limit": page_size, "continue": token})
                    found = page.get("items") or []
                    size += cost(received, len(found) if isinstance(found, list) else 0)
                    if size > self.limits.store:
                        raise TemporaryError(f"{what}: the list is over {self.limits.store} bytes",
                                             reason="TooManyObjects")
                    items += found
                    meta = page.get("metadata") or {}
                    token = meta.get("continue") or None
                    if not token:
                        return {"metadata": meta, "items": items, "size": size}
                    if token in tokens:
                        raise TemporaryError(f"{what}: the server handed out the same page "
                                             "token twice", reason="ListNeverCompletes")
                    tokens.add(token)
                raise TemporaryError(f"{what}: more than {MAX_PAGES} pages",
                                     reason="ListNeverCompletes")
            except Gone:
                if token is None:
                    raise
        raise TemporaryError(f"{what}: every continued page expired (410), {LIST_RESTARTS + 1} "
                             "times in a row", reason="ListNeverCompletes")

    async def watch(self, what: str, path: str, *, resource_version: str,
                    label_selector: str | None, accept: str, server_timeout: int,
                    field_selector: str | None = None) -> Watch:
        """Open a watch from `resource_version`; the caller reads its lines and closes it.
        It has a connection of its own (:mod:`krypton.adapters.wire`)."""
        metrics.API_REQUESTS.labels(self.name, "watch").inc()
        query: Query = {"watch": "true", "resourceVersion": resource_version,
                        "allowWatchBookmarks": "true", "labelSelector": label_selector,
                        "fieldSelector": field_selector, "timeoutSeconds": server_timeout}
        try:
            headers = await self._headers(accept)
            headers["Accept-Encoding"] = "identity"  # an API server compresses no watch
            async with asyncio.timeout(self.timeout):
                status, _, body = await wire.exchange(
                    self._url(path, query), headers, self._tls(),
                    self.config.tls_server_name, what, lifetime=server_timeout + 30,
                    idle=self._take(), keep=self._keep, proxy=self._proxy)
        except TRANSPORT_ERRORS as exc:
            raise transport_error(exc, what) from exc
        if status == 200:
            return body
        data: bytes | bytearray = b""
        try:  # its answer bounded like any other, in size and in time
            async with asyncio.timeout(self.timeout):
                data = await body.read(self.limits.answer)
        except (*TRANSPORT_ERRORS, TemporaryError):
            pass
        finally:
            body.close()
        if status == 401:
            self.config.credentials.rejected()
        raise _status_error(status, data, what)

    def _take(self) -> wire.Wire | None:
        """The connection kept last that the server has not closed meanwhile, if any."""
        while self._idle:
            connection, timer = self._idle.pop()
            timer.cancel()
            if connection.usable:
                return connection
            connection.close()
        return None

    def _keep(self, connection: wire.Wire) -> None:
        """Keep the connection of an answer that ended cleanly for the next request or watch
        (a watch resumes at once; a pass asks again soon): a few per cluster, each for
        IDLE_SECONDS at most."""
        if len(self._idle) >= IDLE_CONNECTIONS:
            connection.close()
            return
        timer = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._expire, connection)
        self._idle.append((connection, timer))

    def _expire(self, connection: wire.Wire) -> None:
        self._idle = [kept for kept in self._idle if kept[0] is not connection]
        connection.close()

    def _tls(self) -> ssl.SSLContext | None:
        """The TLS context of krypton's own connections; None for plain HTTP."""
        if not self.config.host.startswith("https:"):
            return None
        if isinstance(self.config.ssl, ssl.SSLContext):
            return self.config.ssl
        if self._default_tls is None:
            self._default_tls = ssl.create_default_context()
            if self.config.ssl is False:
                self._default_tls.check_hostname = False
                self._default_tls.verify_mode = ssl.CERT_NONE
        return self._default_tls


Watch = wire.Body
