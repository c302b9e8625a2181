"""The followed workloads of a cluster (krypton.runtime.readiness): which changes wake a
release, which copies count, and when the reconciler must read the objects itself. The
watches are exercised against a real API server in tests/integration/test_workloads.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.model import TenantKey
from krypton.runtime.readiness import Readiness, slim
from krypton.runtime.reconcile.memory import Memory

pytestmark = pytest.mark.unit

REF = ObjectRef("apps/v1", "Deployment", "web", "acme")
OTHER = ObjectRef("batch/v1", "Job", "smoke", "acme")
KEY, SECOND = TenantKey("tenants", "acme"), TenantKey("tenants", "beta")


def deployment(available: int, rv: int) -> dict[str, Any]:
    return {"kind": "Deployment",
            "metadata": {"name": "web", "namespace": "acme", "generation": 1,
                         "resourceVersion": str(rv), "managedFields": [{"manager": "x"}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                       "availableReplicas": available}}


class Unwatched:
    """A cluster whose workload kinds are not served: the watches end at once, never live."""

    name = "c1"

    async def collection_path(self, _api_version: str, _kind: str) -> None:
        return None


def scenario(body: Any) -> list[TenantKey]:
    woken: list[TenantKey] = []

    async def run() -> None:
        readiness = Readiness(Unwatched(), woken.append, Memory("c1"))  # type: ignore[arg-type]
        try:
            await body(readiness)
        finally:
            await readiness.close()
    asyncio.run(run())
    return woken


def test_a_release_is_woken_when_its_workload_turns_ready_and_only_then() -> None:
    async def body(r: Readiness) -> None:
        r.follow(KEY, [(REF, deployment(0, 10))])
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(1, 11))  # still not
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(2, 12))  # ready: wake
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(2, 13))  # no change
        r.changed(("apps/v1", "Deployment", "acme", "web"), None)  # deleted: not ready, wake
    assert scenario(body) == [KEY, KEY]


def test_an_older_copy_does_not_replace_a_newer_one() -> None:
    async def body(r: Readiness) -> None:
        r.follow(KEY, [(REF, deployment(2, 20))])
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(0, 19))  # a late event
    assert scenario(body) == []


def test_every_release_following_an_object_is_woken_and_forgotten_ones_are_not() -> None:
    async def body(r: Readiness) -> None:
        r.follow(KEY, [(REF, deployment(0, 10))])
        r.follow(SECOND, [(REF, deployment(0, 10)), (OTHER, None)])
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(2, 11))
        r.unfollow(KEY)
        r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(0, 12))
        assert r.followed() == 1
    # SECOND's Job is missing: its release stays not ready, so only KEY turns, once
    assert scenario(body) == [KEY]


def test_health_is_not_answered_from_copies_of_a_kind_that_is_not_watched() -> None:
    async def body(r: Readiness) -> None:
        r.follow(KEY, [(REF, deployment(0, 10))])
        await asyncio.sleep(0)
        assert KEY in r
        assert r.health(KEY) is None  # the reconciler reads the objects itself
        assert r.health(SECOND) is None  # not followed
    scenario(body)


def test_a_copy_keeps_only_what_the_rules_read() -> None:
    kept = slim(deployment(2, 5))
    assert "managedFields" not in kept["metadata"] and "template" not in kept["spec"]
    assert kept["spec"]["replicas"] == 2 and kept["status"]["availableReplicas"] == 2


def test_a_reread_crossed_by_a_watch_failure_does_not_make_the_kind_watched() -> None:
    """The watch starts (a reread begins), then fails before the reread ends: the copies
    cannot be trusted (changes after the read may be missed) until the next start's reread."""
    async def body(r: Readiness) -> None:
        r.follow(KEY, [(REF, deployment(2, 10))])
        gate = asyncio.Event()

        async def slow_reread(_kind: Any) -> None:
            await gate.wait()
        r.reread = slow_reread  # type: ignore[method-assign]
        watch = r._watches[("apps/v1", "Deployment")]
        watch._resumed()
        await asyncio.sleep(0)
        watch._failed(RuntimeError("watch broke"))
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not watch.live and r.health(KEY) is None
        watch._resumed()  # started again: its own reread completes, nothing crosses it
        for _ in range(5):
            await asyncio.sleep(0)
        assert watch.live and r.health(KEY) is not None and r.health(KEY).ready
    scenario(body)


def test_a_tenant_that_goes_takes_what_it_followed_with_its_memory() -> None:
    """Who follows what is kept in the Tenants' memories: dropping one is the one step
    a Tenant's going takes; the next sweep lets the copy go and the kind's watch linger."""
    memory = Memory("c1")

    async def run() -> None:
        r = Readiness(Unwatched(), lambda _key: None, memory)  # type: ignore[arg-type]
        try:
            r.follow(KEY, [(REF, deployment(0, 10))])
            assert KEY in r and r.followed() == 1 and memory.peek(KEY).ready is False
            memory.drop(KEY)
            assert KEY not in r and r.followed() == 0
            r.changed(("apps/v1", "Deployment", "acme", "web"), deployment(2, 11))  # wakes none
            r.sweep()
            assert r._objects == {}  # noqa: SLF001
            assert r._watches[("apps/v1", "Deployment")].stop_at is not None  # noqa: SLF001
        finally:
            await r.close()
    asyncio.run(run())
