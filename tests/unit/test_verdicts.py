"""What a pass came to, as conditions (SPEC R10) and the next attempt of a failed target (R18)."""

from __future__ import annotations

import pytest

from krypton.decisions import verdicts
from krypton.decisions.verdicts import Verdict

R, E, P = "ClusterReady/c1", "ClusterError/c1", "ClusterProgress/c1"


def said(verdict: Verdict, **kw: str) -> dict[str, tuple[bool, str, str]]:
    return {c.type: (c.status, c.reason, c.message)
            for c in verdicts.changes("c1", verdict, "Why", "what happened", **kw)}


@pytest.mark.parametrize(("verdict", "expected"), [
    # an error that leaves the release not Ready: all three
    (Verdict.FAILED, {R: (False, "Why", "what happened"), E: (True, "Why", "what happened"),
                      P: (False, "Why", "what happened")}),
    # an error before anything changed: Ready is not touched
    (Verdict.BLOCKED, {E: (True, "Why", "what happened"), P: (False, "Why", "what happened")}),
    (Verdict.ERROR, {E: (True, "Why", "what happened")}),
    (Verdict.NOTED, {P: (False, "Why", "what happened")}),
    (Verdict.ANNOUNCED, {P: (True, "Why", "what happened")}),
    (Verdict.WAITING, {R: (False, "Why", "what happened"), P: (True, "Why", "what happened")}),
    (Verdict.APPLIED, {R: (True, "Why", "what happened"), E: (False, "Why", "no error"),
                       P: (False, "Why", "what happened")}),
    (Verdict.APPLIED_WAITING, {R: (False, "Why", "what happened"), E: (False, "Why", "no error"),
                               P: (True, "Why", "what happened")}),
    (Verdict.UNRECORDED, {E: (True, "Why", "what happened"), P: (False, "Why", "what happened")}),
])
def test_each_verdict_sets_its_conditions(verdict: Verdict,
                                          expected: dict[str, tuple[bool, str, str]]) -> None:
    assert said(verdict) == expected


def test_a_completed_run_names_its_outcome_where_it_differs() -> None:
    # "Installed", its progress "InstallComplete"
    assert said(Verdict.APPLIED, ended="InstallComplete") == {
        R: (True, "Why", "what happened"), E: (False, "Why", "no error"),
        P: (False, "InstallComplete", "what happened")}
    # waiting for the workload of a release just "Installed"
    assert said(Verdict.APPLIED_WAITING, cleared="Installed") == {
        R: (False, "Why", "what happened"), E: (False, "Installed", "no error"),
        P: (True, "Why", "what happened")}
    # an error is never said with the outcome of a run, nor a progress under way
    assert said(Verdict.FAILED, cleared="Installed", ended="InstallComplete")[E][1] == "Why"
    assert said(Verdict.ANNOUNCED, ended="InstallComplete")[P][1] == "Why"


def _conds(**status: str) -> list[dict[str, str]]:
    names = {"ready": R, "error": E, "progress": P}
    return [{"type": names[k], "status": v, "reason": "Before"} for k, v in status.items()]


def test_in_sync_writes_only_what_does_not_say_so_already() -> None:
    assert verdicts.in_sync("c1", _conds(ready="True", error="False", progress="False"),
                            "NoChange", "m") == []
    got = verdicts.in_sync("c1", _conds(ready="False", error="True", progress="True"),
                           "NoChange", "m")
    assert {(c.type, c.status) for c in got} == {(R, True), (E, False), (P, False)}
    # no error condition yet: it is written, cleared
    assert [(c.type, c.status, c.message) for c in verdicts.in_sync("c1", _conds(ready="True"),
                                                                    "NoChange", "m")] == \
        [(E, False, "no error")]


def test_a_failed_attempt_counts_the_same_target_and_starts_afresh_on_a_new_one() -> None:
    first = verdicts.failed_attempt(0, True, max_retries=2, backoff_max=300)
    assert (first.failures, first.stalled) == (1, False)
    third = verdicts.failed_attempt(2, True, max_retries=2, backoff_max=300)
    assert (third.failures, third.stalled) == (3, True)
    assert third.delay > first.delay
    fresh = verdicts.failed_attempt(7, False, max_retries=2, backoff_max=300)
    assert (fresh.failures, fresh.stalled) == (1, False)
    assert verdicts.failed_attempt(30, True, max_retries=99, backoff_max=60).delay <= 60 * 1.1


@pytest.mark.parametrize("verdict", sorted(Verdict, key=lambda v: v.value))
def test_an_error_is_a_warning_and_comes_back_on_the_growing_schedule(verdict: Verdict) -> None:
    told = verdicts.tell("c1", verdict, "Why", "what happened")
    error = verdict in (Verdict.FAILED, Verdict.BLOCKED, Verdict.ERROR, Verdict.UNRECORDED)
    assert told.event == ("Warning" if error else "Normal", "Why", "what happened")
    assert (told.outcome.retry, told.outcome.requeue_after) == (error, None)
    # the conditions are the verdict's own
    assert told.changes == verdicts.changes("c1", verdict, "Why", "what happened")


def test_what_a_pass_says_names_its_event_and_its_next_attempt() -> None:
    # a permanent error waits for a change of its input: no next attempt
    stalled = verdicts.tell("c1", Verdict.FAILED, "RetriesExhausted", "m", permanent=True)
    assert stalled.event == ("Warning", "RetriesExhausted", "m")
    assert (stalled.outcome.retry, stalled.outcome.requeue_after) == (False, None)
    # a failed helm run: its own Event name, and the next attempt when it is due
    failed = verdicts.tell("c1", Verdict.FAILED, "InstallFailed", "m", event="HelmInstallFailed",
                           again=12.5)
    assert failed.event == ("Warning", "HelmInstallFailed", "m")
    assert (failed.outcome.retry, failed.outcome.requeue_after) == (False, 12.5)
    # a cluster that is not discovered is noted, as a Warning
    unknown = verdicts.tell("c1", Verdict.NOTED, "UnknownCluster", "m", warning=True)
    assert unknown.event == ("Warning", "UnknownCluster", "m") and not unknown.outcome.retry
    # held by the rollout: noted, no Event, looked at again when something changes
    held = verdicts.tell("c1", Verdict.NOTED, "RolloutHeld", "m", event="")
    assert held.event is None and held.outcome == verdicts.Outcome(reason="RolloutHeld")
    # a completed run names its outcome in the conditions as changes() does
    done = verdicts.tell("c1", Verdict.APPLIED, "Installed", "m", event="HelmInstalled",
                         ended="InstallComplete")
    assert done.event == ("Normal", "HelmInstalled", "m")
    assert {c.type: c.reason for c in done.changes}[P] == "InstallComplete"
