"""This krypton instance as a writer of its releases (SPEC S6): the name it puts on the
records it makes, whether the instance named on a record is at work, and the warning at
start when it runs without a Lease while another instance holds the fleet's.

The rules are :mod:`krypton.decisions.writers`'s; what is read here is the home cluster's
Leases.
"""

from __future__ import annotations

import os
import time
from typing import Any

import structlog

from krypton.adapters.events import EventRecorder, involved_lease, reporting_instance
from krypton.adapters.kube import Kube
from krypton.decisions import leases, writers
from krypton.decisions.errors import KryptonError
from krypton.decisions.settings import Settings

log = structlog.get_logger("krypton")


def _live(lease: dict[str, Any] | None, own: float) -> bool:
    spec = (lease or {}).get("spec") or {}
    return bool(spec.get("holderIdentity")) and leases.live_by_wall_clock(spec, own, time.time())


class Writer:
    """The writer krypton is, on the home cluster `home`."""

    def __init__(self, home: Kube, settings: Settings) -> None:
        self.home, self.settings = home, settings
        self.leased = settings.leader_elect or settings.sharding
        self.started = time.time()
        self.name = writers.name(leased=self.leased, lease_namespace=settings.lease_namespace,
                                 lease_name=settings.leader_election_id,
                                 host=reporting_instance(), pid=os.getpid())

    async def active(self, writer: str, written: float) -> bool:
        """Whether the instance `writer`, which wrote a record at `written`, is at work: its
        Lease renewed, for one that has a Lease in krypton's own Lease namespace; else by the
        time it wrote (:func:`writers.active_without_lease`). The name comes from a record's
        label, which a tenant's admin may write where the records are not guarded: it never
        makes krypton read a Lease anywhere else."""
        lease = writers.lease_of(writer)
        if lease is not None and lease[0] == self.settings.lease_namespace:
            try:
                return _live(await self.home.get_lease(*lease), self.settings.lease_duration)
            except KryptonError as exc:  # another namespace's, not ours to read: the time
                log.info("writer's lease not readable", writer=writer, error=str(exc))
        return writers.active_without_lease(written, self.started, time.time(),
                                            self.settings.resync_period)

    async def warn_if_unleased(self, events: EventRecorder) -> None:
        """Say loudly, at start, that this instance runs without a Lease while another holds
        the fleet's: both will write the same releases (each leaves to the other what the
        other wrote, SPEC S6, but only one should run)."""
        s = self.settings
        if self.leased:
            return
        try:
            lease = await self.home.get_lease(s.lease_namespace, s.leader_election_id)
        except KryptonError:
            return
        if lease is None or not _live(lease, s.lease_duration):
            return
        holder = str(lease["spec"]["holderIdentity"])[:200]
        message = (f"krypton runs without a Lease (--leader-elect is off) while {holder} holds "
                   f"the fleet's Lease {s.lease_namespace}/{s.leader_election_id}: two "
                   "instances write the same releases. Each leaves alone what the other wrote "
                   "(AnotherWriter), but only one should run: stop this one, or start it with "
                   "--leader-elect")
        log.warning("another krypton instance holds the fleet's lease", holder=holder,
                    detail=message)
        await events.emit(involved_lease(lease), "Warning", "AnotherInstance", message)
