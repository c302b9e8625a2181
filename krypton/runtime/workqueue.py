"""A de-duplicating asyncio work queue with per-key exponential backoff (SPEC R3).

A key is never handed out twice at once: a key added while it is being processed is
queued again when `done` is called. `retry` schedules the key after a capped exponential
delay; until then only an *urgent* add (a change of the object itself) brings it back early,
so that echoes of the failed attempt (its own release records, status writes) cannot turn
the retry into a hot loop. `forget` resets the delay after a success.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from krypton.decisions import retry

K = TypeVar("K", bound=Hashable)


class QueueClosed(Exception):
    """The queue was closed (draining): no key is handed out any more."""


class WorkQueue(Generic[K]):
    def __init__(self, *, policy: retry.Policy = retry.RECONCILE) -> None:
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self._not_before: dict[K, float] = {}
        self._urgent: set[K] = set()  # dirty keys that were added urgently
        self._ready = asyncio.Condition()
        self._closed = False
        self.policy = policy

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K, *, urgent: bool = True) -> None:
        if self._closed or key in self._dirty:
            return
        not_before = self._not_before.get(key)
        if not urgent and not_before is not None and \
                asyncio.get_running_loop().time() < not_before:
            return
        self._dirty.add(key)
        if urgent:
            self._urgent.add(key)
        if key not in self._processing:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._ready:
            self._ready.notify()

    def add_after(self, key: K, delay: float) -> None:
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        timer = self._timers.get(key)
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self._not_before.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        """Schedule `key` after its next backoff delay; returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = self.policy.delay(n + 1)
        self._not_before[key] = asyncio.get_running_loop().time() + delay
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)
        self._not_before.pop(key, None)

    async def get(self) -> K:
        async with self._ready:
            await self._ready.wait_for(lambda: bool(self._queue) or self._closed)
            if self._closed:  # draining: queued keys wait for the next leader or start
                raise QueueClosed
            key = self._queue.popleft()
            self._dirty.discard(key)
            self._urgent.discard(key)
            self._processing.add(key)
            return key

    def processing(self, key: K) -> bool:
        """Whether `key` was handed out and is not done yet."""
        return key in self._processing

    def done(self, key: K) -> None:
        self._processing.discard(key)
        not_before = self._not_before.get(key)
        if key in self._dirty and key not in self._urgent and not_before is not None and \
                asyncio.get_running_loop().time() < not_before:
            self._dirty.discard(key)  # an echo of the failed attempt: the retry timer decides
        if key in self._dirty:
            self._queue.append(key)
            asyncio.get_running_loop().create_task(self._notify())

    async def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        async with self._ready:
            self._ready.notify_all()
