"""The Tenants as krypton's own writes left them, told to whoever listens (the fleet page,
SPEC O16): one notification per write, from the one place every write of a Tenant passes
(:meth:`ClusterRuntime.wrote`), never from a second watch. A listener's queue is bounded: one
that falls behind loses what it did not take and is told so once, to read the whole again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

QUEUED = 256  # changes one listener may be behind before it is told to read the whole again
# what a listener that fell behind is told instead of what it lost
LOST: tuple[str, dict[str, Any]] = ("", {})
# what a listener is told when the rollout's state changed (F1, F9)
ROLLOUT: tuple[str, dict[str, Any]] = ("", {"rollout": True})


class Changes:
    """The fleet's writes of Tenants, to its listeners."""

    def __init__(self, queued: int = QUEUED) -> None:
        self.queued = queued
        self._listeners: set[asyncio.Queue[tuple[str, dict[str, Any]]]] = set()

    def tell(self, cluster: str, tenant: dict[str, Any]) -> None:
        """`tenant` as `cluster`'s write left it (its object as the server answered)."""
        for queue in self._listeners:
            if queue.full():
                continue  # said once: LOST stands at its end until it is read
            queue.put_nowait(LOST if queue.qsize() == self.queued - 1 else (cluster, tenant))

    def rollout_changed(self) -> None:
        """The rollout's state changed, as this replica follows it."""
        self.tell(*ROLLOUT)

    @contextlib.contextmanager
    def listen(self) -> Iterator[asyncio.Queue[tuple[str, dict[str, Any]]]]:
        """A queue of (cluster, Tenant) for as long as the block runs."""
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(self.queued)
        self._listeners.add(queue)
        try:
            yield queue
        finally:
            self._listeners.discard(queue)

    @property
    def listeners(self) -> int:
        return len(self._listeners)
