"""The only writer of a Tenant. A pass ends in one commit (:func:`commit`): the finalizer or
the fingerprint annotation its action asks for, then the status (one patch, retried on
conflicts, and only when it changed: SPEC R13), then its Events. Also the interim commit
that announces a long helm run and the removal of a cluster's traces when the cluster leaves
the fleet.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from krypton.adapters import metrics
from krypton.adapters.events import involved_tenant
from krypton.adapters.kube import now_rfc3339
from krypton.decisions import conditions as cond
from krypton.decisions import retry, verdicts
from krypton.decisions.conditions import Change
from krypton.decisions.errors import (
    Conflict,
    KryptonError,
    NotFound,
    TemporaryError,
)
from krypton.decisions.model import (
    FINALIZER,
    TenantKey,
    fingerprint_annotation,
)
from krypton.decisions.trust import redact
from krypton.decisions.verdicts import Outcome, Verdict
from krypton.runtime.reconcile.memory import KEPT
from krypton.runtime.reconcile.model import Pass, Report
from krypton.runtime.reconcile.view import ClusterRuntime

CONFLICT_RETRIES = 10  # status writes re-read and re-applied on 409 before backing off



async def commit(rt: ClusterRuntime, p: Pass, report: Report) -> Outcome:
    """The pass's one commit: the metadata `report` asks for, the status if it changed,
    the Events. A fingerprint annotation that cannot be written turns the status into
    what that means (the release is right, the record of it is not: the next pass only
    retries the annotation, never helm)."""
    changes, outcome, events = p.changes + report.changes, report.outcome, list(report.events)
    annotation = fingerprint_annotation(rt.name)
    try:
        if report.finalizer is not None:
            p.obj = await _write_finalizer(rt, p.obj, add=report.finalizer)
        elif report.fingerprint is not None and \
                (p.obj["metadata"].get("annotations") or {}).get(annotation) != report.fingerprint:
            p.obj = await set_fingerprint(rt, p.obj, report.fingerprint, p.log)
            events.append(("Normal", "FingerprintUpdated", f"{annotation}={report.fingerprint}"))
    except NotFound:
        return Outcome()  # the Tenant went
    except Conflict:
        return Outcome(retry=True, reason="Conflict")  # a newer Tenant: its event comes
    except KryptonError as exc:
        if report.fingerprint is None:
            raise
        done, message = report.ran
        metrics.RECONCILE_ERRORS.labels(rt.name, "FingerprintUpdateFailed").inc()
        told = verdicts.tell(rt.name, Verdict.UNRECORDED, "FingerprintUpdateFailed",
                             f"{message}; writing the fingerprint annotation failed: {exc}",
                             event="", ended=done)  # said by its Event, every time
        guard = [c for c in report.changes if c.type == cond.cluster_type(cond.GUARD, rt.name)]
        changes, outcome = p.changes + told.changes + guard, told.outcome  # the run's guard kept
        events.append(("Warning", "FingerprintUpdateFailed", f"{annotation}: {exc}"))
    if changes or report.applied is not None:
        p.obj, _ = await write_status(rt, p.obj, changes, p.log, event=report.event,
                                      applied=report.applied, last_chart=report.last_chart,
                                      chart_version=report.chart_version)
    for event in events:
        await said(rt, p.obj, *event)
    return outcome


async def said(rt: ClusterRuntime, obj: dict[str, Any], type_: str, reason: str,
               message: str) -> None:
    """The one way an Event of a Tenant leaves: written on its cluster, and the last few
    kept in its memory for the fleet page (SPEC O16)."""
    await rt.recorder.emit(involved_tenant(obj), type_, reason, message)
    meta = obj["metadata"]
    kept = rt.memory.peek(TenantKey(meta["namespace"], meta["name"]))
    if kept is not None:
        kept.said = (*kept.said, (now_rfc3339(), type_, reason, redact.scrub(message)[:1024]))[-KEPT:]


async def interim(rt: ClusterRuntime, p: Pass, report: Report) -> None:
    """A pass's interim commit, before a long helm run: its status and the Event that goes
    with it, best effort (the run goes on, and its own commit writes its outcome)."""
    try:
        p.obj, _ = await write_status(rt, p.obj, [*p.changes, *report.changes], p.log,
                                      event=report.event)
        p.changes = []
    except KryptonError as exc:
        p.log.info("helm run not announced", error=str(exc))


async def write_status(rt: ClusterRuntime, obj: dict[str, Any], changes: list[Change],
                       log: Any, *, event: tuple[str, str, str] | None = None,
                       applied: dict[str, Any] | None = None,
                       last_chart: str | None = None,
                       chart_version: str | None = None,
                       withdrawn: bool = False) -> tuple[dict[str, Any], bool]:
    """Patch the status if it changed (retrying on conflicts), then emit `event` if so;
    `withdrawn`: the cluster's record in ``status.clusters`` removed. Returns the Tenant as
    the server now has it and whether it was written."""
    key = TenantKey(obj["metadata"]["namespace"], obj["metadata"]["name"])
    settings = rt.settings
    changes = [dataclasses.replace(c, message=redact.scrub(c.message)) for c in changes]
    for attempt in range(CONFLICT_RETRIES):
        status = dict(obj.get("status") or {})
        generation = int(obj["metadata"].get("generation") or 1)
        now = now_rfc3339()
        conditions = cond.apply(status.get("conditions") or [], changes,
                                generation=generation, now=now)
        phase, conditions = cond.summarize(conditions, allow_chart_skip=settings.allow_chart_skip,
                                           generation=generation, now=now)
        phase = cond.servable(phase, rt.state.phases)
        new = dict(status, phase=phase, conditions=conditions, observedGeneration=generation)
        clusters_sent = None
        if applied is not None or withdrawn:
            new["clusters"], clusters_sent = _clusters(rt.name, status.get("clusters") or {},
                                                       applied)
        if last_chart is not None:
            new["lastAppliedChart"] = last_chart
            new["chartVersion"] = last_chart.rsplit("|", 1)[-1]
        elif chart_version is not None:
            new["chartVersion"] = chart_version
        if _same_status(status, new) or stored_as_before(rt, key, status, new):
            return obj, False
        patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                 "status": new if clusters_sent is None else dict(new, clusters=clusters_sent)}
        try:
            metrics.API_WRITES.labels(rt.name, "status").inc()
            updated = rt.wrote(await rt.kube.patch_tenant_status(key, patch))
            sent, stored = _comparable(new), _comparable(updated.get("status") or {})
            # kept for every Tenant: one copy where the server stored what was sent
            rt.memory.of(key).written = (sent, sent if stored == sent else stored)
        except Conflict:
            fresh = await rt.kube.get_tenant(key)
            if fresh is None:
                return obj, False
            obj = fresh
            await asyncio.sleep(retry.STATUS_CONFLICT.delay(attempt + 1))
            continue
        if status.get("phase") != phase:
            log.info("phase set", phase=phase)
            await said(rt, updated, "Normal", "PhaseSet",
                       f"phase {status.get('phase') or 'None'} -> {phase}")
            if phase == "Ready":
                log.info("tenant phase is Ready", cluster=rt.name)
        if event is not None:
            await said(rt, updated, *event)
        return updated, True
    raise Conflict(f"status of {key} kept conflicting")




def _clusters(cluster: str, clusters: dict[str, Any], applied: dict[str, Any] | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``status.clusters`` with `cluster`'s record updated by `applied` (a field given as
    None removed), or the record removed (`applied` None); and the same as the merge patch
    sends it, where what goes is null."""
    if applied is None:
        kept = {c: v for c, v in clusters.items() if c != cluster}
        return kept, {**kept, cluster: None}
    record = dict(clusters.get(cluster) or {}, **applied)
    return (dict(clusters, **{cluster: {k: v for k, v in record.items() if v is not None}}),
            dict(clusters, **{cluster: record}))


def stored_as_before(rt: ClusterRuntime, key: TenantKey, live: dict[str, Any],
                     new: dict[str, Any]) -> bool:
    """The same status was written before and the server stored what it holds now: the
    difference is what the served CRD prunes (SPEC R2), and writing again would change
    nothing but the resourceVersion, on every pass."""
    record = rt.memory.peek(key)
    return record is not None and record.written == (_comparable(new), _comparable(live))



async def patch_meta(rt: ClusterRuntime, key: TenantKey, patch: dict[str, Any]) -> dict[str, Any]:
    metrics.API_WRITES.labels(rt.name, "tenant").inc()
    return rt.wrote(await rt.kube.patch_tenant(key, patch))



async def _write_finalizer(rt: ClusterRuntime, obj: dict[str, Any], *, add: bool
                           ) -> dict[str, Any]:
    meta = obj["metadata"]
    finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
    return await patch_meta(rt, TenantKey(meta["namespace"], meta["name"]), {"metadata": {
        "finalizers": finalizers + [FINALIZER] if add else finalizers,
        "resourceVersion": meta["resourceVersion"]}})



async def set_fingerprint(rt: ClusterRuntime, obj: dict[str, Any], fp: str, log: Any
                          ) -> dict[str, Any]:
    """The cluster's fingerprint annotation written (retried: FINGERPRINT_WRITE); the
    commit says it (FingerprintUpdated, or FingerprintUpdateFailed when this raises)."""
    meta = obj["metadata"]
    try:
        return await _write_fingerprint(rt, TenantKey(meta["namespace"], meta["name"]), {
            "metadata": {"annotations": {fingerprint_annotation(rt.name): fp}}})
    except KryptonError as exc:
        log.error("fingerprint update failed", error=str(exc))
        raise


async def _write_fingerprint(rt: ClusterRuntime, key: TenantKey, patch: dict[str, Any]
                             ) -> dict[str, Any]:
    """The annotation PATCH, retried on FINGERPRINT_WRITE after a temporary failure."""
    policy = retry.FINGERPRINT_WRITE
    async for attempt in AsyncRetrying(retry=retry_if_exception_type(TemporaryError),
                                       stop=stop_after_attempt(policy.attempts),
                                       wait=policy.wait(), reraise=True):
        with attempt:
            return await patch_meta(rt, key, patch)
    raise AssertionError("unreachable: the last attempt's error is raised")


async def withdraw(rt: ClusterRuntime, obj: dict[str, Any]) -> None:
    """Remove this cluster's traces from a Tenant when the cluster leaves the fleet.

    Its conditions and its ``status.clusters`` record go in one status write, as a commit
    writes (the verdict :func:`~krypton.decisions.verdicts.withdrawn`, the phase worked out
    anew from what remains, conflicts retried); then its fingerprint annotation and the
    release-cleanup finalizer (no worker is left to honour the finalizer). The release
    itself is kept.
    """
    meta = obj["metadata"]
    key = TenantKey(meta["namespace"], meta["name"])
    obj, _ = await write_status(rt, obj, verdicts.withdrawn(rt.name),
                                rt.log.bind(tenant=str(key)), withdrawn=True)
    annotation = fingerprint_annotation(rt.name)
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if annotation in (obj["metadata"].get("annotations") or {}) or FINALIZER in finalizers:
        await patch_meta(rt, key, {"metadata": {
            "annotations": {annotation: None},
            "finalizers": [f for f in finalizers if f != FINALIZER],
            "resourceVersion": obj["metadata"]["resourceVersion"]}})
    rt.unpublish(key)


# -- metrics ---------------------------------------------------------------------------


def _comparable(status: dict[str, Any]) -> dict[str, Any]:
    """A status without its timestamps."""
    out = {k: v for k, v in status.items() if k not in ("conditions", "clusters")}
    out["conditions"] = cond.without_times(status.get("conditions") or [])
    out["clusters"] = {k: {f: x for f, x in (v or {}).items() if f != "lastAppliedTime"}
                       for k, v in (status.get("clusters") or {}).items()}
    return out


def _same_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return _comparable(old) == _comparable(new)
