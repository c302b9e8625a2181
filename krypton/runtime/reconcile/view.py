"""What a reconcile sees of one cluster and decides there. :class:`ClusterView` observes a
Tenant and plans, satisfying the planner's needs in one loop (:meth:`ClusterView.decide`):
shared by the operator and ``krypton plan``. :class:`ClusterRuntime` adds what a reconcile
acts with (events, helm slots, the fence, the caches of what it wrote and followed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource
from krypton.adapters.events import EventRecorder
from krypton.adapters.helm import HelmEngine
from krypton.adapters.kube import Kube
from krypton.decisions import conditions as cond
from krypton.decisions import crd, retry
from krypton.decisions.charts import ownership
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import ChartNotLoaded, Fenced, HelmFailed, VersionInvalid, VersionNotFound
from krypton.decisions.model import (
    ChartProblem,
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseStatus,
    RolloutGate,
    TenantKey,
    TenantView,
    release_name,
    rfc3339,
)
from krypton.decisions.planner import Action, Need, Plan, admission, plan
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.settings import Settings
from krypton.decisions.trust import writers
from krypton.decisions.trust.records import Keys
from krypton.decisions.windows import Window
from krypton.runtime.readiness import Readiness
from krypton.runtime.reconcile.memory import Memory, OwnWrites
from krypton.runtime.reconcile.model import _since, _until, namespace_state, tenant_view
from krypton.runtime.slots import FairSlots

LOCK_MARGIN = 10.0  # a pending record older than --helm-timeout plus this is a leftover
SHARED_PROBES = ("krypton-probe-a", "krypton-probe-b")  # two releases, two namespaces
LOOKUPS = 8  # the needs a plan can have, each satisfied at most once per pass


async def _unguarded() -> float:
    return 0.0


async def _inactive(_writer: str, _written: float) -> float:
    return 0.0


class Judged(Protocol):
    """What a cluster's health has judged (:class:`~krypton.runtime.clusterhealth.ClusterHealth`),
    as it stands when asked."""

    crd_outdated: str  # why the cluster's Tenant CRD is older than krypton's, "" if it is not
    guard_known: bool  # whether its release records' guard was looked at yet
    guard: Any  # what was found of the guard: .guarded, .message


@dataclass
class _Unjudged:
    crd_outdated: str = ""
    guard_known: bool = False
    guard: Any = None


_NOT_JUDGED = _Unjudged()


@dataclass
class ClusterState:
    """What changes of a cluster while it is engaged, changed only by its own view or
    runtime: made with it, dropped with it."""

    # the maintenance window's state as last worked out: (at, open, when that changes)
    window_seen: tuple[float, bool, float] | None = None
    # of the served Tenant CRD: its phase enum (None: any phase), the field of the seals
    phases: frozenset[str] | None = None
    seals_field: str = ""  # "": not known, both written
    crds_applied: set[str] = field(default_factory=set)  # chart versions whose crds/ are applied
    crds_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # per release: a revision's objects without a namespace, read once (SPEC F5b)
    manifest_objects: dict[tuple[str, str], tuple[int, frozenset[ObjectRef]]] = \
        field(default_factory=dict)
    running: set[tuple[str, str]] = field(default_factory=set)  # releases a helm run works on

    def crd_served(self, served: dict[str, Any] | None) -> None:
        """The cluster serves Tenant CRD `served` (None: not known): what is taken of it."""
        self.phases, self.seals_field = crd.served_phases(served), crd.seals_field(served)


@dataclass(frozen=True, kw_only=True)
class ClusterView:
    """What is needed to observe a Tenant on a cluster and decide about it, with nothing
    that writes: shared by the operator and ``krypton plan``. Its fields are set once;
    what changes is in `state`."""

    name: str
    kube: Kube
    helm: HelmEngine  # renders the chart (and, in a ClusterRuntime, installs it)
    chart: ChartSource
    settings: Settings
    releases: ReleaseIndex
    tenants: dict[tuple[str, str], dict[str, Any]]
    values: dict[str, Any] = field(default_factory=dict)
    window: Window | None = None  # the cluster's maintenance window (None: always open)
    # what is remembered of each Tenant between passes (a TenantMemory each)
    memory: Memory = field(default_factory=lambda: Memory(""))
    # every discovered cluster's name; None until known
    known_clusters: Callable[[], frozenset[str] | None] = lambda: None
    # this krypton instance's name on the records it writes, and whether another writer
    # (its name, when it wrote) is at work (SPEC S6); "": no such check
    writer: str = ""
    writer_active: Callable[[str, float], Awaitable[float]] = _inactive
    state: ClusterState = field(default_factory=ClusterState)

    async def desired_chart(self) -> ChartTarget | ChartProblem:
        try:
            chart = await self.chart.get()
        except (VersionInvalid, VersionNotFound, ChartNotLoaded) as exc:
            return ChartProblem(exc.reason, str(exc))
        fp = fingerprint(chart.repo, chart.name, chart.fingerprinted, self.values)
        return ChartTarget(chart.repo, chart.name, chart.version, self.values, fp, chart.path,
                           chart.digest, chart.newer)

    async def shared_conflicts(self, chart: ChartTarget, release: str, namespace: str,
                               key: TenantKey) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The objects `chart` renders alike for every release (SPEC F5) that Tenant `key`'s
        `release` may not take, each as "<object> (<why>)", and those it may adopt.

        - An object owned by another release that exists: not this release's (helm would
          refuse it, every retry again).
        - An object owned by a release that no longer exists (kept by
          ``helm.sh/resource-policy: keep``): adopted by the first Tenant of the cluster
          under --adopt-orphaned-objects, else refused with the way out (SPEC F5b).
        - An object nobody has created yet: claimed for the first Tenant of the cluster
          only (:meth:`first_tenant`), so that the first installs of a new cluster or chart,
          which run in parallel and each find nothing, cannot all create it (SPEC F5b).
        A kind the cluster does not serve, or a namespaced kind (looked for in the release's
        own namespace), finds nothing to conflict with."""
        found, orphaned, absent = [], [], []
        for ref in await self.chart.shared_objects(chart.fingerprint,
                                                   lambda: self.candidates(chart)):
            annotations = await self.kube.object_annotations(
                ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
            if annotations is None:
                if ref.namespace or await self.kube.cluster_scoped(ref.api_version, ref.kind):
                    absent.append(ref)
                continue
            owner = ownership.foreign_owner(annotations, release, namespace)
            if owner is None:
                continue
            gone = ownership.owner_release(annotations)
            if gone is not None and self.releases.observe(*gone).status in (
                    ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED) and \
                    self.settings.shared_release_namespace is None:
                orphaned.append((ref, owner))
                continue
            found.append(f"{ref} (owned by {owner})")
        first = self.first_tenant() if absent or orphaned else None
        owned = bool(found)  # already refused for objects another release holds
        for ref in absent:
            if first is not None and first != key and not owned:
                found.append(f"{ref} (claimed for the release of Tenant {first}, the first "
                             "Tenant of this cluster: it alone creates the shared objects)")
        adopt = []
        for ref, owner in orphaned:
            if not self.settings.adopt_orphaned_objects:
                found.append(f"{ref} (owned by {owner}, which no longer exists: "
                             "--adopt-orphaned-objects lets the first Tenant of the cluster "
                             "take it over, or remove it)")
            elif first != key:
                found.append(f"{ref} (owned by {owner}, which no longer exists; claimed for "
                             f"adoption by the release of Tenant {first}, the first Tenant)")
            else:
                adopt.append(f"{ref} (from {owner}, which no longer exists)")
        return tuple(found), tuple(adopt)

    def first_tenant(self) -> TenantKey | None:
        """The Tenant of this cluster whose release alone may create (or adopt) the chart's
        shared objects: of the Tenants this cluster serves (the planner's admission rules),
        the one created first, then by namespace and name. Every replica and every restart
        finds the same one from the same Tenant objects, so the claim holds without a
        record of its own; when that Tenant goes, the next one takes over."""
        served = []
        for (ns, name), obj in list(self.tenants.items()):
            if admission(self.observe(obj)) is None:
                created = str((obj.get("metadata") or {}).get("creationTimestamp") or "")
                served.append((created, ns, name))
        return TenantKey(*min(served)[1:]) if served else None

    async def candidates(self, chart: ChartTarget) -> tuple[ObjectRef, ...]:
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
                     look: Callable[[Observation], Awaitable[Observation | None]] | None = None,
                     operator: bool = False) -> tuple[Observation, Plan]:
        """Observe and plan, for the operator and ``krypton plan``/``diff`` alike. A plan
        that needs to know more (the chart, the namespace, the shared objects) is a
        :class:`Need`, not an action: this one loop satisfies it and plans again, until the
        plan is an action. The operator passes the look at an in-sync release's workload
        (`look`); for the `operator` a first install does not look the namespace up (its
        create says whether it exists), and a missing finalizer is the action AddFinalizer.
        Anyone else plans what the pass after that one would do."""
        obs = self.observe(obj, rollout)
        if operator:
            obs = dataclasses.replace(obs, create_namespace=True)
        key = obs.tenant.key
        release = release_name(key.name, self.name)
        namespace = self.settings.release_namespace_for(key.name)
        looked = False
        decided = plan(obs)
        for _ in range(LOOKUPS):
            if decided.action is Need.RESOLVE_CHART:
                obs = dataclasses.replace(obs, chart=await self.desired_chart())
            elif decided.action is Action.ADD_FINALIZER and not operator:
                obs = dataclasses.replace(obs, tenant=dataclasses.replace(
                    obs.tenant, has_finalizer=True))
            elif decided.action is Need.OBSERVE_NAMESPACE:
                state, owner = namespace_state(await self.kube.get_namespace(key.name), key)
                obs = dataclasses.replace(obs, namespace=state, namespace_owner=owner)
            elif decided.action is Need.OBSERVE_SHARED:
                assert isinstance(obs.chart, ChartTarget)
                shared, adopt = await self.shared_conflicts(obs.chart, release, namespace, key)
                obs = dataclasses.replace(obs, shared=shared, adopt=adopt)
            elif decided.action is Need.OBSERVE_WRITER:
                rel = obs.release
                left = await self.writer_active(rel.writer or "", rel.written)
                obs = dataclasses.replace(obs, writer_active=left > 0, writer_wait=left)
            elif decided.action is Need.COUNT_REPAIRS:
                found = await self.kube.release_record_labels(
                    self.settings.helm_driver, namespace, f"owner=helm,name={release}")
                obs = dataclasses.replace(obs, repairs=writers.repairs(found, time.time()))
            elif decided.action is Action.SKIP and look is not None and not looked:
                looked = True
                seen = await look(obs)
                if seen is None:
                    break
                obs = seen
            else:
                break
            decided = plan(obs)
        if isinstance(decided.action, Need):  # the planner asked for more than it may
            raise AssertionError(f"plan still needs {decided.action.value} after {LOOKUPS} looks")
        return obs, decided

    def window_state(self, now: float) -> tuple[bool, float]:
        """Whether the maintenance window is open at `now` and when that changes (always
        open without one), worked out again only once it has changed: every pass asks."""
        if self.window is None:
            return True, now
        seen = self.state.window_seen
        if seen is None or not seen[0] <= now < seen[2]:
            seen = self.state.window_seen = (now, *self.window.state(now))
        return seen[1], seen[2]

    def _since_applied(self, key: TenantKey, text: Any) -> float | None:
        """Seconds since the helm run that applied the release, from the status; where the
        status has no time (a cached Tenant the run's own status write has not reached, a
        release krypton took over), from when this view first saw it so: a missing time
        never counts as elapsed (SPEC F5b)."""
        since = _since(text)
        kept = self.memory.of(key)
        if since is not None:
            kept.unapplied_since = None
            return since
        if kept.unapplied_since is None:
            kept.unapplied_since = time.monotonic()
        return time.monotonic() - kept.unapplied_since

    def _known_for(self, view: TenantView) -> frozenset[str] | None:
        """Every discovered cluster's name, for a Tenant that targets another cluster (the
        planner names them when it targets none of them); None for any other Tenant."""
        if not view.target_cluster or view.target_cluster == self.name:
            return None
        return self.known_clusters()

    def tenant_with_uid(self, uid: str | None) -> str:
        """"<namespace>/<name>" of the Tenant with `uid` on this cluster, "" if none is."""
        for (namespace, name), obj in self.tenants.items():
            if obj["metadata"].get("uid") == uid:
                return f"{namespace}/{name}"
        return ""

    def observe(self, obj: dict[str, Any], rollout: RolloutGate | None = None) -> Observation:
        view = tenant_view(obj, self.name)
        applied = ((obj.get("status") or {}).get("clusters") or {}).get(self.name) or {}
        kept = self.memory.peek(view.key)
        remembered = kept.retry if kept is not None else None
        if remembered is not None and _behind(applied, remembered):
            # the status does not show the failure this process wrote last: its write has
            # not come back through the watch yet, or an older CRD dropped the retry state.
            # The brakes hold on the copy kept here (until a success or a restart).
            applied = {**applied, **remembered}
            view = dataclasses.replace(view, failures=int(remembered["failures"]),
                                       failed_target=str(remembered["failedTarget"]))
        release = release_name(view.key.name, self.name)
        namespace = self.settings.release_namespace_for(view.key.name)
        own = self.settings.shared_release_namespace is None
        observed = self.releases.observe(namespace, release, now=time.time(),
                                         lock_timeout=self.settings.helm_timeout + LOCK_MARGIN)
        if observed.locked and self.helm.interrupted(namespace, release):
            # krypton's own run of it ended with its helm worker: nobody is at work on the
            # pending record, a leftover to unlock and recover at once (SPEC S7)
            observed = dataclasses.replace(observed, locked=False, unlocks_in=0.0)
        foreign = observed.owner_uid not in (None, view.uid)
        ours = None if foreign else self.releases.ours(namespace, release)
        if ours is not None and (view.applied_revision is None or ours[0] > view.applied_revision):
            # Our status write may not have reached the watch cache yet: a revision our own
            # helm run made, with the fingerprint it applied, is what is recorded, not drift.
            view = dataclasses.replace(view, applied_revision=ours[0],
                                       recorded_fingerprint=ours[1])
        now = time.time()
        is_open, opens = self.window_state(now)
        return Observation(
            cluster=self.name,
            tenant=view,
            chart=None,
            release=observed,
            release_owner=self.tenant_with_uid(observed.owner_uid) if foreign else None,
            known_clusters=self._known_for(view),
            reserved_namespaces=self.settings.reserved_namespaces,
            adopt_namespaces=self.settings.adopt_namespaces,
            # with one shared release namespace there is no Tenant namespace to look after
            own_namespace=own,
            namespace=NamespaceState.UNKNOWN if own else NamespaceState.OWNED,
            rollout=rollout or RolloutGate(),
            since_applied=self._since_applied(view.key, applied.get("lastAppliedTime")),
            readiness_timeout=self.settings.helm_timeout,
            # whoever may write the status could put the next attempt in 2099: no wait is
            # believed beyond the longest the schedule gives
            retry_wait=min(_until(applied.get("nextAttemptTime")),
                           retry.helm_failure(self.settings.retry_backoff_max).longest),
            max_retries=self.settings.max_retries,
            window="" if is_open or self.window is None else self.window.text,
            window_opens="" if is_open else rfc3339(opens),
            window_wait=0.0 if is_open else opens - now,
            window_first_install=self.settings.maintenance_window_first_install,
            writer=self.writer,
            repairs=None,
        )


def _behind(applied: dict[str, Any], remembered: dict[str, Any]) -> bool:
    """Whether a Tenant's status (`applied`) is older than the retry state this process
    wrote last (`remembered`): it has none (a CRD that drops it), another target's, or
    fewer failures of the same target."""
    failures = applied.get("failures")
    return applied.get("failedTarget") != remembered["failedTarget"] or \
        (failures if isinstance(failures, int) else 0) < remembered["failures"]


@dataclass(frozen=True, kw_only=True)
class ClusterRuntime(ClusterView):
    """A cluster view plus what a reconcile acts with, made once when the cluster engages
    (:meth:`krypton.runtime.clusterworker.ClusterWorker._made`)."""

    recorder: EventRecorder
    slots: FairSlots
    gate: Callable[[str], RolloutGate] = lambda _cluster: RolloutGate()
    readiness: Readiness | None = None  # follows workloads helm did not wait for
    fence: Callable[[], bool] = lambda: True  # not draining, leadership held and fresh
    # Echoes of krypton's own writes start no pass (SPEC P2): per Tenant, the
    # resourceVersions its writes were given, until their watch events come back (in the
    # Tenants' memories)
    own_writes: OwnWrites = field(default_factory=OwnWrites)
    # the operator's keys that seal and check release records (SPEC S3)
    record_keys: Keys = field(default_factory=lambda: Keys(b""))
    # since when the cluster's records have been guarded at admission without a break,
    # looked at now (SPEC S4, S6); 0: they are not
    guarded_since: Callable[[], Awaitable[float]] = _unguarded
    # what the cluster's health has judged, read at use: its Tenant CRD, its records' guard
    health: Judged = field(default_factory=lambda: _NOT_JUDGED)
    # told of every write of a Tenant, as the server answered it (the fleet page, SPEC O16)
    told: Callable[[str, dict[str, Any]], None] = lambda _cluster, _obj: None

    def __post_init__(self) -> None:
        if self.own_writes.memory is not self.memory:  # the echoes are kept in the memories
            object.__setattr__(self, "own_writes", OwnWrites(self.memory))

    @functools.cached_property
    def log(self) -> Any:
        return structlog.get_logger("krypton.reconciler").bind(cluster=self.name)

    def record_guard(self) -> tuple[bool, str] | None:
        """Whether the cluster's release records are guarded, and how or why not; None
        while that is not known yet."""
        if not self.health.guard_known:
            return None
        return self.health.guard.guarded, self.health.guard.message

    def type(self, kind: str) -> str:
        """This cluster's condition type of `kind` (``ClusterReady/<cluster>``, ...)."""
        return cond.cluster_type(kind, self.name)

    def publish(self, key: TenantKey, release: str, chart: ChartTarget) -> None:
        """The per Tenant x cluster info metric: release, chart version, fingerprint, and
        the newer version of the update notice ("" when there is none)."""
        labels = (self.name, key.namespace, key.name, release, chart.version, chart.fingerprint,
                  chart.newer)
        kept = self.memory.of(key)
        if kept.published == labels:
            return
        self.memory.unpublish(key)
        metrics.TENANT_RELEASE.labels(*labels).set(1)
        kept.published = labels

    def wrote(self, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` is a Tenant as one of this cluster's writes left it. Returns `obj`."""
        self.own_writes.wrote(obj)
        self.told(self.name, obj)
        return obj

    def own_release_change(self, namespace: str, release: str) -> bool:
        """Whether a change of the release's records is this cluster's own doing: a helm run
        of it is under way, or the records say what its last run left."""
        return (namespace, release) in self.state.running or \
            self.releases.settled(namespace, release)

    def unpublish(self, key: TenantKey) -> None:
        """The release is gone from this cluster: its info metric series goes (what else
        is remembered of the Tenant goes when the Tenant goes)."""
        self.memory.unpublish(key)

    async def _render(self, chart: ChartTarget, release: str) -> list[Any]:
        async with self.slots.slot(self.name):  # a helm process like any other (--max-concurrent-helm)
            return await super()._render(chart, release)


def fenced(rt: ClusterRuntime) -> None:
    """Raise Fenced unless this worker may still act: checked right before every helm
    start (and before the status that announces one), so that a leader that lost its Lease,
    or was paused past it, and a worker being drained start nothing (SPEC R3, items 2, 4)."""
    if not rt.fence():
        raise Fenced("no helm operation may start: the cluster's worker is draining or this "
                     "replica is not the leader")
