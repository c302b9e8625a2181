"""A cluster's Tenant keys, from its watches to its reconciles (SPEC R2, R3).

Which watch events start a pass (not the echoes of the cluster's own writes; a change of the
Tenant itself, not of its status, cuts a backoff short), which Tenants a change of a release
record concerns, the de-duplicating queue, and at most --max-concurrent-reconciles passes at
once, each in a task of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.budget import Budget
from krypton.decisions import conditions as cond
from krypton.decisions.errors import HOSTILE_ANSWERS, KryptonError
from krypton.decisions.model import TenantKey
from krypton.runtime.reconcile import ClusterRuntime, Reconciler
from krypton.runtime.reconcile.memory import Memory, OwnWrites
from krypton.runtime.workqueue import QueueClosed, WorkQueue


class Consumer:
    """The queue of one cluster's Tenant keys and the passes it hands them to."""

    def __init__(self, name: str, max_concurrent: int) -> None:
        self.name, self.max_concurrent = name, max_concurrent
        self.log = structlog.get_logger("krypton.worker").bind(cluster=name)
        self.queue: WorkQueue[TenantKey] = WorkQueue()
        self.memory = Memory(name)  # what is remembered of each Tenant of the cache
        self.own_writes = OwnWrites(self.memory)  # its Tenant writes, whose echoes start no pass
        self.reconciles = 0
        self.release_changes = 0  # release record changes seen (the orphan look's clock)
        self._busy = 0
        self._idle = asyncio.Event()  # set while no reconcile is running
        self._idle.set()
        self._refused: Callable[[KryptonError], None] = lambda _exc: None

    async def close(self, grace: float = 0.0) -> None:
        """Hand out no key any more; give running passes up to `grace` seconds to end."""
        await self.queue.close()
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._idle.wait()

    # -- what starts a pass ------------------------------------------------------------------

    def tenant_changed(self, type_: str, obj: dict[str, Any]) -> None:
        """A Tenant watch event: its key is queued, unless the event is the echo of this
        cluster's own write. Only a change of the Tenant itself (not of its status) is
        urgent: it cuts a backoff short."""
        meta = obj["metadata"]
        key = TenantKey(meta["namespace"], meta["name"])
        signature = (meta.get("generation"), meta.get("deletionTimestamp"),
                     tuple(sorted((meta.get("annotations") or {}).items())),
                     tuple(meta.get("finalizers") or ()))
        if type_ == "DELETED":
            self._went(key)
            self.queue.add(key, urgent=True)
            return
        kept = self.memory.of(key)  # made on first sight
        kept.went = False
        urgent, kept.signature = kept.signature != signature, signature
        version = str(meta.get("resourceVersion"))
        if self.queue.processing(key):
            self.own_writes.hold(key, version, urgent=urgent)
            return
        if self.own_writes.echo(key, version):
            return  # this cluster's own write: the pass that made it knew the result
        self.queue.add(key, urgent=urgent)

    def drop_unlisted(self, store: Mapping[tuple[str, str], Any]) -> None:
        """After an engagement's first list of the Tenants: the memories of those not in it
        are of Tenants that went while no watch saw them go (the cluster was away)."""
        for key in self.memory:
            if (key.namespace, key.name) not in store:
                self._went(key)

    def release_moved(self, rt: ClusterRuntime, namespace: str, release: str, *,
                      gone: bool) -> None:
        """A release in `namespace` changed (or went): its Tenant is looked at, and when one
        went, the Tenants refused for SharedObjects (it may have owned what they need)."""
        self.release_changes += 1
        refused = cond.cluster_type(cond.ERROR, self.name)
        if not gone:
            if rt.own_release_change(namespace, release):
                return  # its own helm run's records: that pass tells the outcome
            for ns in self.memory.namespaces_with(namespace):
                self.queue.add(TenantKey(ns, namespace), urgent=False)
            return
        for (ns, name), tenant in list(rt.tenants.items()):
            if name == namespace:
                self.queue.add(TenantKey(ns, name), urgent=False)
            elif cond.holds(tenant, refused, "SharedObjects"):
                # the release that went may have owned what this Tenant was refused
                self.queue.add(TenantKey(ns, name), urgent=True)

    def workload_turned(self, key: TenantKey) -> None:
        """A followed workload became ready or stopped being ready: look at it now (a
        ReadinessTimeout's backoff is cut short)."""
        self.queue.add(key, urgent=True)

    def requeue(self, keys: list[tuple[str, str]]) -> None:
        for ns, name in keys:
            self.queue.add(TenantKey(ns, name), urgent=False)

    # -- the passes ----------------------------------------------------------------------------

    async def run(self, reconciler: Reconciler, group: asyncio.TaskGroup,
                  budget: Budget | None = None,
                  refused: Callable[[KryptonError], None] = lambda _exc: None,
                  held: Callable[[float], None] = lambda _wait: None) -> None:
        """Hand each queued key to a task of its own, at most --max-concurrent-reconciles at
        once: an idle cluster keeps one waiting task, not one per allowed reconcile. Over the
        cluster's `budget` no pass starts until its turn, and none faster than its rate (a
        wait goes to `held`); an answer past a bound met by a pass goes to `refused` (a
        strike, SPEC S5)."""
        self._refused, budget = refused, budget or Budget()
        slots = asyncio.Semaphore(self.max_concurrent)
        while True:
            await slots.acquire()
            try:
                key = await self.queue.get()
            except QueueClosed:
                return
            await budget.turn()
            if wait := budget.take_pass():
                held(wait)
                await asyncio.sleep(wait)
            self._busy += 1
            self._idle.clear()
            task = group.create_task(self._reconcile(reconciler, key),
                                     name=f"{self.name}-reconcile")
            task.add_done_callback(functools.partial(self._reconciled, slots, key))

    def _reconciled(self, slots: asyncio.Semaphore, key: TenantKey, _task: object) -> None:
        """A reconcile task ended (also one cancelled before it ran): its slot and key are
        free again."""
        slots.release()
        self._busy -= 1
        if not self._busy:
            self._idle.set()
        urgent = self.own_writes.settle(key)
        if urgent is not None:
            self.queue.add(key, urgent=urgent)  # someone else's change came while it ran
        self.queue.done(key)
        kept = self.memory.peek(key)
        if kept is not None and kept.went:
            self._went(key)

    def _went(self, key: TenantKey) -> None:
        """The Tenant went from the cluster's cache: what is remembered of it is dropped, at
        once or, while a pass of it runs, when that pass ends (the pass may still write it)."""
        if self.queue.processing(key):
            kept = self.memory.peek(key)
            if kept is not None:
                kept.went = True
            return
        self.memory.drop(key)

    async def _reconcile(self, reconciler: Reconciler, key: TenantKey) -> None:
        metrics.QUEUE_DEPTH.labels(self.name).set(len(self.queue))
        start = time.monotonic()
        try:
            outcome = await reconciler.reconcile(key)
            if outcome.retry:
                self.queue.retry(key)
            else:
                self.queue.forget(key)
                if outcome.requeue_after:
                    self.queue.add_after(key, outcome.requeue_after)
        except KryptonError as exc:
            delay = self.queue.retry(key)
            if exc.reason in HOSTILE_ANSWERS:
                self._refused(exc)
            metrics.RECONCILE_ERRORS.labels(self.name, exc.reason).inc()
            self.log.warning("reconcile failed", tenant=str(key), reason=exc.reason,
                             error=str(exc), retry_in=delay)
        except Exception:  # noqa: BLE001 - a defect must not kill the worker
            delay = self.queue.retry(key)
            metrics.RECONCILE_ERRORS.labels(self.name, "Internal").inc()
            self.log.exception("reconcile crashed", tenant=str(key), retry_in=delay)
        finally:
            self.reconciles += 1
            metrics.RECONCILES.labels(self.name).inc()
            metrics.RECONCILE_SECONDS.labels(self.name).observe(time.monotonic() - start)
