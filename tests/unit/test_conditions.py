"""R10/R11: per-cluster conditions, transition times, phase and the Ready summary."""

from __future__ import annotations

import pytest

from krypton.decisions.conditions import (
    SUMMARY_MESSAGE_LIMIT,
    Change,
    apply,
    holds,
    phase,
    servable,
    summarize,
)


def c(type_: str, status: str, reason: str = "R") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": "m",
            "lastTransitionTime": "t0"}


def test_transition_time_changes_only_when_status_flips() -> None:
    start = [c("ClusterReady/a", "True", "Installed")]
    same = apply(start, [Change("ClusterReady/a", True, "NoChange", "x")], generation=2, now="t1")
    assert same[0]["lastTransitionTime"] == "t0"
    assert same[0]["reason"] == "NoChange" and same[0]["observedGeneration"] == 2
    flipped = apply(start, [Change("ClusterReady/a", False, "UpgradeFailed", "x")],
                    generation=2, now="t1")
    assert flipped[0]["lastTransitionTime"] == "t1"


def test_untouched_conditions_are_kept() -> None:
    out = apply([c("ClusterReady/a", "True"), c("ClusterReady/b", "False")],
                [Change("ClusterReady/a", True, "R", "m")], generation=1, now="t1")
    assert [x["type"] for x in out] == ["ClusterReady/a", "ClusterReady/b"]


PHASES = [
    ("nothing yet", [], False, "Pending"),
    ("one ready", [c("ClusterReady/a", "True")], False, "Ready"),
    ("ready and error cleared", [c("ClusterReady/a", "True"), c("ClusterError/a", "False")],
     False, "Ready"),
    ("install failed", [c("ClusterReady/a", "True"), c("ClusterError/b", "True", "InstallFailed")],
     False, "Error"),
    ("upgrade failed", [c("ClusterError/a", "True", "UpgradeFailed")], False, "Error"),
    ("invalid name", [c("ClusterError/a", "True", "InvalidTenantName")], False, "Error"),
    ("namespace conflict", [c("ClusterError/a", "True", "NamespaceConflict")], False, "Error"),
    ("chart not loaded blocks", [c("ClusterReady/a", "True"),
                                 c("ClusterError/a", "True", "ChartNotLoaded")], False, "Pending"),
    ("chart not loaded skipped", [c("ClusterReady/a", "True"),
                                  c("ClusterError/a", "True", "ChartNotLoaded")], True, "Ready"),
    ("version not found skipped", [c("ClusterReady/a", "True"),
                                   c("ClusterError/a", "True", "VersionNotFound")], True, "Ready"),
    ("skip needs a ready cluster", [c("ClusterError/a", "True", "VersionInvalid")], True,
     "Pending"),
    ("fatal even with skip", [c("ClusterReady/a", "True"),
                              c("ClusterError/a", "True", "InstallFailed")], True, "Error"),
    ("progress only", [c("ClusterProgress/a", "True", "Installing")], False, "Pending"),
    # SPEC F6: a workload that never became ready, or stopped being ready, is an error there
    ("waiting for the workload", [c("ClusterReady/a", "False", "WaitingForReadiness"),
                                  c("ClusterProgress/a", "True", "WaitingForReadiness")],
     False, "Pending"),
    ("readiness timed out", [c("ClusterReady/b", "True"),
                             c("ClusterError/a", "True", "ReadinessTimeout")], False, "Error"),
    ("degraded", [c("ClusterReady/b", "True"), c("ClusterError/a", "True", "Degraded")], True,
     "Error"),
    # Paused by annotation is Suspended, whatever lies underneath
    ("paused before any install", [c("Paused", "True", "Paused")], False, "Suspended"),
    ("paused while ready", [c("ClusterReady/a", "True"), c("Paused", "True", "Paused")], False,
     "Suspended"),
    ("paused with an error", [c("ClusterError/a", "True", "InstallFailed"),
                              c("Paused", "True", "Paused")], False, "Suspended"),
    ("resumed", [c("ClusterReady/a", "True"), c("Paused", "False", "Resumed")], False, "Ready"),
]


@pytest.mark.parametrize(("conditions", "skip", "expected"), [p[1:] for p in PHASES],
                         ids=[p[0] for p in PHASES])
def test_phase(conditions: list, skip: bool, expected: str) -> None:  # type: ignore[type-arg]
    assert phase(conditions, allow_chart_skip=skip) == expected


def test_summary_ready_condition() -> None:
    current, out = summarize([c("ClusterReady/b", "True"), c("ClusterReady/a", "True")],
                             allow_chart_skip=False, generation=3, now="t")
    ready = next(x for x in out if x["type"] == "Ready")
    assert current == "Ready" and ready["status"] == "True"
    assert ready["message"] == "ready on a, b"
    current, out = summarize([c("ClusterError/a", "True", "InstallFailed")],
                             allow_chart_skip=False, generation=3, now="t")
    ready = next(x for x in out if x["type"] == "Ready")
    assert current == "Error" and (ready["status"], ready["reason"]) == ("False", "InstallFailed")


def _ready(conditions: list) -> dict:  # type: ignore[type-arg]
    return next(x for x in conditions if x["type"] == "Ready")


def test_a_suspended_tenant_says_so_and_keeps_what_lies_underneath() -> None:
    current, out = summarize([c("ClusterReady/a", "True"), c("Paused", "True", "Paused")],
                             allow_chart_skip=False, generation=1, now="t")
    ready = _ready(out)
    assert current == "Suspended"
    assert (ready["status"], ready["reason"]) == ("True", "Suspended")
    assert ready["message"].startswith("suspended") and ready["message"].endswith("ready on a")
    current, out = summarize([c("Paused", "True", "Paused")], allow_chart_skip=False,
                             generation=1, now="t")
    assert (_ready(out)["status"], _ready(out)["reason"]) == ("False", "Suspended")
    assert "not installed on any cluster yet" in _ready(out)["message"]


def test_the_summary_message_is_one_short_line() -> None:
    long = dict(c("ClusterError/a", "True", "InstallFailed"),
                message="helm: " + "x" * 900 + "\nsecond line")
    _, out = summarize([long], allow_chart_skip=False, generation=1, now="t")
    message = _ready(out)["message"]
    assert len(message) == SUMMARY_MESSAGE_LIMIT and "\n" not in message
    assert message.startswith("a: helm: xxx") and message.endswith("...")
    two_lines = dict(long, message="first\nsecond")
    _, out = summarize([two_lines], allow_chart_skip=False, generation=1, now="t")
    assert _ready(out)["message"] == "a: first..."


@pytest.mark.parametrize(("phase_", "accepted", "expected"), [
    ("Suspended", None, "Suspended"),
    ("Suspended", frozenset({"Pending", "Ready", "Error"}), "Pending"),
    ("Ready", frozenset({"Pending", "Ready", "Error"}), "Ready"),
    ("Suspended", frozenset({"Pending", "Ready", "Error", "Suspended"}), "Suspended"),
])
def test_a_phase_an_older_crd_rejects_is_written_as_pending(
        phase_: str, accepted: frozenset[str] | None, expected: str) -> None:
    assert servable(phase_, accepted) == expected


def test_holds_is_a_true_condition_with_that_reason() -> None:
    tenant = {"status": {"conditions": [
        {"type": "ClusterError/c1", "status": "True", "reason": "SharedObjects"},
        {"type": "ClusterError/c2", "status": "False", "reason": "SharedObjects"}]}}
    assert holds(tenant, "ClusterError/c1", "SharedObjects")
    assert not holds(tenant, "ClusterError/c2", "SharedObjects")  # not True
    assert not holds(tenant, "ClusterError/c1", "RetriesExhausted")  # another reason
    assert not holds({}, "ClusterError/c1", "SharedObjects")
