"""CEL health rules for a chart's custom resources (F8): compiled at start, judged in the
order inProgress, failed, current, every evaluation bounded."""

from __future__ import annotations

from typing import Any

import pytest

from krypton.app.config import read_health_rules
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import SettingsError
from krypton.decisions.readiness.celhealth import compile_rules
from krypton.decisions.readiness.health import WORKLOAD_KINDS, release_health, workload_refs

WIDGET = {"apiVersion": "w.test/v1", "kind": "Widget",
          "inProgress": "status.?phase.orValue('') == 'Pending'",
          "failed": "status.?phase.orValue('') == 'Failed'",
          "current": "status.?phase.orValue('') == 'Ready' && "
                     "status.?observedGeneration.orValue(0) == metadata.generation"}


def rules(*items: dict[str, Any]) -> Any:
    return compile_rules(list(items), "rules", WORKLOAD_KINDS)


def widget(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "w.test/v1", "kind": "Widget",
            "metadata": {"name": "w", "generation": 2}, "spec": {}, "status": status}


@pytest.mark.parametrize(("status", "said"), [
    ({"phase": "Ready", "observedGeneration": 2}, None),
    ({"phase": "Ready", "observedGeneration": 1}, "not current yet"),  # an older spec's
    ({"phase": "Failed"}, "failed (status.?phase.orValue('') == 'Failed')"),
    ({"phase": "Pending"}, "in progress"),
    ({}, "not current yet"),
])
def test_a_rule_judges_in_progress_then_failed_then_current(status: dict[str, Any],
                                                             said: str | None) -> None:
    rule = rules(WIDGET).find("w.test/v1", "Widget")
    assert rule is not None and rule.judge(widget(**status)) == said


def test_what_cannot_be_evaluated_is_not_ready_and_says_why() -> None:
    found = rules({"apiVersion": "w.test/v1", "kind": "Widget", "current": "status.phase == 'x'"},
                  {"apiVersion": "w.test/v1", "kind": "Gadget", "current": "status.phase"})
    missing = found.find("w.test/v1", "Widget").judge(widget())
    assert missing.startswith("health rule current not evaluated:") and "phase" in missing
    assert found.find("w.test/v1", "Gadget").judge(widget(phase="x")) == \
        "health rule current not evaluated: str, not a boolean"


def test_an_evaluation_is_bounded_by_the_iteration_budget() -> None:
    pairs = "!status.items.exists(a, status.items.exists(b, a + b < 0))"
    rule = rules({"apiVersion": "w.test/v1", "kind": "Widget", "current": pairs}).find(
        "w.test/v1", "Widget")
    said = rule.judge(widget(items=list(range(20000))))  # 4e8 steps without a budget
    assert said is not None and "not evaluated" in said and "budget" in said.lower()


@pytest.mark.parametrize(("item", "problem"), [
    ({"apiVersion": "w.test/v1", "kind": "Widget", "current": "status.phase =="}, "does not compile"),
    ({"apiVersion": "w.test/v1", "kind": "Widget"}, "current is required"),
    ({"kind": "Widget", "current": "true"}, "apiVersion and kind are required"),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "current": "true"}, "judges Deployment itself"),
    ({"apiVersion": "w.test/v1", "kind": "Widget", "current": "true", "healthy": "x"},
     "unknown field(s) healthy"),
    ({"apiVersion": "w.test/v1", "kind": "Widget", "current": 1}, "must be an expression"),
])
def test_a_bad_rule_is_a_settings_error_naming_it(item: dict[str, Any], problem: str) -> None:
    with pytest.raises(SettingsError, match="rule 2") as caught:
        rules(WIDGET | {"kind": "Other"}, item)
    assert problem in str(caught.value)


def test_a_second_rule_for_a_kind_and_a_document_that_is_not_a_list_are_refused() -> None:
    with pytest.raises(SettingsError, match="a second rule"):
        rules(WIDGET, WIDGET)
    with pytest.raises(SettingsError, match="a list"):
        compile_rules({"current": "true"}, "rules", WORKLOAD_KINDS)


def test_the_rules_file_is_read_and_compiled_and_its_problems_named(tmp_path: Any) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("- apiVersion: w.test/v1\n  kind: Widget\n  current: has(status.ok)\n")
    bad.write_text("- apiVersion: w.test/v1\n  kind: Widget\n  current: has(status.\n")
    assert read_health_rules(str(good)).kinds == {"Widget"}
    assert read_health_rules("").rules == {}
    with pytest.raises(SettingsError, match=f"invalid --health-check-expr {bad}: rule 1 "
                                            r"\(w.test/v1 Widget\): current does not compile"):
        read_health_rules(str(bad))
    with pytest.raises(SettingsError, match="cannot read it"):
        read_health_rules(str(tmp_path / "none.yaml"))


def test_a_release_is_judged_by_the_rule_of_each_kind_and_by_krypton_for_the_rest() -> None:
    found = rules(WIDGET)
    w = ObjectRef("w.test/v1", "Widget", "w", "ns")
    g = ObjectRef("w.test/v1", "Gadget", "g", "ns")  # no rule: ready once it exists
    d = ObjectRef("apps/v1", "Deployment", "d", "ns")
    assert workload_refs([w, g, d], found) == [w, d]
    health = release_health([(w, widget(phase="Failed")), (d, None)], found)
    assert health.not_ready == (
        "Widget w in namespace ns: failed (status.?phase.orValue('') == 'Failed')",
        "Deployment d in namespace ns: not found")
    assert release_health([(w, widget(phase="Failed"))]).ready  # without the rule
