"""SPEC H2: Helm 4's field conflicts read from its error text, and its log lines reduced."""

from __future__ import annotations

import pytest

from krypton.decisions.charts.conflicts import Conflict, describe, parse, reduce_log_lines

pytestmark = pytest.mark.unit

# as helm v4.2.4 printed it on the test bed (kubectl patch of a ConfigMap, then an upgrade)
SEEN = ('level=WARN msg="upgrade failed" name=rel error="conflict occurred while applying '
        'object t1/rel /v1, Kind=ConfigMap: Apply failed with 1 conflict: conflict with '
        '\\"kubectl-patch\\" using v1: .data.chartVersion"\n'
        'Error: UPGRADE FAILED: conflict occurred while applying object t1/rel /v1, '
        'Kind=ConfigMap: Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: '
        '.data.chartVersion\n')
# the API server's form for several fields and managers
MANY = ('Error: UPGRADE FAILED: conflict occurred while applying object t1/web apps/v1, '
        'Kind=Deployment: Apply failed with 3 conflicts: conflicts with "kubectl-scale" using '
        'apps/v1:\n- .spec.replicas\n- .spec.template.spec.containers[name="web"].image\n'
        'conflict with "hpa-controller" using autoscaling/v2: .spec.replicas\n')


def test_the_conflict_helm_printed_is_read() -> None:
    assert parse(SEEN) == [Conflict("ConfigMap t1/rel", "kubectl-patch", ".data.chartVersion")]


def test_several_fields_and_managers() -> None:
    assert parse(MANY) == [
        Conflict("Deployment t1/web", "kubectl-scale", ".spec.replicas"),
        Conflict("Deployment t1/web", "kubectl-scale",
                 '.spec.template.spec.containers[name="web"].image'),
        Conflict("Deployment t1/web", "hpa-controller", ".spec.replicas"),
    ]


def test_an_ordinary_failure_has_no_conflicts() -> None:
    assert parse("Error: UPGRADE FAILED: execution error at (x/templates/a.yaml:2:4): nope") == []


def test_describe_names_object_field_and_manager() -> None:
    found = parse(SEEN)
    assert describe(found) == "ConfigMap t1/rel .data.chartVersion (kubectl-patch)"
    assert describe(found * 10, limit=2).endswith("(and 8 more)")


def test_helm_4_log_lines_are_reduced_to_their_error() -> None:
    lines = [ln for ln in SEEN.splitlines() if ln]
    assert reduce_log_lines(lines) == [lines[1]]  # said again on the Error: line: dropped
    alone = ['level=ERROR msg="install failed" name=x error="the server said \\"no\\""']
    assert reduce_log_lines(alone) == ['the server said "no"']
    assert reduce_log_lines(['level=INFO msg="waiting" name=x']) == []


def _live(**managed: dict[str, object]) -> dict[str, object]:
    return {"kind": "Deployment", "metadata": {"name": "web", "namespace": "t1", "managedFields": [
        {"manager": m, "operation": "Update", "fieldsV1": f} for m, f in managed.items()]},
            "spec": {"replicas": 5, "template": {"spec": {"containers": [
                {"name": "web", "image": "web:hand", "ports": [{"containerPort": 80}]}]}}}}


def test_the_preview_names_what_other_managers_own_and_the_apply_changes() -> None:
    from krypton.decisions.charts.conflicts import owned_elsewhere

    live = _live(**{
        "helm": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
            'k:{"name":"web"}': {".": {}, "f:ports": {}}}}}}},
        "kubectl-scale": {"f:spec": {"f:replicas": {}}},
        "kubectl-set": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
            'k:{"name":"web"}': {"f:image": {}}}}}}}})
    desired = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
               "spec": {"replicas": 2, "template": {"spec": {"containers": [
                   {"name": "web", "image": "web:1.1", "ports": [{"containerPort": 80}]}]}}}}
    assert owned_elsewhere(desired, live) == [
        Conflict("Deployment t1/web", "kubectl-scale", ".spec.replicas"),
        Conflict("Deployment t1/web", "kubectl-set", '.spec.template.spec.containers[name="web"]'
                                                    ".image")]
    # the same values as the other managers set: shared ownership, no conflict
    desired["spec"]["replicas"] = 5  # type: ignore[index]
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = "web:hand"  # type: ignore[index]
    assert owned_elsewhere(desired, live) == []
    assert owned_elsewhere(desired, None) == []
