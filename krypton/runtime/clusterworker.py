"""One worker per engaged cluster (SPEC R2, R3): engage, watch Tenants and release records,
feed a de-duplicating queue, reconcile with bounded concurrency, resync periodically.

Engaging means: probe ``/version``, ensure the Tenant CRD, start the watches, install or find
the guard of the release records (SPEC S4: a cluster without it is engaged and reported). A
failure is reported (Warning Event on the cluster's Secret, log line) and retried with capped
exponential backoff; the worker never takes the process down. Cancelling the worker's task
disengages it; its private directory (kubeconfig, certificates and helm's client-go cache)
is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource
from krypton.adapters.clientconfig import ClientConfig, configuration_for, configuration_in_cluster
from krypton.adapters.events import EventRecorder
from krypton.adapters.helm import Helm, HelmEngine
from krypton.adapters.helmworker import HelmWorkerEngine
from krypton.adapters.helmworkerprocess import HelmWorkerPool
from krypton.adapters.informer import Informer, release_record_metadata, shared_strings
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import HELM_RELEASE_SELECTOR, release_records_path, tenants_path
from krypton.decisions import retry
from krypton.decisions.clusters.kubeconfig import Kubeconfig
from krypton.decisions.errors import KryptonError
from krypton.decisions.memory import HelmMemory, divide
from krypton.decisions.model import RolloutGate
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.rollouts.rollout import ClusterObservation
from krypton.decisions.settings import Settings
from krypton.decisions.trust.records import Keys
from krypton.decisions.windows import Window
from krypton.runtime import recordguard
from krypton.runtime.changes import Changes
from krypton.runtime.clusterhealth import REPEAT_WARNING, ClusterHealth, Reporter
from krypton.runtime.consumer import Consumer
from krypton.runtime.engagement import (
    Engagement,
    checked,
    crd_applied,
    observe_for_rollout,
    withdraw_from_tenants,
)
from krypton.runtime.readiness import Readiness
from krypton.runtime.reconcile import ClusterRuntime, Reconciler
from krypton.runtime.reconcile.view import ClusterState
from krypton.runtime.slots import FairSlots

ORPHAN_CHECK = 30.0  # seconds between looks for releases of undiscovered cluster names
FIRST_LISTS = 32  # clusters making their first lists at once
CREDENTIALS_CHECK = 3600.0  # seconds between expiry checks of an engaged cluster's certificate
CRD_CHECK = 10.0  # seconds between looks at a Tenant CRD found outdated (applied since?)


async def _inactive() -> float:
    return 0.0


@dataclass(frozen=True)
class Shared:
    """What all workers share: settings, the chart, the helm cap, a reporter, a workdir;
    made whole once, never set afterwards."""

    settings: Settings
    chart: ChartSource
    slots: FairSlots
    report: Reporter  # (cluster, event type, reason, message) -> Event on its Secret
    workdir: Path
    gate: Callable[[str], RolloutGate] = lambda _cluster: RolloutGate()  # rollout (F1)
    fence: Callable[[], bool] = lambda: True  # still the leader? (checked before every helm start)
    owns: Callable[[str], bool] = lambda _cluster: True  # still this cluster's owner? (F4)
    discovered: Callable[[], frozenset[str] | None] = lambda: None  # every discovered cluster's name
    claims: dict[str, str] = field(default_factory=dict)  # cluster identity -> engaged name (D9)
    # turns for a cluster's first lists (see ClusterWorker._first_list)
    first_lists: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FIRST_LISTS))
    # seal and check the release records krypton's helm runs make (SPEC S3)
    record_keys: Keys = field(default_factory=lambda: Keys(b""))
    # this instance's name on the records it writes, and whether another writer is at
    # work (SPEC S6; "": no name, no check)
    writer: str = ""
    writer_active: Callable[[str, float], Awaitable[float]] = lambda _w, _at: _inactive()
    # the fleet's helm workers, at most --max-concurrent-helm running (SPEC P5)
    helm_workers: HelmWorkerPool = field(default_factory=lambda: HelmWorkerPool(4))
    # every write of a Tenant, to whoever listens (the fleet page, SPEC O16)
    changes: Changes = field(default_factory=Changes)
    # what each helm process may use of the pod's memory (SPEC S7)
    helm_memory: HelmMemory = field(default_factory=lambda: divide(None, 1280 << 20, 4))


def cluster_helm(shared: Shared, name: str, kubeconfig: Path, cache_dir: Path,
                 refused: Callable[[KryptonError], None]) -> HelmEngine:
    """A cluster's helm: its worker (`--helm-engine=worker`, started on the first request)
    or the helm binary. `refused` is told of an answer of the cluster past a bound (a
    strike against its budget, as for krypton's own requests: SPEC S5, S7)."""
    s = shared.settings
    executable = s.helm_path or s.helm_executable
    common: dict[str, Any] = {
        "kubeconfig": kubeconfig, "timeout": s.helm_timeout, "wait": s.helm_wait,
        "driver": s.helm_driver, "history_max": s.helm_history_max, "cache_dir": cache_dir,
        "memory": shared.helm_memory}
    if s.helm_engine != "worker":
        return Helm(executable, **common)

    async def ended(reason: str, message: str) -> None:
        await shared.report(name, "Warning", reason, message)

    return HelmWorkerEngine(s.helm_worker_path or s.helm_worker, cluster=name,
                      on_exit=ended, on_refused=refused, pool=shared.helm_workers, **common)


class ClusterWorker:
    """One engaged cluster: its engagement (retried), its watches, its :class:`Consumer` of
    Tenant keys, its periodic work and its :class:`ClusterHealth`."""

    def __init__(self, name: str, kc: Kubeconfig, values: dict[str, Any], shared: Shared,
                 window: Window | None = None) -> None:
        self.name, self.kc, self.values, self.shared = name, kc, values, shared
        self.window = window  # its maintenance window (None: always open)
        self.log = structlog.get_logger("krypton.worker").bind(cluster=name)
        self.engaged = False
        self.consumer = Consumer(name, shared.settings.max_concurrent_reconciles)
        self.queue = self.consumer.queue
        self.health = ClusterHealth(name, shared.report, shared.settings.api_timeout)
        self.engagement: Engagement | None = None  # while it is engaged, or engaging
        self._dir = shared.workdir / name
        self.last_error = ""  # why engagement failed last, "" once engaged
        self.draining = False  # set by stop(): no key handed out, no helm started
        self._identity: str | None = None
        self._config: ClientConfig | None = None

    @property
    def runtime(self) -> ClusterRuntime | None:
        return None if self.engagement is None else self.engagement.runtime

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        # 0 from discovery on: a cluster that never engages (unreachable, refused) is an
        # alert (krypton_cluster_engaged == 0), not a missing series
        metrics.CLUSTER_ENGAGED.labels(self.name).set(0)
        try:
            await self._engage_with_backoff()
            await self._serve()
        finally:
            await self._teardown()

    async def stop(self, grace: float = 0.0) -> None:
        """Drain: stop taking work and starting helm (a reconcile still waiting for a helm
        slot gives up); give running reconciles up to `grace` seconds to finish."""
        self.draining = True
        await self.consumer.close(grace)

    async def _engage_with_backoff(self) -> None:
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(KryptonError),
                                           wait=retry.ENGAGE.wait(),
                                           before_sleep=self._engage_failed):
            with attempt:
                await self._engage()

    async def _engage_failed(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert isinstance(exc, KryptonError)
        delay = state.next_action.sleep if state.next_action else 0.0
        self.last_error = f"{exc.reason}: {exc}"
        self.log.warning("cluster engagement failed", reason=exc.reason, error=str(exc),
                         retry_in=delay)
        await self.shared.report(self.name, "Warning", exc.reason, str(exc))

    async def _engage(self) -> None:
        settings = self.shared.settings
        await self._disengage()
        if self._config is None:  # one per worker: an exec plugin's token and backoff last
            self._config = configuration_in_cluster() if self.kc.in_cluster else None
        if self._config is None:
            self._config = await configuration_for(self.kc, self._dir / "tls",
                                                   trust=settings.trust_kubeconfig_secrets)
        kube = Kube(self._config, name=self.name, timeout=settings.api_timeout)
        try:
            version, result, served, self._identity = await checked(
                kube, self.name, settings, self.health, self.shared.claims)
            self.engagement = self._made(kube, served)
        except BaseException:
            await kube.close()
            raise
        self.last_error = ""
        self.log.info("cluster engaged", server_version=version, crd=result)

    def _made(self, kube: Kube, served: dict[str, Any] | None) -> Engagement:
        """The engagement of the cluster that `kube` reaches: the one place its runtime is
        made."""
        shared, settings = self.shared, self.shared.settings
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        kubeconfig = self._dir / "kubeconfig"
        kubeconfig.touch(mode=0o600)
        kubeconfig.write_text(self.kc.to_yaml())
        helm = cluster_helm(shared, self.name, kubeconfig, self._dir / "kube-cache",
                            self.health.answer_refused)
        guard = recordguard.Keeper(kube, settings, self.health)
        tenants, releases = self._informers(kube)
        runtime = ClusterRuntime(
            name=self.name, kube=kube, helm=helm, recorder=EventRecorder(kube),
            chart=shared.chart, settings=settings, slots=shared.slots,
            releases=ReleaseIndex(), tenants=tenants.store, values=self.values,
            window=self.window, state=ClusterState(),
            memory=self.consumer.memory, own_writes=self.consumer.own_writes,
            gate=shared.gate, known_clusters=shared.discovered,
            fence=lambda: not self.draining and shared.fence() and shared.owns(self.name),
            readiness=None if settings.helm_wait else Readiness(
                kube, self.consumer.workload_turned, self.consumer.memory, settings.health_rules,
                self.health.budget, self.health.answer_refused),
            record_keys=shared.record_keys, guarded_since=guard.since_now,
            health=self.health, writer=shared.writer,
            writer_active=shared.writer_active, told=shared.changes.tell)
        runtime.state.crd_served(served)
        return Engagement(kube, runtime, guard, tenants, releases)

    def _informers(self, kube: Kube) -> tuple[Informer, Informer]:
        """The engagement's two watches: its Tenants and its release records."""
        settings = self.shared.settings
        tenants = Informer(kube, "tenants", tenants_path(settings.watch_namespace),
                           self.consumer.tenant_changed, on_error=self.health.watch_failed,
                           on_healthy=self.health.watch_restored, transform=shared_strings,
                           budget=self.health.budget)
        releases = Informer(kube, "helm-releases",
                            release_records_path(settings.helm_driver,
                                                 settings.shared_release_namespace),
                            self._release_changed, label_selector=HELM_RELEASE_SELECTOR,
                            metadata_only=True, transform=release_record_metadata,
                            on_list=self._releases_listed, on_error=self.health.watch_failed,
                            on_healthy=self.health.watch_restored, budget=self.health.budget)
        return tenants, releases

    async def _serve(self) -> None:
        """The engaged cluster's tasks (two informers, the consumers, the resync) run in one
        task group: they start and end together, and cancelling the worker ends them all."""
        assert self.engagement is not None
        settings = self.shared.settings
        rt, tenants, releases = self.engagement.runtime, self.engagement.tenants, \
            self.engagement.releases
        async with asyncio.TaskGroup() as group:
            # The guard looked at before the first pass (SPEC S4): what krypton makes under
            # it needs no seal; a cluster that does not answer in time is served without.
            # Its requests take the pool's connection that engaging left idle (the watches
            # have connections of their own).
            looked = asyncio.Event()
            group.create_task(self.engagement.guard.run(looked), name=f"{self.name}-record-guard")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2 * settings.api_timeout):
                    await looked.wait()
            # Release records first, so the first Tenant passes see real release state:
            # before that list every release looks missing, and "missing" means install.
            await self._first_list(group, releases, "Helm release records")
            # Engaged means its Tenants are known: before their first list a cluster looks
            # empty, and an empty cluster would count as a finished rollout wave (F1).
            await self._first_list(group, tenants, "Tenants")
            self.consumer.drop_unlisted(tenants.store)  # gone while it was not engaged
            self.engaged = True
            metrics.CLUSTER_ENGAGED.labels(self.name).set(1)
            metrics.ENGAGED.inc()
            reconciler = Reconciler(rt)
            group.create_task(self.consumer.run(reconciler, group, self.health.budget,
                                                self.health.answer_refused,
                                                self.health.passes_held),
                              name=f"{self.name}-consumer")
            await self._housekeeping(tenants)

    async def _housekeeping(self, tenants: Informer) -> None:
        """The engaged cluster's periodic work, in one task: the phase gauges every few
        seconds, every Tenant queued again each --resync-period, a look for orphaned
        releases at most every ORPHAN_CHECK seconds, the client certificate's expiry
        every CREDENTIALS_CHECK seconds and an outdated Tenant CRD every CRD_CHECK."""
        assert self.engagement is not None
        rt, settings = self.engagement.runtime, self.shared.settings
        store = tenants.store
        now = time.monotonic()
        next_resync, next_orphans = now + settings.resync_period, now
        next_credentials, next_crd = now + CREDENTIALS_CHECK, now + CRD_CHECK
        warned = now if self.kc.warnings else -REPEAT_WARNING  # said at engagement
        relist = False
        while True:
            now = time.monotonic()
            if relist:
                # The CRD was found current at the last tick, and the API server serves it
                # by now. The Tenants kept were decoded by the old schema, which dropped
                # what it lacks (the records' seals a moment ago, say): they are listed anew.
                relist = False
                tenants.relist()
            if self.health.crd_outdated and now >= next_crd:
                next_crd = now + CRD_CHECK
                relist = await crd_applied(self.engagement.kube, self.health, rt)
            if now >= next_orphans:
                next_orphans = now + ORPHAN_CHECK
                await self.health.look_for_orphans(
                    rt.releases, self.shared.discovered(), self.consumer.release_changes,
                    own_namespace=settings.shared_release_namespace is None)
            if now >= next_credentials:
                next_credentials = now + CREDENTIALS_CHECK
                warned = await self.health.judge_credentials(self.kc, warned)
            await asyncio.sleep(min(5.0, settings.resync_period))
            self.health.settle()
            if rt.readiness is not None:
                rt.readiness.sweep()  # what went with Tenants that went
            self.health.count_phases(rt, len(self.queue))
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + settings.resync_period
                self.consumer.requeue(list(store))

    async def _first_list(self, group: asyncio.TaskGroup, informer: Informer, what: str
                          ) -> None:
        """Start `informer` and wait until it has listed once. At most FIRST_LISTS clusters
        make their first list at once: 1000 clusters starting together each held a list
        answer in memory at the same moment (the peak of the whole run when each cluster has
        hundreds of release records). A cluster holds its turn for at most --api-timeout,
        so one that does not answer delays no other for longer."""
        async with self.shared.first_lists:
            group.create_task(informer.run(), name=f"{self.name}-{informer.what}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.shared.settings.api_timeout):
                    await informer.synced.wait()
        await self._await_sync(informer, what)

    async def _await_sync(self, informer: Informer, what: str) -> None:
        """Wait, however long it takes, until `informer` has listed once; no Tenant is
        reconciled from a cache that is not synced. The wait shows in /readyz."""
        waited = 0.0
        timeout = self.shared.settings.api_timeout
        while True:
            try:
                async with asyncio.timeout(timeout):
                    await informer.synced.wait()
                return
            except TimeoutError:
                waited += timeout
            self.last_error = f"CacheNotSynced: {what} not listed after {waited:.0f}s"
            self.log.warning("cache not synced yet; not reconciling", cache=what, waited=waited)

    async def withdraw(self, timeout: float = 30.0) -> None:
        """The cluster left the fleet (its Secret is gone): stop taking work, let short passes
        end, then remove this cluster's traces from its Tenants (best effort, bounded)."""
        await self.stop(grace=min(timeout, 10.0))
        if not self.engaged or self.runtime is None:
            return
        await withdraw_from_tenants(self.runtime, self.log, timeout)

    # -- rollout (F1) -------------------------------------------------------------------

    def requeue_all(self) -> None:
        if self.runtime is not None:
            self.consumer.requeue(list(self.runtime.tenants))

    def rollout_observation(self) -> ClusterObservation:
        if not self.engaged or self.runtime is None:
            return ClusterObservation(False, 0, 0, 0)
        return observe_for_rollout(self.runtime, self.shared.chart, self.values, self.window)

    def _release_changed(self, type_: str, obj: dict[str, Any]) -> None:
        assert self.runtime is not None
        key = self.runtime.releases.on_event(type_, obj, time.time())
        if key is not None:
            self._release_moved(*key, gone=type_ == "DELETED")

    def _releases_listed(self, records: list[dict[str, Any]]) -> None:
        """A list or relist of the release records: the index is rebuilt from it, and the
        Tenants of the releases that changed meanwhile are looked at."""
        assert self.runtime is not None
        releases = self.runtime.releases
        for namespace, release in sorted(releases.replace(records, time.time())):
            self._release_moved(namespace, release, gone=not releases.has(namespace, release))

    def _release_moved(self, namespace: str, release: str, *, gone: bool) -> None:
        assert self.runtime is not None
        self.consumer.release_moved(self.runtime, namespace, release, gone=gone)

    async def _disengage(self) -> None:
        """Its engagement, if any, closed and dropped."""
        if self.engagement is not None:
            engagement, self.engagement = self.engagement, None
            await engagement.close()

    async def _teardown(self) -> None:
        if self._identity is not None and self.shared.claims.get(self._identity) == self.name:
            del self.shared.claims[self._identity]
        if self.engaged:
            metrics.ENGAGED.dec()
        self.engaged = False
        metrics.CLUSTER_ENGAGED.labels(self.name).set(0)
        await self._disengage()
        shutil.rmtree(self._dir, ignore_errors=True)
        self.log.info("cluster disengaged")
