"""The actions that start no helm process: each reports what its Tenant's pass commits
(:mod:`.status`): the finalizer or fingerprint annotation, and what it came to (a
:class:`~krypton.decisions.verdicts.Verdict`, told as conditions, Event and next step by
:func:`~krypton.decisions.verdicts.tell`). Also the two reports of a failure: a helm run
that failed (:func:`failed`, counted against its target in the Tenant's status, SPEC R18)
an action that raised (:func:`raised`) and one that failed on a defect of krypton's own
(:func:`defect`).
"""

from __future__ import annotations

import time
from typing import Any

from krypton.adapters import metrics
from krypton.decisions import conditions as cond
from krypton.decisions import verdicts
from krypton.decisions.conditions import Change
from krypton.decisions.errors import (
    FieldConflict,
    KryptonError,
    OwnershipConflict,
    PermanentError,
    ReleaseRecordChanged,
    ReleaseRecordUntrusted,
)
from krypton.decisions.model import (
    rfc3339,
)
from krypton.decisions.planner import attempt_target, stalled_message
from krypton.decisions.verdicts import Outcome, Verdict
from krypton.runtime.reconcile import look
from krypton.runtime.reconcile.model import Pass, Report
from krypton.runtime.reconcile.view import ClusterRuntime

CHART_SKIP_REQUEUE = 120.0
CHART_EVENTS = {"ChartNotLoaded": "ChartNotLoaded", "VersionNotFound": "ChartVersionNotFound",
                "VersionInvalid": "ChartVersionInvalid",
                "ChartVerificationFailed": "ChartVerificationFailed"}



async def nothing(rt: ClusterRuntime, _p: Pass) -> Report:
    return Report()



async def wait(rt: ClusterRuntime, p: Pass) -> Report:
    """Another helm operation holds the release: write nothing and look again when the
    lock would count as a leftover (a change of the release's records comes sooner, through
    the watch). A growing schedule would overshoot that moment by up to its own length."""
    p.log.info("release busy, waiting", detail=p.plan.message,
               recover_in=round(p.obs.release.unlocks_in, 1))
    if p.obs.release.unlocks_in > 0:
        return Report(outcome=Outcome(requeue_after=p.obs.release.unlocks_in + 1.0,
                                      reason=p.plan.reason))
    return Report(outcome=Outcome(retry=True, reason=p.plan.reason))



async def pause(rt: ClusterRuntime, p: Pass) -> Report:
    return Report([Change(cond.PAUSED, True, "Paused", p.plan.message)])



async def add_finalizer(rt: ClusterRuntime, p: Pass) -> Report:
    """The release-cleanup finalizer goes on before anything is installed (R14)."""
    return Report(finalizer=True)



async def not_targeted(rt: ClusterRuntime, p: Pass) -> Report:
    """Another cluster's Tenant; a Warning when that cluster is not discovered at all."""
    return Report.of(verdicts.tell(rt.name, Verdict.NOTED, p.plan.reason, p.plan.message,
                                   warning=p.plan.reason == "UnknownCluster"))



async def outside_window(rt: ClusterRuntime, p: Pass) -> Report:
    """The cluster's maintenance window is closed (F8): say until when, look again when it
    opens."""
    return Report.of(verdicts.tell(rt.name, Verdict.NOTED, p.plan.reason, p.plan.message,
                                   again=p.obs.window_wait + 1.0))



async def backoff(rt: ClusterRuntime, p: Pass) -> Report:
    """The target failed before and its next attempt is not due (R18): the status
    already says so; nothing is written, the key comes back when the attempt is due."""
    p.log.debug("helm run waits for its next attempt", detail=p.plan.message)
    return Report(outcome=Outcome(requeue_after=p.obs.retry_wait + 0.5, reason=p.plan.reason))



async def another_writer(rt: ClusterRuntime, p: Pass) -> Report:
    """Another krypton instance wrote the release and is at work (SPEC S6): no helm run and
    no write to the Tenant, whose status is that writer's (two writers of it would take
    turns without end). Said once per writer: an Event, a log line; counted every pass.
    The key comes back once the other is no longer taken to be at work (its Lease run out,
    its window past), or with the resync."""
    metrics.RELEASES_YIELDED.labels(rt.name).inc()
    kept, writer = rt.memory.of(p.key), p.obs.tenant.writer or p.obs.release.writer or ""
    # back when the other is no longer taken to be at work, else with the resync
    outcome = Outcome(reason=p.plan.reason, requeue_after=p.obs.writer_wait + 1.0
                      if p.obs.writer_wait > 0 else None)
    if kept.yielded_to == writer:
        return Report(outcome=outcome)
    kept.yielded_to = writer
    p.log.warning("release left to another writer", writer=writer, detail=p.plan.message)
    return Report(events=[("Warning", p.plan.reason, p.plan.message)], outcome=outcome)


async def stalled(rt: ClusterRuntime, p: Pass) -> Report:
    """More failures of the target than --max-retries: no helm run until it changes or a
    retry is asked for. Said once (the status is only written when it differs)."""
    return Report.of(verdicts.tell(rt.name, Verdict.FAILED, p.plan.reason, p.plan.message,
                                   permanent=True))



def raised(rt: ClusterRuntime, p: Pass, exc: KryptonError) -> Report:
    """An action that raised instead of reporting (an API error, a namespace that turned
    out not to be the Tenant's): the status says so, in the pass's one write, instead of
    keeping what the pass announced. A permanent error waits for a change of the input;
    a temporary one is retried with the work queue's backoff. No helm run failed, so the
    retry state is not touched."""
    reason, message = exc.reason, str(exc)
    p.log.warning("pass failed", reason=reason, error=message)
    metrics.RECONCILE_ERRORS.labels(rt.name, reason).inc()
    # the release not as applied (gone, changed by someone else), or not krypton's: not Ready
    untrue = p.plan.drift or isinstance(exc, ReleaseRecordUntrusted)
    return Report.of(verdicts.tell(rt.name, Verdict.FAILED if untrue else Verdict.BLOCKED,
                                   reason, message, permanent=isinstance(exc, PermanentError)))



def defect(rt: ClusterRuntime, p: Pass, exc: Exception) -> Report:
    """An action that failed on a defect of krypton's own (an exception no action
    reports): the commit says so all the same (reason Internal), as it would any error,
    before the pass raises it for the log and the queue's growing schedule."""
    return Report.of(verdicts.tell(rt.name, Verdict.BLOCKED, "Internal",
                                   f"krypton failed on a defect of its own: "
                                   f"{type(exc).__name__}: {exc}"))


def failed(rt: ClusterRuntime, p: Pass, verb: str, exc: KryptonError) -> Report:
    """A helm run of the pass's target failed: count it against the target in the
    Tenant's status, with when the next attempt is due (R18); past --max-retries the
    release is stalled (RetriesExhausted, a Warning Event)."""
    t, chart, settings = p.obs.tenant, p.chart, rt.settings
    target = attempt_target(chart.fingerprint, t)
    attempt = verdicts.failed_attempt(t.failures, t.failed_target == target,
                                      max_retries=settings.max_retries,
                                      backoff_max=settings.retry_backoff_max)
    failures, delay, now = attempt.failures, attempt.delay, time.time()
    reason = exc.reason if isinstance(exc, (OwnershipConflict, FieldConflict,
                                            ReleaseRecordChanged)) else f"{verb}Failed"
    p.log.error(f"helm {verb.lower()} failed", error=str(exc), failures=failures,
                retry_in=round(delay, 1))
    metrics.RECONCILE_ERRORS.labels(rt.name, reason).inc()
    told = verdicts.tell(rt.name, Verdict.FAILED, reason, str(exc), event=f"Helm{verb}Failed",
                         again=delay)
    if attempt.stalled:
        p.log.error("release stalled", failures=failures)
        told = verdicts.tell(rt.name, Verdict.FAILED, "RetriesExhausted",
                             stalled_message(failures, chart.version, str(exc), rt.name, t),
                             permanent=True)
    applied = {"failedFingerprint": chart.fingerprint, "failures": failures,
               "failedTarget": target, "lastFailureTime": rfc3339(now),
               "nextAttemptTime": rfc3339(now + delay)}
    rt.memory.of(p.key).retry = dict(applied)
    # a stalled release: the run's own failure is an Event too
    return Report.of(told, applied=applied, chart_version=chart.version,
                     events=[("Warning", f"Helm{verb}Failed", str(exc))] if attempt.stalled
                     else [])



async def hold(rt: ClusterRuntime, p: Pass) -> Report:
    """The rollout gate keeps this cluster on its version (F1): say why, start nothing."""
    return Report.of(verdicts.tell(rt.name, Verdict.NOTED, p.plan.reason, p.plan.message,
                                   event=""))



async def blocked(rt: ClusterRuntime, p: Pass) -> Report:
    """Input that cannot be acted on (a chart problem, a name, a namespace)."""
    reason, message = p.plan.reason, p.plan.message
    metrics.RECONCILE_ERRORS.labels(rt.name, reason).inc()
    if p.plan.permanent:
        p.log.warning("tenant blocked", reason=reason, detail=message)
    else:
        p.log.warning("chart not available", reason=reason, detail=message)
    skipped = reason in CHART_EVENTS and rt.settings.allow_chart_skip and not p.plan.permanent
    return Report.of(verdicts.tell(rt.name, Verdict.BLOCKED, reason, message,
                                   event=CHART_EVENTS.get(reason), permanent=p.plan.permanent,
                                   again=CHART_SKIP_REQUEUE if skipped else None))



async def skip(rt: ClusterRuntime, p: Pass) -> Report:
    """In sync: nothing to do but make sure the record says so (it also completes the
    record of a pass whose last status write was lost, and marks a workload that became
    ready after it was waited for, timed out or degraded)."""
    rt.publish(p.key, p.release, p.chart)
    event = "HelmSkip" if p.plan.reason == "NoChange" else p.plan.reason
    return Report(verdicts.in_sync(rt.name, conditions(p.obj), p.plan.reason, p.plan.message),
                  applied={"release": p.release, **p.chart.applied,
                           **p.chart.notice(recorded(rt, p)),
                           "fingerprint": p.chart.fingerprint,
                           "revision": p.obs.release.revision},
                  last_chart=p.chart.ref, event=("Normal", event, p.plan.message))



async def await_ready(rt: ClusterRuntime, p: Pass) -> Report:
    """Applied, its workload not ready yet, within --helm-timeout of the helm run: say
    what is not ready and look again soon (no helm process is held meanwhile)."""
    again = look.readiness_requeue(rt, p.key, p.obs.since_applied)
    return Report.of(verdicts.tell(rt.name, Verdict.WAITING, p.plan.reason, p.plan.message,
                                   event="", again=again))



async def unhealthy(rt: ClusterRuntime, p: Pass) -> Report:
    """The workload is not ready: past --helm-timeout after the helm run that applied it
    (ReadinessTimeout), or no longer ready (Degraded). An error of this cluster, named
    objects and all; looked at again with backoff, and Ready again once it is."""
    reason, message = p.plan.reason, p.plan.message
    metrics.RECONCILE_ERRORS.labels(rt.name, reason).inc()
    p.log.warning("workload not ready", reason=reason, detail=message)
    return Report.of(verdicts.tell(rt.name, Verdict.FAILED, reason, message))



async def annotate(rt: ClusterRuntime, p: Pass) -> Report:
    """The release is deployed as recorded; only the fingerprint annotation is missing or
    wrong (a failed write, or removed by hand). Write it; never run helm for it."""
    rt.publish(p.key, p.release, p.chart)
    report = Report(verdicts.in_sync(rt.name, conditions(p.obj), "NoChange", p.plan.message),
                    applied=p.chart.notice(recorded(rt, p)) or None,
                    fingerprint=p.chart.fingerprint, ran=("NoChange", p.plan.message))
    if p.plan.drift:
        p.log.info("drift repaired", detail=p.plan.message)
        report.events.append(("Normal", "DriftRepaired", f"{p.plan.message}: restored"))
    return report


def conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


def recorded(rt: ClusterRuntime, p: Pass) -> dict[str, Any]:
    """The Tenant's ``status.clusters`` record of this cluster, as the pass read it."""
    return dict(((p.obj.get("status") or {}).get("clusters") or {}).get(rt.name) or {})
