"""A global cap on helm processes, shared fairly between clusters (SPEC R3).

At most `total` slots are held at once. While several clusters want slots, none may hold
more than its fair share (``total // clusters wanting``, at least one), so a slow or
unreachable cluster whose helm runs hang until their timeout cannot starve the others.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairSlots:
    def __init__(self, total: int) -> None:
        self.total = total
        self._held: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()
        self._cond = asyncio.Condition()

    def _share(self) -> int:
        wanting = {c for c, n in self._held.items() if n} | {c for c, n in self._waiting.items() if n}
        return max(1, self.total // max(1, len(wanting)))

    def _may_take(self, cluster: str) -> bool:
        return sum(self._held.values()) < self.total and self._held[cluster] < self._share()

    @asynccontextmanager
    async def slot(self, cluster: str) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting[cluster] += 1
            try:
                await self._cond.wait_for(lambda: self._may_take(cluster))
            finally:
                self._waiting[cluster] -= 1
            self._held[cluster] += 1
        try:
            yield
        finally:
            async with self._cond:
                self._held[cluster] -= 1
                self._cond.notify_all()

    @property
    def in_use(self) -> int:
        return sum(self._held.values())

    def held(self, cluster: str) -> int:
        """Slots `cluster` holds now."""
        return self._held[cluster]

    def waiting(self, cluster: str) -> int:
        """Helm runs of `cluster` waiting for a slot."""
        return self._waiting[cluster]
