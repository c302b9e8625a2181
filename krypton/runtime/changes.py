"""The Tenants as krypton's own writes left them, told to whoever listens (the fleet page,
SPEC O16): one notification per write, from the one place every write of a Tenant passes
(:meth:`ClusterRuntime.wrote`), never from a second watch. A listener's queue is bounded: one
that falls behind loses what it did not take and is told so once, to read the whole again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

QUEUED = 256  # changes one listener may be behind before it is told to read the whole again
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


class Changes:
    """The fleet's writes of Tenants, to its listeners."""

    def __init__(self, queued: int = QUEUED) -> None:
        self.queued = queued
        self._listeners: set[asyncio.Queue[Change]] = set()

    def tell(self, cluster: str, tenant: dict[str, Any]) -> None:
        """`tenant` as `cluster`'s write left it (its object as the server answered)."""
        self._tell(Change(ROW, cluster, tenant, time.time()))

    def rollout_changed(self) -> None:
        """The rollout's state changed, as this replica follows it."""
        self._tell(Change(ROLLOUT, at=time.time()))

    def _tell(self, change: Change) -> None:
        for queue in self._listeners:
            if queue.full():
                continue  # said once: LOST stands at its end until it is read
            queue.put_nowait(Change(LOST) if queue.qsize() == self.queued - 1 else change)

    @contextlib.contextmanager
    def listen(self) -> Iterator[asyncio.Queue[Change]]:
        """A queue of changes for as long as the block runs."""
        queue: asyncio.Queue[Change] = asyncio.Queue(self.queued)
        self._listeners.add(queue)
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    @property
    def listeners(self) -> int:
        return len(self._listeners)
