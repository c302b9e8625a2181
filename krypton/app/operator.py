"""The operator process: watch cluster (D7), self cluster (D6), discovery + fleet, health
and metrics (O3), graceful shutdown (O9)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

import krypton
from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource, chart_access
from krypton.adapters.events import EventRecorder, reporting_instance
from krypton.adapters.helm import Helm, watch_children_with_pidfds
from krypton.adapters.helmworkerprocess import HelmWorkerPool
from krypton.adapters.kube import Kube
from krypton.app.config import cgroup_memory_limit
from krypton.app.discovery import Discovery
from krypton.app.fleetpage import fleet_page
from krypton.app.gate import metric_gate
from krypton.app.health import HealthServer, LoopWatch
from krypton.app.home import ensure_record_key, ensure_self_cluster, watch_cluster
from krypton.app.writer import Writer
from krypton.decisions import crd, retry
from krypton.decisions.clusters import sharding
from krypton.decisions.clusters.discovery import ClusterSpec
from krypton.decisions.crd import crd_manifest
from krypton.decisions.errors import SettingsError, TemporaryError
from krypton.decisions.memory import divide
from krypton.decisions.model import RolloutGate
from krypton.decisions.rollouts.rollout import Policy, read_publication
from krypton.decisions.settings import Settings
from krypton.runtime.changes import Changes
from krypton.runtime.clusterworker import ClusterWorker, Shared
from krypton.runtime.fleet import Fleet
from krypton.runtime.leader import LeaderElector
from krypton.runtime.pause import pause
from krypton.runtime.rollout_controller import (
    MetricGate,
    Published,
    RolloutController,
    RolloutFollower,
)
from krypton.runtime.shards import Shards
from krypton.runtime.slots import FairSlots

log = structlog.get_logger("krypton")


def raise_file_limit() -> None:
    """Every engaged cluster keeps a few connections open (two watches, requests, helm's):
    lift the soft limit on open files to the hard one, as Go programs do, so that a large
    fleet does not fail on the common default of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Operator:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stopping = asyncio.Event()
        # set once the running work has finished (or was cut off) after stopping: until then
        # the Leases are renewed, so no other replica takes over what is still running
        self.drained = asyncio.Event()
        self.workdir = Path(tempfile.mkdtemp(prefix="krypton-run-"))
        os.chmod(self.workdir, 0o700)
        # the pod's memory, shared by the operator and its helm processes (SPEC S7)
        self.helm_memory = divide(cgroup_memory_limit(), settings.memory_limit,
                                  settings.max_concurrent_helm)
        self.home: Kube | None = None
        self.fleet: Fleet | None = None
        self._metric_gate: MetricGate | None = None
        self.discovery: Discovery | None = None
        self.loop_watch = LoopWatch()
        self.health = HealthServer(settings.health_probe_bind_address,
                                   settings.metrics_bind_address, self.ready)
        self.changes = Changes()  # every write of a Tenant, for the fleet page (SPEC O16)
        self.web = fleet_page(settings, lambda: self.fleet, self.changes,
                              lambda: self._rollout_view, lambda: self.home,
                              lambda: (self.shards, self._discovered()))
        self.elector: LeaderElector | None = None
        self.shards: Shards | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.writer: Writer | None = None  # this instance as a writer of releases (SPEC S6)
        self._presence_task: asyncio.Task[None] | None = None
        self.exit_code = 0
        self.lease_lost = False
        self._rollout_tasks: list[asyncio.Task[None]] = []
        self._rollout_view: Any = None  # the rollout's controller or follower, for the page
        self._rollout_elector: LeaderElector | None = None

    def ready(self) -> tuple[bool, list[str]]:
        """Ready once discovery synced, or while standing by for the Lease; plus one line per
        discovered cluster that is not serving."""
        if self.elector is not None and not self.elector.is_leader:
            return self.home is not None, [self.elector.standing_by()]
        synced = self.discovery is not None and self.discovery.synced()
        fleet = self.fleet
        details = [self.helm_memory.said()]
        details += [f"cluster {name}: {state}" for name, state in
                    (fleet.health().items() if fleet is not None else []) if state != "engaged"]
        details += self.discovery.details() if self.discovery is not None else []
        return synced, details

    async def run(self) -> int:
        raise_file_limit()
        watch_children_with_pidfds()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        heartbeat = asyncio.create_task(self.loop_watch.run(), name="loop-watch")
        metrics.BUILD.info({"version": krypton.__version__, "python": platform.python_version()})
        try:
            try:
                await self.health.start()
                await self.web.start()
            except OSError as exc:  # a port taken, an address not of this host
                raise SettingsError(f"cannot serve health, metrics or the fleet page: "
                                    f"{exc}") from exc
            self.home = await self._connect_home()
            self._metric_gate = await metric_gate(self.settings, self.home)
        except SettingsError as exc:
            heartbeat.cancel()
            await self.health.stop()
            shutil.rmtree(self.workdir, ignore_errors=True)
            print(f"krypton: {exc}", file=sys.stderr)
            return 2
        except asyncio.CancelledError:
            self.home = None
        try:
            if self.home is not None:
                await self._run()
        finally:
            await self._shutdown()
            heartbeat.cancel()
        return self.exit_code

    async def _connect_home(self) -> Kube:
        failures = 0
        while not self.stopping.is_set():
            try:
                home = await watch_cluster(self.settings, self.workdir)
                version = await home.server_version()
                log.info("watch cluster connected", server=home.config.host, version=version)
                return home
            except TemporaryError as exc:
                failures += 1
                delay = retry.WATCH_CLUSTER.delay(failures)
                log.warning("watch cluster unreachable", error=str(exc), retry_in=delay)
                await pause(self.stopping, delay)  # SIGTERM ends the wait
        raise asyncio.CancelledError()

    async def _run(self) -> None:
        s = self.settings
        assert self.home is not None
        if s.leader_elect:
            self.elector = self._elector()
            if not await self.elector.acquire(self.stopping):
                return
            self._lease_task = asyncio.create_task(self._hold(self.elector.hold(self.drained)))
        dirty = asyncio.Event()
        if s.sharding:
            self.shards = Shards(self.home, s.lease_namespace, s.leader_election_id,
                                 s.shard_identity or reporting_instance(),
                                 lease_duration=s.lease_duration, renew_deadline=s.renew_deadline,
                                 retry_period=s.retry_period, on_change=dirty.set)
            await self.shards.join()
            self._lease_task = asyncio.create_task(self._hold(self.shards.hold(self.drained)))
        if s.ensure_watch_crds:
            result, _ = await self.home.ensure_crd(
                crd_manifest(), replace=lambda live: crd.replaces(live, s.crd_policy))
            log.info("watch cluster CRD ensured", result=result)
        if not s.no_self_cluster:
            await ensure_self_cluster(self.home, s)
        record_keys = await ensure_record_key(self.home, s.namespace)
        chart = ChartSource(s.chart_repo, s.chart_name, s.chart_version,
                            helm=Helm(s.helm_path or s.helm_executable, timeout=s.helm_timeout),
                            cache_dir=self.workdir / "charts", index_deadline=s.chart_fetch_timeout,
                            index_ttl=s.chart_index_ttl,
                            access=chart_access(s, self.home.get_secret))
        home_events = EventRecorder(self.home)
        writer = self.writer = Writer(self.home, s)
        await writer.announce()
        self._presence_task = asyncio.create_task(writer.keep(home_events), name="presence")
        await writer.warn_if_unleased(home_events)
        # built whole, in the order they need each other; the fleet is named before it is
        # made (its reports and workers are asked for only once it runs)
        fleet: Fleet
        fence, owns = (self.shards.holds, self.shards.owns) if self.shards is not None else \
            (self.elector.holds if self.elector is not None else _always, _everyone)
        gate = self._start_rollout(Policy.from_settings(s), chart, lambda: fleet.workers,
                                   home_events, fence)
        memory = self.helm_memory
        (log.warning if memory.concurrency < memory.asked else log.info)(memory.said())
        shared = Shared(s, chart, FairSlots(memory.concurrency),
                        lambda *a: fleet.report(*a), self.workdir / "clusters",
                        gate=gate, fence=fence, owns=owns, discovered=self._discovered,
                        record_keys=record_keys, writer=writer.name,
                        writer_active=writer.active,
                        helm_workers=HelmWorkerPool(memory.concurrency), helm_memory=memory,
                        changes=self.changes)
        fleet = self.fleet = Fleet(
            s, shared, home_events, resync=dirty.set,
            handed_over=self.shards.release if self.shards is not None else None)
        if self.shards is not None:
            self.shards.discovered = self._discovered
        self.discovery = Discovery(self.home, s, home_events, dirty.set).start()
        log.info("krypton started", namespace=s.namespace, chart=f"{s.chart_name} {s.chart_version}")
        await self._follow(dirty, fleet)

    async def _follow(self, dirty: asyncio.Event, fleet: Fleet) -> None:
        """Engage and disengage the fleet's clusters as discovery finds them, until the
        operator stops: every time `dirty` is set."""
        assert self.discovery is not None
        while not self.stopping.is_set():
            waiter = asyncio.create_task(dirty.wait())
            stopper = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            if self.stopping.is_set():
                break
            dirty.clear()
            desired, objects = await self.discovery.desired()
            if self.shards is None:
                await fleet.sync(desired)
                continue
            mine, elsewhere, waiting = await self._share(self.shards, desired, objects)
            await fleet.sync(mine, elsewhere)
            metrics.SHARD_OWNED.set(len(self.shards.held()))
            if waiting:  # assigned here, still held by a member not yet expired: try again
                asyncio.get_running_loop().call_later(self.settings.retry_period, dirty.set)

    def _start_rollout(self, policy: Policy, chart: ChartSource,
                       workers: Callable[[], dict[str, ClusterWorker]], home_events: EventRecorder,
                       fence: Callable[[], bool]) -> Callable[[str], RolloutGate]:
        """The fleet-wide rollout (F1), when configured: its controller here, or shared out
        among the replicas when the fleet is sharded. Its gate on each cluster's releases."""
        if not policy.enabled:
            return lambda _cluster: RolloutGate()
        if self.shards is not None:
            return self._share_rollout(policy, chart, workers, home_events)
        assert self.home is not None
        controller = RolloutController(self.home, self.settings.namespace, policy, chart,
                                       self.settings.chart_values, home_events, workers,
                                       fence=fence, metric_gate=self._metric_gate,
                                       told=self.changes.rollout_changed)
        self._rollout_tasks.append(asyncio.create_task(controller.run(self.stopping)))
        self._rollout_view = controller
        return controller.gate

    def _share_rollout(self, policy: Policy, chart: ChartSource,
                       workers: Callable[[], dict[str, ClusterWorker]], events: EventRecorder
                       ) -> Callable[[str], RolloutGate]:
        """--sharding with a progressive rollout: every replica follows the rollout state and
        publishes what its clusters observe; the replica holding the leader Lease runs the
        controller over every discovered cluster, as published."""
        s, shards, home = self.settings, self.shards, self.home
        assert shards is not None and home is not None
        follower = RolloutFollower(home, s.namespace, policy, chart, s.chart_values, workers,
                                   shards.publish, told=self.changes.rollout_changed)
        elector = self._rollout_elector = self._elector(identity=shards.identity)

        def everyone() -> dict[str, Published]:
            return {name: Published(read_publication(shards.published(name),
                                                     controller.current_target))
                    for name in self._discovered() or ()}
        controller = RolloutController(home, s.namespace, policy, chart, s.chart_values, events,
                                       everyone, fence=elector.holds,
                                       metric_gate=self._metric_gate)
        self._rollout_tasks += [asyncio.create_task(follower.run(self.stopping)),
                                asyncio.create_task(_lead_rollout(elector, controller, self.stopping))]
        self._rollout_view = follower
        return follower.gate

    def _elector(self, identity: str | None = None) -> LeaderElector:
        """An elector on the leader Lease (--leader-election-id and the Lease settings)."""
        s = self.settings
        assert self.home is not None
        return LeaderElector(self.home, s.lease_namespace, s.leader_election_id,
                             lease_duration=s.lease_duration, renew_deadline=s.renew_deadline,
                             retry_period=s.retry_period, identity=identity)

    def _discovered(self) -> frozenset[str] | None:
        """Every discovered cluster's name; None until discovery listed them."""
        return self.discovery.names() if self.discovery is not None else None

    async def _share(self, shards: Shards, desired: dict[str, ClusterSpec],
                     objects: list[dict[str, Any]]
                     ) -> tuple[dict[str, ClusterSpec], frozenset[str], bool]:
        """The clusters this replica serves (assigned here and their Lease taken), the
        engaged clusters now served elsewhere, and whether a claim must wait. A cluster's
        Secret or profile may pin it to a replica (--shard-pin-label)."""
        pins = sharding.pins(objects, self.settings.shard_pin_label)
        assigned = shards.assignment(list(desired), pins)
        mine, waiting = {}, False
        for name, spec in desired.items():
            if assigned.get(name) != shards.identity:
                continue
            if shards.owner(name) == shards.identity or await shards.claim(name):
                mine[name] = spec
            else:
                waiting = True
        fleet = self.fleet
        engaged = set(fleet.clusters) if fleet is not None else set()
        elsewhere = frozenset(n for n in engaged if n in assigned and
                              assigned[n] != shards.identity)
        return mine, elsewhere, waiting

    async def _hold(self, renewing: Awaitable[None]) -> None:
        """Renew the leader Lease or this replica's membership until the work is drained
        after stopping (a helm run finishing within --shutdown-timeout is still this
        replica's: no other may take its clusters meanwhile); when it ends before that, the
        Lease was lost: stop working at once (others take over) and exit 1 to come back as a
        standby or a new member."""
        await renewing
        if not self.drained.is_set():
            self.exit_code = 1
            self.lease_lost = True
            self.stopping.set()

    async def _shutdown(self) -> None:
        # A lost Lease leaves no grace: another replica leads already, so running helm
        # operations are stopped at once rather than finished.
        grace = 0.0 if self.lease_lost else self.settings.shutdown_timeout
        log.info("shutting down", grace=grace, lease_lost=self.lease_lost)
        if self.discovery is not None:
            await self.discovery.stop()
        for task in self._rollout_tasks:
            task.cancel()
        if self.fleet is not None:
            await self.fleet.shutdown(grace)
        self.drained.set()  # nothing runs any more: the Leases may go
        if self._lease_task is not None:
            self._lease_task.cancel()
        for elector in (self.elector, self._rollout_elector):
            if elector is not None:
                await elector.release()
        if self.shards is not None and not self.shards.lost:
            await self.shards.leave()  # every worker has stopped: hand everything over
        if self._presence_task is not None:
            self._presence_task.cancel()
        if self.writer is not None:
            await self.writer.withdraw()  # another instance takes its releases on at once
        if self.home is not None:
            await self.home.close()
        await self.web.stop()
        await self.health.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        log.info("stopped")


async def _lead_rollout(elector: LeaderElector, controller: RolloutController,
                        stopping: asyncio.Event) -> None:
    """Run the rollout controller whenever this replica holds the leader Lease; losing the
    Lease stops the controller only (this replica keeps serving its clusters)."""
    while await elector.acquire(stopping):
        leading = asyncio.create_task(controller.run(stopping))
        try:
            await elector.hold(stopping)
        finally:
            leading.cancel()
        controller.unload()
        if not stopping.is_set():
            log.warning("rollout leadership lost; standing by for the leader Lease")


def _always() -> bool:
    return True


def _everyone(_cluster: str) -> bool:
    return True
