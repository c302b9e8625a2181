"""Metric gates of the progressive rollout (SPEC F7): one evaluation's verdict
from the Prometheus HTTP API's answer, and what a wave's evaluations add up to. The
answers are shaped as the Prometheus documentation gives them (/api/v1/query)."""

from __future__ import annotations

import dataclasses

import pytest

from krypton.decisions.model import RolloutGate
from krypton.decisions.rollouts import gates
from krypton.decisions.rollouts.gates import FAILED, PASSED, UNANSWERED, GatePolicy, Reading
from krypton.decisions.rollouts.rollout import (
    HALTED,
    PROGRESSING,
    ClusterObservation,
    Policy,
    evaluate,
    gate,
    revert_outcome,
    soaking,
    start,
    with_readings,
)


def vector(*values: str) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"cluster": "c"}, "value": [1700000000.0, v]} for v in values]}}


@pytest.mark.parametrize(("answer", "result", "value"), [
    (vector("1"), PASSED, "1"),
    (vector("0.003", "1"), PASSED, "0.003, 1"),
    (vector(), FAILED, "empty"),  # no data, or the comparison does not hold
    (vector("0"), FAILED, "0"),  # the bool form, false
    (vector("1", "NaN"), FAILED, "1, nan"),
    (vector("+Inf"), FAILED, "inf"),
    ({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}}, PASSED, "2"),
    ({"status": "success", "data": {"resultType": "matrix", "result": []}}, UNANSWERED, None),
    ({"status": "error", "errorType": "timeout", "error": "query timed out"}, UNANSWERED, None),
    ("not a document", UNANSWERED, None),
])
def test_one_evaluation(answer: object, result: str, value: str | None) -> None:
    reading = gates.judge(answer)
    assert reading.result == result
    if value is not None:
        assert reading.value == value


def test_the_cluster_placeholder_is_a_promql_string_inside() -> None:
    q = 'sum(rate(errors{cluster="$cluster"}[1m])) < 0.01'
    assert gates.query_for(q, "eu-1") == 'sum(rate(errors{cluster="eu-1"}[1m])) < 0.01'
    assert gates.query_for(q, 'a"b\\c') == 'sum(rate(errors{cluster="a\\"b\\\\c"}[1m])) < 0.01'


GATED = Policy(canaries=("c",), max_parallel=2, soak=60, wave_deadline=100, auto_revert=True,
               gate=GatePolicy("up == 1", failures=2, deadline=100))
DONE = ClusterObservation(True, 1, 1, 0)


def _soaking(now: float = 10.0) -> object:
    state = start("t", "2.0", ["c", "d"], GATED, 0.0, previous=start("t0", "1.0", ["c"], GATED, 0))
    state = evaluate(state, {"c": DONE, "d": DONE}, GATED, now)
    assert state.wave_healthy_since == now and soaking(state) == ("c",)
    return state


def test_a_wave_passes_only_on_a_passing_evaluation_made_during_its_soak() -> None:
    state = _soaking()
    observed = {"c": DONE, "d": DONE}
    # the soak is over, but nothing was evaluated yet: the wave waits for its gate
    waiting = evaluate(state, observed, GATED, 100)
    assert waiting.wave == 0 and "metric gate: waiting for c" in waiting.message
    # one failed evaluation (2 allowed), then a passing one: the wave moves on
    state = with_readings(state, {"c": Reading(FAILED, "0")}, 20)
    assert evaluate(state, observed, GATED, 100).wave == 0
    state = with_readings(state, {"c": Reading(PASSED, "1")}, 30)
    assert evaluate(state, observed, GATED, 50).wave == 0  # still soaking
    moved = evaluate(state, observed, GATED, 100)
    assert moved.wave == 1 and moved.gates == {}  # the next wave starts with no readings


def test_a_failing_gate_halts_the_wave_and_reverts_its_healthy_releases() -> None:
    state = _soaking()
    for at in (20, 30):
        state = with_readings(state, {"c": Reading(FAILED, "0.2")}, at)
    halted = evaluate(state, {"c": DONE, "d": DONE}, GATED, 31)
    assert (halted.phase, halted.failed, halted.gate_failed) == (HALTED, ("c",), True)
    assert "'up == 1' gave 0.2 (2 failed evaluation(s), 2 allowed)" in halted.message
    handed = dataclasses.replace(halted, reverted=True)
    assert gate(handed, "c", GATED) == RolloutGate(False, "RolloutHalted", revert=True,
                                                   revert_healthy_to="1.0")
    assert gate(handed, "d", GATED).revert_healthy_to == ""  # not reached, nothing to revert
    # the outcome is reported once no release is Ready on the target any more
    assert not revert_outcome(handed, {"c": DONE}).revert_reported
    back = ClusterObservation(True, 1, 0, 1, reverted=1)
    assert revert_outcome(handed, {"c": back}).reverted_releases == 1


def test_unanswered_evaluations_count_only_past_the_deadline() -> None:
    state = _soaking()
    for at in (20, 60, 110):
        state = with_readings(state, {"c": Reading(UNANSWERED, "unreachable")}, at)
    assert evaluate(state, {"c": DONE, "d": DONE}, GATED, 115).phase == PROGRESSING
    late = evaluate(state, {"c": DONE, "d": DONE}, GATED, 121)
    assert late.phase == HALTED and "no answer for 101s (deadline 100s)" in late.message
    # an answer in between starts the count again
    answered = with_readings(state, {"c": Reading(PASSED, "1")}, 112)
    assert with_readings(answered, {"c": Reading(UNANSWERED, "x")}, 113) \
        .gates["c"]["unanswered_since"] == 113


def test_the_gate_state_survives_the_configmap() -> None:
    from krypton.decisions.rollouts.rollout import RolloutState

    state = with_readings(_soaking(), {"c": Reading(FAILED, "0")}, 20)
    again = RolloutState.from_json(state.to_json())
    assert again == state and again.gates["c"]["failures"] == 1
    assert again.previous_version == "1.0"


def test_gate_records_read_back_from_the_configmap_are_typed_or_dropped() -> None:
    """The rollout ConfigMap can be written by whoever may write ConfigMaps there: a gate
    record of the wrong shape is dropped (that cluster is evaluated afresh) instead of
    stopping the controller's evaluate with a TypeError."""
    import json

    from krypton.decisions.rollouts.rollout import RolloutState

    good = with_readings(_soaking(), {"c": Reading(FAILED, "0")}, 20)
    raw = json.loads(good.to_json())
    raw["gates"] |= {"d": {"result": "failed", "failures": "many"},
                     "e": {"result": "passed", "unanswered_since": "soon"},
                     "f": ["not", "a", "record"], "g": {"result": "maybe"}}
    raw["previous_version"], raw["gate_failed"] = {"x": 1}, "yes"
    back = RolloutState.from_json(json.dumps(raw))
    assert set(back.gates) == {"c"} and back.gates["c"] == good.gates["c"]
    assert (back.previous_version, back.gate_failed) == ("{'x': 1}", False)
    assert evaluate(back, {"c": DONE, "d": DONE}, GATED, 30).phase == PROGRESSING
    raw["gates"] = "not a mapping"
    assert RolloutState.from_json(json.dumps(raw)).gates == {}


def test_a_first_rollout_that_fails_its_gate_reports_its_revert_at_once() -> None:
    """With no version before it there is nothing to roll back to: the halted state must not
    wait for the wave's Ready releases to leave the target (they never will)."""
    state = start("t", "1.0", ["c", "d"], GATED, 0.0)
    state = evaluate(state, {"c": DONE, "d": DONE}, GATED, 10)
    state = with_readings(state, {"c": Reading(FAILED, "0")}, 20)
    state = with_readings(state, {"c": Reading(FAILED, "0")}, 21)
    halted = dataclasses.replace(evaluate(state, {"c": DONE, "d": DONE}, GATED, 22),
                                 reverted=True)
    assert halted.phase == HALTED and halted.previous_version == ""
    assert gate(halted, "c", GATED).revert_healthy_to == ""
    reported = revert_outcome(halted, {"c": DONE})
    assert reported.revert_reported and reported.reverted_releases == 0
