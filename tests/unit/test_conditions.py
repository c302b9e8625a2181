"""R10/R11: per-cluster conditions, transition times, phase and the Ready summary."""

from __future__ import annotations

import pytest

from krypton.decisions.conditions import Change, apply, phase, summarize


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
