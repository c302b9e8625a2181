"""The only module that imports `kubernetes`: per-cluster API clients, list+watch, patches.

Every cluster gets its own ``ApiClient`` built from a validated kubeconfig, never the
library's process-wide default configuration (it silently leaks between clusters).
Certificate material is written to a per-cluster directory (mode 0700/0600) that the owner
removes on disengage. The synchronous client runs in threads: request/response calls via
``asyncio.to_thread``, watches in one daemon thread per :class:`Informer`. API failures are
translated into krypton's error types here, so callers never see ``ApiException``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from . import metrics
from .errors import ClusterUnreachable, CRDEnsureFailed, SettingsError, TemporaryError
from .kubeconfig import Kubeconfig
from .model import CRD_NAME, GROUP, PLURAL, VERSION, TenantKey

Obj = dict[str, Any]
EventHandler = Callable[[str, Obj], None]

HELM_RELEASE_SELECTOR = "owner=helm"


class NotFound(TemporaryError):
    reason = "NotFound"


class Conflict(TemporaryError):
    reason = "Conflict"


class Forbidden(TemporaryError):
    reason = "Forbidden"


class AlreadyExists(TemporaryError):
    reason = "AlreadyExists"


def _translate(exc: BaseException, what: str) -> Exception:
    if isinstance(exc, ApiException):
        status = exc.status or 0
        detail = _api_message(exc)
        if status == 404:
            return NotFound(f"{what}: not found")
        if status == 409:
            kind = AlreadyExists if "already exists" in detail else Conflict
            return kind(f"{what}: {detail}")
        if status in (401, 403):
            return Forbidden(f"{what}: {'unauthorized' if status == 401 else 'forbidden'}: "
                             f"{detail}")
        if status == 0:
            return ClusterUnreachable(f"{what}: {exc.reason}")
        return TemporaryError(f"{what}: HTTP {status}: {detail}", reason="APIError")
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        return ClusterUnreachable(f"{what}: {type(exc).__name__}: {_short(exc)}")
    if isinstance(exc, ValueError):  # e.g. a body that is not JSON: not an API server's answer
        return TemporaryError(f"{what}: the server's answer is not a Kubernetes API response "
                              f"({type(exc).__name__})", reason="BadResponse")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."


def _api_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write_private(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


def configuration_for(kc: Kubeconfig, workdir: Path, *, trust: bool = False) -> k8s.Configuration:
    """A client Configuration for a validated kubeconfig; cert files go into `workdir`."""
    _private_dir(workdir)
    if kc.uses_plugins_or_files:
        if not trust:
            raise ValueError("kubeconfig with plugins or files needs trust")
        cfg = k8s.Configuration()
        loader = k8s_config.kube_config.KubeConfigLoader(config_dict=kc.config,
                                                         active_context=kc.context,
                                                         temp_file_path=str(workdir))
        loader.load_and_set(cfg)
        return cfg
    cfg = k8s.Configuration(host=kc.server)
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


def configuration_from_file(path: str, context: str | None = None, *,
                            what: str = "kubeconfig") -> k8s.Configuration:
    """Configuration from a kubeconfig file trusted by the operator's owner (watch cluster).

    Raises SettingsError with one line when the file is missing, unreadable or unusable.
    """
    if not os.path.isfile(path):
        raise SettingsError(f"{what} {path} does not exist")
    cfg = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=path, context=context or None,
                                    client_configuration=cfg, persist_config=False)
    except (k8s_config.ConfigException, OSError, ValueError, TypeError, AttributeError,
            yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SettingsError(f"{what} {path} is not usable: {reason[:200]}") from exc
    return cfg


def configuration_in_cluster() -> k8s.Configuration | None:
    """The pod's service-account configuration; the token file is re-read as it rotates."""
    try:
        cfg = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg, try_refresh_token=True)
        return cfg
    except k8s_config.ConfigException:
        return None


class Kube:
    """Async façade over one cluster's API, with krypton's error types."""

    def __init__(self, cfg: k8s.Configuration, *, name: str, timeout: float = 30.0) -> None:
        cfg.connection_pool_maxsize = 32
        cfg.retries = False
        self.name = name
        self.timeout = timeout
        self.config = cfg
        self.api = k8s.ApiClient(cfg)
        self.core = k8s.CoreV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)
        self.ext = k8s.ApiextensionsV1Api(self.api)
        self.coordination = k8s.CoordinationV1Api(self.api)
        self.version_api = k8s.VersionApi(self.api)
        self._dynamic: Any = None  # kubernetes.dynamic.DynamicClient, built on first use

    def close(self) -> None:
        try:
            self.api.close()
        except Exception:  # noqa: BLE001 - closing a pool must never fail a disengage
            pass

    async def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.timeout)
        metrics.API_REQUESTS.labels(self.name, what.split(" ", 1)[0].lower()).inc()

        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - translated into krypton errors
                raise _translate(exc, what) from exc

        return await asyncio.to_thread(run)

    def plain(self, obj: Any) -> Obj:
        return self.api.sanitize_for_serialization(obj)  # type: ignore[no-any-return]

    # -- cluster ---------------------------------------------------------------------------

    async def server_version(self) -> str:
        info = await self.call("GET /version", self.version_api.get_code)
        return str(info.git_version)

    async def cluster_identity(self, *, by_uid: bool = True) -> str:
        """What makes this API server the same cluster under another name (SPEC D9): the
        UID of its kube-system namespace, else its URL and CA (also when not `by_uid`:
        credentials limited to one namespace are not asked for what they cannot read)."""
        if by_uid:
            try:
                ns = await self.call("get namespace kube-system", self.core.read_namespace,
                                     "kube-system")
                return f"uid:{ns.metadata.uid}"
            except (NotFound, Forbidden):
                pass
        ca = Path(self.config.ssl_ca_cert).read_bytes() if self.config.ssl_ca_cert else b""
        return f"server:{self.config.host}|{hashlib.sha256(ca).hexdigest()}"

    async def ensure_crd(self, manifest: Obj, *, upgrade: bool) -> str:
        """Create the CRD when absent; replace it only when `upgrade` and its revision differs.

        Returns "created", "upgraded" or "present". Raises CRDEnsureFailed.
        """
        try:
            current = await self.call(f"get CRD {CRD_NAME}", self.ext.read_custom_resource_definition,
                                      CRD_NAME)
        except NotFound:
            try:
                await self.call(f"create CRD {CRD_NAME}",
                                self.ext.create_custom_resource_definition, manifest)
            except AlreadyExists:
                return "present"
            except TemporaryError as exc:
                raise CRDEnsureFailed(str(exc)) from exc
            await self._wait_established()
            return "created"
        except TemporaryError as exc:
            raise CRDEnsureFailed(str(exc)) from exc
        key = f"{GROUP}/crd-revision"
        have = (current.metadata.annotations or {}).get(key)
        want = manifest["metadata"].get("annotations", {}).get(key)
        if not upgrade or have == want:
            return "present"
        body = dict(manifest)
        body["metadata"] = dict(manifest["metadata"],
                                resourceVersion=current.metadata.resource_version)
        try:
            await self.call(f"replace CRD {CRD_NAME}",
                            self.ext.replace_custom_resource_definition, CRD_NAME, body)
        except TemporaryError as exc:
            raise CRDEnsureFailed(str(exc)) from exc
        return "upgraded"

    async def _wait_established(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            crd = await self.call("get CRD", self.ext.read_custom_resource_definition, CRD_NAME)
            for cond in (crd.status.conditions or []) if crd.status else []:
                if cond.type == "Established" and cond.status == "True":
                    return
            await asyncio.sleep(0.2)

    # -- tenants ---------------------------------------------------------------------------

    def tenant_lister(self, namespace: str | None) -> Callable[..., Any]:
        if namespace:
            return lambda **kw: self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, **kw)
        return lambda **kw: self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **kw)

    async def get_tenant(self, key: TenantKey) -> Obj | None:
        try:
            return await self.call(f"get tenant {key}", self.custom.get_namespaced_custom_object,  # type: ignore[no-any-return]
                                   GROUP, VERSION, key.namespace, PLURAL, key.name)
        except NotFound:
            return None

    async def patch_tenant(self, key: TenantKey, patch: Obj) -> Obj:
        """JSON merge patch of the Tenant's metadata (annotations, finalizers)."""
        return await self.call(f"patch tenant {key}", self._merge_patch(  # type: ignore[no-any-return]
            self.custom.patch_namespaced_custom_object), GROUP, VERSION, key.namespace, PLURAL,
            key.name, patch)

    async def patch_tenant_status(self, key: TenantKey, patch: Obj) -> Obj:
        """JSON merge patch of the status subresource (include metadata.resourceVersion to
        make it conditional)."""
        return await self.call(f"patch tenant status {key}", self._merge_patch(  # type: ignore[no-any-return]
            self.custom.patch_namespaced_custom_object_status), GROUP, VERSION, key.namespace,
            PLURAL, key.name, patch)

    def _merge_patch(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, _content_type="application/merge-patch+json", **kwargs)
        return call

    # -- any object ------------------------------------------------------------------------

    async def object_annotations(self, api_version: str, kind: str, name: str,
                                 namespace: str) -> dict[str, str] | None:
        """Annotations of a live object of any kind, or None when it does not exist (or its
        kind is not served). `namespace` is used only for namespaced kinds."""
        from kubernetes.dynamic import DynamicClient
        from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

        def get(_request_timeout: float | None = None) -> dict[str, str] | None:
            if self._dynamic is None:
                self._dynamic = DynamicClient(self.api)
            try:
                resource = self._dynamic.resources.get(api_version=api_version, kind=kind)
                obj = resource.get(name=name, namespace=namespace if resource.namespaced else None,
                                   _request_timeout=_request_timeout)
            except (NotFoundError, ResourceNotFoundError):
                return None
            return dict(obj.to_dict().get("metadata", {}).get("annotations") or {})

        return await self.call(f"get {kind} {name}", get)  # type: ignore[no-any-return]

    # -- namespaces, secrets, events -------------------------------------------------------

    async def get_namespace(self, name: str) -> Obj | None:
        try:
            return self.plain(await self.call(f"get namespace {name}", self.core.read_namespace,
                                              name))
        except NotFound:
            return None

    async def create_namespace(self, name: str, labels: dict[str, str],
                               annotations: dict[str, str]) -> None:
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations}}
        await self.call(f"create namespace {name}", self.core.create_namespace, body)

    async def patch_namespace(self, name: str, patch: Obj) -> None:
        await self.call(f"patch namespace {name}", self.core.patch_namespace, name, patch)

    async def delete_namespace(self, name: str) -> None:
        try:
            await self.call(f"delete namespace {name}", self.core.delete_namespace, name)
        except NotFound:
            pass

    async def get_secret(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.plain(await self.call(f"get secret {namespace}/{name}",
                                              self.core.read_namespaced_secret, name, namespace))
        except NotFound:
            return None

    async def create_secret(self, namespace: str, body: Obj) -> None:
        await self.call(f"create secret in {namespace}", self.core.create_namespaced_secret,
                        namespace, body)

    async def replace_secret(self, namespace: str, name: str, body: Obj) -> None:
        await self.call(f"replace secret {namespace}/{name}",
                        self.core.replace_namespaced_secret, name, namespace, body)

    def secret_lister(self, namespace: str | None) -> Callable[..., Any]:
        if namespace:
            return lambda **kw: self.core.list_namespaced_secret(namespace, **kw)
        return lambda **kw: self.core.list_secret_for_all_namespaces(**kw)

    def configmap_lister(self, namespace: str | None) -> Callable[..., Any]:
        if namespace:
            return lambda **kw: self.core.list_namespaced_config_map(namespace, **kw)
        return lambda **kw: self.core.list_config_map_for_all_namespaces(**kw)

    def release_lister(self, driver: str, namespace: str | None = None) -> Callable[..., Any]:
        """Lister of Helm release records (Secrets or ConfigMaps, as helm stores them), in
        `namespace` or in all namespaces."""
        if driver == "configmap":
            return self.configmap_lister(namespace)
        return self.secret_lister(namespace)

    async def create_event(self, namespace: str, body: Obj) -> Obj:
        return self.plain(await self.call(f"create event in {namespace}",
                                          self.core.create_namespaced_event, namespace, body))

    async def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        await self.call(f"patch event {namespace}/{name}", self.core.patch_namespaced_event,
                        name, namespace, patch)

    # -- leases ----------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.plain(await self.call(f"get lease {namespace}/{name}",
                                              self.coordination.read_namespaced_lease, name,
                                              namespace))
        except NotFound:
            return None

    async def create_lease(self, namespace: str, body: Obj) -> Obj:
        return self.plain(await self.call(f"create lease {namespace}",
                                          self.coordination.create_namespaced_lease, namespace,
                                          body))

    async def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        return self.plain(await self.call(f"replace lease {namespace}/{name}",
                                          self.coordination.replace_namespaced_lease, name,
                                          namespace, body))


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Informer:
    """List, then watch from the returned resourceVersion; relist on 410 Gone or errors.

    Runs in a daemon thread and keeps a store of plain dicts keyed by (namespace, name).
    `handler(type, obj)` is called from that thread for every ADDED/MODIFIED/DELETED
    (initial list items arrive as ADDED, vanished ones as DELETED after a relist).
    """

    def __init__(self, kube: Kube, what: str, lister: Callable[..., Any], handler: EventHandler,
                 *, label_selector: str | None = None, watch_timeout: int = 290,
                 on_error: Callable[[Exception], None] | None = None,
                 on_listed: Callable[[], None] | None = None,
                 metadata_only: bool = False) -> None:
        self.kube, self.what, self.lister, self.handler = kube, what, lister, handler
        # Ask the API server for PartialObjectMetadata: names, labels, versions, no payload.
        self.metadata_only = metadata_only
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
        self.on_error = on_error
        self.on_listed = on_listed  # after every successful list (recovery from errors)
        self.store: dict[tuple[str, str], Obj] = {}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"informer-{kube.name}-{what}")

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            # Closing the response from this thread would block on the TLS object the
            # watch thread is reading from; shutting the plain socket down wakes it instead.
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _kwargs(self, *, watch: bool = False) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.label_selector:
            kw["label_selector"] = self.label_selector
        if self.metadata_only:
            kind = "PartialObjectMetadata" if watch else "PartialObjectMetadataList"
            kw["_headers"] = {"Accept": f"application/json;as={kind};g=meta.k8s.io;v=v1"}
        return kw

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                rv = self._list()
                backoff = 0.5
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except _Gone:
                continue
            except Exception as exc:  # noqa: BLE001 - a watch must survive any failure
                if self._stop.is_set():
                    return
                if self.on_error:
                    self.on_error(_translate(exc, f"watch {self.what}"))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list(self) -> str:
        metrics.API_REQUESTS.labels(self.kube.name, "list").inc()
        if self.metadata_only:
            raw = self.lister(_request_timeout=self.kube.timeout, _preload_content=False,
                              **self._kwargs())
            body = json.loads(raw.data)
        else:
            resp = self.lister(_request_timeout=self.kube.timeout, **self._kwargs())
            body = resp if isinstance(resp, dict) else self.kube.plain(resp)
        items = body.get("items") or []
        seen: dict[tuple[str, str], Obj] = {}
        for item in items:
            meta = item["metadata"]
            seen[(meta.get("namespace", ""), meta["name"])] = item
        for key in list(self.store):
            if key not in seen:
                gone = self.store.pop(key)
                self.handler("DELETED", gone)
        for key, item in seen.items():
            old = self.store.get(key)
            self.store[key] = item
            if old is None or old["metadata"].get("resourceVersion") != \
                    item["metadata"].get("resourceVersion"):
                self.handler("ADDED" if old is None else "MODIFIED", item)
        self.synced.set()
        if self.on_listed:
            self.on_listed()
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> str:
        metrics.API_REQUESTS.labels(self.kube.name, "watch").inc()
        resp = self.lister(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                           timeout_seconds=self.watch_timeout, _preload_content=False,
                           _request_timeout=(self.kube.timeout, self.watch_timeout + 30),
                           **self._kwargs(watch=True))
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise TemporaryError(f"watch {self.what}: {obj.get('message')}")
                rv = obj.get("metadata", {}).get("resourceVersion", rv)
                if kind == "BOOKMARK":
                    continue
                meta = obj["metadata"]
                key = (meta.get("namespace", ""), meta["name"])
                if kind == "DELETED":
                    self.store.pop(key, None)
                else:
                    self.store[key] = obj
                self.handler(str(kind), obj)
        finally:
            self._resp = None
            resp.release_conn()
        return rv


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""
