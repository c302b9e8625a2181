"""One reconcile pass for one Tenant on one cluster: observe -> plan -> act -> one status patch.

Nothing is written unless something changed: the status is patched only when the computed
status differs from the stored one, Events accompany condition changes and actions, and the
fingerprint annotation is patched only after a successful helm run (SPEC R13).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource
from krypton.adapters.events import EventRecorder, involved_tenant
from krypton.adapters.helm import Helm
from krypton.adapters.kube import Kube, now_rfc3339
from krypton.decisions import conditions as cond
from krypton.decisions import ownership, redact, retry
from krypton.decisions.conditions import Change
from krypton.decisions.errors import (
    AlreadyExists,
    ChartNotLoaded,
    Conflict,
    Fenced,
    HelmFailed,
    KryptonError,
    NotFound,
    OwnershipConflict,
    PermanentError,
    ReleaseLocked,
    TemporaryError,
    VersionInvalid,
    VersionNotFound,
)
from krypton.decisions.fingerprint import fingerprint
from krypton.decisions.model import (
    ADOPTED_ANNOTATION,
    FINALIZER,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OWNER_ANNOTATION,
    OWNER_LABEL,
    PAUSED_ANNOTATION,
    SYSTEM_NAMESPACES,
    ChartProblem,
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseStatus,
    TenantKey,
    TenantView,
    fingerprint_annotation,
    release_name,
)
from krypton.decisions.planner import INSTALLING, Action, Plan, plan
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.settings import Settings
from krypton.runtime.slots import FairSlots

CHART_SKIP_REQUEUE = 120.0
CONFLICT_RETRIES = 10  # status writes re-read and re-applied on 409 before backing off
LOCK_MARGIN = 10.0  # a pending record older than --helm-timeout plus this is a leftover
CHART_EVENTS = {"ChartNotLoaded": "ChartNotLoaded", "VersionNotFound": "ChartVersionNotFound",
                "VersionInvalid": "ChartVersionInvalid"}


@dataclass(kw_only=True)
class ClusterView:
    """What is needed to observe a Tenant on a cluster and decide about it, with nothing
    that writes: shared by the operator and ``krypton plan``."""

    name: str
    kube: Kube
    chart: ChartSource
    settings: Settings
    releases: ReleaseIndex
    tenants: dict[tuple[str, str], dict[str, Any]]
    values: dict[str, Any] = field(default_factory=dict)

    async def desired_chart(self) -> ChartTarget | ChartProblem:
        try:
            chart = await self.chart.get()
        except (VersionInvalid, VersionNotFound, ChartNotLoaded) as exc:
            return ChartProblem(exc.reason, str(exc))
        fp = fingerprint(chart.repo, chart.name, chart.version, self.values)
        return ChartTarget(chart.repo, chart.name, chart.version, self.values, fp, chart.path)

    def observe(self, obj: dict[str, Any]) -> Observation:
        view = tenant_view(obj, self.name)
        release = release_name(view.key.name, self.name)
        namespace = self.settings.release_namespace_for(view.key.name)
        own = self.settings.shared_release_namespace is None
        ours = self.releases.ours(namespace, release)
        if ours is not None and (view.applied_revision is None or ours[0] > view.applied_revision):
            # Our status write may not have reached the watch cache yet: a revision our own
            # helm run made, with the fingerprint it applied, is what is recorded, not drift.
            view = dataclasses.replace(view, applied_revision=ours[0],
                                       recorded_fingerprint=ours[1])
        return Observation(
            cluster=self.name,
            tenant=view,
            chart=None,
            release=self.releases.observe(
                namespace, release, now=time.time(),
                lock_timeout=self.settings.helm_timeout + LOCK_MARGIN),
            reserved_namespaces=self.settings.reserved_namespaces,
            adopt_namespaces=self.settings.adopt_namespaces,
            # with one shared release namespace there is no Tenant namespace to look after
            own_namespace=own,
            namespace=NamespaceState.UNKNOWN if own else NamespaceState.OWNED,
        )


@dataclass(kw_only=True)
class ClusterRuntime(ClusterView):
    """A cluster view plus what a reconcile acts with."""

    helm: Helm
    recorder: EventRecorder
    slots: FairSlots
    published: dict[TenantKey, tuple[str, ...]] = field(default_factory=dict)
    # per Tenant: (the status last written, the status the server stored), both without
    # timestamps; they differ when the served CRD prunes fields (an older CRD)
    written: dict[TenantKey, tuple[Any, Any]] = field(default_factory=dict)
    gate: Callable[[str], tuple[bool, str]] = lambda _cluster: (True, "")
    fence: Callable[[], bool] = lambda: True  # not draining, leadership held and fresh


def fenced(rt: ClusterRuntime) -> None:
    """Raise Fenced unless this worker may still act: checked right before every helm
    start (and before the status that announces one), so that a leader that lost its Lease,
    or was paused past it, and a worker being drained start nothing (issue 11, items 2, 4)."""
    if not rt.fence():
        raise Fenced("no helm operation may start: the cluster's worker is draining or this "
                     "replica is not the leader")


@dataclass(frozen=True)
class Outcome:
    """How the worker should treat the key after a pass."""

    requeue_after: float | None = None  # fixed delay (no backoff growth)
    retry: bool = False  # exponential backoff
    reason: str = ""


def tenant_view(obj: dict[str, Any], cluster: str) -> TenantView:
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    applied = (status.get("clusters") or {}).get(cluster) or {}
    ref = (obj.get("spec") or {}).get("clusterRef") or {}
    revision = applied.get("revision")
    return TenantView(
        key=TenantKey(meta["namespace"], meta["name"]),
        generation=int(meta.get("generation") or 1),
        uid=meta.get("uid", ""),
        paused=str(annotations.get(PAUSED_ANNOTATION, "")).lower() == "true",
        deleting=bool(meta.get("deletionTimestamp")),
        has_finalizer=FINALIZER in (meta.get("finalizers") or []),
        target_cluster=ref.get("secretName") or None,
        workspace=str((obj.get("spec") or {}).get("workspace") or "") or None,
        applied_fingerprint=annotations.get(fingerprint_annotation(cluster)),
        applied_revision=int(revision) if isinstance(revision, int) else None,
        recorded_fingerprint=applied.get("fingerprint"),
        annotations=dict(annotations),
    )


def namespace_state(ns: dict[str, Any] | None, key: TenantKey) -> tuple[NamespaceState, str | None]:
    if ns is None:
        return NamespaceState.ABSENT, None
    meta = ns.get("metadata") or {}
    owner = (meta.get("annotations") or {}).get(OWNER_ANNOTATION)
    if owner is None:
        return NamespaceState.UNMANAGED, None
    if owner == str(key):
        return NamespaceState.OWNED, owner
    return NamespaceState.CONFLICT, owner


def created_by_krypton(ns: dict[str, Any] | None, key: TenantKey) -> bool:
    """The namespace carries this Tenant's owner annotation and was not adopted."""
    annotations = ((ns or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(OWNER_ANNOTATION) == str(key) and ADOPTED_ANNOTATION not in annotations


class NamespaceNotOwned(PermanentError):
    reason = "NamespaceConflict"


class Reconciler:
    def __init__(self, rt: ClusterRuntime) -> None:
        self.rt = rt
        self.log = structlog.get_logger("krypton.reconciler").bind(cluster=rt.name)

    # -- observe ---------------------------------------------------------------------------

    # -- one pass --------------------------------------------------------------------------

    async def reconcile(self, key: TenantKey) -> Outcome:
        obj = self.rt.tenants.get((key.namespace, key.name))
        if obj is None:
            return Outcome()
        obs = self.rt.observe(obj)
        release = release_name(key.name, self.rt.name)
        log = self.log.bind(tenant=str(key), release=release)
        decided = plan(obs)
        if decided.action is Action.RESOLVE_CHART:
            obs = dataclasses.replace(obs, chart=await self.rt.desired_chart())
            decided = plan(obs)
        if decided.action is Action.ADD_FINALIZER:
            obj = await self._add_finalizer(obj)
            obs = dataclasses.replace(obs, tenant=tenant_view(obj, self.rt.name))
            decided = plan(obs)
        if decided.action is Action.OBSERVE_NAMESPACE:
            state, owner = namespace_state(await self.rt.kube.get_namespace(key.name), key)
            obs = dataclasses.replace(obs, namespace=state, namespace_owner=owner)
            decided = plan(obs)
        log.debug("planned", action=decided.action.value, reason=decided.reason)
        return await self._act(obj, obs, decided, release, log)

    async def _act(self, obj: dict[str, Any], obs: Observation, p: Plan, release: str,
                   log: Any) -> Outcome:
        c = self.rt.name
        a = p.action
        if a is Action.NOTHING:
            return Outcome()
        if a is Action.WAIT:
            log.info("release busy, waiting", detail=p.message)
            return Outcome(retry=True, reason=p.reason)
        if a is Action.UNINSTALL:
            return await self._uninstall(obj, release, log)
        if a is Action.PAUSE:
            await self._commit(obj, [Change(cond.PAUSED, True, "Paused", p.message)], log)
            return Outcome()
        changes = [Change(cond.PAUSED, False, "Resumed", "reconciliation active")] \
            if _has_condition(obj, cond.PAUSED) else []
        if a is Action.NOT_TARGETED:
            changes.append(Change(cond.cluster_type(cond.PROGRESS, c), False, "NotTargeted",
                                  p.message))
            await self._commit(obj, changes, log, event=("Normal", "NotTargeted", p.message))
            return Outcome()
        if a is Action.BLOCKED:
            return await self._blocked(obj, p, changes, log)
        assert isinstance(obs.chart, ChartTarget)
        if a is Action.ANNOTATE:
            return await self._annotate(obj, obs, p, release, changes, log)
        if a is Action.SKIP:
            self._publish(obs.tenant.key, release, obs.chart)
            changes += self._success_changes(obj, "NoChange", p.message, keep_ready=True)
            # Also completes the record of a pass whose last status write was lost.
            applied = {"release": release, "chartVersion": obs.chart.version,
                       "fingerprint": obs.chart.fingerprint, "revision": obs.release.revision}
            await self._commit(obj, changes, log, event=("Normal", "HelmSkip", p.message),
                               applied=applied, last_chart=obs.chart.ref)
            return Outcome()
        return await self._helm(obj, obs, p, release, changes, log)

    # -- actions ---------------------------------------------------------------------------

    async def _annotate(self, obj: dict[str, Any], obs: Observation, p: Plan, release: str,
                        changes: list[Change], log: Any) -> Outcome:
        """The release is deployed as recorded; only the fingerprint annotation is missing or
        wrong (a failed write, or removed by hand). Write it; never run helm for it."""
        assert isinstance(obs.chart, ChartTarget)
        obj = await self._set_fingerprint(obj, obs.chart.fingerprint, log)  # raises on failure
        self._publish(obs.tenant.key, release, obs.chart)
        changes += self._success_changes(obj, "NoChange", p.message, keep_ready=True)
        await self._commit(obj, changes, log)
        if p.drift:
            log.info("drift repaired", detail=p.message)
            await self.rt.recorder.emit(involved_tenant(obj), "Normal", "DriftRepaired",
                                        f"{p.message}: restored")
        return Outcome()

    async def _blocked(self, obj: dict[str, Any], p: Plan, changes: list[Change],
                       log: Any) -> Outcome:
        c = self.rt.name
        changes.append(Change(cond.cluster_type(cond.ERROR, c), True, p.reason, p.message))
        changes.append(Change(cond.cluster_type(cond.PROGRESS, c), False, p.reason, p.message))
        event = CHART_EVENTS.get(p.reason, p.reason)
        await self._commit(obj, changes, log, event=("Warning", event, p.message))
        metrics.RECONCILE_ERRORS.labels(c, p.reason).inc()
        if p.permanent:
            log.warning("tenant blocked", reason=p.reason, detail=p.message)
            return Outcome(reason=p.reason)
        log.warning("chart not available", reason=p.reason, detail=p.message)
        if p.reason in CHART_EVENTS and self.rt.settings.allow_chart_skip:
            return Outcome(requeue_after=CHART_SKIP_REQUEUE, reason=p.reason)
        return Outcome(retry=True, reason=p.reason)

    def _success_changes(self, obj: dict[str, Any], reason: str, message: str,
                         *, keep_ready: bool = False) -> list[Change]:
        c = self.rt.name
        out = []
        ready_type = cond.cluster_type(cond.READY, c)
        if not (keep_ready and _condition_true(obj, ready_type)):
            out.append(Change(ready_type, True, reason, message))
        error_type = cond.cluster_type(cond.ERROR, c)
        if not keep_ready or _condition_true(obj, error_type) or not _has_condition(obj, error_type):
            out.append(Change(error_type, False, reason, "no error"))
        if _condition_true(obj, cond.cluster_type(cond.PROGRESS, c)):
            out.append(Change(cond.cluster_type(cond.PROGRESS, c), False, reason, message))
        return out

    async def _helm(self, obj: dict[str, Any], obs: Observation, p: Plan, release: str,
                    changes: list[Change], log: Any) -> Outcome:
        c, key = self.rt.name, obs.tenant.key
        chart = obs.chart
        assert isinstance(chart, ChartTarget)
        installing = p.action in INSTALLING
        verb = "Install" if installing else "Upgrade"
        moving = obs.tenant.applied_fingerprint is not None or \
            obs.release.status is not ReleaseStatus.ABSENT
        if moving and not p.drift:
            may, reason = self.rt.gate(c)
            if not may:
                message = ("the fleet-wide rollout has not reached this cluster yet"
                           if reason == "RolloutPending" else
                           "the fleet-wide rollout is halted; this cluster stays on its version")
                await self._commit(obj, changes + [Change(
                    cond.cluster_type(cond.PROGRESS, c), False, reason, message)], log)
                return Outcome(reason=reason)
        fenced(self.rt)
        await self._ensure_namespace(key, obs.namespace)
        start = Change(cond.cluster_type(cond.PROGRESS, c), True,
                       "Installing" if installing else "Upgrading", p.message)
        obj = await self._commit(obj, changes + [start], log,
                                 event=("Normal", f"Helm{verb}Start", p.message))
        log.info(f"helm {verb.lower()} start", chart_version=chart.version, action=p.action.value)
        namespace = self.rt.settings.release_namespace_for(key.name)
        try:
            async with self.rt.slots.slot(c):
                fenced(self.rt)  # waiting for the slot may have outlasted the Lease
                if p.action is Action.UNINSTALL_THEN_INSTALL and \
                        obs.release.status is not ReleaseStatus.ABSENT:
                    await self._check_ownership(release, namespace)
                    await self.rt.helm.uninstall(release, namespace)
                elif p.action is Action.ROLLBACK_THEN_UPGRADE:
                    await self.rt.helm.rollback(release, namespace)
                result = await self.rt.helm.install_or_upgrade(
                    release, chart.path, namespace, chart.values, operation=verb.lower())
        except ReleaseLocked as exc:
            # Another helm operation holds the release (it took the lock after this pass
            # looked): nothing failed, so no failedFingerprint, and a progressive rollout
            # never counts it as a failed release. Retried with backoff, like a planned wait.
            log.info("release busy, waiting", detail=str(exc))
            return Outcome(retry=True, reason=exc.reason)
        except HelmFailed as exc:
            reason = exc.reason if isinstance(exc, OwnershipConflict) else f"{verb}Failed"
            log.error(f"helm {verb.lower()} failed", error=str(exc))
            await self._commit(obj, [
                Change(cond.cluster_type(cond.ERROR, c), True, reason, str(exc)),
                Change(cond.cluster_type(cond.READY, c), False, reason, str(exc)),
                Change(cond.cluster_type(cond.PROGRESS, c), False, reason, str(exc)),
            ], log, event=("Warning", f"Helm{verb}Failed", str(exc)),
                applied={"failedFingerprint": chart.fingerprint})
            metrics.RECONCILE_ERRORS.labels(c, reason).inc()
            return Outcome(retry=True, reason=reason)
        revision = int(result.get("version") or 0)
        self.rt.releases.note(namespace, release, revision,
                              ReleaseStatus.parse((result.get("info") or {}).get("status")),
                              chart.fingerprint)
        done = "Installed" if installing else "Upgraded"
        message = f"chart {chart.name} {chart.version} {done.lower()} as {release} revision {revision}"
        log.info(f"helm {verb.lower()} success", chart_version=chart.version, revision=revision)
        applied = {"release": release, "chartVersion": chart.version,
                   "fingerprint": chart.fingerprint, "revision": revision,
                   "failedFingerprint": "", "lastAppliedTime": now_rfc3339()}
        try:
            obj = await self._set_fingerprint(obj, chart.fingerprint, log)
        except KryptonError as exc:
            # The release is right; the record of it is not. Keep what was applied so the next
            # pass only retries the annotation (with backoff), never helm.
            message = f"{message}; writing the fingerprint annotation failed: {exc}"
            await self._commit(obj, [
                Change(cond.cluster_type(cond.ERROR, c), True, "FingerprintUpdateFailed", message),
                Change(cond.cluster_type(cond.PROGRESS, c), False, f"{verb}Complete", message),
            ], log, applied=applied, last_chart=chart.ref)
            metrics.RECONCILE_ERRORS.labels(c, "FingerprintUpdateFailed").inc()
            return Outcome(retry=True, reason="FingerprintUpdateFailed")
        self._publish(key, release, chart)
        success = [
            Change(cond.cluster_type(cond.READY, c), True, done, message),
            Change(cond.cluster_type(cond.ERROR, c), False, done, "no error"),
            Change(cond.cluster_type(cond.PROGRESS, c), False, f"{verb}Complete", message),
        ]
        obj = await self._commit(obj, success, log, event=("Normal", f"Helm{done}", message),
                                 applied=applied, last_chart=chart.ref)
        if p.drift:
            log.info("drift repaired", detail=p.message)
            await self.rt.recorder.emit(involved_tenant(obj), "Normal", "DriftRepaired",
                                        f"{p.message}; now {message}")
        return Outcome()

    async def _check_ownership(self, release: str, namespace: str) -> None:
        """Refuse to uninstall a failed release whose manifest lists objects that another
        release (or nobody) owns: helm would delete them (SPEC R17)."""
        live = {}
        for ref in ownership.manifest_objects(await self.rt.helm.manifest(release, namespace)):
            annotations = await self.rt.kube.object_annotations(
                ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
            if annotations is not None:
                live[ref] = annotations
        found = ownership.conflicts(live, release, namespace)
        if found:
            raise OwnershipConflict(
                f"release {release} failed and cannot be recovered by uninstalling it without "
                f"deleting objects it does not own: {'; '.join(found[:5])}"
                + (f" (and {len(found) - 5} more)" if len(found) > 5 else ""))

    async def _uninstall(self, obj: dict[str, Any], release: str, log: Any) -> Outcome:
        key = tenant_view(obj, self.rt.name).key
        involved = involved_tenant(obj)
        namespace = self.rt.settings.release_namespace_for(key.name)
        try:
            async with self.rt.slots.slot(self.rt.name):
                fenced(self.rt)
                await self.rt.helm.uninstall(release, namespace)
            if self.rt.settings.delete_namespace_on_uninstall and \
                    self.rt.settings.shared_release_namespace is None:
                ns = await self.rt.kube.get_namespace(key.name)
                if created_by_krypton(ns, key) and \
                        key.name not in self.rt.settings.reserved_namespaces | SYSTEM_NAMESPACES:
                    await self.rt.kube.delete_namespace(key.name)
        except Fenced:
            raise
        except (HelmFailed, TemporaryError) as exc:
            log.error("helm uninstall failed", error=str(exc))
            await self.rt.recorder.emit(involved, "Warning", "HelmUninstallFailed", str(exc))
            return Outcome(retry=True, reason="UninstallFailed")
        self.rt.releases.forget(namespace, release)
        self.unpublish(key)
        log.info("helm uninstall success")
        await self.rt.recorder.emit(involved, "Normal", "HelmUninstalled",
                                    f"release {release} uninstalled")
        finalizers = [f for f in obj["metadata"].get("finalizers") or [] if f != FINALIZER]
        try:
            await self._patch_meta(key, {"metadata": {
                "finalizers": finalizers, "resourceVersion": obj["metadata"]["resourceVersion"]}})
        except NotFound:
            pass
        except Conflict:
            return Outcome(retry=True, reason="Conflict")
        return Outcome()

    async def forget(self, obj: dict[str, Any]) -> None:
        """Remove this cluster's traces from a Tenant when the cluster leaves the fleet.

        Its conditions, its ``status.clusters`` record, its fingerprint annotation and the
        release-cleanup finalizer go (no worker is left to honour the finalizer); the phase
        is recomputed from what remains. The release itself is kept.
        """
        c = self.rt.name
        meta = obj["metadata"]
        key = TenantKey(meta["namespace"], meta["name"])
        status = dict(obj.get("status") or {})
        mine = [cond.cluster_type(t, c) for t in (cond.READY, cond.ERROR, cond.PROGRESS)]
        remaining = cond.remove(status.get("conditions") or [], mine)
        generation = int(meta.get("generation") or 1)
        phase, conditions = cond.summarize(remaining, allow_chart_skip=self.rt.settings.allow_chart_skip,
                                           generation=generation, now=now_rfc3339())
        if c in (status.get("clusters") or {}) or len(remaining) != len(status.get("conditions") or []):
            metrics.API_WRITES.labels(c, "status").inc()
            obj = await self.rt.kube.patch_tenant_status(key, {
                "metadata": {"resourceVersion": meta["resourceVersion"]},
                "status": {"phase": phase, "conditions": conditions, "clusters": {c: None}}})
        annotation = fingerprint_annotation(c)
        finalizers = list(obj["metadata"].get("finalizers") or [])
        if annotation in (obj["metadata"].get("annotations") or {}) or FINALIZER in finalizers:
            await self._patch_meta(key, {"metadata": {
                "annotations": {annotation: None},
                "finalizers": [f for f in finalizers if f != FINALIZER],
                "resourceVersion": obj["metadata"]["resourceVersion"]}})
        self.unpublish(key)

    # -- metrics ---------------------------------------------------------------------------

    def _publish(self, key: TenantKey, release: str, chart: ChartTarget) -> None:
        """The per Tenant x cluster info metric: release, chart version, fingerprint."""
        labels = (self.rt.name, key.namespace, key.name, release, chart.version, chart.fingerprint)
        old = self.rt.published.get(key)
        if old == labels:
            return
        if old is not None:
            metrics.TENANT_RELEASE.remove(*old)
        metrics.TENANT_RELEASE.labels(*labels).set(1)
        self.rt.published[key] = labels

    def unpublish(self, key: TenantKey) -> None:
        self.rt.written.pop(key, None)
        old = self.rt.published.pop(key, None)
        if old is not None:
            metrics.TENANT_RELEASE.remove(*old)

    # -- writes ----------------------------------------------------------------------------

    async def _patch_meta(self, key: TenantKey, patch: dict[str, Any]) -> dict[str, Any]:
        metrics.API_WRITES.labels(self.rt.name, "tenant").inc()
        return await self.rt.kube.patch_tenant(key, patch)

    async def _add_finalizer(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or []) + [FINALIZER]
        key = TenantKey(meta["namespace"], meta["name"])
        return await self._patch_meta(key, {"metadata": {
            "finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}})

    async def _ensure_namespace(self, key: TenantKey, state: NamespaceState) -> None:
        labels = {MANAGED_BY_LABEL: MANAGED_BY, OWNER_LABEL: f"{key.namespace}.{key.name}"[:63]}
        annotations = {OWNER_ANNOTATION: str(key)}
        if state is NamespaceState.ABSENT:
            try:
                await self.rt.kube.create_namespace(key.name, labels, annotations)
                metrics.API_WRITES.labels(self.rt.name, "namespace").inc()
                self.log.info("workspace namespace created", tenant=str(key), namespace=key.name)
                return
            except AlreadyExists:
                state = NamespaceState.UNMANAGED
        if state is NamespaceState.UNMANAGED:
            if not self.rt.settings.adopt_namespaces:
                raise NamespaceNotOwned(f"namespace {key.name!r} exists and was not created by "
                                        "krypton (--adopt-namespaces allows taking it over)")
            annotations[ADOPTED_ANNOTATION] = "true"  # adopted namespaces are never deleted
            await self.rt.kube.patch_namespace(
                key.name, {"metadata": {"labels": labels, "annotations": annotations}})
            metrics.API_WRITES.labels(self.rt.name, "namespace").inc()

    async def _set_fingerprint(self, obj: dict[str, Any], fp: str, log: Any) -> dict[str, Any]:
        meta = obj["metadata"]
        key = TenantKey(meta["namespace"], meta["name"])
        annotation = fingerprint_annotation(self.rt.name)
        if (meta.get("annotations") or {}).get(annotation) == fp:
            return obj
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(TemporaryError),
                stop=stop_after_attempt(retry.FINGERPRINT_WRITE.attempts),
                wait=retry.FINGERPRINT_WRITE.wait(), reraise=True,
            ):
                with attempt:
                    obj = await self._patch_meta(key, {"metadata": {"annotations": {annotation: fp}}})
        except KryptonError as exc:
            log.error("fingerprint update failed", error=str(exc))
            await self.rt.recorder.emit(involved_tenant(obj), "Warning", "FingerprintUpdateFailed",
                                        f"{annotation}: {exc}")
            raise
        await self.rt.recorder.emit(involved_tenant(obj), "Normal", "FingerprintUpdated",
                                    f"{annotation}={fp}")
        return obj

    def _stored_as_before(self, key: TenantKey, live: dict[str, Any],
                          new: dict[str, Any]) -> bool:
        """The same status was written before and the server stored what it holds now: the
        difference is what the served CRD prunes (issue 16), and writing again would change
        nothing but the resourceVersion, on every pass."""
        return self.rt.written.get(key) == (_comparable(new), _comparable(live))

    async def _commit(self, obj: dict[str, Any], changes: list[Change], log: Any, *,
                      event: tuple[str, str, str] | None = None,
                      applied: dict[str, Any] | None = None,
                      last_chart: str | None = None) -> dict[str, Any]:
        """Patch the status if it changed (retrying on conflicts), then emit `event` if so."""
        key = TenantKey(obj["metadata"]["namespace"], obj["metadata"]["name"])
        settings = self.rt.settings
        changes = [dataclasses.replace(c, message=redact.scrub(c.message)) for c in changes]
        for attempt in range(CONFLICT_RETRIES):
            status = dict(obj.get("status") or {})
            generation = int(obj["metadata"].get("generation") or 1)
            now = now_rfc3339()
            conditions = cond.apply(status.get("conditions") or [], changes,
                                    generation=generation, now=now)
            phase, conditions = cond.summarize(conditions, allow_chart_skip=settings.allow_chart_skip,
                                               generation=generation, now=now)
            new = dict(status, phase=phase, conditions=conditions, observedGeneration=generation)
            if applied is not None:
                previous = (status.get("clusters") or {}).get(self.rt.name) or {}
                new["clusters"] = dict(status.get("clusters") or {},
                                       **{self.rt.name: dict(previous, **applied)})
            if last_chart is not None:
                new["lastAppliedChart"] = last_chart
            if _same_status(status, new) or self._stored_as_before(key, status, new):
                return obj
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "status": new}
            try:
                metrics.API_WRITES.labels(self.rt.name, "status").inc()
                updated = await self.rt.kube.patch_tenant_status(key, patch)
                self.rt.written[key] = (_comparable(new),
                                        _comparable(updated.get("status") or {}))
            except Conflict:
                fresh = await self.rt.kube.get_tenant(key)
                if fresh is None:
                    return obj
                obj = fresh
                await asyncio.sleep(0.02 * (attempt + 1))
                continue
            if status.get("phase") != phase:
                log.info("phase set", phase=phase)
                await self.rt.recorder.emit(involved_tenant(updated), "Normal", "PhaseSet",
                                            f"phase {status.get('phase') or 'None'} -> {phase}")
                if phase == "Ready":
                    log.info("tenant phase is Ready", cluster=self.rt.name)
            if event is not None:
                await self.rt.recorder.emit(involved_tenant(updated), *event)
            return updated
        raise Conflict(f"status of {key} kept conflicting")


def _has_condition(obj: dict[str, Any], type_: str) -> bool:
    return any(c.get("type") == type_ for c in (obj.get("status") or {}).get("conditions") or [])


def _condition_true(obj: dict[str, Any], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A status without its timestamps."""
    out = {k: v for k, v in status.items() if k not in ("conditions", "clusters")}
    out["conditions"] = cond.without_times(status.get("conditions") or [])
    out["clusters"] = {k: {f: x for f, x in (v or {}).items() if f != "lastAppliedTime"}
                       for k, v in (status.get("clusters") or {}).items()}
    return out


def _same_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return _comparable(old) == _comparable(new)
