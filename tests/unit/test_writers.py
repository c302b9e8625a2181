"""Another writer of krypton's releases, and drift repaired in a loop (SPEC S6): the names
on the records, the planner's rules and the index that carries a record's writer. The two
instances on one fleet are tested on the real bed (tests/reliability/test_brakes.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from krypton.decisions.model import ReleaseObservation, ReleaseStatus, rfc3339
from krypton.decisions.planner import Action, Need, plan
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.trust import writers
from tests.unit.test_planner import CHART, DEPLOYED, SYNCED, obs

OURS, THEIRS = "run.host-a.17", "run.host-b.23"
BUMPED = replace(SYNCED, applied_fingerprint="0" * 64)  # the chart changed: an upgrade
MOVED = replace(SYNCED, applied_revision=0)  # FP applied at another revision: drift
WRITTEN = replace(DEPLOYED, writer=THEIRS, written=1000.0)


def test_names_are_label_values_and_a_lease_is_told_back() -> None:
    leased = writers.name(leased=True, lease_namespace="krypton", lease_name="krypton-leader",
                          host="h", pid=1)
    assert leased == "lease.krypton.krypton-leader"
    assert writers.lease_of(leased) == ("krypton", "krypton-leader")
    run = writers.name(leased=False, lease_namespace="k", lease_name="l",
                       host="pod/a b", pid=42)
    assert run == "run.pod-a-b.42" and writers.lease_of(run) is None
    long = writers.name(leased=True, lease_namespace="n" * 60, lease_name="x", host="", pid=0)
    assert len(long) == writers.LABEL_MAX and writers.lease_of(long) is None  # cut: unknown


@pytest.mark.parametrize("written, now, active", [
    (999.0, 1100.0, False),  # before this process started: its predecessor, or one stopped
    (1001.0, 1100.0, True),
    (1001.0, 1001.0 + 3 * 60.0, False),  # three resync periods on: it stopped meanwhile
])
def test_a_writer_without_a_lease_is_at_work_for_a_few_resyncs_after_this_one_started(
        written: float, now: float, active: bool) -> None:
    left = writers.active_without_lease(written, 1000.0, now, 60.0)
    assert (left > 0) is active and (not active or left == 1001.0 + 180.0 - now)


def test_a_release_another_writer_at_work_wrote_is_left_alone() -> None:
    seen = replace(obs(BUMPED, CHART, WRITTEN), writer=OURS)
    assert plan(seen).action is Need.OBSERVE_WRITER
    yielded = plan(replace(seen, writer_active=True))
    assert (yielded.action, yielded.reason) == (Action.YIELD, "AnotherWriter")
    assert THEIRS in yielded.message and OURS in yielded.message
    assert plan(replace(seen, writer_active=False)).action is Action.UPGRADE


def test_the_instance_a_tenant_names_writes_and_every_other_leaves_it_alone() -> None:
    """An administrator settles it: the named instance upgrades without looking whether
    the other is at work; any other yields, even over a record of its own."""
    named = replace(BUMPED, writer=OURS)
    assert plan(replace(obs(named, CHART, WRITTEN), writer=OURS)).action is Action.UPGRADE
    mine = replace(DEPLOYED, writer=OURS, written=1000.0)
    other = plan(replace(obs(replace(BUMPED, writer=THEIRS), CHART, mine), writer=OURS))
    assert (other.action, other.reason) == (Action.YIELD, "AnotherWriter")
    assert THEIRS in other.message and "mesh.openkcm.io/writer" in other.message
    # in sync, nothing is left to anyone
    assert plan(replace(obs(replace(SYNCED, writer=THEIRS), CHART, mine),
                        writer=OURS)).action is Action.SKIP


@pytest.mark.parametrize("writer, ours", [(OURS, OURS), (None, OURS), (THEIRS, "")])
def test_no_look_for_our_own_an_unnamed_or_without_a_name_of_our_own(
        writer: str | None, ours: str) -> None:
    seen = replace(obs(BUMPED, CHART, replace(DEPLOYED, writer=writer)), writer=ours)
    assert plan(seen).action is Action.UPGRADE


def test_an_in_sync_release_is_not_looked_at_whoever_wrote_it() -> None:
    assert plan(replace(obs(SYNCED, CHART, WRITTEN), writer=OURS)).action is Action.SKIP


def test_drift_is_repaired_three_times_an_hour_then_braked() -> None:
    drifted = replace(obs(MOVED, CHART, DEPLOYED), repairs=None)
    assert plan(drifted).action is Need.COUNT_REPAIRS
    assert plan(replace(drifted, repairs=2)).action is Action.UPGRADE
    braked = plan(replace(drifted, repairs=3))
    assert (braked.action, braked.reason) == (Action.STALLED, "DriftRepairsExhausted")
    # a change of the target is no repair: never counted, never braked
    assert plan(replace(obs(BUMPED, CHART, DEPLOYED), repairs=None)).action is Action.UPGRADE


def _record(revision: int, repair: str, made: float, writer: str = OURS) -> dict[str, object]:
    return {"metadata": {"name": f"sh.helm.release.v1.r.v{revision}", "namespace": "ns",
                         "creationTimestamp": rfc3339(made),
                         "labels": {"owner": "helm", "name": "r", "version": str(revision),
                                    "status": "deployed", "mesh.openkcm.io/repair": repair,
                                    "mesh.openkcm.io/writer": writer}}}


def test_repairs_are_counted_from_the_records_of_the_last_hour_each_once() -> None:
    now = 1_800_000_000.0
    first, second, third = (writers.repair_token(t) for t in (now - 4000, now - 3000, now - 10))
    assert len({first, second, third, writers.NOT_A_REPAIR}) == 4
    found = [_record(1, writers.NOT_A_REPAIR, now - 100), _record(2, first, now - 4000),
             _record(3, second, now - 3000), _record(4, third, now - 10),
             _record(5, third, now - 5),  # a person's upgrade: helm copied the labels
             {"metadata": None}]
    assert writers.repairs(found, now) == 2


def test_the_index_carries_the_newest_records_writer_and_when_it_wrote() -> None:
    index = ReleaseIndex()
    index.on_event("ADDED", _record(1, writers.NOT_A_REPAIR, 1000.0), now=5000.0)
    carried = _record(2, writers.NOT_A_REPAIR, 2000.0, THEIRS)  # helm carries modifiedAt into upgrades
    carried["metadata"]["labels"]["modifiedAt"] = "900"  # type: ignore[index]
    index.on_event("ADDED", carried, now=5000.0)
    seen = index.observe("ns", "r")
    assert (seen.writer, seen.written, seen.revision) == (THEIRS, 2000.0, 2)
    assert ReleaseObservation(ReleaseStatus.DEPLOYED, 1).writer is None
