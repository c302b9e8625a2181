"""The Tenants as krypton's own writes left them, told to whoever listens (the fleet page,
SPEC O16): one notification per write, from the one place every write of a Tenant passes
(:meth:`ClusterRuntime.wrote`), never from a second watch. The changes are kept once, in one
bounded log that every listener reads from its own place: a listener that falls more than
the log behind loses what it did not take and is told so once, to read the whole again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

KEPT = 256  # changes kept: a listener further behind is told to read the whole again
ROW, LOST, ROLLOUT = "row", "lost", "rollout"


@dataclass(frozen=True, eq=False)
class Change:
    """One change, the same value to every listener: a Tenant as `cluster`'s write left it
    (ROW), the rollout's state changed (ROLLOUT), or what a listener that fell behind is told
    instead of what it lost (LOST). `at` is when it was told (epoch seconds); `memo` keeps
    what the first listener made of it, for the others."""

    kind: str
    cluster: str = ""
    tenant: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    memo: dict[str, Any] = field(default_factory=dict)


class Feed:
    """One listener's place in the log."""

    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self._next = changes.told  # the number of the first change not taken yet

    async def wait(self, timeout: float) -> None:
        """Until a change not taken yet is there; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while self._next >= self._changes.told:
                await self._changes.newer()

    def take(self) -> list[Change]:
        """The changes not taken yet, or LOST once when some of them are no longer kept."""
        changes = self._changes
        first = changes.told - len(changes.log)
        if self._next < first:
            self._next = changes.told
            return [Change(LOST)]
        taken = list(changes.log)[self._next - first:]
        self._next = changes.told
        return taken


class Changes:
    """The fleet's writes of Tenants, to its listeners."""

    def __init__(self, kept: int = KEPT) -> None:
        self.log: deque[Change] = deque(maxlen=kept)
        self.told = 0  # changes told so far
        self.listeners = 0
        self._newer: asyncio.Event | None = None  # set when a change comes

    def tell(self, cluster: str, tenant: dict[str, Any]) -> None:
        """`tenant` as `cluster`'s write left it (its object as the server answered)."""
        if self.listeners:  # nobody looks: nothing is made, nothing kept
            self._tell(Change(ROW, cluster, tenant, time.time()))

    def rollout_changed(self) -> None:
        """The rollout's state changed, as this replica follows it."""
        if self.listeners:
            self._tell(Change(ROLLOUT, at=time.time()))

    def _tell(self, change: Change) -> None:
        self.log.append(change)
        self.told += 1
        if self._newer is not None:
            self._newer.set()
            self._newer = None

    async def newer(self) -> None:
        """Until the next change is told."""
        if self._newer is None:
            self._newer = asyncio.Event()
        await self._newer.wait()

    @contextlib.contextmanager
    def listen(self) -> Iterator[Feed]:
        """A place in the log, from now on, for as long as the block runs."""
        self.listeners += 1
        try:
            yield Feed(self)
        finally:
            self.listeners -= 1
            if not self.listeners:
                self.log.clear()  # what nobody will read goes
