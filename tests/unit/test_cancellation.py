"""A cancel is never lost: a worker that is stopped (a handover to another replica, new
credentials, shutdown) ends even when what it waited for happens at the same moment.

Python 3.11's ``asyncio.wait_for`` returns the awaited result instead of raising when the
cancel and the result arrive in the same loop iteration. A worker cancelled just as its
first list answered kept running, so its cluster was never released to the replica it had
been handed to (seen as a sharded rollout that never covered one cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from krypton.decisions.settings import Settings
from krypton.runtime import fleet
from krypton.runtime.clusterworker import ClusterWorker
from krypton.runtime.pause import pause
from tests.unit.workers import Group, workers


class _Informer:
    """What a worker waits on while a cluster makes its first list."""

    what = "tenants"

    def __init__(self) -> None:
        self.synced = asyncio.Event()

    async def run(self) -> None:
        await asyncio.Event().wait()  # the watch that follows the list


def _worker(tmp_path: Path) -> ClusterWorker:
    return workers(tmp_path, dataclasses.replace(Settings(), api_timeout=30.0), 1)[0]  # type: ignore[no-any-return]


Waiting = Callable[[Path], tuple[Coroutine[Any, Any, Any], Callable[[], None], list[Any]]]


def _first_list(tmp_path: Path) -> tuple[Coroutine[Any, Any, Any], Callable[[], None], list[Any]]:
    informer, group = _Informer(), Group()
    return _worker(tmp_path)._first_list(group, informer, "Tenants"), informer.synced.set, \
        group.tasks  # type: ignore[arg-type]


def _await_sync(tmp_path: Path) -> tuple[Coroutine[Any, Any, Any], Callable[[], None], list[Any]]:
    informer = _Informer()
    return _worker(tmp_path)._await_sync(informer, "Tenants"), informer.synced.set, []  # type: ignore[arg-type]


def _drain(tmp_path: Path) -> tuple[Coroutine[Any, Any, Any], Callable[[], None], list[Any]]:
    worker = _worker(tmp_path)
    worker.consumer._idle.clear()  # a reconcile is running
    return worker.stop(grace=30.0), worker.consumer._idle.set, []


def _pause(_tmp_path: Path) -> tuple[Coroutine[Any, Any, Any], Callable[[], None], list[Any]]:
    stopping = asyncio.Event()
    return pause(stopping, 30.0), stopping.set, []


@pytest.mark.parametrize("waiting", [_first_list, _await_sync, _drain, _pause],
                         ids=["first list", "cache sync", "drain", "pause"])
def test_a_cancel_that_comes_with_what_was_awaited_still_ends_the_task(
        tmp_path: Path, waiting: Waiting) -> None:
    async def scenario() -> bool:
        coro, happen, others = waiting(tmp_path)
        task = asyncio.create_task(coro)
        for _ in range(5):  # into its wait
            await asyncio.sleep(0)
        assert not task.done()
        happen()
        task.cancel()  # in the same loop iteration as what it waited for
        await asyncio.wait({task}, timeout=5)
        cancelled = task.cancelled()
        for other in [task, *others]:
            other.cancel()
        await asyncio.gather(task, *others, return_exceptions=True)
        return cancelled

    assert asyncio.run(scenario())


def test_a_worker_that_ignores_its_cancel_is_cancelled_again(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: Any) -> None:
    """Whatever swallows a cancel (a library catching CancelledError), the cluster still
    leaves: its worker is cancelled again after CANCEL_AGAIN, with a warning."""
    monkeypatch.setattr(fleet, "CANCEL_AGAIN", 0.05)
    cancels = []

    async def stubborn() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancels.append("swallowed")
        await asyncio.Event().wait()  # goes on as if nothing happened

    async def scenario() -> bool:
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        async with asyncio.timeout(5):
            await fleet.end_task(task, cluster="c0")
        return task.cancelled()

    assert asyncio.run(scenario())
    assert cancels == ["swallowed"]
