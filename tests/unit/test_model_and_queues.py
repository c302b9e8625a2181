"""Release names (R9), the release index (R8), the work queue and the fair helm cap (R3),
discovery's desired set (D2) and the single CRD source (R1)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from krypton.decisions.clusters.discovery import desired_clusters
from krypton.decisions.crd import crd_text
from krypton.decisions.model import ReleaseStatus, is_valid_namespace_name, release_name
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.retry import Policy
from krypton.runtime.consumer import Consumer
from krypton.runtime.slots import FairSlots
from krypton.runtime.workqueue import QueueClosed, WorkQueue
from tests.unit.workers import Group, workers

ROOT = Path(__file__).resolve().parents[2]


def test_release_name_short_and_long() -> None:
    assert release_name("acme", "remote") == "tenant-acme-remote"
    long_tenant = "a" * 40
    name = release_name(long_tenant, "cluster-number-one")
    # R9: the first 44 characters, "-" and 8 hex characters of the full name's sha256, as
    # `printf tenant-aaa...a-cluster-number-one | sha256sum` gives them (211ccb68...)
    assert name == "tenant-" + "a" * 37 + "-211ccb68"
    assert len(name) == 53
    assert release_name(long_tenant, "cluster-number-one") == name  # deterministic
    assert release_name(long_tenant, "cluster-number-two") != name


@pytest.mark.parametrize(("name", "valid"), [("acme", True), ("a-1", True), ("a.b", False),
                                             ("A", False), ("-a", False), ("a" * 63, True),
                                             ("a" * 64, False)])
def test_namespace_names(name: str, valid: bool) -> None:
    assert is_valid_namespace_name(name) is valid


def record(ns: str, name: str, version: int, status: str) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"namespace": ns, "name": f"sh.helm.release.v1.{name}.v{version}",
                         "labels": {"owner": "helm", "name": name, "version": str(version),
                                    "status": status}}}


def test_release_index_tracks_latest_revision() -> None:
    idx = ReleaseIndex()
    assert idx.observe("ns", "r").status is ReleaseStatus.ABSENT
    idx.on_event("ADDED", record("ns", "r", 1, "superseded"))
    idx.on_event("ADDED", record("ns", "r", 2, "failed"))
    obs = idx.observe("ns", "r")
    assert (obs.status, obs.revision, obs.has_good_revision) == (ReleaseStatus.FAILED, 2, True)
    idx.on_event("DELETED", record("ns", "r", 2, "failed"))
    idx.on_event("DELETED", record("ns", "r", 1, "superseded"))
    assert idx.observe("ns", "r").status is ReleaseStatus.ABSENT


def test_release_index_prefers_our_note_until_the_watch_catches_up() -> None:
    idx = ReleaseIndex()
    idx.on_event("ADDED", record("ns", "r", 1, "pending-install"))
    idx.note("ns", "r", 2, ReleaseStatus.DEPLOYED, "fp2")
    assert idx.observe("ns", "r").status is ReleaseStatus.DEPLOYED
    idx.on_event("ADDED", record("ns", "r", 2, "deployed"))
    idx.on_event("MODIFIED", record("ns", "r", 2, "failed"))
    assert idx.observe("ns", "r").status is ReleaseStatus.FAILED  # the watch wins again


def test_work_queue_deduplicates_and_never_hands_out_a_key_twice() -> None:
    async def scenario() -> list[str]:
        q: WorkQueue[str] = WorkQueue(policy=Policy(first=0.01, cap=300.0))
        q.add("a")
        q.add("a")
        q.add("b")
        assert len(q) == 2
        first = await q.get()
        q.add(first)  # re-added while processing: queued again only after done()
        second = await q.get()
        assert second != first and len(q) == 0
        q.done(first)
        q.done(second)
        third = await q.get()
        q.done(third)
        assert q.retry("x") == 0.01 and q.retry("x") == 0.02
        q.forget("x")
        assert q.retry("x") == 0.01
        await q.close()
        return [first, second, third]

    assert asyncio.run(scenario()) == ["a", "b", "a"]


def test_a_closed_queue_hands_out_no_key() -> None:
    """Draining (shutdown, lost lease, re-engage): keys still queued are not handed out, or
    new helm runs would start after the decision to stop."""
    async def scenario() -> bool:
        q: WorkQueue[str] = WorkQueue()
        q.add("a")
        q.add("b")
        await q.close()
        try:
            await q.get()
        except QueueClosed:
            return True
        return False

    assert asyncio.run(scenario())


def test_a_freed_slot_goes_to_the_starving_cluster() -> None:
    """Two slots, both held by a hanging cluster that has three more runs queued; a second
    cluster arrives and waits. When one slot frees, it must go to the second cluster: a plain
    semaphore would hand it to the hanging cluster's next queued run (first come, first
    served), and the second cluster would wait for every hung run in turn (R3)."""
    async def scenario() -> tuple[int, bool]:
        slots = FairSlots(2)
        hanging = {"held": 0}
        gates = [asyncio.Event() for _ in range(5)]

        async def slow(i: int) -> None:
            async with slots.slot("slow"):
                hanging["held"] += 1
                await gates[i].wait()
                hanging["held"] -= 1

        async def until(condition: Callable[[], bool]) -> None:
            while not condition():
                await asyncio.sleep(0)  # let the other tasks run up to their next wait

        slow_tasks = []
        for i in range(5):  # queued in this order, before the other cluster asks
            slow_tasks.append(asyncio.create_task(slow(i)))
            await until(lambda i=i: slots.in_use + slots.waiting("slow") == i + 1)
        assert hanging["held"] == 2
        got = asyncio.Event()

        async def fast() -> None:
            async with slots.slot("fast"):
                got.set()
                await asyncio.sleep(3600)

        fast_task = asyncio.create_task(fast())
        await until(lambda: slots.waiting("fast") == 1)
        gates[0].set()  # one hung run ends
        try:
            await asyncio.wait_for(got.wait(), 1)
            fair = True
        except TimeoutError:
            fair = False
        held = hanging["held"]
        fast_task.cancel()
        for gate in gates:
            gate.set()
        await asyncio.gather(*slow_tasks, fast_task, return_exceptions=True)
        return held, fair

    assert asyncio.run(scenario()) == (1, True)


def test_fair_slots_cap_a_cluster_at_its_share() -> None:
    """4 slots. Alone, a cluster may take all 4. Once a second cluster wants one, the share
    is 4 // 2 = 2: the first gets no new slot while it holds 2 or more, even with a slot
    free, and gets them again when it is alone once more."""
    async def scenario() -> list[tuple[int, int]]:
        slots = FairSlots(4)
        seen: list[tuple[int, int]] = []
        gates = [asyncio.Event() for _ in range(6)]

        async def hold(cluster: str, gate: asyncio.Event) -> None:
            async with slots.slot(cluster):
                await gate.wait()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)
            seen.append((slots.held("slow"), slots.held("fast")))

        slow = [asyncio.create_task(hold("slow", g)) for g in gates]
        await settle()  # alone: every slot
        fast_gate = asyncio.Event()
        fast = asyncio.create_task(hold("fast", fast_gate))
        await settle()  # no slot free: fast waits
        gates[0].set()
        await settle()  # the freed slot goes to fast (slow holds 3, over its share)
        gates[1].set()
        await settle()  # slow at its share (2): a slot stays free rather than go to it
        fast_gate.set()
        await settle()  # alone again: slow takes what is free (its last two runs)
        for g in gates:
            g.set()
        await asyncio.gather(*slow, fast)
        await settle()
        return seen

    assert asyncio.run(scenario()) == [(4, 0), (4, 0), (3, 1), (2, 1), (4, 0), (0, 0)]


def secret(name: str, data: dict[str, str]) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name, "namespace": "d", "uid": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_desired_clusters_hash_kubeconfig_and_values() -> None:
    a = desired_clusters([secret("c1", {"kubeconfig": "x"})], "kubeconfig")["c1"]
    b = desired_clusters([secret("c1", {"kubeconfig": "x", "values.yaml": "a: 1"})],
                         "kubeconfig")["c1"]
    c = desired_clusters([secret("c1", {"other": "x"})], "kubeconfig")["c1"]
    assert a.kubeconfig == b"x" and a.digest != b.digest and b.values == b"a: 1"
    assert c.kubeconfig is None
    deleting = secret("c2", {"kubeconfig": "x"})
    deleting["metadata"]["deletionTimestamp"] = "now"
    assert desired_clusters([deleting], "kubeconfig") == {}


def test_one_crd_source() -> None:
    canonical = (ROOT / "crds" / "mesh.openkcm.io_tenants.yaml").read_text()
    assert (ROOT / "chart" / "crds" / "mesh.openkcm.io_tenants.yaml").read_text() == canonical
    assert crd_text() == canonical


def test_release_index_reports_recent_pending_records_as_locked() -> None:
    idx = ReleaseIndex()
    rec = record("ns", "r", 1, "pending-install")
    rec["metadata"]["labels"]["modifiedAt"] = "1000"
    idx.on_event("ADDED", rec)
    locked = idx.observe("ns", "r", now=1050, lock_timeout=100)
    # modified at 1000, a leftover from 1100 on: the next look is due in 50 s, not later
    assert locked.locked and locked.unlocks_in == 50
    stale = idx.observe("ns", "r", now=1200, lock_timeout=100)
    assert not stale.locked and stale.unlocks_in == 0
    rec = record("ns", "r", 1, "deployed")
    rec["metadata"]["labels"]["modifiedAt"] = "1000"
    idx.on_event("MODIFIED", rec)
    assert not idx.observe("ns", "r", now=1050, lock_timeout=100).locked


def test_backoff_ignores_echoes_but_not_real_changes() -> None:
    async def scenario() -> tuple[int, int, int]:
        q: WorkQueue[str] = WorkQueue(policy=Policy(first=10, cap=300.0))
        q.retry("k")
        q.add("k", urgent=False)  # an echo of the failed attempt
        echoed = len(q)
        q.add("k")  # the object itself changed
        changed = len(q)
        q.forget("j")
        q.add("j", urgent=False)
        await q.close()
        return echoed, changed, len(q)

    assert asyncio.run(scenario()) == (0, 1, 2)


def test_echoes_during_a_failed_attempt_wait_for_the_backoff() -> None:
    async def scenario() -> int:
        q: WorkQueue[str] = WorkQueue(policy=Policy(first=10, cap=300.0))
        q.add("k")
        key = await q.get()
        q.add(key, urgent=False)  # our own status write echoes while we work
        q.retry(key)  # the attempt failed
        q.done(key)
        depth = len(q)
        await q.close()
        return depth

    assert asyncio.run(scenario()) == 0


def test_release_index_remembers_our_own_revisions() -> None:
    idx = ReleaseIndex()
    assert idx.ours("ns", "r") is None
    idx.note("ns", "r", 3, ReleaseStatus.DEPLOYED, "fp3")
    idx.on_event("ADDED", record("ns", "r", 3, "deployed"))
    idx.observe("ns", "r")  # the watch caught up: the note is dropped, ours is kept
    assert idx.ours("ns", "r") == (3, "fp3")
    idx.drop("ns", "r")
    assert idx.ours("ns", "r") is None


def test_retry_policies_double_up_to_their_cap() -> None:
    """The named policies (krypton.decisions.retry): the n-th failure waits first * 2**(n-1),
    at most cap; jitter only lengthens a delay, by at most its fraction; tenacity's wait
    strategy gives the same delays."""
    from tenacity import RetryCallState

    from krypton.decisions import retry

    assert [retry.ENGAGE.delay(n) for n in (1, 2, 3, 9, 10, 50)] == [1, 2, 4, 256, 300, 300]
    assert [retry.WATCH_CLUSTER.delay(n) for n in (1, 6, 7)] == [1, 32, 60]
    for n in range(1, 12):
        base = min(0.5 * 2 ** (n - 1), 30.0)
        assert base <= retry.WATCH.delay(n) <= base * 1.2
    state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]
    for n in (1, 2, 5, 12):
        state.attempt_number = n
        assert retry.ENGAGE.wait()(state) == retry.ENGAGE.delay(n)


def test_only_the_label_value_true_makes_a_cluster_and_the_rest_is_named() -> None:
    from krypton.decisions.clusters.discovery import by_label

    label = "sigs.k8s.io/multicluster-runtime-kubeconfig"

    def secret(name: str, value: str | None) -> dict[str, object]:
        labels = {} if value is None else {label: value}
        return {"metadata": {"name": name, "labels": {"other": "x", **labels}}}

    given = [secret("a", "true"), secret("b", "True"), secret("c", "yes"), secret("d", "1"),
             secret("e", ""), secret("f", None), secret("g", "true")]
    accepted, ignored = by_label(given, label)
    assert [s["metadata"]["name"] for s in accepted] == ["a", "g"]
    assert [(s["metadata"]["name"], v) for s, v in ignored] == \
        [("b", "True"), ("c", "yes"), ("d", "1"), ("e", "")]


def test_a_worker_reconciles_at_most_its_limit_at_once_and_idles_on_one_task() -> None:
    """--max-concurrent-reconciles passes at once (never more), each queued key once, and
    an idle cluster holds one waiting task instead of one per allowed pass."""
    from krypton.decisions.model import TenantKey
    from krypton.decisions.verdicts import Outcome

    limit, keys = 3, [TenantKey("ns", f"t{i}") for i in range(10)]
    consumer = Consumer("c0", limit)

    class Counting:
        def __init__(self) -> None:
            self.running, self.most, self.seen = 0, 0, []
            self.release = asyncio.Event()

        async def reconcile(self, key: TenantKey) -> Outcome:
            self.running += 1
            self.most = max(self.most, self.running)
            self.seen.append(key)
            await self.release.wait()
            self.running -= 1
            return Outcome()

    async def scenario() -> tuple[Counting, int, int]:
        reconciler = Counting()
        async with asyncio.TaskGroup() as group:
            running = group.create_task(consumer.run(reconciler, group))  # type: ignore[arg-type]
            await asyncio.sleep(0)
            idle_tasks = len(asyncio.all_tasks()) - 1  # without this test's own task
            for key in keys:
                consumer.queue.add(key)
            while reconciler.running < limit:
                await asyncio.sleep(0)
            for _ in range(20):  # let anything over the limit start, if it could
                await asyncio.sleep(0)
            busy_at_limit = reconciler.running
            reconciler.release.set()
            while len(reconciler.seen) < len(keys) or reconciler.running:
                await asyncio.sleep(0)
            await consumer.queue.close()
            await running
        return reconciler, idle_tasks, busy_at_limit

    reconciler, idle_tasks, busy_at_limit = asyncio.run(scenario())
    assert idle_tasks == 1
    assert busy_at_limit == limit and reconciler.most == limit
    assert sorted(reconciler.seen) == sorted(keys)
    assert consumer.reconciles == len(keys) and consumer._idle.is_set()


def test_clusters_take_turns_for_their_first_lists(tmp_path: Path) -> None:
    """At most FIRST_LISTS clusters list at once; a cluster whose list never answers gives
    its turn up after --api-timeout and keeps waiting for its list without one."""
    import dataclasses

    from krypton.decisions.settings import Settings

    settings = dataclasses.replace(Settings(), api_timeout=0.2)
    count = {"started": 0, "answering": 0, "most": 0}

    class Informer:
        def __init__(self, answers: bool) -> None:
            self.what, self.answers = "helm-releases", answers
            self.synced, self.release = asyncio.Event(), asyncio.Event()

        async def run(self) -> None:
            count["started"] += 1
            if self.answers:
                count["answering"] += 1
                count["most"] = max(count["most"], count["answering"])
                await self.release.wait()
                self.synced.set()
                count["answering"] -= 1
            await asyncio.Event().wait()  # the watch that follows (or a list never answered)

    async def scenario() -> tuple[int, list[bool]]:
        clusters = workers(tmp_path, settings, 6, first_lists=asyncio.Semaphore(2))
        informers = [Informer(answers=False) for _ in range(2)] + \
            [Informer(answers=True) for _ in range(4)]
        group = Group()
        waits = [asyncio.create_task(w._first_list(group, i, "Helm release records"))  # type: ignore[arg-type]
                 for w, i in zip(clusters, informers, strict=True)]
        while count["started"] < 2:
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)  # well within --api-timeout: nobody else may start
        at_once = count["started"]
        for informer in informers[2:]:
            informer.release.set()
        # the two that never answer give their turns up, so the others get theirs
        await asyncio.wait_for(asyncio.gather(*waits[2:]), 5)
        done = [w.done() for w in waits]  # the two still wait for their lists
        for task in [*waits, *group.tasks]:
            task.cancel()
        await asyncio.gather(*waits, *group.tasks, return_exceptions=True)
        return at_once, done

    at_once, done = asyncio.run(scenario())
    assert at_once == 2 and count["most"] <= 2
    assert done == [False, False, True, True, True, True]


@pytest.mark.parametrize(("owner", "adopt", "outcome"), [
    ("ns/t1", False, None),  # made by another pass of the same Tenant (a second cluster name)
    ("other/t1", False, "NamespaceConflict"),  # another Tenant's
    (None, False, "NamespaceConflict"),  # someone else's, and no --adopt-namespaces
    (None, True, "adopted"),
    ("gone", False, "TemporaryError"),  # deleted again in between
])
@pytest.mark.parametrize("looked", [True, False], ids=["looked-up-absent", "not-looked-up"])
def test_a_namespace_made_while_it_was_being_created_is_judged_like_any_other(
        owner: str | None, adopt: bool, outcome: str | None, looked: bool) -> None:
    """Two names of one cluster (--allow-duplicate-clusters) install the same Tenant side by
    side: the pass whose create loses the race must not take the other's namespace for one
    krypton did not create (a permanent NamespaceConflict stopped that Tenant for good).
    A first install that did not look the namespace up creates it and judges an
    existing one the same way."""
    from types import SimpleNamespace

    import structlog

    from krypton.decisions.errors import AlreadyExists, TemporaryError
    from krypton.decisions.model import OWNER_ANNOTATION, NamespaceState, TenantKey
    from krypton.runtime.reconcile.install import ensure_namespace
    from krypton.runtime.reconcile.model import NamespaceNotOwned

    patched: list[Any] = []

    class Kube:
        async def create_namespace(self, *_: Any) -> None:
            raise AlreadyExists("namespaces \"t1\" already exists")

        async def get_namespace(self, name: str) -> Any:
            if owner == "gone":
                return None
            notes = {OWNER_ANNOTATION: owner} if owner else {}
            return {"metadata": {"name": name, "annotations": notes}}

        async def patch_namespace(self, name: str, body: Any) -> None:
            patched.append(body)

    rt = SimpleNamespace(kube=Kube(), name="w3", log=structlog.get_logger(),
                         settings=SimpleNamespace(adopt_namespaces=adopt))
    state = NamespaceState.ABSENT if looked else NamespaceState.UNKNOWN
    run = ensure_namespace(rt, TenantKey("ns", "t1"), state, first=True)  # type: ignore[arg-type]
    if outcome == "NamespaceConflict":
        with pytest.raises(NamespaceNotOwned):
            asyncio.run(run)
    elif outcome == "TemporaryError":
        with pytest.raises(TemporaryError):
            asyncio.run(run)
    else:
        asyncio.run(run)
        assert bool(patched) == (outcome == "adopted")


@pytest.mark.parametrize(("looked", "exists", "outcome"), [
    (False, "ns/t1", None),  # made for krypton (its owner annotation): installed into
    (False, None, "NamespaceConflict"),  # someone else's: refused as any other
    (False, "gone", "Forbidden"),  # absent, and krypton may not create it: the error stands
    (True, "ns/t1", "Forbidden"),  # looked up as absent: nothing to judge, not read again
])
def test_a_namespace_krypton_may_not_create_is_judged_when_it_exists(
        looked: bool, exists: str | None, outcome: str | None) -> None:
    """A first install creates its namespace without reading it. Credentials
    without the right to create namespaces, on a cluster where they are made for krypton,
    must still install into one that exists and is the Tenant's, as when it was read first."""
    from types import SimpleNamespace

    import structlog

    from krypton.decisions.errors import Forbidden
    from krypton.decisions.model import OWNER_ANNOTATION, NamespaceState, TenantKey
    from krypton.runtime.reconcile.install import ensure_namespace
    from krypton.runtime.reconcile.model import NamespaceNotOwned

    reads: list[str] = []

    class Kube:
        async def create_namespace(self, *_: Any) -> None:
            raise Forbidden("create namespace t1: forbidden: cannot create resource")

        async def get_namespace(self, name: str) -> Any:
            reads.append(name)
            if exists == "gone":
                return None
            notes = {OWNER_ANNOTATION: exists} if exists else {}
            return {"metadata": {"name": name, "annotations": notes}}

    rt = SimpleNamespace(kube=Kube(), name="w3", log=structlog.get_logger(),
                         settings=SimpleNamespace(adopt_namespaces=False))
    state = NamespaceState.ABSENT if looked else NamespaceState.UNKNOWN
    run = ensure_namespace(rt, TenantKey("ns", "t1"), state, first=True)  # type: ignore[arg-type]
    if outcome is None:
        asyncio.run(run)
    else:
        with pytest.raises(Forbidden if outcome == "Forbidden" else NamespaceNotOwned):
            asyncio.run(run)
    assert reads == ([] if looked else ["t1"])


def test_the_echo_of_an_own_write_is_told_from_anyone_elses_change() -> None:
    """The watch events of the operator's own Tenant writes start no pass; an
    event at any other resourceVersion (someone else's write) does, and so does one that
    comes after a relist skipped the echoes."""
    from krypton.decisions.model import TenantKey
    from krypton.runtime.reconcile.memory import OwnWrites

    key = TenantKey("ns", "t1")

    def tenant(rv: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "t1", "resourceVersion": rv}}

    own = OwnWrites()
    own.wrote(tenant("10"))  # the finalizer
    own.wrote(tenant("12"))  # the fingerprint annotation
    own.wrote(tenant("13"))  # the status
    assert own.echo(key, "10")
    assert not own.echo(key, "11")  # someone else wrote in between
    assert own.echo(key, "13")  # a relist skipped 12: it is not waited for any more
    assert not own.echo(key, "12") and not own.echo(key, "13")  # each echo once
    assert not own.echo(TenantKey("other", "t1"), "13")
    own.wrote(tenant("20"))
    own.memory.drop(key)  # the Tenant went: its record with it
    assert not own.echo(key, "20") and key not in own.memory
    for rv in range(100, 100 + 3 * OwnWrites.KEPT):  # bounded however many go unechoed
        own.wrote(tenant(str(rv)))
    assert not own.echo(key, "100")  # the oldest are not kept
    assert own.echo(key, str(100 + 3 * OwnWrites.KEPT - OwnWrites.KEPT))


def test_a_pass_is_started_again_only_by_events_that_are_not_its_own_writes() -> None:
    """Events of a Tenant that come while a pass of it runs wait for its end (the answer to
    a write may come after the write's event): the pass's own writes start no pass, anyone
    else's write does; an own write's echo coming after the pass starts none either."""
    consumer = Consumer("c0", 1)
    own = consumer.own_writes

    def tenant(rv: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "t1", "resourceVersion": rv}}

    async def pass_(events: list[str], writes: list[str]) -> int:
        """One pass: `events` come while it runs, its `writes` are answered after them;
        returns how many keys are queued once it is done."""
        slots = asyncio.Semaphore(1)
        await slots.acquire()
        key = await consumer.queue.get()
        consumer._busy += 1
        for rv in events:
            consumer.tenant_changed("MODIFIED", tenant(rv))
        for rv in writes:
            own.wrote(tenant(rv))
        consumer._reconciled(slots, key, None)
        return len(consumer.queue)

    async def scenario() -> list[int]:
        consumer.tenant_changed("ADDED", tenant("1"))
        counts = [await pass_(["2", "3"], ["2", "3"])]  # finalizer and status: echoes only
        own.wrote(tenant("4"))  # a write answered before its event, after the pass
        consumer.tenant_changed("MODIFIED", tenant("4"))
        counts.append(len(consumer.queue))
        consumer.tenant_changed("MODIFIED", tenant("5"))  # someone else's write
        counts.append(len(consumer.queue))
        counts.append(await pass_(["6", "7"], ["6"]))  # 7: someone else's, during the pass
        return counts

    assert asyncio.run(scenario()) == [0, 0, 1, 1]


def test_a_tenant_record_is_made_on_first_sight_and_dropped_when_the_tenant_goes() -> None:
    """One record per Tenant, made by its first event, dropped by its DELETED
    event (at once, or when a pass of it that is running ends: the pass may still write),
    with its metric series and the workloads followed for it; the count is a metric."""
    from krypton.adapters import metrics
    from krypton.decisions.charts.ownership import ObjectRef
    from krypton.decisions.model import TenantKey
    from krypton.runtime.readiness import object_key

    consumer = Consumer("churn", 1)
    memory = consumer.memory
    web = ObjectRef("apps/v1", "Deployment", "web", "a")

    def tenant(name: str, rv: str) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": rv}}

    def records() -> float:
        new, old = (g.labels("churn")._value.get()  # noqa: SLF001
                    for g in (metrics.TENANTS_REMEMBERED, metrics.TENANT_RECORDS))
        assert new == old  # the old name, an alias
        return new

    async def scenario() -> None:
        a, b = TenantKey("ns", "a"), TenantKey("ns", "b")
        consumer.tenant_changed("ADDED", tenant("a", "1"))
        consumer.tenant_changed("ADDED", tenant("b", "2"))
        assert len(memory) == 2 and records() == 2 and memory.namespaces_with("a") == ("ns",)
        metrics.TENANT_RELEASE.labels("churn", "ns", "a", "tenant-a", "1.0.0", "f", "").set(1)
        memory.of(a).published = ("churn", "ns", "a", "tenant-a", "1.0.0", "f", "")
        memory.follow(a, (web,))
        memory.follow(b, (web,))
        assert set(memory.followers(object_key(web))) == {a, b}
        consumer.tenant_changed("DELETED", tenant("a", "3"))  # no pass of it runs
        assert a not in memory and records() == 1
        assert memory.followers(object_key(web)) == (b,) and memory.following() == 1
        assert memory.namespaces_with("a") == ()
        assert ("churn", "ns", "a", "tenant-a", "1.0.0", "f", "") not in {
            tuple(s.labels.values()) for f in metrics.TENANT_RELEASE.collect() for s in f.samples}
        while await consumer.queue.get() != b:  # a pass of b starts
            consumer.queue.done(a)
        consumer._busy += 1
        consumer.tenant_changed("DELETED", tenant("b", "4"))
        consumer.own_writes.wrote(tenant("b", "5"))  # the pass writes on
        assert b in memory  # kept while its pass runs
        consumer._reconciled(asyncio.Semaphore(0), b, None)
        assert len(memory) == 0 and records() == 0
        assert memory.followed_objects() == frozenset() and memory.following() == 0
        # engaged again: the first list has c but not d, deleted while no watch was there
        consumer.tenant_changed("ADDED", tenant("c", "6"))
        consumer.tenant_changed("ADDED", tenant("d", "7"))
        consumer.drop_unlisted({("ns", "c"): {}})
        assert list(memory) == [TenantKey("ns", "c")] and records() == 1

    asyncio.run(scenario())
