"""O4 / issue 11: the leader's fence. Leadership counts only while it was renewed within the
renew deadline, judged on the local clock without any request, so a process that was paused
past its Lease starts nothing when it runs again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from krypton.decisions.model import FINALIZER
from krypton.runtime import leader
from krypton.runtime.leader import LeaderElector


class _Leases:
    """The elector's port to the API server: one Lease, resourceVersions kept."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None

    async def get_lease(self, _ns: str, _name: str) -> dict[str, Any] | None:
        return self.lease

    async def create_lease(self, _ns: str, body: dict[str, Any]) -> None:
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}

    async def replace_lease(self, _ns: str, _name: str, body: dict[str, Any]) -> None:
        assert self.lease is not None
        version = int(self.lease["metadata"]["resourceVersion"]) + 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(version)}}


def test_leadership_goes_stale_at_the_renew_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: clock[0])
    leases = _Leases()
    elector = LeaderElector(leases, "ns", "lease", lease_duration=15, renew_deadline=10,  # type: ignore[arg-type]
                            retry_period=2, identity="me")
    assert not elector.holds()
    assert asyncio.run(elector.acquire(asyncio.Event()))
    assert elector.holds()
    clock[0] += 9.9
    assert elector.holds()
    clock[0] += 0.2  # paused past the deadline: stale before any request is made
    assert not elector.holds()
    assert asyncio.run(elector._try())  # a renewal restores it
    assert elector.holds()


def test_a_lease_taken_by_another_holder_is_lost_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: clock[0])

    async def no_pause(_stopping: asyncio.Event, _seconds: float) -> bool:
        return False

    monkeypatch.setattr(leader, "pause", no_pause)
    leases = _Leases()
    elector = LeaderElector(leases, "ns", "lease", lease_duration=15, renew_deadline=10,  # type: ignore[arg-type]
                            retry_period=2, identity="me")
    assert asyncio.run(elector.acquire(asyncio.Event()))
    assert leases.lease is not None
    leases.lease["spec"]["holderIdentity"] = "other"  # taken over while we were away
    leases.lease["spec"]["renewTime"] = "later"
    asyncio.run(asyncio.wait_for(elector.hold(asyncio.Event()), 5))
    assert not elector.holds() and not elector.is_leader


TENANT: dict[str, Any] = {"metadata": {"namespace": "ns", "name": "t", "uid": "u",
                                       "resourceVersion": "1", "generation": 1,
                                       "finalizers": [FINALIZER]},
                          "spec": {}}


class _Cluster:
    """The reconcile's ports to its cluster: status writes are recorded, Events dropped."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def emit(self, *_a: object) -> None:
        pass

    async def patch_tenant_status(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.written.append(patch.get("status") or {})
        return {**TENANT, "status": patch.get("status") or {}}


def _install_pass(helm: object, fence: Any = lambda: True) -> tuple[Any, Any, _Cluster]:
    """The plan for a new Tenant on cluster c1 (an install) and a coroutine acting on it with
    `helm`, plus the cluster fake that records what was written."""
    from krypton.decisions.model import ChartTarget, NamespaceState, Observation
    from krypton.decisions.planner import plan
    from krypton.decisions.releases import ReleaseIndex
    from krypton.decisions.settings import Settings
    from krypton.runtime.reconciler import ClusterRuntime, Reconciler, tenant_view
    from krypton.runtime.slots import FairSlots

    cluster = _Cluster()
    rt = ClusterRuntime(name="c1", kube=cluster, helm=helm, recorder=cluster,  # type: ignore[arg-type]
                        chart=None, settings=Settings(), slots=FairSlots(1),  # type: ignore[arg-type]
                        releases=ReleaseIndex(), tenants={}, fence=fence)
    obs = Observation("c1", tenant_view(TENANT, "c1"),
                      ChartTarget("r", "c", "1.0.0", {}, "f" * 64, "/chart"),
                      namespace=NamespaceState.OWNED)
    decided = plan(obs)
    reconciler = Reconciler(rt)
    return decided, reconciler._act(TENANT, obs, decided, "tenant-t-c1", reconciler.log), cluster


@pytest.mark.parametrize("stage", ["start", "slot"])
def test_no_helm_operation_starts_without_fresh_leadership(stage: str) -> None:
    """The reconciler asks the fence before it announces a helm run and again once it has a
    helm slot (waiting for one may outlast the Lease): a stale leader starts nothing."""
    from krypton.decisions.errors import Fenced
    from krypton.decisions.planner import Action

    helm_calls: list[str] = []
    answers = iter([True] if stage == "slot" else [])  # fresh at the start, stale at the slot

    class Helm:
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            helm_calls.append("install")
            return {"version": 1, "info": {"status": "deployed"}}

    decided, act, _ = _install_pass(Helm(), fence=lambda: next(answers, False))
    assert decided.action is Action.INSTALL
    with pytest.raises(Fenced):
        asyncio.run(act)
    assert helm_calls == []


@pytest.mark.parametrize("error", ["ReleaseLocked", "HelmFailed"])
def test_a_locked_release_is_not_a_failed_release(error: str) -> None:
    """helm refusing because another operation holds the release (ReleaseLocked) is a wait:
    no failedFingerprint, so a progressive rollout never counts it as failed (issue 11,
    item 6). A real failure still records the fingerprint that failed."""
    from krypton.decisions import errors

    class Helm:
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            raise getattr(errors, error)("another operation (install/upgrade/rollback) is in "
                                         "progress" if error == "ReleaseLocked" else "boom")

    _, act, cluster = _install_pass(Helm())
    outcome = asyncio.run(act)
    assert outcome.retry and outcome.reason == ("ReleaseLocked" if error == "ReleaseLocked"
                                                else "InstallFailed")
    failed = [((s.get("clusters") or {}).get("c1") or {}).get("failedFingerprint")
              for s in cluster.written]
    assert failed[-1:] == ([None] if error == "ReleaseLocked" else ["f" * 64])
