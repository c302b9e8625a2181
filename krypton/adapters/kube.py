"""One cluster's API as krypton uses it: typed calls for Tenants, CRDs, namespaces, Secrets,
ConfigMaps, release records, Events and Leases, over :class:`~krypton.adapters.kubeapi.Transport`
(requests, lists and watches)."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from krypton.adapters.kubeapi import (
    CRDS_PATH,
    DISCOVERY_TTL,
    MERGE_PATCH,
    METADATA_ONLY,
    PAGE_SIZE,
    Obj,
    Transport,
    _path,
    core_path,
    release_records_path,
    tenants_path,
)
from krypton.decisions.errors import (
    AlreadyExists,
    CRDEnsureFailed,
    Forbidden,
    NotFound,
    TemporaryError,
)
from krypton.decisions.model import CRD_NAME, TenantKey


class Objects(Transport):
    """Calls on objects of any kind, found by discovery: what a chart renders and krypton
    looks at (its workloads, shared objects, CRDs)."""

    async def _resource(self, api_version: str, kind: str) -> tuple[list[str], Obj] | None:
        """The API path parts of `api_version` and the resource serving `kind` there, found
        by discovery (one answer per group version, remembered for DISCOVERY_TTL seconds);
        None when the kind is not served."""
        group_version = ["api", api_version] if "/" not in api_version else \
            ["apis", *api_version.split("/", 1)]
        cached = self._discovery.get(api_version)
        if cached is None or time.monotonic() - cached[0] > DISCOVERY_TTL:
            try:
                served = await self.request(f"discover {api_version}", "GET",
                                            _path(*group_version))
            except NotFound:
                return None  # not remembered: a CRD may bring the group version later
            cached = (time.monotonic(), list(served.get("resources") or []))
            self._discovery[api_version] = cached
        for resource in cached[1]:
            if resource.get("kind") == kind and "/" not in str(resource.get("name")):
                return group_version, resource
        return None

    async def _resource_path(self, api_version: str, kind: str, name: str,
                             namespace: str) -> str | None:
        """The API path of an object of any kind; None when the kind is not served."""
        found = await self._resource(api_version, kind)
        if found is None:
            return None
        parts, resource = found
        if resource.get("namespaced"):
            parts = [*parts, "namespaces", namespace]
        return _path(*parts, str(resource["name"]), name)

    async def cluster_scoped(self, api_version: str, kind: str) -> bool | None:
        """Whether `kind` is cluster-scoped on this cluster (None: the kind is not served)."""
        found = await self._resource(api_version, kind)
        return None if found is None else not found[1].get("namespaced")

    async def collection_path(self, api_version: str, kind: str) -> str | None:
        """The path of every object of `kind`, in all namespaces (for a watch)."""
        found = await self._resource(api_version, kind)
        return None if found is None else _path(*found[0], str(found[1]["name"]))

    async def collection_version(self, what: str, path: str) -> str:
        """The collection's current resourceVersion, read with a one-item page of metadata:
        where a watch starts that wants changes from now on, not every object."""
        page = await self.request(what, "GET", path, accept=METADATA_ONLY,
                                  query={"limit": 1})
        return str((page.get("metadata") or {}).get("resourceVersion") or "")

    async def get_object(self, api_version: str, kind: str, name: str,
                         namespace: str) -> Obj | None:
        """A live object of any kind, or None when it does not exist (or its kind is not
        served). `namespace` is used only for namespaced kinds."""
        path = await self._resource_path(api_version, kind, name, namespace)
        return None if path is None else await self.get(f"get {kind} {name}", path)

    async def object_annotations(self, api_version: str, kind: str, name: str,
                                 namespace: str) -> dict[str, str] | None:
        """Annotations of a live object of any kind, or None when it does not exist."""
        obj = await self.get_object(api_version, kind, name, namespace)
        return None if obj is None else dict((obj.get("metadata") or {}).get("annotations") or {})


class Reviews(Objects):
    """Whom a cluster says a client is, and what it says they may do."""

    async def user(self) -> str:
        """The user this client's credentials authenticate as, asked of the API server
        (SelfSubjectReview): the identity krypton, and helm with the same kubeconfig, act as."""
        answer = await self.request(
            "create selfsubjectreview", "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        user = ((answer.get("status") or {}).get("userInfo") or {}).get("username")
        if not isinstance(user, str) or not user:
            raise TemporaryError("the API server's SelfSubjectReview names no user",
                                 reason="BadResponse")
        return user

    # -- who may see the fleet page (SPEC O16, --web-auth=kubernetes) -----------------------

    async def review_token(self, token: str) -> Obj | None:
        """Whom a bearer token authenticates as on this cluster (TokenReview): its userInfo,
        None when it authenticates no one."""
        answer = await self.request(
            "create tokenreview", "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": token}})
        status = answer.get("status") or {}
        user = status.get("user")
        if status.get("authenticated") is not True or not isinstance(user, dict) \
                or not isinstance(user.get("username"), str) or not user["username"]:
            return None
        return user

    async def may(self, user: Mapping[str, Any], verb: str, group: str, resource: str,
                  namespace: str) -> bool:
        """Whether `user` (a TokenReview's userInfo) may `verb` `resource` in `namespace`
        ("": in every namespace) on this cluster (SubjectAccessReview)."""
        spec = {"user": user["username"], "groups": user.get("groups") or [],
                "uid": user.get("uid") or "", "extra": user.get("extra") or {},
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                       "namespace": namespace}}
        answer = await self.request(
            "create subjectaccessreview", "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": spec})
        return (answer.get("status") or {}).get("allowed") is True


class Kube(Reviews):
    """Async façade over one cluster's API, with krypton's error types."""

    # -- cluster ---------------------------------------------------------------------------

    async def server_version(self) -> str:
        info = await self.request("GET /version", "GET", "/version")
        return str(info.get("gitVersion"))

    async def cluster_identity(self, *, by_uid: bool = True) -> str:
        """What makes this API server the same cluster under another name (SPEC D9): the
        UID of its kube-system namespace, else its URL and CA (also when not `by_uid`:
        credentials limited to one namespace are not asked for what they cannot read)."""
        if by_uid:
            try:
                ns = await self.get_namespace("kube-system")
                if ns is not None:
                    return f"uid:{ns['metadata']['uid']}"
            except Forbidden:
                pass
        ca = self.config.ca_pem
        return f"server:{self.config.host}|{hashlib.sha256(ca).hexdigest()}"

    async def get_crd(self) -> Obj | None:
        """The Tenant CRD as the cluster serves it, None when there is none."""
        return await self.get(f"get CRD {CRD_NAME}", f"{CRDS_PATH}/{CRD_NAME}")

    async def crd(self, name: str) -> Obj | None:
        return await self.get(f"get CRD {name}", f"{CRDS_PATH}/{name}")

    async def create_crd(self, body: Obj) -> Obj:
        """Create a CRD and wait until it is established (its kind is served)."""
        name = body["metadata"]["name"]
        created = await self.request(f"create CRD {name}", "POST", CRDS_PATH, body=body)
        try:
            await self._wait_established(f"{CRDS_PATH}/{name}")
        except TimeoutError as exc:
            raise TemporaryError(f"CRD {name} created but not established within 30 s") from exc
        return created

    async def replace_crd(self, body: Obj, resource_version: str) -> Obj:
        name = body["metadata"]["name"]
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=resource_version))
        return await self.request(f"replace CRD {name}", "PUT", f"{CRDS_PATH}/{name}", body=body)

    async def ensure_crd(self, manifest: Obj, *, replace: Callable[[Obj], bool]
                         ) -> tuple[str, Obj]:
        """Create the CRD when absent; replace it only when `replace(served)` says so.

        Returns "created", "upgraded" or "present", and the CRD now served (as far as
        known). Raises CRDEnsureFailed.
        """
        crds = CRDS_PATH
        try:
            current = await self.get_crd()
        except TemporaryError as exc:
            raise CRDEnsureFailed(str(exc)) from exc
        if current is None:
            try:
                await self.request(f"create CRD {CRD_NAME}", "POST", crds, body=manifest)
            except AlreadyExists:
                return "present", manifest
            except TemporaryError as exc:
                raise CRDEnsureFailed(str(exc)) from exc
            await self._wait_established(f"{crds}/{CRD_NAME}")
            return "created", manifest
        if not replace(current):
            return "present", current
        body = dict(manifest)
        body["metadata"] = dict(manifest["metadata"],
                                resourceVersion=current["metadata"]["resourceVersion"])
        try:
            await self.request(f"replace CRD {CRD_NAME}", "PUT", f"{crds}/{CRD_NAME}", body=body)
        except TemporaryError as exc:
            raise CRDEnsureFailed(str(exc)) from exc
        return "upgraded", manifest

    async def _wait_established(self, path: str, timeout: float = 30.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                crd = await self.request("get CRD", "GET", path)
                for cond in (crd.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "Established" and cond.get("status") == "True":
                        return
                await asyncio.sleep(0.2)

    # -- tenants ---------------------------------------------------------------------------

    async def list_tenants(self, namespace: str | None) -> list[Obj]:
        return (await self.list_all("list tenants", tenants_path(namespace)))["items"]

    async def get_tenant(self, key: TenantKey) -> Obj | None:
        return await self.get(f"get tenant {key}", f"{tenants_path(key.namespace)}/"
                                                   f"{quote(key.name, safe='')}")

    async def patch_tenant(self, key: TenantKey, patch: Obj) -> Obj:
        """JSON merge patch of the Tenant's metadata (annotations, finalizers)."""
        return await self.request(f"patch tenant {key}", "PATCH",
                                  f"{tenants_path(key.namespace)}/{quote(key.name, safe='')}",
                                  body=patch, content_type=MERGE_PATCH)

    async def patch_tenant_status(self, key: TenantKey, patch: Obj) -> Obj:
        """JSON merge patch of the status subresource (include metadata.resourceVersion to
        make it conditional)."""
        return await self.request(
            f"patch tenant status {key}", "PATCH",
            f"{tenants_path(key.namespace)}/{quote(key.name, safe='')}/status",
            body=patch, content_type=MERGE_PATCH)

    # -- namespaces, secrets, configmaps, events -------------------------------------------

    async def get_namespace(self, name: str) -> Obj | None:
        return await self.get(f"get namespace {name}", _path("api", "v1", "namespaces", name))

    async def create_namespace(self, name: str, labels: dict[str, str],
                               annotations: dict[str, str]) -> None:
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations}}
        await self.request(f"create namespace {name}", "POST", core_path("namespaces"),
                           body=body)

    async def patch_namespace(self, name: str, patch: Obj) -> None:
        await self.request(f"patch namespace {name}", "PATCH",
                           _path("api", "v1", "namespaces", name), body=patch,
                           content_type=MERGE_PATCH)

    async def delete_namespace(self, name: str) -> None:
        try:
            await self.request(f"delete namespace {name}", "DELETE",
                               _path("api", "v1", "namespaces", name))
        except NotFound:
            pass

    async def get_secret(self, namespace: str, name: str) -> Obj | None:
        return await self.get(f"get secret {namespace}/{name}",
                              f"{core_path('secrets', namespace)}/{quote(name, safe='')}")

    async def list_secrets(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        return (await self.list_all(f"list secrets in {namespace}", core_path("secrets", namespace),
                                label_selector=label_selector))["items"]

    async def create_secret(self, namespace: str, body: Obj) -> None:
        await self.request(f"create secret in {namespace}", "POST",
                           core_path("secrets", namespace), body=body)

    async def replace_secret(self, namespace: str, name: str, body: Obj) -> None:
        await self.request(f"replace secret {namespace}/{name}", "PUT",
                           f"{core_path('secrets', namespace)}/{quote(name, safe='')}", body=body)

    async def get_configmap(self, namespace: str, name: str) -> Obj | None:
        return await self.get(f"get configmap {namespace}/{name}",
                              f"{core_path('configmaps', namespace)}/{quote(name, safe='')}")

    async def patch_configmap(self, namespace: str, name: str, patch: Obj) -> Obj:
        return await self.request(f"patch configmap {namespace}/{name}", "PATCH",
                                  f"{core_path('configmaps', namespace)}/{quote(name, safe='')}",
                                  body=patch, content_type=MERGE_PATCH)

    async def get_deployment(self, namespace: str, name: str) -> Obj | None:
        return await self.get(f"get deployment {namespace}/{name}",
                              _path("apis", "apps", "v1", "namespaces", namespace,
                                    "deployments", name))

    async def list_deployments(self, namespace: str, label_selector: str) -> list[Obj]:
        """Deployments in `namespace` with this label."""
        return (await self.list_all(
            f"list deployments in {namespace}",
            _path("apis", "apps", "v1", "namespaces", namespace, "deployments"),
            label_selector=label_selector))["items"]

    async def create_configmap(self, namespace: str, body: Obj) -> Obj:
        return await self.request(f"create configmap in {namespace}", "POST",
                                  core_path("configmaps", namespace), body=body)

    async def replace_configmap(self, namespace: str, name: str, body: Obj) -> Obj:
        """Replace; a body carrying metadata.resourceVersion makes it conditional (409)."""
        return await self.request(f"replace configmap {namespace}/{name}", "PUT",
                                  f"{core_path('configmaps', namespace)}/{quote(name, safe='')}",
                                  body=body)

    async def list_release_records(self, driver: str, namespace: str,
                                   label_selector: str, *, page_size: int = PAGE_SIZE) -> list[Obj]:
        return (await self.list_all("list release records", release_records_path(driver, namespace),
                                    label_selector=label_selector, page_size=page_size))["items"]

    async def release_record_labels(self, driver: str, namespace: str,
                                    label_selector: str) -> list[Obj]:
        """The metadata of the release records `label_selector` selects, without their
        bodies."""
        return (await self.list_all("list release records", release_records_path(driver, namespace),
                                    label_selector=label_selector, accept=METADATA_ONLY))["items"]

    async def release_record(self, driver: str, namespace: str, name: str) -> Obj | None:
        """One Helm release record (``sh.helm.release.v1.<release>.v<revision>``)."""
        return await self.get(f"get release record {namespace}/{name}",
                              f"{release_records_path(driver, namespace)}/{quote(name, safe='')}")

    async def list_events(self, namespace: str) -> list[Obj]:
        return (await self.list_all(f"list events in {namespace}",
                                core_path("events", namespace)))["items"]

    async def create_event(self, namespace: str, body: Obj) -> Obj:
        return await self.request(f"create event in {namespace}", "POST",
                                  core_path("events", namespace), body=body)

    async def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        await self.request(f"patch event {namespace}/{name}", "PATCH",
                           f"{core_path('events', namespace)}/{quote(name, safe='')}",
                           body=patch, content_type=MERGE_PATCH)

    # -- the release-record guard's objects (SPEC S4) ------------------------------------

    async def cluster_object(self, what: str, collection: str, name: str) -> Obj | None:
        return await self.get(f"get {what} {name}", f"{collection}/{quote(name, safe='')}")

    async def write_cluster_object(self, what: str, collection: str, body: Obj,
                                   resource_version: str | None) -> Obj:
        """Create the cluster-scoped object `body` in `collection` (`resource_version`
        None), or replace that version of it."""
        name = body["metadata"]["name"]
        if resource_version is None:
            return await self.request(f"create {what} {name}", "POST", collection, body=body)
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=resource_version))
        return await self.request(f"replace {what} {name}", "PUT",
                                  f"{collection}/{quote(name, safe='')}", body=body)

    async def patch_cluster_object(self, what: str, collection: str, name: str,
                                   patch: Obj) -> Obj:
        return await self.request(f"patch {what} {name}", "PATCH",
                                  f"{collection}/{quote(name, safe='')}", body=patch,
                                  content_type=MERGE_PATCH)

    async def dry_run_create(self, namespace: str, body: Obj) -> Obj:
        """Send the create of ConfigMap `body` through admission without storing it; the
        object as it would have been stored."""
        return await self.request(f"dry-run create configmap in {namespace}", "POST",
                           core_path("configmaps", namespace), query={"dryRun": "All"},
                           body=body)

    # -- leases ----------------------------------------------------------------------------

    def lease_path(self, namespace: str, name: str = "") -> str:
        base = _path("apis", "coordination.k8s.io", "v1", "namespaces", namespace, "leases")
        return f"{base}/{quote(name, safe='')}" if name else base

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        return await self.get(f"get lease {namespace}/{name}", self.lease_path(namespace, name))

    async def list_leases(self, namespace: str, label_selector: str) -> list[Obj]:
        return (await self.list_all(f"list leases in {namespace}", self.lease_path(namespace),
                                    label_selector=label_selector))["items"]

    async def create_lease(self, namespace: str, body: Obj) -> Obj:
        return await self.request(f"create lease {namespace}", "POST",
                                  self.lease_path(namespace), body=body)

    async def replace_lease(self, namespace: str, name: str, body: Obj) -> Obj:
        return await self.request(f"replace lease {namespace}/{name}", "PUT",
                                  self.lease_path(namespace, name), body=body)

    async def delete_lease(self, namespace: str, name: str,
                           resource_version: str | None = None) -> None:
        """Delete a Lease (gone already is fine); with `resource_version`, only that version
        of it (a Lease written since is left alone: Conflict)."""
        body = {"preconditions": {"resourceVersion": resource_version}} \
            if resource_version else None
        try:
            await self.request(f"delete lease {namespace}/{name}", "DELETE",
                               self.lease_path(namespace, name), body=body)
        except NotFound:
            pass


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def without_managed_fields(obj: Obj) -> Obj:
    """The object without metadata.managedFields, which krypton never reads and which is often
    the largest part of a small object."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = dict(obj, metadata={k: v for k, v in meta.items() if k != "managedFields"})
    return obj
