"""Is a release's workload ready? Pure: the readiness rules of helm's wait and kstatus (SPEC F6).

`object_health` judges one live object of a release's manifest; `release_health` judges them
all. The rules follow what ``helm --wait`` (Helm 4 uses kstatus) checks, so that a release
krypton calls Ready is one helm would have called ready:

- any object: the controller has seen its latest spec (``status.observedGeneration`` is not
  behind ``metadata.generation``);
- Deployment: every replica updated and available, no old replica left, and not past its
  progress deadline (``ProgressDeadlineExceeded`` fails it);
- StatefulSet: every replica ready and, for a rolling update without a partition, on the
  update revision;
- DaemonSet: every scheduled pod updated and available;
- Job: complete (a ``Failed`` condition fails it); Pod: ready or succeeded;
- PersistentVolumeClaim: bound; Service of type LoadBalancer: an ingress address assigned;
- a kind with a CEL rule of the operator's admin (``--health-check-expr``,
  :mod:`krypton.decisions.readiness.celhealth`): as the rule says;
- every other kind is ready once it exists.

An object that is gone is not ready ("not found"): with drift repair on, the planner restores
it before health is judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.readiness.celhealth import HealthRules

# Kinds with readiness rules; only these are read for health (others: ready when present).
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "Pod",
                            "PersistentVolumeClaim", "Service"})
SHOWN = 5  # not-ready objects named in a message
# ClusterReady/<c> reasons of a release whose workload failed after helm applied it: errors
# of that cluster, and failed releases for a progressive rollout's wave
UNHEALTHY = frozenset({"ReadinessTimeout", "Degraded"})
WAITING = "WaitingForReadiness"
NO_RULES = HealthRules()


@dataclass(frozen=True)
class Health:
    """The release's workload: the objects that are not ready, each with why."""

    not_ready: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.not_ready

    def summary(self) -> str:
        more = f" (and {len(self.not_ready) - SHOWN} more)" if len(self.not_ready) > SHOWN else ""
        return "; ".join(self.not_ready[:SHOWN]) + more


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def _deployment(spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    progressing = _conditions(status).get("Progressing") or {}
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        return "progress deadline exceeded"
    want = _int(spec.get("replicas"), 1)
    updated, available = _int(status.get("updatedReplicas")), _int(status.get("availableReplicas"))
    if updated < want:
        return f"{updated} of {want} replicas updated"
    if _int(status.get("replicas")) > updated:
        return f"{_int(status.get('replicas')) - updated} old replicas pending termination"
    if available < want:
        return f"{available} of {want} replicas available"
    return None


def _statefulset(spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    want = _int(spec.get("replicas"), 1)
    ready = _int(status.get("readyReplicas"))
    if ready < want:
        return f"{ready} of {want} replicas ready"
    strategy = spec.get("updateStrategy") or {}
    partition = _int((strategy.get("rollingUpdate") or {}).get("partition"))
    if strategy.get("type", "RollingUpdate") == "RollingUpdate" and partition == 0:
        if _int(status.get("updatedReplicas")) < want:
            return f"{_int(status.get('updatedReplicas'))} of {want} replicas updated"
        if status.get("updateRevision") and \
                status.get("currentRevision") != status.get("updateRevision"):
            return "rolling update in progress"
    return None


def _daemonset(status: dict[str, Any]) -> str | None:
    want = _int(status.get("desiredNumberScheduled"))
    updated = _int(status.get("updatedNumberScheduled"))
    available = _int(status.get("numberAvailable"))
    if updated < want:
        return f"{updated} of {want} pods updated"
    if available < want:
        return f"{available} of {want} pods available"
    return None


def _job(status: dict[str, Any]) -> str | None:
    conditions = _conditions(status)
    if (conditions.get("Failed") or {}).get("status") == "True":
        failed = conditions["Failed"]
        return f"failed ({failed.get('reason') or 'Failed'})"
    if (conditions.get("Complete") or {}).get("status") == "True":
        return None
    return "not complete"


def _pod(status: dict[str, Any]) -> str | None:
    phase = status.get("phase")
    if phase == "Succeeded":
        return None
    if phase == "Failed":
        return "failed"
    if (_conditions(status).get("Ready") or {}).get("status") == "True":
        return None
    return f"not ready (phase {phase or 'unknown'})"


def object_health(obj: dict[str, Any] | None) -> str | None:
    """Why the live object `obj` is not ready, or None when it is. None for `obj` means gone."""
    if obj is None:
        return "not found"
    meta = obj.get("metadata") or {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    kind = obj.get("kind")
    generation = _int(meta.get("generation"))
    observed = status.get("observedGeneration")
    if kind in ("Deployment", "StatefulSet", "DaemonSet") and generation and \
            _int(observed) < generation:
        return "new spec not yet seen by its controller"
    if kind == "Deployment":
        return _deployment(spec, status)
    if kind == "StatefulSet":
        return _statefulset(spec, status)
    if kind == "DaemonSet":
        return _daemonset(status)
    if kind == "Job":
        return _job(status)
    if kind == "Pod":
        return _pod(status)
    if kind == "PersistentVolumeClaim":
        return None if status.get("phase") == "Bound" else \
            f"not bound (phase {status.get('phase') or 'unknown'})"
    if kind == "Service" and spec.get("type") == "LoadBalancer":
        return None if (status.get("loadBalancer") or {}).get("ingress") else \
            "no load balancer address yet"
    return None


def release_health(objects: Iterable[tuple[ObjectRef, dict[str, Any] | None]],
                   rules: HealthRules = NO_RULES) -> Health:
    """The health of a release from its workload objects as read live (None: gone): by the
    CEL rule of their kind where there is one (`rules`), else by krypton's."""
    return Health(tuple(f"{ref}: {why}" for ref, obj in objects
                        if (why := _judged(ref, obj, rules)) is not None))


def _judged(ref: ObjectRef, obj: dict[str, Any] | None, rules: HealthRules) -> str | None:
    rule = rules.find(ref.api_version, ref.kind)
    if rule is None or obj is None:
        return object_health(obj)
    return rule.judge(obj)


def workload_refs(refs: Iterable[ObjectRef], rules: HealthRules = NO_RULES) -> list[ObjectRef]:
    """The objects of a manifest whose readiness has rules (the ones worth reading)."""
    return [r for r in refs if r.kind in WORKLOAD_KINDS or rules.find(r.api_version, r.kind)]


def workload_kinds(rules: HealthRules = NO_RULES) -> frozenset[str]:
    """The kinds whose objects are read for health: krypton's and those of CEL rules."""
    return WORKLOAD_KINDS | rules.kinds
