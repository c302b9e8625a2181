"""F1: the pure rollout state machine, and how its state is written."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from krypton.decisions.errors import AlreadyExists, Conflict, NotFound, TemporaryError
from krypton.decisions.model import RolloutGate
from krypton.decisions.rollouts.rollout import (
    COMPLETE,
    HALTED,
    PROGRESSING,
    ClusterObservation,
    Policy,
    RolloutState,
    allowed,
    engaging,
    evaluate,
    gate,
    include,
    plan_waves,
    publication,
    read_publication,
    revert_outcome,
    start,
    to_wake,
)

POLICY = Policy(canaries=("c",), max_parallel=2, max_failures="0", wave_deadline=100, soak=0)
OK = ClusterObservation(True, 2, 2, 0)
TODO = ClusterObservation(True, 2, 0, 0)
FAILED = ClusterObservation(True, 2, 1, 1)
DOWN = ClusterObservation(False, 0, 0, 0)


def test_waves_canary_first_then_bounded_groups() -> None:
    assert plan_waves(["e", "c", "b", "a", "d"], POLICY) == (("c",), ("a", "b"), ("d", "e"))
    assert plan_waves(["a", "b"], Policy(max_parallel=1)) == (("a",), ("b",))
    assert plan_waves(["a", "b", "c"], Policy(canaries=("b",))) == (("b",), ("a", "c"))
    assert not Policy().enabled and POLICY.enabled


def test_only_reached_clusters_move() -> None:
    s = start("t1", "2.0.0", ["a", "b", "c", "d"], POLICY, now=0)
    assert s.waves == (("c",), ("a", "b"), ("d",))
    assert allowed(s, "c") == (True, "")
    assert allowed(s, "a") == (False, "RolloutPending")
    assert allowed(s, "new-cluster") == (False, "RolloutPending")
    late = include(s, ["a", "b", "c", "d", "e", "f"], POLICY)
    assert late.waves == (("c",), ("a", "b"), ("d",), ("e", "f"))
    assert include(late, ["a", "e"], POLICY) == late
    assert allowed(None, "a") == (True, "")


def test_waves_advance_and_complete() -> None:
    s = start("t1", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    s = evaluate(s, {"c": TODO, "a": TODO, "b": TODO}, POLICY, now=1)
    assert (s.phase, s.wave) == (PROGRESSING, 0)
    s = evaluate(s, {"c": OK, "a": TODO, "b": TODO}, POLICY, now=2)
    assert (s.phase, s.wave) == (PROGRESSING, 1) and allowed(s, "a")[0]
    s = evaluate(s, {"c": OK, "a": OK, "b": OK}, POLICY, now=3)
    assert s.phase == COMPLETE and allowed(s, "anything")[0]


def test_failure_halts_and_keeps_the_rest_back() -> None:
    s = start("t1", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    s = evaluate(s, {"c": FAILED, "a": TODO, "b": TODO}, POLICY, now=1)
    assert s.phase == HALTED and s.failed == ("c",) and "1 failed" in s.message
    assert allowed(s, "a") == (False, "RolloutHalted")
    assert evaluate(s, {"c": OK, "a": OK, "b": OK}, POLICY, now=2) == s  # stays halted
    lenient = dataclasses.replace(POLICY, max_failures="1")
    s2 = evaluate(start("t1", "2.0.0", ["a", "c"], lenient, 0), {"c": FAILED, "a": TODO},
                  lenient, now=1)
    assert s2.phase == PROGRESSING


@pytest.mark.parametrize("budget, unit, failing, halts", [
    ("25%", "clusters", 1, False),  # 25% of 4 clusters: one may fail
    ("25%", "clusters", 2, True),
    ("25%", "releases", 1, False),  # 25% of 8 releases: two may fail (one each here)
    ("25%", "releases", 2, False),
    ("25%", "releases", 3, True),
    ("1", "clusters", 1, False),  # a plain number keeps its meaning, in the unit chosen
    ("1", "releases", 2, True),
    ("0%", "clusters", 1, True),
    ("100%", "clusters", 4, False),
])
def test_a_failure_budget_is_a_count_or_a_share_of_the_wave(budget: str, unit: str,
                                                            failing: int, halts: bool) -> None:
    """A wave of 4 clusters with 2 releases each; `failing` of them have one
    failed release."""
    policy = Policy(max_parallel=4, max_failures=budget, failure_unit=unit,
                    wave_deadline=100)
    seen = {c: (FAILED if i < failing else OK) for i, c in enumerate("abcd")}
    s = evaluate(start("t1", "2.0.0", list("abcd"), policy, now=0), seen, policy, now=1)
    assert (s.phase == HALTED) is halts, s.message
    assert (s.budget_used, s.budget_unit) == (failing, unit)
    if halts:
        assert f"more than the {s.budget} allowed ({budget} of" in s.message


def test_deadline_counts_as_failed() -> None:
    s = start("t1", "2.0.0", ["a", "c"], POLICY, now=0)
    s = evaluate(s, {"c": TODO, "a": TODO}, POLICY, now=101)
    assert s.phase == HALTED and "deadline" in s.message


def test_the_deadline_counts_only_the_time_a_clusters_window_was_open() -> None:
    # open in the first minute of every hour, UTC; the wave starts at 10:00:30
    hourly = dataclasses.replace(TODO, window="0 * * * * 1m")
    begun = 1_795_860_030.0  # 2026-11-28 10:00:30 UTC
    s = start("t1", "2.0.0", ["c"], POLICY, now=begun)
    # 2 hours on: 30 s + 60 s + 60 s of window time, more than the 100 s deadline
    assert evaluate(s, {"c": hourly}, POLICY, now=begun + 7200).phase == HALTED
    # 1 hour on: 30 s + 60 s, within it: the wave waits for the window
    waiting = evaluate(s, {"c": hourly}, POLICY, now=begun + 3600)
    assert waiting.phase == PROGRESSING, waiting.message
    # without a window the same hour is past the deadline
    assert evaluate(s, {"c": TODO}, POLICY, now=begun + 3600).phase == HALTED
    # a window in a publication is read back, and a malformed one is no publication
    published = read_publication(publication("t1", hourly), "t1")
    assert published == hourly
    assert read_publication(publication("t1", hourly).replace('"0 * * * * 1m"', "3"),
                            "t1") == DOWN


def test_unreachable_clusters_are_skipped_not_blocking() -> None:
    s = start("t1", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    s = evaluate(s, {"c": OK, "a": DOWN, "b": OK}, POLICY, now=1)
    assert s.phase == COMPLETE and s.skipped == ("a",) and "skipped: a" in s.message
    assert allowed(s, "a")[0]  # catches up when it returns


def test_soak_holds_the_next_wave() -> None:
    soaking = dataclasses.replace(POLICY, soak=10)
    s = start("t1", "2.0.0", ["a", "c"], soaking, now=0)
    s = evaluate(s, {"c": OK, "a": TODO}, soaking, now=1)
    assert s.wave == 0 and "soaking" in s.message
    s = evaluate(s, {"c": OK, "a": TODO}, soaking, now=12)
    assert s.wave == 1


def test_new_target_supersedes_and_state_round_trips() -> None:
    s = start("t1", "2.0.0", ["a", "c"], POLICY, now=0)
    s = evaluate(s, {"c": FAILED, "a": TODO}, POLICY, now=1)
    s2 = start("t2", "2.0.1", ["a", "c"], POLICY, now=5, previous=s)
    assert s2.phase == PROGRESSING and s2.history == ("initial 2.0.0", "2.0.0 -> 2.0.1")
    assert RolloutState.from_json(s.to_json()) == s


class _ConfigMaps:
    """The rollout controller's port to the home cluster (the three ConfigMap calls of
    ``Kube``), keeping resourceVersions as the API server does."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] | None = None
        self.version = 0

    def _object(self) -> dict[str, Any]:
        assert self.stored is not None
        return {"metadata": {"resourceVersion": str(self.version)}, "data": self.stored["data"]}

    async def get_configmap(self, _ns: str, _name: str) -> dict[str, Any] | None:
        return None if self.stored is None else self._object()

    async def create_configmap(self, _ns: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.stored is not None:
            raise AlreadyExists("create configmap: already exists")
        return self._write(body)

    async def replace_configmap(self, _ns: str, _name: str,
                                body: dict[str, Any]) -> dict[str, Any]:
        if self.stored is None:
            raise NotFound("replace configmap: not found")
        wanted = body["metadata"].get("resourceVersion")  # absent: unconditional, as a PUT
        if wanted is not None and wanted != str(self.version):
            raise Conflict("replace configmap: the object has been modified")
        return self._write(body)

    def _write(self, body: dict[str, Any]) -> dict[str, Any]:
        self.stored, self.version = body, self.version + 1
        return self._object()


def test_rollout_state_is_never_written_over_another_writer() -> None:
    """Two leaders (or a person) writing the rollout state: a write based on an older read
    fails instead of overwriting, and the state is read again."""
    from krypton.runtime.rollout_controller import RolloutController

    home = _ConfigMaps()
    controller = RolloutController(home, "ns", POLICY, None, {}, None, dict)  # type: ignore[arg-type]
    ours = start("t1", "1.0.0", ["a", "b"], POLICY, 0.0)
    asyncio.run(controller._save(ours))  # created
    asyncio.run(controller._save(ours))  # replaced over its own version
    theirs = start("t2", "2.0.0", ["a", "b"], POLICY, 0.0)
    home.stored = {"data": {"state.json": theirs.to_json()}}
    home.version += 1  # the other writer
    with pytest.raises(TemporaryError, match="another writer"):
        asyncio.run(controller._save(ours))
    assert RolloutState.from_json(home.stored["data"]["state.json"]).target == "t2"
    assert asyncio.run(controller._load()) == theirs
    asyncio.run(controller._save(ours))  # based on the fresh read: accepted
    assert RolloutState.from_json(home.stored["data"]["state.json"]).target == "t1"


def _halted(policy: Policy) -> RolloutState:
    state = start("t", "1.0", ["c", "d", "e"], policy, 0)
    halted = evaluate(state, {"c": FAILED, "d": OK, "e": OK}, policy, 1)
    assert halted.phase == HALTED and halted.failed == ("c",)
    return halted


def test_the_gate_asks_only_the_failed_clusters_to_revert_once_handed_over() -> None:
    reverting = Policy(**{**dataclasses.asdict(POLICY), "auto_revert": True})
    halted = _halted(reverting)
    assert gate(halted, "c", reverting) == RolloutGate(False, "RolloutHalted", revert=False)
    handed = dataclasses.replace(halted, reverted=True)
    assert gate(handed, "c", reverting) == RolloutGate(False, "RolloutHalted", revert=True)
    assert not gate(handed, "d", reverting).revert  # a cluster that did not fail
    assert not gate(handed, "c", POLICY).revert  # without --rollout-auto-revert


def test_the_revert_outcome_waits_for_every_release_and_counts_failures() -> None:
    handed = dataclasses.replace(_halted(POLICY), reverted=True)
    pending = ClusterObservation(True, 3, 0, 3, to_revert=1, reverted=1, revert_failed=1)
    assert revert_outcome(handed, {"c": pending}) == handed  # one release still to go
    finished = ClusterObservation(True, 3, 0, 3, to_revert=0, reverted=2, revert_failed=1)
    done = revert_outcome(handed, {"c": finished})
    assert (done.revert_reported, done.reverted_releases, done.revert_failures) == (True, 2, 1)
    assert done.message.endswith("rolled back 2 failed release(s); 1 could not be rolled back")
    assert revert_outcome(done, {"c": finished}) == done  # reported once
    gone = revert_outcome(handed, {"c": DOWN})  # unreachable: nothing to wait for
    assert (gone.revert_reported, gone.reverted_releases) == (True, 0)
    assert RolloutState.from_json(done.to_json()) == done


def _tenant(cluster: str, *, fingerprint: str = "", failed: str = "", ready: str = "",
            reason: str = "", error: str = "", reverted: str = "",
            revision: int | None = 2) -> dict[str, object]:
    conditions = [{"type": f"ClusterReady/{cluster}", "status": ready, "reason": reason}]
    if error:
        conditions.append({"type": f"ClusterError/{cluster}", "status": "True", "reason": error})
    return {"status": {"conditions": conditions, "clusters": {cluster: {
        "fingerprint": fingerprint, "failedFingerprint": failed, "revertedFingerprint": reverted,
        "revision": revision}}}}


def test_a_cluster_counts_ready_failed_and_unhealthy_releases_on_the_target() -> None:
    """SPEC F1 with F6: a release on the target whose workload timed out or degraded is a
    failed release of the wave, like a failed helm run; one still waiting is neither."""
    from krypton.decisions.rollouts.rollout import observe_cluster

    new, old = "n" * 64, "o" * 64
    tenants = [
        _tenant("a", fingerprint=new, ready="True", reason="Upgraded"),
        _tenant("a", fingerprint=new, ready="False", reason="WaitingForReadiness"),
        _tenant("a", fingerprint=new, ready="False", reason="ReadinessTimeout"),
        _tenant("a", fingerprint=new, ready="False", reason="Degraded"),
        _tenant("a", fingerprint=old, ready="False", reason="Degraded"),  # not on the target
        _tenant("a", fingerprint=old, failed=new, ready="False", reason="UpgradeFailed"),
        _tenant("a", fingerprint=old, failed=new, reverted=new, ready="True", reason="RolledBack"),
        _tenant("a", fingerprint=old, failed=new, error="RevertFailed"),
        _tenant("a", fingerprint=old, ready="True", reason="NoChange"),
    ]
    seen = observe_cluster("a", tenants, new)
    assert (seen.tenants, seen.done, seen.failed) == (9, 1, 5)
    assert (seen.to_revert, seen.reverted, seen.revert_failed) == (1, 1, 1)
    assert observe_cluster("a", tenants, None).failed == 0


def test_a_publication_reads_back_only_against_its_own_target() -> None:
    seen = ClusterObservation(True, 3, 2, 1, to_revert=1)
    text = publication("t1", seen)
    assert read_publication(text, "t1") == seen
    # the owner observed against another target (it has not resolved the new chart yet):
    # nothing is done or failed on the rollout's target there, though it is reachable
    assert read_publication(text, "t2") == ClusterObservation(True, 3, 0, 0)
    assert read_publication(text, None) == ClusterObservation(True, 3, 0, 0)
    unreachable = ClusterObservation(False, 0, 0, 0)
    for bad in (None, "", "{", "[]", '{"target": "t1"}', '{"target": "t1", "reachable": "yes",'
                ' "tenants": 1, "done": 1, "failed": 0}',
                '{"target": "t1", "reachable": true, "tenants": "1", "done": 1, "failed": 0}'):
        assert read_publication(bad, "t1") == unreachable, bad


def test_a_written_state_wakes_the_newly_reached_clusters_or_all_on_a_phase_change() -> None:
    first = start("t1", "1.0.0", ["a", "b", "c", "d"], POLICY, 0)  # waves: (c), (a, b), (d)
    assert to_wake(None, first) == ({"c"}, False)
    second = dataclasses.replace(first, wave=1)
    assert to_wake(first, second) == ({"a", "b"}, False)
    assert to_wake(second, second) == (set(), False)
    halted = dataclasses.replace(second, phase=HALTED)
    assert to_wake(second, halted) == (set(), True)
    other = start("t2", "2.0.0", ["a", "b", "c", "d"], POLICY, 0, previous=second)
    assert to_wake(second, other) == ({"c"}, False)  # a new target: its first wave again


def test_a_wave_waits_for_a_cluster_that_may_still_engage_then_skips_it() -> None:
    """Right after a start (or a handover) the wave's clusters are not engaged yet: the first
    look must not skip them all and call the rollout complete."""
    s = start("t1", "2.0.0", ["a", "b", "c"], POLICY, now=0)  # waves: (c), (a, b)
    nothing: dict[str, ClusterObservation] = {}  # the first look: no worker engaged
    settling, since = engaging({"a", "b", "c"}, nothing, {}, now=100, grace=30)
    assert settling == {"a", "b", "c"} and since == dict.fromkeys("abc", 100)
    waiting = evaluate(s, nothing, POLICY, now=100, settling=settling)
    assert waiting.phase == PROGRESSING and waiting.wave == 0 and not waiting.skipped
    assert "waiting for c to engage" in waiting.message
    # c engaged and is done; a and b still coming: wave 2 waits for them
    seen = {"c": OK}
    settling, since = engaging({"a", "b", "c"}, seen, since, now=110, grace=30)
    assert settling == {"a", "b"} and "c" not in since
    s = evaluate(s, seen, POLICY, now=110, settling=settling)
    assert (s.phase, s.wave, s.skipped) == (PROGRESSING, 1, ())
    # the grace runs out for a (still down); b engaged: a is skipped as before
    seen = {"c": OK, "b": OK}
    settling, since = engaging({"a", "b", "c"}, seen, since, now=131, grace=30)
    assert settling == frozenset() and since == {"a": 100}
    s = evaluate(s, {**seen, "a": DOWN}, POLICY, now=131, settling=settling)
    assert s.phase == COMPLETE and s.skipped == ("a",)


def test_a_failure_halts_even_while_another_cluster_of_the_wave_is_engaging() -> None:
    s = start("t1", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    s = evaluate(s, {"c": OK}, POLICY, now=1, settling=frozenset({"a", "b"}))
    assert s.wave == 1
    bad = ClusterObservation(True, 2, 0, 1)
    s = evaluate(s, {"a": bad}, POLICY, now=2, settling=frozenset({"b"}))
    assert s.phase == HALTED and s.failed == ("a",)


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"target": "x"}', '{"nope": 1}',
                                  '{"target": "t", "version": "1", "waves": 7}', "null"])
def test_a_garbage_rollout_state_is_no_state(text: str) -> None:
    from krypton.decisions.rollouts.rollout import RolloutState

    assert RolloutState.from_configmap({"data": {"state.json": text}}) is None
    assert RolloutState.from_configmap({"data": {"state.json": 5}}) is None
    assert RolloutState.from_configmap({"data": "garbage"}) is None


def test_a_restarted_controller_wakes_the_tenants_it_held_before_it_knew_its_target() -> None:
    """Until the first step has read the state and resolved the chart, the gate says
    RolloutPending and a Tenant looked at meanwhile is held, with nothing to bring it back.
    The state read after a restart may be exactly the one the step keeps (no wave moved):
    the step must still wake every worker, or the wave's Tenants wait for the resync."""
    from types import SimpleNamespace

    from krypton.adapters.charts import ResolvedChart
    from krypton.decisions.charts.fingerprint import fingerprint
    from krypton.runtime.rollout_controller import RolloutController

    class Chart:
        async def get(self) -> ResolvedChart:
            return ResolvedChart("r", "n", "1.0.0", "/chart")

    woken: list[str] = []

    def worker(name: str) -> Any:
        return SimpleNamespace(engaged=True, requeue_all=lambda: woken.append(name),
                               rollout_observation=lambda: waiting)

    workers = {"c": worker("c"), "d": worker("d")}
    home = _ConfigMaps()
    waiting = ClusterObservation(True, 1, 0, 0)
    saved = evaluate(start(fingerprint("r", "n", "1.0.0", {}), "1.0.0", ["c", "d"], POLICY,
                           time.time()), {"c": waiting, "d": waiting}, POLICY, time.time())
    home.stored = {"data": {"state.json": saved.to_json()}}
    controller = RolloutController(home, "ns", POLICY, Chart(), {}, None,  # type: ignore[arg-type]
                                   lambda: workers)
    assert controller.gate("c").reason == "RolloutPending"  # before the first step
    asyncio.run(controller.step())
    assert controller.state == saved  # nothing moved: no write, no wake by a change of state
    assert controller.gate("c").open and sorted(woken) == ["c", "d"]
    woken.clear()
    asyncio.run(controller.step())
    assert woken == []  # only when the gate may have opened


# -- rollout control (F9) ----------------------------------------------------------------------

from krypton.decisions.rollouts import rollout as rollout_mod  # noqa: E402
from krypton.decisions.rollouts import rolloutcontrol  # noqa: E402

APPROVING = dataclasses.replace(POLICY, approval="after-canaries")


def _approve(state: RolloutState, wave: int, target: str | None = None,
             by: str = "alice") -> dict[str, str]:
    return {rolloutcontrol.APPROVE: f"{wave}@{target or state.target}", rolloutcontrol.BY: by}


def test_the_wave_after_the_canaries_waits_for_an_approval_of_its_own_target() -> None:
    s = start("t2", "2.0.0", ["a", "b", "c"], APPROVING, now=0)
    s = evaluate(s, {"c": OK, "a": TODO, "b": TODO}, APPROVING, now=1)
    assert (s.wave, s.awaiting) == (1, True)
    assert allowed(s, "a") == (False, "RolloutAwaitingApproval")
    assert allowed(s, "c") == (True, "")
    # an approval written for the previous target, or for another wave, lets nothing through
    huge = {rolloutcontrol.APPROVE: f"2@{s.target}" + "x" * 200_000}
    for stale in (_approve(s, 2, target="t1"), _approve(s, 1), _approve(s, 3), huge):
        same, said = rolloutcontrol.control(s, stale, {}, now=2)
        assert [r for _, r, _ in said] == ["RolloutApprovalIgnored"]
        assert same.approved == -1 and 0 < len(same.ignored) <= 16  # not kept whole
        assert len(said[0][2]) < 400
        assert rolloutcontrol.control(same, stale, {}, now=3) == (same, [])  # said once
        assert evaluate(same, {"c": OK, "a": TODO, "b": TODO}, APPROVING, now=2).awaiting
    s, said = rolloutcontrol.control(s, _approve(s, 2), {}, now=3)
    assert [r for _, r, _ in said] == ["RolloutApproved"] and "alice" in said[0][2]
    s = evaluate(s, {"c": OK, "a": TODO, "b": TODO}, APPROVING, now=3)
    assert (s.wave, s.awaiting, s.wave_started) == (1, False, 3)
    assert allowed(s, "a") == (True, "")
    assert s.approvals == ({"wave": 2, "by": "alice", "at": 3},)
    # the approval stays on the ConfigMap: it approves that wave again, never the next
    again, said = rolloutcontrol.control(s, _approve(s, 2), {}, now=4)
    assert again == s and said == []


def test_a_wave_approved_while_paused_stays_closed_and_is_approved_once() -> None:
    s = start("t2", "2.0.0", ["a", "c"], APPROVING, now=0)
    s = evaluate(s, {"c": OK, "a": TODO}, APPROVING, now=1)
    given = {**_approve(s, 2), rolloutcontrol.PAUSE: "t2"}
    for now in (2, 3, 4):
        s, _ = rolloutcontrol.control(s, given, {}, now=now)
        s = evaluate(s, {"c": OK, "a": TODO}, APPROVING, now=now)
    assert allowed(s, "a") == (False, "RolloutPaused")
    assert [a["at"] for a in s.approvals] == [2]


def test_every_wave_waits_with_every_wave_approval() -> None:
    policy = dataclasses.replace(POLICY, approval="every-wave")
    s = evaluate(start("t", "2.0.0", ["a", "c"], policy, now=0), {"c": TODO, "a": TODO},
                 policy, now=1)
    assert (s.wave, s.awaiting) == (0, True) and allowed(s, "c")[1] == "RolloutAwaitingApproval"
    assert not rollout_mod.needs_approval(s, 1, POLICY)


def test_a_pause_holds_every_cluster_and_its_deadline_until_resumed() -> None:
    s = start("t", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    paused, said = rolloutcontrol.control(s, {rolloutcontrol.PAUSE: "t"}, {}, now=10)
    assert [r for _, r, _ in said] == ["RolloutPaused"]
    assert allowed(paused, "c") == (False, "RolloutPaused")
    # a pause lasting past the wave's deadline does not fail the wave
    assert evaluate(paused, {"c": TODO}, POLICY, now=500) == paused
    resumed, said = rolloutcontrol.control(paused, {}, {}, now=500)
    assert [r for _, r, _ in said] == ["RolloutResumed"]
    assert resumed.wave_started == 490 and allowed(resumed, "c") == (True, "")
    assert evaluate(resumed, {"c": TODO, "a": TODO, "b": TODO}, POLICY, now=501).phase == PROGRESSING
    assert to_wake(s, paused)[1] and to_wake(paused, resumed)[1]
    # a pause of another target does nothing
    assert rolloutcontrol.control(s, {rolloutcontrol.PAUSE: "old"}, {}, now=10) == (s, [])


def test_an_abort_halts_with_the_failed_clusters_of_the_reached_waves() -> None:
    s = start("t", "2.0.0", ["a", "b", "c"], POLICY, now=0)
    s = evaluate(s, {"c": OK, "a": TODO, "b": TODO}, POLICY, now=1)
    aborted, _ = rolloutcontrol.control(s, {rolloutcontrol.ABORT: "t", rolloutcontrol.BY: "bob"},
                                     {"c": OK, "a": FAILED, "b": TODO}, now=2)
    assert (aborted.phase, aborted.failed, aborted.aborted) == (HALTED, ("a",), "bob")
    assert "aborted by bob in wave 2/2" in aborted.message
    # handed over by the controller as any halt: only the failed cluster's releases go back
    handed = dataclasses.replace(aborted, reverted=True)
    reverting = dataclasses.replace(POLICY, auto_revert=True)
    assert gate(handed, "a", reverting).revert and not gate(handed, "c", reverting).revert
    assert rolloutcontrol.control(aborted, {rolloutcontrol.ABORT: "t"}, {}, now=3) == (aborted, [])


def test_the_history_keeps_the_last_rollouts_with_their_approvals() -> None:
    s = start("t1", "1.0.0", ["a", "c"], APPROVING, now=0)
    s = rollout_mod.ended(evaluate(s, {"c": OK, "a": OK}, POLICY, now=1), now=1)
    assert (s.phase, s.ended) == (COMPLETE, 1)
    for i in range(2, 9):
        s = start(f"t{i}", f"{i}.0.0", ["a", "c"], APPROVING, now=i, previous=s)
    assert [p["version"] for p in s.past] == ["3.0.0", "4.0.0", "5.0.0", "6.0.0", "7.0.0"]
    assert RolloutState.from_json(s.to_json()) == s
    lines = rolloutcontrol.history_lines(s, str)
    assert lines[0].startswith("2.0.0 -> 3.0.0: Progressing, started 3")
    assert lines[-2] == "  wave 2: a" and "(current)" in lines[-4]


def test_a_command_on_a_rollout_not_running_or_of_another_format_changes_nothing() -> None:
    s = start("t", "2.0.0", ["a", "c"], APPROVING, now=0)
    assert rolloutcontrol.command(None, "pause", "me")[0] is None
    assert rolloutcontrol.command(s, "approve", "me")[0] is None  # nothing waits
    old = RolloutState.from_json(s.to_json().replace('"format": 2, ', ""))
    assert old.format == 1
    annotations, said = rolloutcontrol.command(old, "pause", "me")
    assert annotations is None and "format 1" in said
    done = dataclasses.replace(s, phase=COMPLETE)
    assert rolloutcontrol.command(done, "abort", "me")[0] is None
    assert rolloutcontrol.command(s, "pause", "me")[0] == {rolloutcontrol.PAUSE: "t",
                                                        rolloutcontrol.BY: "me"}
    waiting = evaluate(s, {"c": OK, "a": TODO}, APPROVING, now=1)
    assert rolloutcontrol.command(waiting, "approve", "me")[0] == {
        rolloutcontrol.APPROVE: "2@t", rolloutcontrol.BY: "me"}
