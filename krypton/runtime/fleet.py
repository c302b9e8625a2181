"""Engages and disengages one worker per cluster to match the discovered clusters (D1-D5,
D10): their Secrets and ClusterProfiles.

The fleet is reconciled as a set: stop what is redundant or changed *first*, then start what
is missing. A Secret whose kubeconfig is rejected, or a profile krypton cannot reach with
the admin's providers, gets a Warning Event and no worker until its content changes
(retrying the same bytes cannot succeed); an engaged cluster that cannot be reached is
retried by its worker with backoff.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.events import EventRecorder
from krypton.decisions import retry
from krypton.decisions.charts.fingerprint import deep_merge
from krypton.decisions.clusters import inventory, kubeconfig
from krypton.decisions.clusters.discovery import (
    PROFILE,
    SELF_CLUSTER,
    ClusterSpec,
    cluster_values,
    cluster_window,
)
from krypton.decisions.errors import KubeconfigRejected
from krypton.decisions.model import cluster_name_problem
from krypton.decisions.settings import Settings
from krypton.decisions.trust import redact
from krypton.decisions.windows import Window
from krypton.runtime.clusterworker import ClusterWorker, Shared

log = structlog.get_logger("krypton.fleet")
HEALTHY_RUN = 60.0  # a worker that ran this long before failing restarts from the minimum delay
CANCEL_AGAIN = 60.0  # seconds a cancelled worker has to end before it is cancelled once more


@dataclass
class Engaged:
    spec: ClusterSpec
    worker: ClusterWorker | None
    task: asyncio.Task[None] | None
    problem: str = ""  # why the cluster is not serving: rejected, failing, ... ("" = fine)


async def end_task(task: asyncio.Task[None], *, cluster: str) -> None:
    """Cancel a cluster's worker and wait until it has ended.

    A cancellation can be lost: code that catches CancelledError, or an await that returns
    what it waited for when that finished at the moment of the cancel (Python 3.11's
    asyncio.wait_for does). A worker that kept running then kept its cluster for good: never
    released to the replica it was handed to, never engaged again. So one still running
    CANCEL_AGAIN seconds after its cancel (well past the grace a cancelled helm gets) is
    cancelled again, with a warning."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN)
        if not task.done():
            log.warning("worker still running after it was cancelled; cancelling it again",
                        cluster=cluster, waited=CANCEL_AGAIN)
    if not task.cancelled():
        task.exception()  # retrieved: the supervisor reported it already


class Fleet:
    def __init__(self, settings: Settings, shared: Shared, home_events: EventRecorder, *,
                 resync: Callable[[], None] = lambda: None,
                 handed_over: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.shared = shared
        self.home_events = home_events
        self.clusters: dict[str, Engaged] = {}
        # clusters being disengaged (removed, or drained before re-engaging with new
        # credentials): each in a task of its own, so that none waits for another
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self.resync = resync  # ask for another sync
        # --sharding: a cluster handed to another replica, once its worker stopped
        self.handed_over = handed_over

    @property
    def workers(self) -> dict[str, ClusterWorker]:
        return {n: e.worker for n, e in self.clusters.items() if e.worker is not None}

    def health(self) -> dict[str, str]:
        """Every discovered cluster and its state, for /readyz and logs."""
        out = {}
        for name, e in sorted(self.clusters.items()):
            if e.worker is not None and e.worker.engaged and e.worker.health.problem:
                out[name] = f"failing: {e.worker.health.problem}"
            elif e.worker is not None and e.worker.engaged and e.worker.health.crd_outdated:
                out[name] = f"engaged, CRDOutdated: {e.worker.health.crd_outdated}"
            elif e.worker is not None and e.worker.engaged and e.worker.health.guard_known \
                    and not e.worker.health.guard.guarded:
                out[name] = f"engaged, RecordsUnguarded: {e.worker.health.guard.message}"
            elif e.worker is not None and e.worker.engaged:
                out[name] = "engaged"
            elif e.problem:
                out[name] = e.problem
            elif e.worker is not None and e.worker.health.problem:
                waiting = f"{e.worker.last_error}; " if e.worker.last_error else ""
                out[name] = f"engaging: {waiting}failing: {e.worker.health.problem}"
            elif e.worker is not None and e.worker.last_error:
                out[name] = f"engaging: {e.worker.last_error}"
            else:
                out[name] = "engaging"
        return out

    async def report(self, cluster: str, type_: str, reason: str, message: str) -> None:
        engaged = self.clusters.get(cluster)
        if engaged is None:
            return
        await self.home_events.emit(engaged.spec.involved, type_, reason, message)

    async def sync(self, desired: dict[str, ClusterSpec],
                   elsewhere: frozenset[str] = frozenset()) -> None:
        """Match the engaged clusters to the discovered ones, stopping first.

        A cluster whose Secret or profile is gone, or whose kubeconfig or access changed,
        leaves in a task of its
        own: a changed one is drained (no new work; running helm gets --shutdown-timeout to
        finish, as on shutdown) and engages again with the new credentials when that task
        ends. No engagement or disengagement waits for another cluster's. A cluster in
        `elsewhere` (served by another replica under --sharding) is drained the same way
        and handed over: not forgotten, since it did not leave the fleet.
        """
        for name in list(self.clusters):
            if name in elsewhere:
                self._leave(name, removed=False, handover=True)
            elif name not in desired:
                self._leave(name, removed=True)
            elif desired[name].digest != self.clusters[name].spec.digest:
                self._leave(name, removed=False)
        for name, spec in desired.items():
            if name not in self.clusters and name not in self._leaving:
                await self._engage(spec)

    def _leave(self, name: str, *, removed: bool, handover: bool = False) -> None:
        grace = 0.0 if removed else self.settings.shutdown_timeout

        async def leave() -> None:
            try:
                await self._disengage(name, grace, removed=removed)
                if handover:
                    metrics.drop_cluster(name)
                    if self.handed_over is not None:
                        await self.handed_over(name)
            finally:
                del self._leaving[name]
                self.resync()  # engage the new credentials (or whatever is wanted now)

        self._leaving[name] = asyncio.create_task(leave(), name=f"leave-{name}")

    async def _engage(self, spec: ClusterSpec) -> None:
        self.clusters[spec.name] = Engaged(spec, None, None)
        try:
            problem = cluster_name_problem(spec.name)
            if problem:
                raise KubeconfigRejected(problem, reason="ClusterNameInvalid")
            if spec.source == PROFILE:
                kc = kubeconfig.for_profile(spec.name, inventory.profile_access(
                    spec.profile or {}, self.settings.profile_providers))
            else:
                kc = kubeconfig.parse(spec.kubeconfig,
                                      trust=self.settings.trust_kubeconfig_secrets,
                                      allow_in_cluster=spec.name == SELF_CLUSTER,
                                      pod_server=self.settings.pod_server)
            values = cluster_values(spec)
            window = cluster_window(spec, self.settings.maintenance_window)
        except KubeconfigRejected as exc:
            message = str(exc)
            if spec.kubeconfig is None and spec.source != PROFILE:
                message = f"data key {self.settings.kubeconfig_key!r}: {message}"
            self.clusters[spec.name].problem = f"rejected: {exc.reason}: {message}"
            if exc.reason == "ClusterProfilePending":  # its manager has not written it yet
                log.info("cluster profile pending", cluster=spec.name, detail=message)
                return
            log.warning("cluster rejected", cluster=spec.name, source=spec.source,
                        reason=exc.reason, error=message)
            await self.report(spec.name, "Warning", exc.reason, message)
            return
        redact.register(kc.token, kc.password)
        for warning in kc.warnings:
            log.warning("credentials expiring soon", cluster=spec.name, detail=warning)
            await self.report(spec.name, "Warning", "CredentialsExpiringSoon", warning)
        engaged = self.clusters[spec.name]
        merged = deep_merge(self.settings.chart_values, values)
        engaged.task = asyncio.create_task(self._supervise(engaged, kc, merged, window),
                                           name=f"cluster-{spec.name}")
        log.info("cluster engaging", cluster=spec.name)

    async def _supervise(self, engaged: Engaged, kc: kubeconfig.Kubeconfig,
                         values: dict[str, Any], window: Window | None) -> None:
        """Run the cluster's worker; restart it with capped backoff when it fails (SPEC D8).

        An unexpected exception is a defect or an input nobody foresaw: it is reported
        (Warning Event WorkerFailed on the Secret, metric, /readyz, log line, all without
        credentials) and the worker starts again, never taking the process or another
        cluster with it.
        """
        name = engaged.spec.name
        failures = 0
        while True:
            worker = ClusterWorker(name, kc, values, self.shared, window)
            engaged.worker = worker
            started = time.monotonic()
            try:
                await worker.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - supervision: report and restart
                failures = 1 if time.monotonic() - started > HEALTHY_RUN else failures + 1
                delay = retry.WORKER_RESTART.delay(failures)
                detail = redact.describe(exc)
                metrics.WORKER_FAILURES.labels(name).inc()
                engaged.problem = f"failing: WorkerFailed: {detail}"
                log.error("worker failed", cluster=name, error=detail, restart_in=delay)
                await self.report(name, "Warning", "WorkerFailed",
                                  f"worker failed with {detail}; restarting in {delay:.0f}s")
            await asyncio.sleep(delay)
            engaged.problem = ""

    async def _disengage(self, name: str, grace: float = 0.0, *, removed: bool = False) -> None:
        engaged = self.clusters.pop(name)
        if grace > 0:
            log.info("cluster draining", cluster=name, grace=grace)
        if engaged.worker is not None and removed:
            await engaged.worker.withdraw()
        if engaged.worker is not None:
            await engaged.worker.stop(grace)
        if engaged.task is not None:
            await end_task(engaged.task, cluster=name)
        if removed:
            metrics.drop_cluster(name)
        log.info("cluster removed from the fleet" if removed else "cluster stopped", cluster=name)

    async def shutdown(self, grace: float) -> None:
        """Stop every worker; running reconciles get up to `grace` seconds to finish."""
        await asyncio.gather(*(e.worker.stop(grace) for e in self.clusters.values()
                               if e.worker is not None),
                             *list(self._leaving.values()), return_exceptions=True)
        # then cancel what is still running, every cluster at once: each cancelled helm gets
        # a bounded grace of its own (helm.STOP_GRACE), so the whole stop stays bounded
        await asyncio.gather(*(self._disengage(name) for name in list(self.clusters)))
