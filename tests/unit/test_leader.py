"""O4: the leader's fence. Leadership counts only while it was renewed within the
renew deadline, judged on the local clock without any request, so a process that was paused
past its Lease starts nothing when it runs again."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from krypton.adapters.charts import ResolvedChart
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.errors import AlreadyExists
from krypton.decisions.model import FINALIZER, OWNER_ANNOTATION, ReleaseStatus, TenantKey
from krypton.decisions.trust import leases
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
    """The reconcile's ports to its cluster: status writes and Events (type, reason) are
    recorded, the Tenant's namespace is its own."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.wrote = asyncio.Event()  # set by every status write
        self.namespace_requests: list[str] = []  # "create", "get"
        self.records: list[dict[str, Any]] = []  # release records, as a list hands them over

    async def list_release_records(self, *_a: object, **_k: object) -> list[dict[str, Any]]:
        return self.records

    async def emit(self, _involved: object, type_: str, reason: str, _message: str) -> None:
        self.events.append((type_, reason))

    async def create_namespace(self, name: str, *_a: object) -> None:
        self.namespace_requests.append("create")
        raise AlreadyExists(f"namespace {name!r} exists")

    async def get_namespace(self, name: str) -> dict[str, Any]:
        self.namespace_requests.append("get")
        return {"metadata": {"name": name, "annotations": {OWNER_ANNOTATION: "ns/t"}}}

    async def patch_tenant_status(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.written.append(patch.get("status") or {})
        self.wrote.set()
        return {**TENANT, "status": patch.get("status") or {}}

    async def patch_tenant(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        return {**TENANT, "metadata": {**TENANT["metadata"], **patch["metadata"]}}


class _Chart:
    async def get(self) -> Any:
        return ResolvedChart("r", "c", "1.0.0", "/chart")

    async def shared_objects(self, *_a: object) -> tuple[()]:
        return ()  # a chart whose objects are all named after the release


def _runtime(helm: object, fence: Any = lambda: True) -> tuple[Any, Any, _Cluster]:
    """A reconciler of cluster c1 acting with `helm` on the cluster fake."""
    from krypton.decisions.releases import ReleaseIndex
    from krypton.decisions.settings import Settings
    from krypton.runtime.reconcile import ClusterRuntime, Reconciler
    from krypton.runtime.slots import FairSlots

    cluster = _Cluster()
    rt = ClusterRuntime(name="c1", kube=cluster, helm=helm, recorder=cluster,  # type: ignore[arg-type]
                        chart=_Chart(), settings=Settings(), slots=FairSlots(1),  # type: ignore[arg-type]
                        releases=ReleaseIndex(), tenants={}, fence=fence)
    return rt, Reconciler(rt), cluster


def _install_pass(helm: object, fence: Any = lambda: True) -> tuple[Any, Any, _Cluster]:
    """The plan for a new Tenant on cluster c1 (an install) whose status already announces
    it (the pass before wrote that), and a coroutine reconciling it with `helm`, plus the
    cluster fake that records what was written."""
    rt, reconciler, cluster = _runtime(helm, fence)
    decided = asyncio.run(reconciler.decide(TENANT)).plan
    announced = {**TENANT, "status": {"conditions": [
        {"type": "ClusterProgress/c1", "status": "True", "reason": decided.reason,
         "message": decided.message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    rt.tenants[("ns", "t")] = announced
    return decided, reconciler.reconcile(TenantKey("ns", "t")), cluster


class _HelmPort:
    """What every fake helm here answers as the port does: no run of krypton's was cut short."""

    def interrupted(self, *_a: object) -> str:
        return ""


class _RecordingHelm(_HelmPort):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
        self.calls.append("install")
        return {"version": 1, "info": {"status": "deployed"}}


def test_a_quick_helm_run_costs_one_pass_and_one_status_write() -> None:
    """The pass that decides an install runs helm itself and writes the status
    once, with the outcome (R10 `Installed`) and its Event (R9 HelmInstalled). A run this
    quick is not announced (no HelmInstallStart), so no second pass is needed to run it."""
    helm = _RecordingHelm()
    rt, reconciler, cluster = _runtime(helm)
    key = TenantKey("ns", "t")
    rt.tenants[("ns", "t")] = TENANT
    outcome = asyncio.run(reconciler.reconcile(key))
    assert helm.calls == ["install"] and len(cluster.written) == 1 and not outcome.retry
    done = {c["type"]: c for c in cluster.written[0]["conditions"]}
    assert (done["ClusterReady/c1"]["status"], done["ClusterReady/c1"]["reason"]) == \
        ("True", "Installed")
    assert cluster.written[0]["clusters"]["c1"]["fingerprint"] == fingerprint("r", "c", "1.0.0", {})
    reasons = [reason for _, reason in cluster.events]
    assert "HelmInstalled" in reasons and "HelmInstallStart" not in reasons


def test_an_install_creates_the_namespace_first_and_an_upgrade_of_its_release_leaves_it(
        ) -> None:
    """A first install does not read the namespace before creating it (here it
    exists, is the Tenant's, and is read only then); an upgrade of the release labelled as
    the Tenant's neither reads nor creates it."""
    from krypton.decisions.planner import Action

    helm = _RecordingHelm()
    rt, reconciler, cluster = _runtime(helm)
    key = TenantKey("ns", "t")
    rt.tenants[("ns", "t")] = TENANT
    assert asyncio.run(reconciler.decide(TENANT)).plan.action is Action.INSTALL
    asyncio.run(reconciler.reconcile(key))
    assert cluster.namespace_requests == ["create", "get"]
    old = "0" * 64
    rt.releases.note("t", "tenant-t-c1", 1, ReleaseStatus.DEPLOYED, old, "u")
    deployed = {**TENANT, "metadata": {**TENANT["metadata"], "annotations": {
        "mesh.openkcm.io/fingerprint-c1": old}}}
    rt.tenants[("ns", "t")] = deployed
    assert asyncio.run(reconciler.decide(deployed)).plan.action is Action.UPGRADE
    cluster.namespace_requests.clear()
    asyncio.run(reconciler.reconcile(key))
    assert helm.calls == ["install", "install"]  # (the fake's name for every run)
    assert cluster.namespace_requests == []


def test_a_helm_run_that_lasts_is_announced_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run still going after ANNOUNCE_AFTER (a slot to wait for, --helm-wait) is said
    while helm runs: ClusterProgress True `Installing` and the Event HelmInstallStart, then
    the outcome. helm here ends only once the announcement was written."""
    from krypton.runtime.reconcile import install

    monkeypatch.setattr(install, "ANNOUNCE_AFTER", 0.01)

    class SlowHelm(_RecordingHelm):
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            await asyncio.wait_for(cluster.wrote.wait(), 10)  # the status says it runs
            return await super().install_or_upgrade()

    helm = SlowHelm()
    rt, reconciler, cluster = _runtime(helm)
    rt.tenants[("ns", "t")] = TENANT
    asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    assert helm.calls == ["install"] and len(cluster.written) == 2
    said = {c["type"]: c for c in cluster.written[0]["conditions"]}["ClusterProgress/c1"]
    assert (said["status"], said["reason"]) == ("True", "Installing")
    done = {c["type"]: c for c in cluster.written[1]["conditions"]}
    assert (done["ClusterReady/c1"]["status"], done["ClusterReady/c1"]["reason"]) == \
        ("True", "Installed")
    assert done["ClusterProgress/c1"]["status"] == "False"
    reasons = [reason for _, reason in cluster.events]
    assert reasons.index("HelmInstallStart") < reasons.index("HelmInstalled")


@pytest.mark.parametrize("stage", ["start", "slot"])
def test_no_helm_operation_starts_without_fresh_leadership(stage: str) -> None:
    """The reconciler asks the fence before it announces a helm run and again once it has a
    helm slot (waiting for one may outlast the Lease): a stale leader starts nothing."""
    from krypton.decisions.errors import Fenced
    from krypton.decisions.planner import Action

    helm_calls: list[str] = []
    answers = iter([True] if stage == "slot" else [])  # fresh at the start, stale at the slot

    class Helm(_HelmPort):
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
    no failedFingerprint, so a progressive rollout never counts it as failed. A real failure
    still records the fingerprint that failed."""
    from krypton.decisions import errors

    class Helm(_HelmPort):
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            raise getattr(errors, error)("another operation (install/upgrade/rollback) is in "
                                         "progress" if error == "ReleaseLocked" else "boom")

    _, act, cluster = _install_pass(Helm())
    outcome = asyncio.run(act)
    if error == "ReleaseLocked":  # a wait, with the work queue's backoff
        assert outcome.retry and outcome.reason == "ReleaseLocked"
    else:  # a failure, its next attempt 10 s later (+ up to a tenth: R18), from the status
        assert not outcome.retry and outcome.reason == "InstallFailed"
        assert outcome.requeue_after is not None and 10.0 <= outcome.requeue_after <= 11.0
    failed = [((s.get("clusters") or {}).get("c1") or {}).get("failedFingerprint")
              for s in cluster.written]
    want = fingerprint("r", "c", "1.0.0", {})
    assert failed == ([] if error == "ReleaseLocked" else [want])  # one write per pass


def test_a_missing_applied_time_counts_from_when_it_was_first_seen() -> None:
    """A Tenant whose lastAppliedTime has not reached the cache yet is judged
    as just applied, not as applied at the epoch."""

    rt, _reconciler, _cluster = _runtime(object())
    first = rt.observe(TENANT).since_applied
    assert first is not None and first < 1.0
    record = rt.memory.of(TenantKey("ns", "t"))
    assert record.unapplied_since is not None
    record.unapplied_since -= 100.0  # as if first seen 100 s ago
    assert 100.0 <= rt.observe(TENANT).since_applied < 101.0  # type: ignore[operator]
    stamped = {**TENANT, "status": {"clusters": {"c1": {"lastAppliedTime": time_ago(30)}}}}
    assert 29.0 <= rt.observe(stamped).since_applied < 32.0  # type: ignore[operator]
    assert record.unapplied_since is None  # the status has it now


def time_ago(seconds: float) -> str:
    import datetime as dt

    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def test_a_deleted_tenant_without_a_release_runs_no_helm() -> None:
    """A pass over a deleting Tenant whose release is already gone removes the finalizer
    without a helm uninstall (once, 45 uninstall processes ran for 40 Tenants)."""
    calls: list[str] = []

    class Helm(_HelmPort):
        async def uninstall(self, release: str, _namespace: str, **_k: object) -> None:
            calls.append(release)

    rt, reconciler, cluster = _runtime(Helm())
    deleting = {**TENANT, "metadata": {**TENANT["metadata"],
                                       "deletionTimestamp": "2026-11-23T12:00:00Z"}}
    rt.tenants[("ns", "t")] = deleting
    asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    assert calls == []
    # with a release record, it is uninstalled (once)
    record = {"metadata": {"namespace": "t", "name": "sh.helm.release.v1.tenant-t-c1.v1",
                           "labels": {"owner": "helm", "name": "tenant-t-c1", "version": "1",
                                      "status": "deployed", "mesh.openkcm.io/tenant-uid": "u"}},
              "data": {"release": base64.b64encode(base64.b64encode(json.dumps(
                  {"name": "tenant-t-c1", "version": 1,
                   "info": {"status": "deployed"}}).encode())).decode()}}
    rt.releases.on_event("ADDED", record)
    cluster.records = [record]

    class Manifest:
        async def manifest(self, *_a: object, **_k: object) -> list[Any]:
            return []

    rt.helm.manifest = Manifest().manifest  # type: ignore[attr-defined]
    asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    assert calls == ["tenant-t-c1"]


def _failed_once() -> tuple[Any, Any, dict[str, Any]]:
    """A runtime whose first install of TENANT failed: it, its reconciler and the retry
    record the failed pass wrote to the status."""
    from krypton.decisions import errors

    class Helm(_HelmPort):
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            raise errors.HelmFailed("boom")

    rt, reconciler, cluster = _runtime(Helm())
    decided = asyncio.run(reconciler.decide(TENANT)).plan
    rt.tenants[("ns", "t")] = {**TENANT, "status": {"conditions": [
        {"type": "ClusterProgress/c1", "status": "True", "reason": decided.reason,
         "message": decided.message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    written = cluster.written[-1]["clusters"]["c1"]
    assert written["failures"] == 1
    return rt, reconciler, written


def test_the_retry_state_holds_where_an_older_crd_drops_it() -> None:
    """R18 on a cluster whose Tenant CRD prunes the record: the copy the process kept brakes
    the next pass all the same (no attempt before the one scheduled)."""
    from krypton.decisions.planner import Action

    rt, reconciler, _written = _failed_once()
    pruned = {**TENANT, "status": {"clusters": {"c1": {"failedFingerprint": "x"}}}}
    assert rt.observe(pruned).tenant.failures == 1  # from the copy, not the status
    assert asyncio.run(reconciler.decide(pruned)).plan.action is Action.BACKOFF


def test_the_retry_state_holds_until_the_status_shows_it() -> None:
    """R18: a pass that starts before the watch brought back the last failure's status
    write (a release record's event right after the run) sees the status of the failure
    before; the copy the process kept brakes it all the same. A status ahead of the copy
    (more failures of the same target) is believed."""
    from krypton.decisions.planner import Action

    rt, reconciler, written = _failed_once()
    stale = {**TENANT, "status": {"clusters": {"c1": {"failures": 0, "failedTarget": ""}}}}
    assert rt.observe(stale).tenant.failures == 1  # from the copy, not the stale status
    assert asyncio.run(reconciler.decide(stale)).plan.action is Action.BACKOFF
    ahead = {**TENANT, "status": {"clusters": {"c1": {
        **written, "failures": 2, "nextAttemptTime": time_ago(-30)}}}}
    assert rt.observe(ahead).tenant.failures == 2


def test_a_next_attempt_far_away_is_not_believed() -> None:
    """Whoever may write a Tenant's status can set nextAttemptTime in 2099: the wait is held
    to the longest the schedule gives (--retry-backoff-max, jittered by a tenth)."""
    rt, _reconciler, _cluster = _runtime(object())
    far = {**TENANT, "status": {"clusters": {"c1": {
        "failures": 2, "failedTarget": "x", "nextAttemptTime": "2099-01-01T00:00:00Z"}}}}
    assert rt.observe(far).retry_wait == pytest.approx(600.0 * 1.1)
    soon = {**TENANT, "status": {"clusters": {"c1": {
        "failures": 2, "failedTarget": "x", "nextAttemptTime": time_ago(-30)}}}}
    assert 28.0 <= rt.observe(soon).retry_wait <= 31.0


def test_a_locked_release_is_looked_at_again_when_the_lock_would_expire() -> None:
    """A pending record a helm run left (an operator killed during its run) is a leftover
    --helm-timeout plus LOCK_MARGIN after it was written. The wait comes back at that
    moment: a growing schedule (1, 2, 4 … 64 s) would overshoot it by up to a minute."""
    import time

    from krypton.decisions.model import release_name
    from krypton.runtime.reconcile.view import LOCK_MARGIN

    helm = _RecordingHelm()
    rt, reconciler, cluster = _runtime(helm)
    rt.tenants[("ns", "t")] = TENANT
    name = release_name("t", "c1")
    written = time.time() - 30  # the killed run wrote its pending record 30 s ago
    rt.releases.on_event("ADDED", {"metadata": {
        "namespace": "t", "name": f"sh.helm.release.v1.{name}.v1",
        "labels": {"owner": "helm", "name": name, "version": "1", "status": "pending-install",
                   "modifiedAt": str(int(written))}}})
    outcome = asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    assert helm.calls == [] and outcome.reason == "ReleaseLocked" and not outcome.retry
    due = rt.settings.helm_timeout + LOCK_MARGIN - (time.time() - int(written))
    assert outcome.requeue_after is not None and due < outcome.requeue_after <= due + 2


def test_a_lease_renewed_into_the_future_again_and_again_is_warned_about_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder writing another far-future renewTime at every renewal is one
    LeaseNotBelieved, not one a second."""
    warned: list[list[str]] = []

    async def not_believed(_kube: object, _lease: object, _what: str, _holder: str,
                           doubts: list[str]) -> None:
        warned.append(doubts)

    monkeypatch.setattr(leader, "not_believed", not_believed)
    elector = LeaderElector(object(), "ns", "lease", lease_duration=15,  # type: ignore[arg-type]
                            renew_deadline=10, retry_period=2)
    for second in range(5):
        spec = {"renewTime": f"2099-01-01T00:00:0{second}.000000Z"}
        asyncio.run(elector._report({"spec": spec}, "ghost",
                                    leases.doubts(spec, 15, 1_800_000_000.0)))
    assert len(warned) == 1


def test_a_pass_that_fails_on_a_defect_still_commits_what_it_came_to() -> None:
    """An exception no action reports (a defect of krypton's) does not skip the commit: the
    status says ClusterError Internal with the exception, a Warning Event goes, and the
    exception still reaches the consumer (its log line and the queue's backoff)."""

    class BrokenHelm(_HelmPort):
        async def install_or_upgrade(self, *_a: object, **_k: object) -> dict[str, Any]:
            raise KeyError("version")

    rt, reconciler, cluster = _runtime(BrokenHelm())
    rt.tenants[("ns", "t")] = TENANT
    with pytest.raises(KeyError):
        asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    [written] = cluster.written
    error = {c["type"]: c for c in written["conditions"]}["ClusterError/c1"]
    assert (error["status"], error["reason"]) == ("True", "Internal")
    assert "KeyError" in error["message"]
    assert ("Warning", "Internal") in cluster.events
    # the next attempt (the queue's growing schedule) fails alike and writes nothing more
    rt.tenants[("ns", "t")] = {**TENANT, "status": written}
    events = len(cluster.events)
    with pytest.raises(KeyError):
        asyncio.run(reconciler.reconcile(TenantKey("ns", "t")))
    assert len(cluster.written) == 1 and len(cluster.events) == events
