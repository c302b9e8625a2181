"""Leader election on a coordination.k8s.io Lease (SPEC O4).

A candidate takes the Lease when it is free or when its holder has not renewed it for a
lease duration, measured on the candidate's own clock from the moment it last saw the
record change (so clock skew between replicas does not matter). Every write carries the
resourceVersion it read, so two candidates can never both win. The leader renews every
retry period, gives up when it could not renew within the renew deadline, and on shutdown
releases the Lease so that a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.events import EventRecorder, involved_lease, reporting_instance
from krypton.adapters.kube import Kube, now_micro
from krypton.decisions.errors import TemporaryError
from krypton.decisions.trust import leases
from krypton.runtime.pause import pause

log = structlog.get_logger("krypton.leader")


async def keep_renewed(stopping: asyncio.Event, *, every: float, deadline: Callable[[], float],
                       renew: Callable[[], Awaitable[object]], holds: Callable[[], bool],
                       what: str, logger: Any = log,
                       each: Callable[[], Awaitable[None]] | None = None) -> bool:
    """Renew a Lease every `every` seconds until `stopping` (True) or until it is no longer
    held (False). One deadline for all attempts since the last successful renewal
    (client-go's semantics): an attempt may only use the time left until the monotonic
    `deadline()`, so a loss is noticed within the renew deadline, well before the Lease
    expires for the others. `each` runs after every period in which the Lease is held."""
    while not stopping.is_set():
        if await pause(stopping, every):
            return True
        left = deadline() - time.monotonic()
        try:
            if left > 0:
                async with asyncio.timeout(left):
                    await renew()
        except (TemporaryError, TimeoutError) as exc:
            logger.warning(f"{what} renewal failed", error=str(exc) or type(exc).__name__)
        if not holds():
            return False
        if each is not None:
            await each()
    return True


async def not_believed(kube: Kube, lease: dict[str, Any], what: str, holder: str,
                       doubts: list[str]) -> None:
    """Say that a Lease is not believed as written (SPEC S2): a Warning log line naming
    its holder, krypton_lease_not_believed, and a Warning Event LeaseNotBelieved on it."""
    meta = lease.get("metadata") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    log.warning(f"{what} Lease not believed as written", lease=name, holder=holder,
                doubts=doubts)
    metrics.LEASE_NOT_BELIEVED.labels(name).set(1)
    await EventRecorder(kube).emit(involved_lease(lease), "Warning", "LeaseNotBelieved",
                                   f"{what} Lease {name} {leases.describe(holder, doubts)}; "
                                   "judged with ours")


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str, *, lease_duration: float,
                 renew_deadline: float, retry_period: float, identity: str | None = None) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.identity = identity or f"{reporting_instance()}_{uuid.uuid4().hex[:8]}"
        self._seen: tuple[str, str] | None = None
        self._seen_at = 0.0
        self._renewed_at = 0.0  # monotonic time of the start of the last successful write
        self.is_leader = False
        self.holder = ""  # another replica holding the Lease, as last seen
        self.doubts: list[str] = []  # what that Lease says and is not believed
        self._reported: tuple[str, tuple[str, ...]] | None = None

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    def standing_by(self) -> str:
        """Why this replica is not leading, naming the holder (for /readyz)."""
        return f"standby: leader Lease {self.lease} {leases.describe(self.holder, self.doubts)}"

    async def _report(self, lease: dict[str, Any], holder: str, doubts: list[str]) -> None:
        """Log who holds the Lease when that changes; a Lease not believed as written is
        also a Warning Event on it and a metric (SPEC S2)."""
        said = (holder, leases.kinds(doubts))
        if said == self._reported:
            return
        self._reported = said
        if self.holder and self.holder != holder:
            metrics.LEASE_HOLDER.remove(self.lease, self.holder)
        metrics.LEASE_HOLDER.labels(self.lease, holder).set(1)
        self.holder, self.doubts = holder, doubts
        if not doubts:
            metrics.LEASE_NOT_BELIEVED.labels(self.lease).set(0)
            log.info("leader Lease held by another replica", lease=self.lease, holder=holder)
            return
        await not_believed(self.kube, lease, "leader", holder, doubts)

    def holds(self) -> bool:
        """Leadership held and renewed within the renew deadline: a fence that needs no
        I/O. A process paused past its Lease (SIGSTOP, a long GC, a frozen VM) fails it the
        moment it runs again, before it can start anything."""
        return self.is_leader and time.monotonic() - self._renewed_at < self.renew_deadline

    async def _try(self) -> bool:
        started = time.monotonic()
        if await self._write():
            self._renewed_at = started  # counted from before the request, never after
            return True
        return False

    async def _write(self) -> bool:
        now = now_micro()
        lease = await self.kube.get_lease(self.namespace, self.name)
        spec_new: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "renewTime": now,
        }
        if lease is None:
            spec_new.update(acquireTime=now, leaseTransitions=0)
            await self.kube.create_lease(self.namespace, {
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec_new})
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime")))
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        if holder and holder != self.identity:
            await self._report(lease, holder, leases.doubts(spec, self.lease_duration,
                                                            time.time()))
            duration, _ = leases.believed_duration(spec, self.lease_duration)
            if time.monotonic() - self._seen_at < duration:
                return False
        if holder != self.identity:
            spec_new["acquireTime"] = now
            spec_new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        else:
            spec_new["acquireTime"] = spec.get("acquireTime") or now
            spec_new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0)
        body = {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": spec_new}
        await self.kube.replace_lease(self.namespace, self.name, body)
        return True

    async def acquire(self, stopping: asyncio.Event) -> bool:
        """Wait until this process leads (True) or `stopping` is set (False)."""
        log.info("waiting for leadership", lease=f"{self.namespace}/{self.name}",
                 identity=self.identity)
        while not stopping.is_set():
            try:
                if await self._try():
                    self.is_leader = True
                    log.info("became leader", lease=f"{self.namespace}/{self.name}",
                             identity=self.identity)
                    return True
            except TemporaryError as exc:
                log.debug("lease attempt failed", error=str(exc))
            await pause(stopping, self.retry_period)
        return False

    async def hold(self, stopping: asyncio.Event) -> None:
        """Renew until `stopping` is set; returns early when leadership is lost (another
        holder took the Lease, or no renewal within the renew deadline)."""
        if not await keep_renewed(stopping, every=self.retry_period,
                                  deadline=lambda: self._renewed_at + self.renew_deadline,
                                  renew=self._renew, holds=self.holds, what="lease"):
            self.is_leader = False
            log.error("leadership lost", lease=f"{self.namespace}/{self.name}")

    async def _renew(self) -> None:
        if not await self._try():
            self.is_leader = False  # another holder has the Lease

    async def release(self) -> None:
        if not self.is_leader:
            return
        try:
            lease = await self.kube.get_lease(self.namespace, self.name)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = dict(lease["spec"], holderIdentity="", leaseDurationSeconds=1)
                await self.kube.replace_lease(self.namespace, self.name, {
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": spec})
                log.info("lease released", lease=f"{self.namespace}/{self.name}")
        except TemporaryError as exc:
            log.warning("lease release failed", error=str(exc))
        self.is_leader = False
