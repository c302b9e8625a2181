"""Readiness rules (krypton.decisions.readiness.health) and the planner's decisions about an in-sync
release's workload (SPEC F6), row by row. The expected verdicts are those of helm's wait /
kstatus for the same object states."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.model import (
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseObservation,
    ReleaseStatus,
    TenantKey,
    TenantView,
)
from krypton.decisions.planner import Action, plan
from krypton.decisions.readiness.health import Health, object_health, release_health, workload_refs

pytestmark = pytest.mark.unit


def deployment(replicas: int = 2, *, generation: int = 1, observed: int = 1, updated: int = 2,
               total: int = 2, available: int = 2, deadline: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Progressing", "status": "False",
                   "reason": "ProgressDeadlineExceeded"}] if deadline else []
    return {"kind": "Deployment", "metadata": {"generation": generation},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "updatedReplicas": updated,
                       "replicas": total, "availableReplicas": available,
                       "conditions": conditions}}


def statefulset(*, ready: int = 3, updated: int = 3, current: str = "r2", update: str = "r2",
                partition: int = 0) -> dict[str, Any]:
    return {"kind": "StatefulSet", "metadata": {"generation": 2},
            "spec": {"replicas": 3, "updateStrategy": {
                "type": "RollingUpdate", "rollingUpdate": {"partition": partition}}},
            "status": {"observedGeneration": 2, "readyReplicas": ready, "updatedReplicas": updated,
                       "currentRevision": current, "updateRevision": update}}


def daemonset(*, desired: int = 4, updated: int = 4, available: int = 4) -> dict[str, Any]:
    return {"kind": "DaemonSet", "metadata": {"generation": 1},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": desired,
                       "updatedNumberScheduled": updated, "numberAvailable": available}}


def job(condition: str | None) -> dict[str, Any]:
    conds = [{"type": condition, "status": "True", "reason": "BackoffLimitExceeded"}] \
        if condition else []
    return {"kind": "Job", "metadata": {}, "status": {"conditions": conds}}


def pod(phase: str, ready: bool = False) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {}, "status": {
        "phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}}


HEALTH = [
    ("gone", None, "not found"),
    ("deployment ready", deployment(), None),
    ("deployment one replica by default", {"kind": "Deployment", "metadata": {}, "spec": {},
                                           "status": {"updatedReplicas": 1, "replicas": 1,
                                                      "availableReplicas": 1}}, None),
    ("deployment spec not seen", deployment(generation=2, observed=1),
     "new spec not yet seen by its controller"),
    ("deployment rolling", deployment(updated=1, total=3, available=2), "1 of 2 replicas updated"),
    ("deployment old replicas", deployment(total=3), "1 old replicas pending termination"),
    ("deployment unavailable", deployment(available=1), "1 of 2 replicas available"),
    ("deployment past its deadline", deployment(available=0, deadline=True),
     "progress deadline exceeded"),
    ("statefulset ready", statefulset(), None),
    ("statefulset not ready", statefulset(ready=2), "2 of 3 replicas ready"),
    ("statefulset updating", statefulset(updated=1), "1 of 3 replicas updated"),
    ("statefulset revision", statefulset(current="r1"), "rolling update in progress"),
    ("statefulset partitioned rollout is as asked", statefulset(current="r1", partition=2), None),
    ("daemonset ready", daemonset(), None),
    ("daemonset updating", daemonset(updated=3), "3 of 4 pods updated"),
    ("daemonset unavailable", daemonset(available=1), "1 of 4 pods available"),
    ("job complete", job("Complete"), None),
    ("job running", job(None), "not complete"),
    ("job failed", job("Failed"), "failed (BackoffLimitExceeded)"),
    ("pod ready", pod("Running", True), None),
    ("pod succeeded", pod("Succeeded"), None),
    ("pod pending", pod("Pending"), "not ready (phase Pending)"),
    ("pod failed", pod("Failed"), "failed"),
    ("pvc bound", {"kind": "PersistentVolumeClaim", "status": {"phase": "Bound"}}, None),
    ("pvc pending", {"kind": "PersistentVolumeClaim", "status": {"phase": "Pending"}},
     "not bound (phase Pending)"),
    ("service", {"kind": "Service", "spec": {"type": "ClusterIP"}}, None),
    ("load balancer without address", {"kind": "Service", "spec": {"type": "LoadBalancer"}},
     "no load balancer address yet"),
    ("load balancer with address", {"kind": "Service", "spec": {"type": "LoadBalancer"},
                                    "status": {"loadBalancer": {"ingress": [{"ip": "1.2.3.4"}]}}},
     None),
    ("configmap", {"kind": "ConfigMap", "data": {}}, None),
    ("garbage status", {"kind": "Deployment", "spec": {"replicas": "two"},
                        "status": {"availableReplicas": True}}, "0 of 1 replicas updated"),
]


@pytest.mark.parametrize(("obj", "why"), [c[1:] for c in HEALTH], ids=[c[0] for c in HEALTH])
def test_object_health(obj: dict[str, Any] | None, why: str | None) -> None:
    assert object_health(obj) == why


def test_release_health_names_each_object_that_is_not_ready() -> None:
    web = ObjectRef("apps/v1", "Deployment", "web", "acme")
    db = ObjectRef("apps/v1", "StatefulSet", "db", "acme")
    found = release_health([(web, deployment(available=0)), (db, statefulset())])
    assert found == Health(("Deployment web in namespace acme: 0 of 2 replicas available",))
    assert not found.ready
    many = Health(tuple(f"Pod p{i}: failed" for i in range(7)))
    assert many.summary().endswith("Pod p4: failed (and 2 more)")


def test_only_kinds_with_rules_are_read() -> None:
    refs = [ObjectRef("v1", k, "x", None) for k in ("ConfigMap", "Service", "Deployment", "Secret")]
    assert [r.kind for r in workload_refs(refs)] == ["Service", "Deployment"]


# -- the planner over an in-sync release -------------------------------------------------

FP = "f" * 64
CHART = ChartTarget("https://r", "sample", "0.2.0", {}, FP, "/tmp/chart")
SYNCED = TenantView(TenantKey("ns", "acme"), has_finalizer=True, applied_fingerprint=FP,
                    applied_revision=1)
NOT_READY = Health(("Deployment web in namespace acme: 0 of 2 replicas available",))


def in_sync(readiness: tuple[bool, str] | None, health: Health | None,
            since: float | None = 10.0) -> Observation:
    return Observation("c1", replace(SYNCED, readiness=readiness), CHART,
                       ReleaseObservation(ReleaseStatus.DEPLOYED, 1), NamespaceState.OWNED,
                       shared=(), health=health, since_applied=since, readiness_timeout=180.0)


DECISIONS = [
    # (id, observation, action, reason)
    ("not looked at", in_sync((True, "Installed"), None), Action.SKIP, "NoChange"),
    ("ready and was ready", in_sync((True, "Installed"), Health()), Action.SKIP, "NoChange"),
    ("ready after waiting", in_sync((False, "WaitingForReadiness"), Health()), Action.SKIP,
     "WorkloadReady"),
    ("ready after degrading", in_sync((False, "Degraded"), Health()), Action.SKIP,
     "WorkloadReady"),
    ("ready after timing out", in_sync((False, "ReadinessTimeout"), Health()), Action.SKIP,
     "WorkloadReady"),
    ("first look at a taken-over release", in_sync(None, Health()), Action.SKIP, "NoChange"),
    ("was ready, is not", in_sync((True, "Installed"), NOT_READY), Action.UNHEALTHY, "Degraded"),
    ("still degraded, however long ago it was applied",
     in_sync((False, "Degraded"), NOT_READY, since=1e6), Action.UNHEALTHY, "Degraded"),
    ("fresh and not ready", in_sync((False, "WaitingForReadiness"), NOT_READY),
     Action.AWAIT_READY, "WaitingForReadiness"),
    ("not ready at the timeout", in_sync((False, "WaitingForReadiness"), NOT_READY, since=180.0),
     Action.UNHEALTHY, "ReadinessTimeout"),
    ("timed out stays timed out", in_sync((False, "ReadinessTimeout"), NOT_READY, since=1.0),
     Action.UNHEALTHY, "ReadinessTimeout"),
    # A missing time never counts as elapsed
    ("no record of when it was applied", in_sync(None, NOT_READY, since=None),
     Action.AWAIT_READY, "WaitingForReadiness"),
]


@pytest.mark.parametrize(("o", "action", "reason"), [c[1:] for c in DECISIONS],
                         ids=[c[0] for c in DECISIONS])
def test_in_sync_release_by_its_workload(o: Observation, action: Action, reason: str) -> None:
    p = plan(o)
    assert (p.action, p.reason) == (action, reason)
    if action is not Action.SKIP:
        assert "Deployment web in namespace acme: 0 of 2 replicas available" in p.message


def test_missing_objects_are_repaired_before_health_is_judged() -> None:
    o = replace(in_sync((True, "Installed"), NOT_READY), missing=("Deployment web",))
    assert plan(o).action is Action.UPGRADE
