"""Stand-ins for the tests of a cluster worker's own scheduling: workers that share only
their settings, and a task group that keeps the tasks it starts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


def workers(tmp_path: Path, settings: Any, n: int, **shared: Any) -> list[Any]:
    """`n` cluster workers sharing `settings` and nothing else of the operator's (no chart,
    helm slots or reporter)."""
    from krypton.runtime.clusterworker import ClusterWorker, Shared

    common = Shared(settings=settings, chart=None, slots=None, report=None,  # type: ignore[arg-type]
                    workdir=tmp_path, **shared)
    return [ClusterWorker(f"c{i}", None, {}, common) for i in range(n)]  # type: ignore[arg-type]


class Group:
    """What a worker asks of its task group: create_task; the tasks are kept to end them."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def create_task(self, coro: Any, name: str = "") -> asyncio.Task[None]:
        self.tasks.append(asyncio.create_task(coro, name=name))
        return self.tasks[-1]
