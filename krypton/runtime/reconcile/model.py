"""The values one reconcile pass works with: what it observed and decided (:class:`Pass`),
what an action reports (:class:`Report`), and the Tenant read model (:func:`tenant_view`). No I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from krypton.decisions import conditions as cond
from krypton.decisions import crd
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.conditions import Change
from krypton.decisions.errors import PermanentError
from krypton.decisions.model import (
    ADOPT_ANNOTATION,
    ADOPTED_ANNOTATION,
    FINALIZER,
    OWNER_ANNOTATION,
    PAUSED_ANNOTATION,
    RELEASE_CLUSTER_LABEL,
    RELEASE_OWNER_LABEL,
    RELEASE_REPAIR_LABEL,
    RELEASE_WRITER_LABEL,
    RETRY_ANNOTATION,
    WRITER_ANNOTATION,
    ChartTarget,
    NamespaceState,
    Observation,
    TenantKey,
    TenantView,
    epoch_seconds,
    fingerprint_annotation,
)
from krypton.decisions.planner import Plan
from krypton.decisions.trust import records, writers
from krypton.decisions.verdicts import Outcome, Told

Workload = list[tuple[ObjectRef, dict[str, Any] | None]]  # objects as read (None: not found)


def tenant_view(obj: dict[str, Any], cluster: str) -> TenantView:
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    applied = (status.get("clusters") or {}).get(cluster) or {}
    ref = (obj.get("spec") or {}).get("clusterRef") or {}
    revision = applied.get("revision")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    progress = conditions.get(cond.cluster_type(cond.PROGRESS, cluster))
    if progress is not None and progress.get("status") != "True":
        progress = None
    ready = conditions.get(cond.cluster_type(cond.READY, cluster))
    error = conditions.get(cond.cluster_type(cond.ERROR, cluster))
    if error is not None and error.get("status") != "True":
        error = None
    failures = applied.get("failures")
    return TenantView(
        key=TenantKey(meta["namespace"], meta["name"]),
        generation=int(meta.get("generation") or 1),
        uid=meta.get("uid", ""),
        paused=str(annotations.get(PAUSED_ANNOTATION, "")).lower() == "true",
        deleting=bool(meta.get("deletionTimestamp")),
        has_finalizer=FINALIZER in (meta.get("finalizers") or []),
        target_cluster=ref.get("secretName") or None,
        workspace=str((obj.get("spec") or {}).get("workspace") or "") or None,
        applied_fingerprint=annotations.get(fingerprint_annotation(cluster)),
        applied_revision=int(revision) if isinstance(revision, int) else None,
        recorded_fingerprint=applied.get("fingerprint"),
        recorded_version=applied.get("chartVersion") or None,
        failed_fingerprint=applied.get("failedFingerprint") or None,
        reverted_fingerprint=applied.get("revertedFingerprint") or None,
        progress=(str(progress.get("reason")), str(progress.get("message")))
        if progress else None,
        readiness=(ready.get("status") == "True", str(ready.get("reason")))
        if ready else None,
        error=(str(error.get("reason")), str(error.get("message"))) if error else None,
        annotations=dict(annotations),
        failures=failures if isinstance(failures, int) else 0,
        failed_target=str(applied.get("failedTarget") or ""),
        retry_token=str(annotations.get(RETRY_ANNOTATION, "")),
        record_seals=_seals(crd.seals_of(applied)),
        adopted_seals=records.asked(annotations.get(ADOPT_ANNOTATION)),
        writer=str(annotations.get(WRITER_ANNOTATION) or "")[:writers.LABEL_MAX],
    )


def _seals(value: Any) -> tuple[str, ...]:
    """The record seals a status keeps (anything else in the field is not one)."""
    if not isinstance(value, list):
        return ()
    return tuple(s for s in value[:records.SEALS_KEPT] if isinstance(s, str))


def _until(text: Any) -> float:
    """Seconds until the RFC 3339 time `text` (0 when it is past or not a time)."""
    when = epoch_seconds(text)
    return 0.0 if when is None else max(0.0, when - time.time())


def _since(text: Any) -> float | None:
    """Seconds since the RFC 3339 time `text` (None when it is not one)."""
    when = epoch_seconds(text)
    return None if when is None else max(0.0, time.time() - when)


def namespace_state(ns: dict[str, Any] | None, key: TenantKey) -> tuple[NamespaceState, str | None]:
    if ns is None:
        return NamespaceState.ABSENT, None
    meta = ns.get("metadata") or {}
    owner = (meta.get("annotations") or {}).get(OWNER_ANNOTATION)
    if owner is None:
        return NamespaceState.UNMANAGED, None
    if owner == str(key):
        return NamespaceState.OWNED, owner
    return NamespaceState.CONFLICT, owner


def created_by_krypton(ns: dict[str, Any] | None, key: TenantKey) -> bool:
    """The namespace carries this Tenant's owner annotation and was not adopted."""
    annotations = ((ns or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(OWNER_ANNOTATION) == str(key) and ADOPTED_ANNOTATION not in annotations


class NamespaceNotOwned(PermanentError):
    reason = "NamespaceConflict"


@dataclass
class Pass:
    """One reconcile pass of one Tenant: what was observed and decided, and the Tenant object
    as last read or written (its resourceVersion is the precondition of the next write)."""

    obj: dict[str, Any]
    obs: Observation
    plan: Plan
    release: str
    namespace: str  # where the release goes
    log: Any
    changes: list[Change] = field(default_factory=list)  # made by the pass itself (Resumed)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # its own (a record adopted)

    @property
    def key(self) -> TenantKey:
        return self.obs.tenant.key

    @property
    def chart(self) -> ChartTarget:
        assert isinstance(self.obs.chart, ChartTarget)
        return self.obs.chart


@dataclass
class Report:
    """What a pass reports, for its one commit (:func:`.status.commit`): the finalizer or
    fingerprint annotation to write, the condition changes and the ``status.clusters``
    record of its status patch, the Event that goes with that patch (only when the status
    changed), Events that go out whether or not it changed, and how the work queue treats
    the key next."""

    changes: list[Change] = field(default_factory=list)
    applied: dict[str, Any] | None = None
    last_chart: str | None = None  # repo|name|version applied
    chart_version: str | None = None  # the version a failed helm run tried
    event: tuple[str, str, str] | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    outcome: Outcome = Outcome()
    # written to the Tenant's metadata before its status
    fingerprint: str | None = None  # the fingerprint annotation of this cluster
    ran: tuple[str, str] = ("", "")  # the (reason, message) of the run `fingerprint` records
    finalizer: bool | None = None  # the release-cleanup finalizer added (True) or removed

    @classmethod
    def of(cls, told: Told, **more: Any) -> Report:
        """The report of what `told` says, with `more` of the pass's record."""
        return cls(list(told.changes), event=told.event, outcome=told.outcome, **more)


def has_condition(obj: dict[str, Any], type_: str) -> bool:
    return any(c.get("type") == type_ for c in (obj.get("status") or {}).get("conditions") or [])


def condition_true(obj: dict[str, Any], type_: str) -> bool:
    return any(c.get("type") == type_ and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def release_labels(cluster: str, p: Pass, writer: str = "") -> dict[str, str]:
    """The labels a helm run puts on the release record: whose it is, for which cluster,
    which krypton instance wrote it and whether it repairs drift (SPEC S6; helm keeps the
    labels of the record before, so each is set every time)."""
    labels = {RELEASE_CLUSTER_LABEL: cluster, RELEASE_REPAIR_LABEL:
              writers.repair_token(time.time()) if p.plan.drift else writers.NOT_A_REPAIR}
    if writer:
        labels[RELEASE_WRITER_LABEL] = writer
    if p.obs.tenant.uid:
        labels[RELEASE_OWNER_LABEL] = p.obs.tenant.uid
    return labels
