"""This krypton instance as a writer of its releases (SPEC S6): the name it puts on the
records it makes, the Lease it keeps while it runs without the fleet's, whether the instance
named on a record is at work, and the warning at start when it runs without a Lease while
another instance holds the fleet's.

The rules are :mod:`krypton.decisions.trust.writers`'s; what is read here is the home cluster's
Leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import structlog

from krypton.adapters.events import EventRecorder, involved_lease, reporting_instance
from krypton.adapters.kube import Kube, now_micro
from krypton.decisions.errors import KryptonError
from krypton.decisions.model import epoch_seconds
from krypton.decisions.settings import Settings
from krypton.decisions.trust import leases, writers

log = structlog.get_logger("krypton")
SAID_MAX = 64  # other instances said (or Leases read), before the memory of them starts again
READ_AGAIN = 1.0  # seconds a Lease read is answered from memory: one read for many releases
LOOK_EVERY = 30.0  # seconds between looks for other instances beside this one


def _running_here(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live(lease: dict[str, Any] | None, own: float) -> bool:
    spec = (lease or {}).get("spec") or {}
    return bool(spec.get("holderIdentity")) and leases.live_by_wall_clock(spec, own, time.time())


async def _warn(events: EventRecorder, lease: dict[str, Any], said: str, message: str) -> None:
    """Two instances write the same releases: a Warning log line `said`, and a Warning Event
    AnotherInstance on the other's `lease`."""
    log.warning(said, detail=message)
    await events.emit(involved_lease(lease), "Warning", "AnotherInstance", message)


class Writer:
    """The writer krypton is, on the home cluster `home`."""

    def __init__(self, home: Kube, settings: Settings) -> None:
        self.home, self.settings = home, settings
        self.leased = settings.leader_elect or settings.sharding
        self.started = time.time()
        self.name = writers.name(leased=self.leased, lease_namespace=settings.lease_namespace,
                                 lease_name=settings.leader_election_id,
                                 host=reporting_instance(), pid=os.getpid())
        self.presence = ""  # the name of this instance's own Lease while it keeps one
        self._version = ""  # its resourceVersion as last written (a Lease is replaced at one)
        self._said: set[str] = set()  # the other instances' own Leases said (AnotherInstance)
        self._read: dict[str, tuple[float, dict[str, Any] | None]] = {}  # by name: when, what

    def _presence(self, name: str) -> dict[str, Any]:
        now = now_micro()
        meta: dict[str, Any] = {
            "name": name, "labels": {writers.PRESENCE_LABEL: "true",
                                     "app.kubernetes.io/managed-by": "krypton"},
            "annotations": {writers.PRESENCE_HOST: reporting_instance(),
                            writers.PRESENCE_PID: str(os.getpid())}}
        if self._version:
            meta["resourceVersion"] = self._version
        return {"metadata": meta,
                "spec": {"holderIdentity": self.name, "renewTime": now, "acquireTime": now,
                         "leaseDurationSeconds": int(self.settings.lease_duration)}}

    async def announce(self) -> None:
        """Without the fleet's Lease: make a Lease of this instance's own and be named after
        it, so that another instance sees exactly while this one runs (renewed by
        :meth:`keep`, deleted by :meth:`withdraw`). Leftovers of instances that ended
        without deleting theirs are deleted first: those of this host whose process is gone
        (this one's own predecessor, killed), and any unrenewed for an hour. Where it cannot
        be made, the process's name stands (judged by the time it wrote)."""
        s = self.settings
        if self.leased:
            return
        name = writers.presence_lease(s.lease_namespace, reporting_instance(), os.getpid())
        try:
            await self._prune()
            self.name = writers.name(leased=True, lease_namespace=s.lease_namespace,
                                     lease_name=name, host="", pid=0)
            made = await self.home.create_lease(s.lease_namespace, self._presence(name))
        except KryptonError as exc:
            self.name = writers.name(leased=False, lease_namespace="", lease_name="",
                                     host=reporting_instance(), pid=os.getpid())
            log.info("no lease of this instance's own: named after its process",
                     writer=self.name, error=str(exc))
            return
        self.presence, self._version = name, str(made["metadata"]["resourceVersion"])

    async def _prune(self) -> None:
        ns = self.settings.lease_namespace
        for lease in await self.home.list_leases(ns, f"{writers.PRESENCE_LABEL}=true"):
            meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
            renewed = epoch_seconds(spec.get("renewTime")) or 0.0
            notes = meta.get("annotations") or {}
            pid = str(notes.get(writers.PRESENCE_PID) or "")
            gone_here = notes.get(writers.PRESENCE_HOST) == reporting_instance() and \
                pid.isascii() and pid.isdigit() and len(pid) < 10 and int(pid) != os.getpid() and \
                not _running_here(int(pid))
            if gone_here or time.time() - renewed > writers.PRESENCE_STALE:
                await self.home.delete_lease(ns, str(meta.get("name")),
                                             str(meta.get("resourceVersion") or "") or None)

    async def keep(self, events: EventRecorder) -> None:
        """Renew this instance's own Lease until cancelled (a third of its duration apart),
        saying each other instance that keeps one beside it at start and every LOOK_EVERY
        seconds (:meth:`_look_around`); a renewal that fails is tried again at the next
        one."""
        if not self.presence:
            return
        looked = -LOOK_EVERY
        while True:
            if time.monotonic() - looked >= LOOK_EVERY:
                looked = time.monotonic()
                with contextlib.suppress(KryptonError):
                    await self._look_around(events)
            await asyncio.sleep(self.settings.lease_duration / 3)
            ns = self.settings.lease_namespace
            try:
                if not self._version:  # a renewal failed: at the version it has now
                    found = await self.home.get_lease(ns, self.presence)
                    self._version = str(((found or {}).get("metadata") or {}).get(
                        "resourceVersion") or "")
                body = self._presence(self.presence)
                written = await (self.home.replace_lease(ns, self.presence, body)
                                 if self._version else self.home.create_lease(ns, body))
                self._version = str(written["metadata"]["resourceVersion"])
            except KryptonError as exc:
                self._version = ""
                log.info("own lease not renewed", lease=self.presence, error=str(exc))

    async def _look_around(self, events: EventRecorder) -> None:
        """Say once, loudly, each other instance running beside this one without the
        fleet's Lease (its own Lease renewed): both write the same releases."""
        s = self.settings
        for lease in await self.home.list_leases(s.lease_namespace,
                                                 f"{writers.PRESENCE_LABEL}=true"):
            name = str((lease.get("metadata") or {}).get("name"))
            if name == self.presence or name in self._said or not _live(lease, s.lease_duration):
                continue
            if len(self._said) >= SAID_MAX:
                self._said.clear()
            self._said.add(name)
            other = str(lease["spec"]["holderIdentity"])[:200]
            message = (f"another krypton instance ({other}) runs beside this one ({self.name}) "
                       "without the fleet's Lease: both write the same releases. Each leaves "
                       "alone what the other writes while it runs (AnotherWriter), but only "
                       "one should run: stop one of them, or run both with --leader-elect")
            await _warn(events, lease, "another krypton instance runs beside this one", message)

    async def withdraw(self) -> None:
        """Delete this instance's own Lease: another instance takes its releases on at once."""
        if self.presence:
            with contextlib.suppress(KryptonError):
                await self.home.delete_lease(self.settings.lease_namespace, self.presence)
            self.presence = ""

    async def active(self, writer: str, written: float) -> float:
        """For how many seconds more the instance `writer`, which wrote a record at
        `written`, is taken to be at work (0: it is not): while its Lease is renewed, for
        one that has a Lease in krypton's own Lease namespace; else by the time it wrote
        (:func:`writers.active_without_lease`). The name comes from a record's label, which
        a tenant's admin may write where the records are not guarded: it never makes
        krypton read a Lease anywhere else."""
        lease = writers.lease_of(writer)
        if lease is not None and lease[0] == self.settings.lease_namespace:
            try:
                spec = (await self._lease(lease[1]) or {}).get("spec") or {}
                return leases.left_by_wall_clock(spec, self.settings.lease_duration,
                                                 time.time()) \
                    if spec.get("holderIdentity") else 0.0
            except KryptonError as exc:  # not ours to read: the time
                log.info("writer's lease not readable", writer=writer, error=str(exc))
        return writers.active_without_lease(written, self.started, time.time(),
                                            self.settings.resync_period)

    async def _lease(self, name: str) -> dict[str, Any] | None:
        """The Lease `name` of krypton's Lease namespace, read at most once a READ_AGAIN."""
        now = time.monotonic()
        if (hit := self._read.get(name)) is not None and now - hit[0] < READ_AGAIN:
            return hit[1]
        found = await self.home.get_lease(self.settings.lease_namespace, name)
        if len(self._read) >= SAID_MAX:
            self._read.clear()
        self._read[name] = (now, found)
        return found

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
        await _warn(events, lease, "another krypton instance holds the fleet's lease", message)
