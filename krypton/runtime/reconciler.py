"""One reconcile pass for one Tenant on one cluster: observe -> plan -> act -> one status patch.

Nothing is written unless something changed: the status is patched only when the computed
status differs from the stored one, Events accompany condition changes and actions, and the
fingerprint annotation is patched only after a successful helm run (SPEC R13).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource, read_chart_crds
from krypton.adapters.events import EventRecorder, involved_tenant
from krypton.adapters.helm import Helm
from krypton.adapters.kube import Kube, now_rfc3339
from krypton.decisions import chartcrds, health, ownership, redact, retry, safeyaml
from krypton.decisions import conditions as cond
from krypton.decisions import conflicts as fields
from krypton.decisions.conditions import Change
from krypton.decisions.errors import (
    AlreadyExists,
    ChartNotLoaded,
    Conflict,
    Fenced,
    FieldConflict,
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
from krypton.decisions.health import Health
from krypton.decisions.model import (
    ADOPTED_ANNOTATION,
    FINALIZER,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OWNER_ANNOTATION,
    OWNER_LABEL,
    PAUSED_ANNOTATION,
    RELEASE_CLUSTER_LABEL,
    RELEASE_OWNER_LABEL,
    RETRY_ANNOTATION,
    SYSTEM_NAMESPACES,
    ChartProblem,
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseStatus,
    RolloutGate,
    TenantKey,
    TenantView,
    epoch_seconds,
    fingerprint_annotation,
    release_name,
    rfc3339,
)
from krypton.decisions.ownership import ObjectRef
from krypton.decisions.planner import (
    INSTALLING,
    Action,
    Plan,
    announced,
    attempt_target,
    plan,
    stalled_message,
)
from krypton.decisions.releases import ReleaseIndex, decode_release
from krypton.decisions.settings import Settings
from krypton.runtime.readiness import Readiness
from krypton.runtime.slots import FairSlots

CHART_SKIP_REQUEUE = 120.0
CONFLICT_RETRIES = 10  # status writes re-read and re-applied on 409 before backing off
LOCK_MARGIN = 10.0  # a pending record older than --helm-timeout plus this is a leftover
SHARED_PROBES = ("krypton-probe-a", "krypton-probe-b")  # two releases, two namespaces
ANNOUNCE_REQUEUE = 10.0  # backstop for the pass after an announcement (its watch event)
READINESS_POLL = 5.0  # seconds between looks at a workload being waited for, not watched
LOOKUPS = 8  # the needs a plan can have, each satisfied at most once per pass
# no Resumed with these
QUIET = {Action.NOTHING, Action.WAIT, Action.PAUSE, Action.UNINSTALL, Action.DROP_FINALIZER}
CHART_EVENTS = {"ChartNotLoaded": "ChartNotLoaded", "VersionNotFound": "ChartVersionNotFound",
                "VersionInvalid": "ChartVersionInvalid"}


Workload = list[tuple[ObjectRef, dict[str, Any] | None]]  # objects as read (None: not found)


@dataclass(kw_only=True)
class ClusterView:
    """What is needed to observe a Tenant on a cluster and decide about it, with nothing
    that writes: shared by the operator and ``krypton plan``."""

    name: str
    kube: Kube
    helm: Helm  # renders the chart (and, in a ClusterRuntime, installs it)
    chart: ChartSource
    settings: Settings
    releases: ReleaseIndex
    tenants: dict[tuple[str, str], dict[str, Any]]
    values: dict[str, Any] = field(default_factory=dict)
    # every discovered cluster's name; None until known
    known_clusters: Callable[[], set[str] | None] = lambda: None

    async def desired_chart(self) -> ChartTarget | ChartProblem:
        try:
            chart = await self.chart.get()
        except (VersionInvalid, VersionNotFound, ChartNotLoaded) as exc:
            return ChartProblem(exc.reason, str(exc))
        fp = fingerprint(chart.repo, chart.name, chart.version, self.values)
        return ChartTarget(chart.repo, chart.name, chart.version, self.values, fp, chart.path)

    async def shared_conflicts(self, chart: ChartTarget, release: str,
                               namespace: str) -> tuple[str, ...]:
        """The objects `chart` renders alike for every release (issue 12) that exist on the
        cluster and are not `release`'s: each as "<object> (owned by <owner>)". A kind the
        cluster does not serve, or a namespaced kind (looked for in the release's own
        namespace), finds nothing to conflict with."""
        found = []
        for ref in await self.chart.shared_objects(chart.fingerprint,
                                                   lambda: self._candidates(chart)):
            annotations = await self.kube.object_annotations(
                ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
            owner = None if annotations is None else \
                ownership.foreign_owner(annotations, release, namespace)
            if owner is not None:
                found.append(f"{ref} (owned by {owner})")
        return tuple(found)

    async def _candidates(self, chart: ChartTarget) -> tuple[ObjectRef, ...]:
        try:
            first, second = [await self._render(chart, probe) for probe in SHARED_PROBES]
        except HelmFailed as exc:
            # helm's install reports the same problem, with the Tenant's own failure reason
            structlog.get_logger("krypton.reconciler").info(
                "chart not rendered for the shared-objects check", error=str(exc))
            return ()
        return ownership.shared_candidates(first, second)

    async def _render(self, chart: ChartTarget, release: str) -> list[Any]:
        return await self.helm.template(chart.path, release, release, chart.values)

    async def decide(self, obj: dict[str, Any], rollout: RolloutGate | None = None, *,
                     add_finalizer: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
                     | None = None,
                     look: Callable[[Observation], Awaitable[Observation | None]] | None = None,
                     ) -> tuple[dict[str, Any], Observation, Plan]:
        """Observe and plan, for the operator and ``krypton plan`` alike. A plan that asks
        for a look at the cluster (the chart, the finalizer, the namespace, the shared
        objects, an in-sync release's workload) is a need, not an action: this one loop
        satisfies it and plans again, until the plan is an action. The operator passes the
        writes and reads only it makes (`add_finalizer`, `look`); without `add_finalizer`
        the finalizer is taken as added (a dry run plans what the pass after it would do)."""
        obs = self.observe(obj, rollout)
        key = obs.tenant.key
        release = release_name(key.name, self.name)
        namespace = self.settings.release_namespace_for(key.name)
        looked = False
        decided = plan(obs)
        for _ in range(LOOKUPS):
            if decided.action is Action.RESOLVE_CHART:
                obs = dataclasses.replace(obs, chart=await self.desired_chart())
            elif decided.action is Action.ADD_FINALIZER:
                if add_finalizer is not None:
                    obj = await add_finalizer(obj)
                    obs = dataclasses.replace(obs, tenant=tenant_view(obj, self.name))
                else:
                    obs = dataclasses.replace(obs, tenant=dataclasses.replace(
                        obs.tenant, has_finalizer=True))
            elif decided.action is Action.OBSERVE_NAMESPACE:
                state, owner = namespace_state(await self.kube.get_namespace(key.name), key)
                obs = dataclasses.replace(obs, namespace=state, namespace_owner=owner)
            elif decided.action is Action.OBSERVE_SHARED:
                assert isinstance(obs.chart, ChartTarget)
                obs = dataclasses.replace(obs, shared=await self.shared_conflicts(
                    obs.chart, release, namespace))
            elif decided.action is Action.SKIP and look is not None and not looked:
                looked = True
                seen = await look(obs)
                if seen is None:
                    break
                obs = seen
            else:
                break
            decided = plan(obs)
        return obj, obs, decided

    def tenant_with_uid(self, uid: str | None) -> str:
        """"<namespace>/<name>" of the Tenant with `uid` on this cluster, "" if none is."""
        for (namespace, name), obj in self.tenants.items():
            if obj["metadata"].get("uid") == uid:
                return f"{namespace}/{name}"
        return ""

    def observe(self, obj: dict[str, Any], rollout: RolloutGate | None = None) -> Observation:
        view = tenant_view(obj, self.name)
        applied = ((obj.get("status") or {}).get("clusters") or {}).get(self.name) or {}
        release = release_name(view.key.name, self.name)
        namespace = self.settings.release_namespace_for(view.key.name)
        own = self.settings.shared_release_namespace is None
        observed = self.releases.observe(namespace, release, now=time.time(),
                                         lock_timeout=self.settings.helm_timeout + LOCK_MARGIN)
        foreign = observed.owner_uid not in (None, view.uid)
        ours = None if foreign else self.releases.ours(namespace, release)
        if ours is not None and (view.applied_revision is None or ours[0] > view.applied_revision):
            # Our status write may not have reached the watch cache yet: a revision our own
            # helm run made, with the fingerprint it applied, is what is recorded, not drift.
            view = dataclasses.replace(view, applied_revision=ours[0],
                                       recorded_fingerprint=ours[1])
        return Observation(
            cluster=self.name,
            tenant=view,
            chart=None,
            release=observed,
            release_owner=self.tenant_with_uid(observed.owner_uid) if foreign else None,
            known_clusters=None if (known := self.known_clusters()) is None
            else frozenset(known),
            reserved_namespaces=self.settings.reserved_namespaces,
            adopt_namespaces=self.settings.adopt_namespaces,
            # with one shared release namespace there is no Tenant namespace to look after
            own_namespace=own,
            namespace=NamespaceState.UNKNOWN if own else NamespaceState.OWNED,
            rollout=rollout or RolloutGate(),
            since_applied=_since(applied.get("lastAppliedTime")),
            readiness_timeout=self.settings.helm_timeout,
            retry_wait=_until(applied.get("nextAttemptTime")),
            max_retries=self.settings.max_retries,
        )


@dataclass(kw_only=True)
class ClusterRuntime(ClusterView):
    """A cluster view plus what a reconcile acts with."""

    recorder: EventRecorder
    slots: FairSlots
    published: dict[TenantKey, tuple[str, ...]] = field(default_factory=dict)
    # per Tenant: (the status last written, the status the server stored), both without
    # timestamps; they differ when the served CRD prunes fields (an older CRD)
    written: dict[TenantKey, tuple[Any, Any]] = field(default_factory=dict)
    gate: Callable[[str], RolloutGate] = lambda _cluster: RolloutGate()
    readiness: Readiness | None = None  # follows workloads helm did not wait for
    fence: Callable[[], bool] = lambda: True  # not draining, leadership held and fresh
    looked_at: dict[TenantKey, float] = field(default_factory=dict)  # monotonic time
    gone: dict[TenantKey, tuple[str, ...]] = field(default_factory=dict)  # missing objects
    crds_applied: set[str] = field(default_factory=set)  # chart versions whose crds/ are applied
    crds_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    phases: frozenset[str] | None = None  # the served CRD's phase enum; None: any phase

    async def _render(self, chart: ChartTarget, release: str) -> list[Any]:
        async with self.slots.slot(self.name):  # a helm process like any other (--max-concurrent-helm)
            return await super()._render(chart, release)


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
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    progress = conditions.get(cond.cluster_type(cond.PROGRESS, cluster))
    if progress is not None and progress.get("status") != "True":
        progress = None
    ready = conditions.get(cond.cluster_type(cond.READY, cluster))
    error = conditions.get(cond.cluster_type(cond.ERROR, cluster))
    if error is not None and error.get("status") != "True":
        error = None
    failures = applied.get("failures")
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
        recorded_version=applied.get("chartVersion") or None,
        failed_fingerprint=applied.get("failedFingerprint") or None,
        reverted_fingerprint=applied.get("revertedFingerprint") or None,
        progress=(str(progress.get("reason")), str(progress.get("message")))
        if progress else None,
        readiness=(ready.get("status") == "True", str(ready.get("reason")))
        if ready else None,
        error=(str(error.get("reason")), str(error.get("message"))) if error else None,
        annotations=dict(annotations),
        failures=failures if isinstance(failures, int) else 0,
        failed_target=str(applied.get("failedTarget") or ""),
        retry_token=str(annotations.get(RETRY_ANNOTATION, "")),
    )


def _until(text: Any) -> float:
    """Seconds until the RFC 3339 time `text` (0 when it is past or not a time)."""
    when = epoch_seconds(text)
    return 0.0 if when is None else max(0.0, when - time.time())


def _since(text: Any) -> float | None:
    """Seconds since the RFC 3339 time `text` (None when it is not one)."""
    when = epoch_seconds(text)
    return None if when is None else max(0.0, time.time() - when)


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


@dataclass
class Pass:
    """One reconcile pass of one Tenant: what was observed and decided, and the Tenant object
    as last read or written (its resourceVersion is the precondition of the next write)."""

    obj: dict[str, Any]
    obs: Observation
    plan: Plan
    release: str
    log: Any
    changes: list[Change] = field(default_factory=list)  # made by the pass itself (Resumed)

    @property
    def key(self) -> TenantKey:
        return self.obs.tenant.key

    @property
    def chart(self) -> ChartTarget:
        assert isinstance(self.obs.chart, ChartTarget)
        return self.obs.chart


@dataclass
class Report:
    """What a pass reports: the condition changes and the ``status.clusters`` record written
    in the pass's one status patch at its end, the Event that goes with that patch (only
    when the status changed), Events that go out whether or not it changed, and how the
    work queue treats the key next."""

    changes: list[Change] = field(default_factory=list)
    applied: dict[str, Any] | None = None
    last_chart: str | None = None  # repo|name|version applied
    chart_version: str | None = None  # the version a failed helm run tried
    event: tuple[str, str, str] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    outcome: Outcome = Outcome()


Action_ = Callable[[Pass], Awaitable[Report]]


class Reconciler:
    """observe -> decide (``planner.plan``) -> one action -> one status write.

    Each action is one small method below, named after the planner's Action; each returns a
    :class:`Report` and writes no status itself."""

    def __init__(self, rt: ClusterRuntime) -> None:
        self.rt = rt
        self.log = structlog.get_logger("krypton.reconciler").bind(cluster=rt.name)
        self.actions: dict[Action, Action_] = {
            Action.NOTHING: self._nothing, Action.WAIT: self._wait, Action.PAUSE: self._pause,
            Action.NOT_TARGETED: self._not_targeted, Action.BLOCKED: self._blocked,
            Action.HOLD: self._hold, Action.SKIP: self._skip, Action.ANNOTATE: self._annotate,
            Action.REVERT: self._revert, Action.AWAIT_READY: self._await_ready,
            Action.UNHEALTHY: self._unhealthy, Action.BACKOFF: self._backoff,
            Action.STALLED: self._stalled,
            **{a: self._helm for a in (Action.INSTALL, Action.UPGRADE,
                                       Action.UNINSTALL_THEN_INSTALL, Action.ROLLBACK_THEN_UPGRADE)},
        }

    async def reconcile(self, key: TenantKey) -> Outcome:
        obj = self.rt.tenants.get((key.namespace, key.name))
        if obj is None:
            return Outcome()
        p = await self._decide(obj)
        p.log.debug("planned", action=p.plan.action.value, reason=p.plan.reason)
        if p.plan.action is Action.UNINSTALL:
            return await self._uninstall(p)  # ends with the finalizer, not with a status
        if p.plan.action is Action.DROP_FINALIZER:
            return await self._drop_finalizer(p)
        if p.plan.action not in QUIET and _has_condition(p.obj, cond.PAUSED):
            p.changes.append(Change(cond.PAUSED, False, "Resumed", "reconciliation active"))
        try:
            report = await self.actions[p.plan.action](p)
        except (Fenced, Conflict):
            raise  # nothing may be written (fenced), or the Tenant moved on: a new pass
        except KryptonError as exc:
            report = self._raised(p, exc)
        changes = p.changes + report.changes
        if changes or report.applied is not None:
            p.obj, _ = await self._commit(p.obj, changes, p.log, event=report.event,
                                          applied=report.applied, last_chart=report.last_chart,
                                          chart_version=report.chart_version)
        for event in report.events:
            await self.rt.recorder.emit(involved_tenant(p.obj), *event)
        return report.outcome

    async def _decide(self, obj: dict[str, Any]) -> Pass:
        obj, obs, decided = await self.rt.decide(obj, self.rt.gate(self.rt.name),
                                                 add_finalizer=self._add_finalizer,
                                                 look=self._look_in_sync)
        key = obs.tenant.key
        release = release_name(key.name, self.rt.name)
        return Pass(obj, obs, decided, release,
                    self.log.bind(tenant=str(key), release=release))

    async def _look_in_sync(self, obs: Observation) -> Observation | None:
        """An in-sync release's objects and workload, when a look is due (F2, F6): the
        observation with what was found, None when nothing was looked at or found."""
        key = obs.tenant.key
        missing, found = self.rt.gone.get(key) or (), None
        if not missing and self._look_due(key, obs.tenant):
            found = self.rt.readiness.health(key) if self.rt.readiness else None
            if found is not None:  # the watches keep its workload current: no reads
                self._follow(key, None, found)
            else:
                missing, found = await self._look(
                    key, release_name(key.name, self.rt.name),
                    self.rt.settings.release_namespace_for(key.name), obs.release.revision)
        if missing:
            # remembered until a helm run restores them: the pass that announces the
            # upgrade and the one that makes it both see them
            self.rt.gone[key] = missing
        if not missing and found is None:
            return None
        return dataclasses.replace(obs, missing=missing, health=found)

    def _look_due(self, key: TenantKey, t: TenantView) -> bool:
        """Every pass while the release is not Ready on this cluster (its workload is being
        waited for, timed out or degraded); else once per --resync-period per Tenant (the
        first one a period after it is first seen, so that a start does not look at every
        object of the fleet at once)."""
        if t.readiness is None or not t.readiness[0]:
            return True
        now = time.monotonic()
        last = self.rt.looked_at.setdefault(key, now)
        if now - last < self.rt.settings.resync_period:
            return False
        self.rt.looked_at[key] = now
        return True

    async def _look(self, key: TenantKey, release: str, namespace: str,
                    revision: int) -> tuple[tuple[str, ...], Health | None]:
        """The deployed revision's manifest (read from its release record, without helm),
        looked at on the cluster: the objects that are gone (with --drift-detection=repair)
        and the health of its workload. One read per object; a workload that is not ready is
        followed by the watches from then on."""
        driver = self.rt.settings.helm_driver
        record = await self.rt.kube.release_record(driver, namespace,
                                                   f"sh.helm.release.v1.{release}.v{revision}")
        if record is None:
            return (), None  # the release changed meanwhile: its watch brings the key back
        try:
            manifest = str(decode_release(record, driver).get("manifest") or "")
        except ValueError as exc:
            self.log.warning("release manifest not readable; objects not checked",
                             release=release, error=str(exc))
            return (), None
        gone, workload = await self._look_at_manifest(release, namespace, manifest)
        return gone, self._judge(key, workload)

    async def _look_at_manifest(self, release: str, namespace: str, manifest: str, *,
                                workload_only: bool = False
                                ) -> tuple[tuple[str, ...], Workload | None]:
        try:
            docs = safeyaml.load_all(manifest, safeyaml.CHART_CRDS, what=f"manifest of {release}")
        except safeyaml.YamlRejected as exc:
            self.log.warning("release manifest not readable; objects not checked",
                             release=release, error=str(exc))
            return (), None
        refs = ownership.manifest_objects(docs)
        if workload_only:
            refs = health.workload_refs(refs)
        gone, workload = [], []
        for ref in refs:
            obj = await self.rt.kube.get_object(ref.api_version, ref.kind, ref.name,
                                                ref.namespace or namespace)
            if obj is None:
                gone.append(str(ref))
            if ref.kind in health.WORKLOAD_KINDS:  # namespaced kinds, named where they are
                workload.append((dataclasses.replace(ref, namespace=ref.namespace or namespace),
                                 obj))
        repair = self.rt.settings.drift_detection != "off"
        return (tuple(gone) if repair else ()), workload

    def _judge(self, key: TenantKey, workload: Workload | None) -> Health | None:
        """The health of the workload objects just read (None: not looked at), which are
        followed from now on if they are not ready."""
        if workload is None:
            return None
        found = health.release_health(workload)
        self._follow(key, workload, found)
        return found

    def _follow(self, key: TenantKey, workload: Workload | None, found: Health | None) -> None:
        """A workload that is not ready is followed by the cluster's watches (its objects as
        just read), one that is ready no longer."""
        if self.rt.readiness is None or found is None:
            return
        if found.ready:
            self.rt.readiness.forget(key)
        elif workload is not None:
            self.rt.readiness.follow(key, workload)

    async def _not_ready(self, key: TenantKey, release: str, namespace: str,
                         manifest: str) -> Health | None:
        """The health of a release helm applied without waiting, from the manifest it
        returned; None when every workload object is ready (or there is none)."""
        try:
            _gone, workload = await self._look_at_manifest(release, namespace, manifest,
                                                           workload_only=True)
        except TemporaryError as exc:  # the next pass looks again
            return Health((f"workload not looked at yet ({exc})",))
        found = self._judge(key, workload)
        return None if found is None or found.ready else found

    def _readiness_requeue(self, key: TenantKey, since_applied: float | None) -> float:
        """When to look again at a workload being waited for: when it would time out if its
        objects are watched (a change that makes it ready wakes it sooner), else soon."""
        if self.rt.readiness is None or self.rt.readiness.health(key) is None:
            return READINESS_POLL
        left = self.rt.settings.helm_timeout - (since_applied or 0.0)
        return max(READINESS_POLL, left + 1.0)

    def _labels(self, p: Pass) -> dict[str, str]:
        """The labels a helm run puts on the release record: whose it is, for which cluster."""
        labels = {RELEASE_CLUSTER_LABEL: self.rt.name}
        if p.obs.tenant.uid:
            labels[RELEASE_OWNER_LABEL] = p.obs.tenant.uid
        return labels

    def _namespace(self, p: Pass) -> str:
        return self.rt.settings.release_namespace_for(p.key.name)

    def _type(self, kind: str) -> str:
        return cond.cluster_type(kind, self.rt.name)

    # -- actions ---------------------------------------------------------------------------

    async def _nothing(self, _p: Pass) -> Report:
        return Report()

    async def _wait(self, p: Pass) -> Report:
        """Another helm operation holds the release: retry later, write nothing."""
        p.log.info("release busy, waiting", detail=p.plan.message)
        return Report(outcome=Outcome(retry=True, reason=p.plan.reason))

    async def _pause(self, p: Pass) -> Report:
        return Report([Change(cond.PAUSED, True, "Paused", p.plan.message)])

    async def _not_targeted(self, p: Pass) -> Report:
        """Another cluster's Tenant; a Warning when that cluster is not discovered at all."""
        unknown = p.plan.reason == "UnknownCluster"
        return Report([Change(self._type(cond.PROGRESS), False, p.plan.reason, p.plan.message)],
                      event=("Warning" if unknown else "Normal", p.plan.reason, p.plan.message))

    async def _backoff(self, p: Pass) -> Report:
        """The target failed before and its next attempt is not due (R18): the status
        already says so; nothing is written, the key comes back when the attempt is due."""
        p.log.debug("helm run waits for its next attempt", detail=p.plan.message)
        return Report(outcome=Outcome(requeue_after=p.obs.retry_wait + 0.5, reason=p.plan.reason))

    async def _stalled(self, p: Pass) -> Report:
        """More failures of the target than --max-retries: no helm run until it changes or a
        retry is asked for. Said once (the status is only written when it differs)."""
        reason, message = p.plan.reason, p.plan.message
        return Report([Change(self._type(cond.ERROR), True, reason, message),
                       Change(self._type(cond.READY), False, reason, message),
                       Change(self._type(cond.PROGRESS), False, reason, message)],
                      event=("Warning", reason, message), outcome=Outcome(reason=reason))

    def _raised(self, p: Pass, exc: KryptonError) -> Report:
        """An action that raised instead of reporting (an API error, a namespace that turned
        out not to be the Tenant's): the status says so, in the pass's one write, instead of
        keeping what the pass announced. A permanent error waits for a change of the input;
        a temporary one is retried with the work queue's backoff. No helm run failed, so the
        retry record is not touched."""
        reason, message = exc.reason, str(exc)
        p.log.warning("pass failed", reason=reason, error=message)
        metrics.RECONCILE_ERRORS.labels(self.rt.name, reason).inc()
        permanent = isinstance(exc, PermanentError)
        return Report([Change(self._type(cond.ERROR), True, reason, message),
                       Change(self._type(cond.PROGRESS), False, reason, message)],
                      event=("Warning", reason, message),
                      outcome=Outcome(retry=not permanent, reason=reason))

    def _failed(self, p: Pass, verb: str, exc: KryptonError) -> Report:
        """A helm run of the pass's target failed: count it against the target in the
        Tenant's status, with when the next attempt is due (R18); past --max-retries the
        release is stalled (RetriesExhausted, a Warning Event)."""
        t, chart, settings = p.obs.tenant, p.chart, self.rt.settings
        target = attempt_target(chart.fingerprint, t)
        failures = (t.failures if t.failed_target == target else 0) + 1
        delay = retry.helm_failure(settings.retry_backoff_max).delay(failures)
        now = time.time()
        reason = exc.reason if isinstance(exc, (OwnershipConflict, FieldConflict)) \
            else f"{verb}Failed"
        message, event = str(exc), ("Warning", f"Helm{verb}Failed", str(exc))
        outcome = Outcome(requeue_after=delay, reason=reason)
        p.log.error(f"helm {verb.lower()} failed", error=message, failures=failures,
                    retry_in=round(delay, 1))
        metrics.RECONCILE_ERRORS.labels(self.rt.name, reason).inc()
        if failures > settings.max_retries:
            reason = "RetriesExhausted"
            message = stalled_message(failures, chart.version, message, self.rt.name, t)
            event, outcome = ("Warning", reason, message), Outcome(reason=reason)
            p.log.error("release stalled", failures=failures)
        report = Report([Change(self._type(cond.ERROR), True, reason, message),
                         Change(self._type(cond.READY), False, reason, message),
                         Change(self._type(cond.PROGRESS), False, reason, message)],
                        applied={"failedFingerprint": chart.fingerprint, "failures": failures,
                                 "failedTarget": target, "lastFailureTime": rfc3339(now),
                                 "nextAttemptTime": rfc3339(now + delay)},
                        chart_version=chart.version, event=event, outcome=outcome)
        if reason == "RetriesExhausted":  # the run's own failure is an Event too
            report.events.append(("Warning", f"Helm{verb}Failed", str(exc)))
        return report

    async def _hold(self, p: Pass) -> Report:
        """The rollout gate keeps this cluster on its version (F1): say why, start nothing."""
        return Report([Change(self._type(cond.PROGRESS), False, p.plan.reason, p.plan.message)],
                      outcome=Outcome(reason=p.plan.reason))

    async def _blocked(self, p: Pass) -> Report:
        """Input that cannot be acted on (a chart problem, a name, a namespace)."""
        reason, message = p.plan.reason, p.plan.message
        metrics.RECONCILE_ERRORS.labels(self.rt.name, reason).inc()
        report = Report([Change(self._type(cond.ERROR), True, reason, message),
                         Change(self._type(cond.PROGRESS), False, reason, message)],
                        event=("Warning", CHART_EVENTS.get(reason, reason), message),
                        outcome=Outcome(retry=True, reason=reason))
        if p.plan.permanent:
            p.log.warning("tenant blocked", reason=reason, detail=message)
            report.outcome = Outcome(reason=reason)
            return report
        p.log.warning("chart not available", reason=reason, detail=message)
        if reason in CHART_EVENTS and self.rt.settings.allow_chart_skip:
            report.outcome = Outcome(requeue_after=CHART_SKIP_REQUEUE, reason=reason)
        return report

    async def _skip(self, p: Pass) -> Report:
        """In sync: nothing to do but make sure the record says so (it also completes the
        record of a pass whose last status write was lost, and marks a workload that became
        ready after it was waited for, timed out or degraded)."""
        self._publish(p.key, p.release, p.chart)
        event = "HelmSkip" if p.plan.reason == "NoChange" else p.plan.reason
        return Report(self._success_changes(p.obj, p.plan.reason, p.plan.message,
                                            keep_ready=True),
                      applied={"release": p.release, "chartVersion": p.chart.version,
                               "fingerprint": p.chart.fingerprint,
                               "revision": p.obs.release.revision},
                      last_chart=p.chart.ref, event=("Normal", event, p.plan.message))

    async def _await_ready(self, p: Pass) -> Report:
        """Applied, its workload not ready yet, within --helm-timeout of the helm run: say
        what is not ready and look again soon (no helm process is held meanwhile)."""
        reason, message = p.plan.reason, p.plan.message
        again = self._readiness_requeue(p.key, p.obs.since_applied)
        return Report([Change(self._type(cond.READY), False, reason, message),
                       Change(self._type(cond.PROGRESS), True, reason, message)],
                      outcome=Outcome(requeue_after=again, reason=reason))

    async def _unhealthy(self, p: Pass) -> Report:
        """The workload is not ready: past --helm-timeout after the helm run that applied it
        (ReadinessTimeout), or no longer ready (Degraded). An error of this cluster, named
        objects and all; looked at again with backoff, and Ready again once it is."""
        reason, message = p.plan.reason, p.plan.message
        metrics.RECONCILE_ERRORS.labels(self.rt.name, reason).inc()
        p.log.warning("workload not ready", reason=reason, detail=message)
        return Report([Change(self._type(cond.READY), False, reason, message),
                       Change(self._type(cond.ERROR), True, reason, message),
                       Change(self._type(cond.PROGRESS), False, reason, message)],
                      event=("Warning", reason, message),
                      outcome=Outcome(retry=True, reason=reason))

    async def _annotate(self, p: Pass) -> Report:
        """The release is deployed as recorded; only the fingerprint annotation is missing or
        wrong (a failed write, or removed by hand). Write it; never run helm for it."""
        p.obj = await self._set_fingerprint(p.obj, p.chart.fingerprint, p.log)  # raises on failure
        self._publish(p.key, p.release, p.chart)
        report = Report(self._success_changes(p.obj, "NoChange", p.plan.message, keep_ready=True))
        if p.plan.drift:
            p.log.info("drift repaired", detail=p.plan.message)
            report.events.append(("Normal", "DriftRepaired", f"{p.plan.message}: restored"))
        return report

    async def _revert(self, p: Pass) -> Report:
        """Roll a release that failed on a halted rollout's target back to the last revision
        krypton applied (--rollout-auto-revert). Runs from the work queue like any helm
        action, so never beside a retry of the same release. When helm's rollback trips over
        what the failed upgrade left, the last good chart version is applied again."""
        t, chart, namespace = p.obs.tenant, p.chart, self._namespace(p)
        good = t.applied_revision or 0  # set: the planner reverts only to a recorded revision
        fp = t.recorded_fingerprint or t.applied_fingerprint or ""
        try:
            async with self.rt.slots.slot(self.rt.name):
                fenced(self.rt)
                try:
                    revision = await self.rt.helm.rollback(p.release, namespace, good)
                    how = f"rolled back to revision {good}"
                except HelmFailed as exc:
                    if not t.recorded_version:
                        raise
                    p.log.warning("helm rollback failed, re-applying the last good chart",
                                  error=str(exc))
                    old = await self.rt.chart.fetch(t.recorded_version)
                    fenced(self.rt)
                    result = await self.rt.helm.install_or_upgrade(
                        p.release, old.path, namespace, chart.values, operation="revert",
                        skip_crds=True, labels=self._labels(p))
                    revision = int(result.get("version") or 0)
                    fp = fingerprint(old.repo, old.name, old.version, chart.values)
                    how = f"chart {old.version} applied again"
        except ReleaseLocked as exc:
            p.log.info("release busy, waiting", detail=str(exc))
            return Report(outcome=Outcome(retry=True, reason=exc.reason))
        except (HelmFailed, TemporaryError) as exc:
            message = f"rolling back after chart {chart.version} failed: {exc}"
            p.log.error("rollout revert failed", error=str(exc))
            metrics.RECONCILE_ERRORS.labels(self.rt.name, "RevertFailed").inc()
            return Report([Change(self._type(cond.ERROR), True, "RevertFailed", message)],
                          event=("Warning", "RolloutRevertFailed", message),
                          outcome=Outcome(retry=True, reason="RevertFailed"))
        self.rt.releases.note(namespace, p.release, revision, ReleaseStatus.DEPLOYED, fp,
                              p.obs.tenant.uid)
        p.obj = await self._set_fingerprint(p.obj, fp, p.log)
        message = (f"chart {chart.version} failed and the rollout halted: {how} "
                   f"(revision {revision}, chart {t.recorded_version})")
        p.log.info("rollout reverted", revision=revision, detail=how)
        return Report([Change(self._type(cond.READY), True, "RolledBack", message),
                       Change(self._type(cond.ERROR), False, "RolledBack", "no error"),
                       Change(self._type(cond.PROGRESS), False, "RolloutHalted", message)],
                      applied={"revision": revision, "fingerprint": fp,
                               "revertedFingerprint": chart.fingerprint,
                               "lastAppliedTime": now_rfc3339()},
                      event=("Normal", "RolloutReverted", message))

    async def _helm(self, p: Pass) -> Report:
        """Install or upgrade (after uninstalling or rolling back what an interrupted run
        left). Announced first: the pass that decides a helm run writes the progress
        condition and its Event, and the pass that follows it (the status write is its
        cause) runs helm, so that the Tenant says what is under way while helm waits."""
        chart, key, c = p.chart, p.key, self.rt.name
        installing = p.plan.action in INSTALLING
        verb = "Install" if installing else "Upgrade"
        fenced(self.rt)
        if not announced(p.obs, p.plan):
            await self._ensure_namespace(key, p.obs.namespace)
            p.obj, wrote = await self._commit(
                p.obj, [*p.changes, Change(self._type(cond.PROGRESS), True, p.plan.reason,
                                           p.plan.message)],
                p.log, event=("Normal", f"Helm{verb}Start", p.plan.message))
            p.changes = []
            if wrote:
                # The write's watch event brings the key back; the requeue only covers a
                # watch that is down.
                return Report(outcome=Outcome(requeue_after=ANNOUNCE_REQUEUE))
        try:
            await self._apply_chart_crds(chart, p.log)
        except KryptonError as exc:
            message = f"applying the CRDs of chart {chart.version}'s crds/ failed: {exc}"
            p.log.error("chart CRDs not applied", error=str(exc))
            metrics.RECONCILE_ERRORS.labels(c, "ChartCRDsFailed").inc()
            return Report([Change(self._type(cond.ERROR), True, "ChartCRDsFailed", message),
                           Change(self._type(cond.PROGRESS), False, "ChartCRDsFailed", message)],
                          event=("Warning", "ChartCRDsFailed", message),
                          outcome=Outcome(retry=True, reason="ChartCRDsFailed"))
        p.log.info(f"helm {verb.lower()} start", chart_version=chart.version,
                   action=p.plan.action.value)
        namespace = self._namespace(p)
        try:
            async with self.rt.slots.slot(c):
                fenced(self.rt)  # waiting for the slot may have outlasted the Lease
                if p.plan.action is Action.UNINSTALL_THEN_INSTALL and \
                        p.obs.release.status is not ReleaseStatus.ABSENT:
                    await self._check_ownership(p.release, namespace)
                    await self.rt.helm.uninstall(p.release, namespace)
                elif p.plan.action is Action.ROLLBACK_THEN_UPGRADE:
                    await self.rt.helm.rollback(p.release, namespace)
                result, taken = await self._apply(p, verb, namespace)
        except ReleaseLocked as exc:
            # Another helm operation holds the release (it took the lock after this pass
            # looked): nothing failed, so no failedFingerprint, and a progressive rollout
            # never counts it as a failed release. Retried with backoff, like a planned wait.
            p.log.info("release busy, waiting", detail=str(exc))
            return Report(outcome=Outcome(retry=True, reason=exc.reason))
        except HelmFailed as exc:
            return self._failed(p, verb, exc)
        events = [] if taken is None else [("Normal", "FieldsTakenOver", taken)]
        revision = int(result.get("version") or 0)
        self.rt.releases.note(namespace, p.release, revision,
                              ReleaseStatus.parse((result.get("info") or {}).get("status")),
                              chart.fingerprint, p.obs.tenant.uid)
        done = "Installed" if installing else "Upgraded"
        message = f"chart {chart.name} {chart.version} {done.lower()} as {p.release} revision {revision}"
        p.log.info(f"helm {verb.lower()} success", chart_version=chart.version, revision=revision)
        applied = {"release": p.release, "chartVersion": chart.version,
                   "fingerprint": chart.fingerprint, "revision": revision,
                   "failedFingerprint": "", "revertedFingerprint": "", "failures": 0,
                   "failedTarget": "", "lastAppliedTime": now_rfc3339()}
        try:
            p.obj = await self._set_fingerprint(p.obj, chart.fingerprint, p.log)
        except KryptonError as exc:
            # The release is right; the record of it is not. Keep what was applied so the next
            # pass only retries the annotation (with backoff), never helm.
            message = f"{message}; writing the fingerprint annotation failed: {exc}"
            metrics.RECONCILE_ERRORS.labels(c, "FingerprintUpdateFailed").inc()
            return Report([
                Change(self._type(cond.ERROR), True, "FingerprintUpdateFailed", message),
                Change(self._type(cond.PROGRESS), False, f"{verb}Complete", message),
            ], applied=applied, last_chart=chart.ref,
                outcome=Outcome(retry=True, reason="FingerprintUpdateFailed"))
        self._publish(key, p.release, chart)
        self.rt.gone.pop(key, None)
        waiting = None if self.rt.settings.helm_wait else await self._not_ready(
            key, p.release, namespace, str(result.get("manifest") or ""))
        if waiting is not None:
            # helm did not wait: the workload is tracked by the passes that follow (F6)
            wait = f"{message}; waiting for {waiting.summary()}"
            return Report([Change(self._type(cond.READY), False, "WaitingForReadiness", wait),
                           Change(self._type(cond.ERROR), False, done, "no error"),
                           Change(self._type(cond.PROGRESS), True, "WaitingForReadiness", wait)],
                          applied=applied, last_chart=chart.ref,
                          event=("Normal", f"Helm{done}", wait),
                          outcome=Outcome(requeue_after=self._readiness_requeue(key, 0.0),
                                          reason="WaitingForReadiness"))
        report = Report([Change(self._type(cond.READY), True, done, message),
                         Change(self._type(cond.ERROR), False, done, "no error"),
                         Change(self._type(cond.PROGRESS), False, f"{verb}Complete", message)],
                        applied=applied, last_chart=chart.ref,
                        event=("Normal", f"Helm{done}", message))
        if p.plan.drift:
            p.log.info("drift repaired", detail=p.plan.message)
            report.events.append(("Normal", "DriftRepaired", f"{p.plan.message}; now {message}"))
        report.events += events
        return report

    async def _apply(self, p: Pass, verb: str, namespace: str
                     ) -> tuple[dict[str, Any], str | None]:
        """``helm upgrade --install`` of the pass's chart; with Helm 4, fields other field
        managers own are taken over under --helm-force-conflicts (the default, as Flux and
        Sveltos do on every upgrade) by a second run with --force-conflicts, and what was
        taken over is returned for an Event; without it the run fails with FieldConflict,
        naming them and the way out (SPEC H2)."""
        chart = p.chart
        run = functools.partial(self.rt.helm.install_or_upgrade, p.release, chart.path,
                                namespace, chart.values, operation=verb.lower(), skip_crds=True,
                                labels=self._labels(p))
        try:
            return await run(), None
        except FieldConflict as exc:
            if not self.rt.settings.helm_force_conflicts:
                raise FieldConflict(
                    f"{exc}; krypton does not take them over (--helm-force-conflicts=false): "
                    "give the fields back (e.g. kubectl apply --server-side of the release's "
                    "values for them, or remove them from the other manager) or let krypton "
                    "take them (--helm-force-conflicts=true), then krypton retry",
                    exc.conflicts) from exc
            found = [fields.Conflict(*c) for c in exc.conflicts]
            taken = (f"took over {len(found)} field(s) that other field managers owned: "
                     f"{fields.describe(found)}")
            p.log.warning("taking over fields of other managers", detail=str(exc))
            fenced(self.rt)
            return await run(force_conflicts=True), taken

    async def _apply_chart_crds(self, chart: ChartTarget, log: Any) -> None:
        """The chart's crds/ under --chart-crds, once per cluster and chart version, before
        any release of that version (helm itself runs with --skip-crds)."""
        policy = self.rt.settings.chart_crds
        if policy == "skip" or chart.version in self.rt.crds_applied:
            return
        async with self.rt.crds_lock:
            if chart.version in self.rt.crds_applied:
                return
            for crd in read_chart_crds(chart.path):
                name = crd["metadata"]["name"]
                live = await self.rt.kube.crd(name)
                action = chartcrds.crd_action(policy, live, crd)
                if action == "create":
                    try:
                        await self.rt.kube.create_crd(crd)
                    except AlreadyExists:
                        continue  # created meanwhile by someone else: theirs
                elif action == "replace":
                    assert live is not None
                    await self.rt.kube.replace_crd(crd, live["metadata"]["resourceVersion"])
                else:
                    continue
                metrics.API_WRITES.labels(self.rt.name, "crd").inc()
                log.info("chart CRD applied", crd=name, action=action,
                         chart_version=chart.version)
            self.rt.crds_applied.add(chart.version)

    def _success_changes(self, obj: dict[str, Any], reason: str, message: str,
                         *, keep_ready: bool = False) -> list[Change]:
        out = []
        ready_type = self._type(cond.READY)
        if not (keep_ready and _condition_true(obj, ready_type)):
            out.append(Change(ready_type, True, reason, message))
        error_type = self._type(cond.ERROR)
        if not keep_ready or _condition_true(obj, error_type) or not _has_condition(obj, error_type):
            out.append(Change(error_type, False, reason, "no error"))
        if _condition_true(obj, self._type(cond.PROGRESS)):
            out.append(Change(self._type(cond.PROGRESS), False, reason, message))
        return out

    async def _check_ownership(self, release: str, namespace: str, *,
                               why: str = "failed and cannot be recovered by uninstalling it"
                               ) -> None:
        """Refuse to uninstall a release whose manifest lists objects that another release
        (or nobody) owns now: helm would delete them (SPEC R17). Objects the manifest marks
        ``helm.sh/resource-policy: keep`` are left by helm and need no check."""
        live = {}
        docs = await self.rt.helm.manifest(release, namespace)
        for ref in ownership.manifest_objects(d for d in docs if not ownership.kept(d)):
            annotations = await self.rt.kube.object_annotations(
                ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
            if annotations is not None:
                live[ref] = annotations
        found = ownership.conflicts(live, release, namespace)
        if found:
            raise OwnershipConflict(
                f"release {release} {why} without deleting objects it does not own: "
                f"{'; '.join(found[:5])}"
                + (f" (and {len(found) - 5} more)" if len(found) > 5 else ""))

    async def _uninstall(self, p: Pass) -> Outcome:
        obj, release, log, key = p.obj, p.release, p.log, p.key
        involved = involved_tenant(obj)
        namespace = self.rt.settings.release_namespace_for(key.name)
        try:
            async with self.rt.slots.slot(self.rt.name):
                fenced(self.rt)
                if p.obs.release.status not in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED):
                    await self._check_ownership(release, namespace,
                                                why="is not uninstalled (the finalizer stays)")
                await self.rt.helm.uninstall(release, namespace)
            if self.rt.readiness is not None:
                self.rt.readiness.forget(key)
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
        return await self._remove_finalizer(obj)

    async def _drop_finalizer(self, p: Pass) -> Outcome:
        """A Tenant being deleted whose release is another Tenant's (issue 25.2): the
        release stays as it is, the finalizer goes, and an Event says why."""
        p.log.warning("release not uninstalled: not this Tenant's", detail=p.plan.message)
        self.unpublish(p.key)
        await self.rt.recorder.emit(involved_tenant(p.obj), "Warning", p.plan.reason,
                                    p.plan.message)
        return await self._remove_finalizer(p.obj)

    async def _remove_finalizer(self, obj: dict[str, Any]) -> Outcome:
        meta = obj["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        try:
            await self._patch_meta(TenantKey(meta["namespace"], meta["name"]), {"metadata": {
                "finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}})
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
        phase = cond.servable(phase, self.rt.phases)
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
        if self.rt.readiness is not None:
            self.rt.readiness.forget(key)
        self.rt.written.pop(key, None)
        self.rt.looked_at.pop(key, None)
        self.rt.gone.pop(key, None)
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
                      last_chart: str | None = None,
                      chart_version: str | None = None) -> tuple[dict[str, Any], bool]:
        """Patch the status if it changed (retrying on conflicts), then emit `event` if so.
        Returns the Tenant as the server now has it and whether it was written."""
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
            phase = cond.servable(phase, self.rt.phases)
            new = dict(status, phase=phase, conditions=conditions, observedGeneration=generation)
            if applied is not None:
                previous = (status.get("clusters") or {}).get(self.rt.name) or {}
                new["clusters"] = dict(status.get("clusters") or {},
                                       **{self.rt.name: dict(previous, **applied)})
            if last_chart is not None:
                new["lastAppliedChart"] = last_chart
                new["chartVersion"] = last_chart.rsplit("|", 1)[-1]
            elif chart_version is not None:
                new["chartVersion"] = chart_version
            if _same_status(status, new) or self._stored_as_before(key, status, new):
                return obj, False
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
                    return obj, False
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
            return updated, True
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
