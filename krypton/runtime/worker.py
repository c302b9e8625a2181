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
import dataclasses
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
from krypton.adapters.helmworker import WorkerHelm
from krypton.adapters.informer import Informer, release_record_metadata, shared_strings
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import HELM_RELEASE_SELECTOR, release_records_path, tenants_path
from krypton.adapters.workerprocess import WorkerPool
from krypton.decisions import crd, retry
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.clusters.execplugins import CredentialPluginFailed
from krypton.decisions.clusters.kubeconfig import Kubeconfig
from krypton.decisions.crd import crd_manifest
from krypton.decisions.errors import HOSTILE_ANSWERS, KryptonError, TemporaryError
from krypton.decisions.memory import HelmMemory, divide
from krypton.decisions.model import RolloutGate, TenantKey
from krypton.decisions.planner import admission
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.rollouts import rollout
from krypton.decisions.rollouts.rollout import ClusterObservation
from krypton.decisions.settings import Settings
from krypton.decisions.trust.records import Keys
from krypton.decisions.windows import Window
from krypton.runtime import recordguard
from krypton.runtime.changes import Changes
from krypton.runtime.clusterhealth import REPEAT_WARNING, ClusterHealth, Reporter
from krypton.runtime.consumer import Consumer
from krypton.runtime.readiness import Readiness
from krypton.runtime.reconcile import ClusterRuntime, Reconciler
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
    # turns for a cluster's first lists (see Worker._first_list)
    first_lists: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FIRST_LISTS))
    # seal and check the release records krypton's helm runs make (SPEC S3)
    record_keys: Keys = field(default_factory=lambda: Keys(b""))
    # this instance's name on the records it writes, and whether another writer is at
    # work (SPEC S6; "": no name, no check)
    writer: str = ""
    writer_active: Callable[[str, float], Awaitable[float]] = lambda _w, _at: _inactive()
    # the fleet's helm workers, at most --max-concurrent-helm running (SPEC P5)
    helm_workers: WorkerPool = field(default_factory=lambda: WorkerPool(4))
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

    return WorkerHelm(s.helm_worker_path or s.helm_worker, cluster=name,
                      on_exit=ended, on_refused=refused, pool=shared.helm_workers, **common)


async def withdraw_from_tenants(rt: ClusterRuntime, log: Any, timeout: float) -> None:
    """Remove a cluster that left the fleet from each of its Tenants (best effort, within
    `timeout` seconds)."""
    reconciler = Reconciler(rt)

    async def withdraw_all() -> None:
        for obj in list(rt.tenants.values()):
            try:
                await reconciler.withdraw(obj)
            except KryptonError as exc:
                log.warning("could not clear the cluster from a Tenant",
                            tenant=f"{obj['metadata'].get('namespace')}/"
                                   f"{obj['metadata'].get('name')}", error=str(exc))

    try:
        async with asyncio.timeout(timeout):
            await withdraw_all()
    except TimeoutError:
        log.warning("clearing the cluster from its Tenants timed out", timeout=timeout)
    log.info("cluster cleared from its Tenants")


def observe_for_rollout(rt: ClusterRuntime, chart: ChartSource, values: dict[str, Any],
                        window: Window | None) -> ClusterObservation:
    """What a cluster's Tenants say of the rollout's target (F1): only those it serves, by
    the planner's own admission rules (a paused, deleted, elsewhere-targeted or permanently
    refused Tenant is not waited for by a rollout wave)."""
    resolved = chart.cached
    desired = None if resolved is None else \
        fingerprint(resolved.repo, resolved.name, resolved.fingerprinted, values)
    served = [t for t in list(rt.tenants.values()) if admission(rt.observe(t)) is None]
    seen = rollout.observe_cluster(rt.name, served, desired)
    return dataclasses.replace(seen, window=window.text if window else "")


async def crd_applied(kube: Kube, health: ClusterHealth, rt: ClusterRuntime) -> bool:
    """Whether the outdated Tenant CRD was replaced by a current one (an administrator
    applied krypton's): said, and the phases it accepts taken."""
    try:
        served = await kube.get_crd()
    except KryptonError as exc:
        if exc.reason in HOSTILE_ANSWERS:
            health.answer_refused(exc)  # a strike, as for any request (SPEC S5)
        return False  # looked at again in CRD_CHECK seconds
    if served is None:
        return False
    await health.judge_crd(served)
    if health.crd_outdated:
        return False
    rt.phases = crd.served_phases(served)
    return True


def claim(claims: dict[str, str], identity: str, name: str) -> None:
    """One worker per API server: cluster `name` may not engage while another engaged
    cluster reaches the same API server (`identity`), or every Tenant there would be
    installed twice (SPEC D9)."""
    owner = claims.setdefault(identity, name)
    if owner != name:
        raise TemporaryError(
            f"cluster {name} reaches the same API server as engaged cluster {owner} "
            f"({identity.split('|')[0]}); not engaged while {owner} is", reason="DuplicateCluster")


class Worker:
    """One engaged cluster: its engagement (retried), its watches, its :class:`Consumer` of
    Tenant keys, its periodic work and its :class:`ClusterHealth`."""

    def __init__(self, name: str, kc: Kubeconfig, values: dict[str, Any], shared: Shared,
                 window: Window | None = None) -> None:
        self.name, self.kc, self.values, self.shared = name, kc, values, shared
        self.window = window  # its maintenance window (None: always open)
        self.log = structlog.get_logger("krypton.worker").bind(cluster=name)
        self.engaged = False
        self.consumer = Consumer(name, shared.settings.max_concurrent_reconciles,
                                 on_gone=self._tenant_gone)
        self.queue = self.consumer.queue
        self.health = ClusterHealth(name, shared.report, shared.settings.api_timeout)
        self.kube: Kube | None = None
        self.runtime: ClusterRuntime | None = None
        self._watches: tuple[Informer, Informer]  # the engagement's Tenants, release records
        self.guard: recordguard.Keeper | None = None  # its release records' guard, kept
        self._dir = shared.workdir / name
        self.last_error = ""  # why engagement failed last, "" once engaged
        self.draining = False  # set by stop(): no key handed out, no helm started
        self._identity: str | None = None
        self._config: ClientConfig | None = None

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
        await self._close_kube()

    async def _engage(self) -> None:
        settings = self.shared.settings
        await self._close_kube()
        if self._config is None:  # one per worker: an exec plugin's token and backoff last
            self._config = configuration_in_cluster() if self.kc.in_cluster else None
        if self._config is None:
            self._config = await configuration_for(self.kc, self._dir / "tls",
                                                   trust=settings.trust_kubeconfig_secrets)
        self.kube = Kube(self._config, name=self.name, timeout=settings.api_timeout)
        try:
            version = await self.kube.server_version()
        except CredentialPluginFailed:
            raise  # its own reason: the plugin, not the server
        except TemporaryError as exc:
            raise TemporaryError(f"cluster {self.name} unreachable: {exc}",
                                 reason="ClusterUnreachable") from exc
        if not settings.allow_duplicate_clusters:
            self._identity = await self.kube.cluster_identity(
                by_uid=settings.shared_release_namespace is None)
            claim(self.shared.claims, self._identity, self.name)
        result, phases = "not checked (--crd-policy=skip)", None
        if settings.crd_policy != "skip":
            result, served = await self.kube.ensure_crd(
                crd_manifest(), replace=lambda live: crd.replaces(live, settings.crd_policy))
            phases = crd.served_phases(served)
            await self.health.judge_crd(served)
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        kubeconfig = self._dir / "kubeconfig"
        kubeconfig.touch(mode=0o600)
        kubeconfig.write_text(self.kc.to_yaml())
        helm = cluster_helm(self.shared, self.name, kubeconfig, self._dir / "kube-cache",
                            self.health.answer_refused)
        self.guard = recordguard.Keeper(self.kube, settings, self.health)
        self._watches = self._informers(self.kube)
        self.runtime = ClusterRuntime(
            name=self.name, kube=self.kube, helm=helm, recorder=EventRecorder(self.kube),
            chart=self.shared.chart, settings=settings, slots=self.shared.slots,
            releases=ReleaseIndex(), tenants=self._watches[0].store, values=self.values,
            window=self.window,
            memory=self.consumer.memory, own_writes=self.consumer.own_writes,
            gate=self.shared.gate,
            known_clusters=self.shared.discovered,
            fence=lambda: not self.draining and self.shared.fence() and
            self.shared.owns(self.name), phases=phases,
            readiness=None if settings.helm_wait else Readiness(
                self.kube, self.consumer.workload_turned, settings.health_rules,
                self.health.budget, self.health.answer_refused),
            record_keys=self.shared.record_keys,
            guarded_since=self.guard.since_now,
            health=self.health, writer=self.shared.writer,
            writer_active=self.shared.writer_active, told=self.shared.changes.tell)
        self.last_error = ""
        self.log.info("cluster engaged", server_version=version, crd=result)

    def _tenant_gone(self, key: TenantKey) -> None:
        """A Tenant went: the workloads followed for it are no longer followed."""
        if self.runtime is not None and self.runtime.readiness is not None:
            self.runtime.readiness.unfollow(key)

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
        assert self.kube is not None and self.runtime is not None
        settings = self.shared.settings
        rt = self.runtime

        tenants, releases = self._watches
        async with asyncio.TaskGroup() as group:
            # The guard looked at before the first pass (SPEC S4): what krypton makes under
            # it needs no seal; a cluster that does not answer in time is served without.
            # Its requests take the pool's connection that engaging left idle (the watches
            # have connections of their own).
            looked = asyncio.Event()
            assert self.guard is not None
            group.create_task(self.guard.run(looked), name=f"{self.name}-record-guard")
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
        assert self.runtime is not None
        settings = self.shared.settings
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
                assert self.kube is not None
                relist = await crd_applied(self.kube, self.health, self.runtime)
            if now >= next_orphans:
                next_orphans = now + ORPHAN_CHECK
                await self.health.look_for_orphans(
                    self.runtime.releases, self.shared.discovered(), self.consumer.release_changes,
                    own_namespace=settings.shared_release_namespace is None)
            if now >= next_credentials:
                next_credentials = now + CREDENTIALS_CHECK
                warned = await self.health.judge_credentials(self.kc, warned)
            await asyncio.sleep(min(5.0, settings.resync_period))
            self.health.settle()
            self.health.count_phases(self.runtime, len(self.queue))
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

    async def _close_kube(self) -> None:
        if self.runtime is not None:
            await self.runtime.helm.close()
        if self.runtime is not None and self.runtime.readiness is not None:
            await self.runtime.readiness.close()
        if self.kube is not None:
            kube, self.kube = self.kube, None
            await kube.close()

    async def _teardown(self) -> None:
        if self._identity is not None and self.shared.claims.get(self._identity) == self.name:
            del self.shared.claims[self._identity]
        if self.engaged:
            metrics.ENGAGED.dec()
        self.engaged = False
        metrics.CLUSTER_ENGAGED.labels(self.name).set(0)
        await self._close_kube()
        shutil.rmtree(self._dir, ignore_errors=True)
        self.log.info("cluster disengaged")
