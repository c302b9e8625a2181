"""Roll back a release that failed on a halted rollout's target (F1 with
--rollout-auto-revert). Precondition: the rollout asks for it and this release failed on the
target after a revision krypton recorded.
"""

from __future__ import annotations

from krypton.adapters import metrics
from krypton.adapters.kube import now_rfc3339
from krypton.decisions import conditions as cond
from krypton.decisions.conditions import Change
from krypton.decisions.errors import (
    HelmFailed,
    ReleaseLocked,
    TemporaryError,
)
from krypton.decisions.fingerprint import fingerprint
from krypton.decisions.model import (
    ReleaseStatus,
)
from krypton.runtime.reconcile import status
from krypton.runtime.reconcile.model import Outcome, Pass, Report, release_labels
from krypton.runtime.reconcile.view import ClusterRuntime, fenced


async def revert(rt: ClusterRuntime, p: Pass) -> Report:
    """Roll a release that failed on a halted rollout's target back to the last revision
    krypton applied (--rollout-auto-revert). Runs from the work queue like any helm
    action, so never beside a retry of the same release. When helm's rollback trips over
    what the failed upgrade left, the last good chart version is applied again."""
    t, chart, namespace = p.obs.tenant, p.chart, p.namespace
    if p.obs.rollout.revert_healthy_to:
        return await _revert_healthy(rt, p, p.obs.rollout.revert_healthy_to)
    good = t.applied_revision or 0  # set: the planner reverts only to a recorded revision
    fp = t.recorded_fingerprint or t.applied_fingerprint or ""
    try:
        async with rt.slots.slot(rt.name):
            fenced(rt)
            try:
                revision = await rt.helm.rollback(p.release, namespace, good)
                how = f"rolled back to revision {good}"
            except HelmFailed as exc:
                if not t.recorded_version:
                    raise
                p.log.warning("helm rollback failed, re-applying the last good chart",
                              error=str(exc))
                old = await rt.chart.fetch(t.recorded_version)
                fenced(rt)
                result = await rt.helm.install_or_upgrade(
                    p.release, old.path, namespace, chart.values, operation="revert",
                    skip_crds=True, labels=release_labels(rt.name, p))
                revision = int(result.get("version") or 0)
                fp = fingerprint(old.repo, old.name, old.version, chart.values)
                how = f"chart {old.version} applied again"
    except ReleaseLocked as exc:
        p.log.info("release busy, waiting", detail=str(exc))
        return Report(outcome=Outcome(retry=True, reason=exc.reason))
    except (HelmFailed, TemporaryError) as exc:
        message = f"rolling back after chart {chart.version} failed: {exc}"
        p.log.error("rollout revert failed", error=str(exc))
        metrics.RECONCILE_ERRORS.labels(rt.name, "RevertFailed").inc()
        return Report([Change(rt.type(cond.ERROR), True, "RevertFailed", message)],
                      event=("Warning", "RolloutRevertFailed", message),
                      outcome=Outcome(retry=True, reason="RevertFailed"))
    rt.releases.note(namespace, p.release, revision, ReleaseStatus.DEPLOYED, fp,
                     p.obs.tenant.uid)
    p.obj = await status.set_fingerprint(rt, p.obj, fp, p.log)
    message = (f"chart {chart.version} failed and the rollout halted: {how} "
               f"(revision {revision}, chart {t.recorded_version})")
    p.log.info("rollout reverted", revision=revision, detail=how)
    return Report([Change(rt.type(cond.READY), True, "RolledBack", message),
                   Change(rt.type(cond.ERROR), False, "RolledBack", "no error"),
                   Change(rt.type(cond.PROGRESS), False, "RolloutHalted", message)],
                  applied={"revision": revision, "fingerprint": fp,
                           "revertedFingerprint": chart.fingerprint,
                           "lastAppliedTime": now_rfc3339()},
                  event=("Normal", "RolloutReverted", message))



async def _revert_healthy(rt: ClusterRuntime, p: Pass, version: str) -> Report:
    """Roll a release that is Ready on the target back to the revision before it, because
    its wave failed the rollout's metric gate (F7). Recorded as failed on the target and
    reverted, like a failed release that was rolled back."""
    chart, namespace = p.chart, p.namespace
    fp = fingerprint(chart.repo, chart.name, version, chart.values)
    try:
        async with rt.slots.slot(rt.name):
            fenced(rt)
            revision = await rt.helm.rollback(p.release, namespace)
    except ReleaseLocked as exc:
        p.log.info("release busy, waiting", detail=str(exc))
        return Report(outcome=Outcome(retry=True, reason=exc.reason))
    except (HelmFailed, TemporaryError) as exc:
        message = f"rolling back after chart {chart.version} failed the metric gate: {exc}"
        p.log.error("rollout revert failed", error=str(exc))
        metrics.RECONCILE_ERRORS.labels(rt.name, "RevertFailed").inc()
        return Report([Change(rt.type(cond.ERROR), True, "RevertFailed", message)],
                      event=("Warning", "RolloutRevertFailed", message),
                      outcome=Outcome(retry=True, reason="RevertFailed"))
    rt.releases.note(namespace, p.release, revision, ReleaseStatus.DEPLOYED, fp,
                     p.obs.tenant.uid)
    p.obj = await status.set_fingerprint(rt, p.obj, fp, p.log)
    message = (f"chart {chart.version} failed the rollout's metric gate: rolled back to the "
               f"previous revision (revision {revision}, chart {version})")
    p.log.info("rollout reverted", revision=revision, detail=message)
    return Report([Change(rt.type(cond.READY), True, "RolledBack", message),
                   Change(rt.type(cond.ERROR), False, "RolledBack", "no error"),
                   Change(rt.type(cond.PROGRESS), False, "RolloutHalted", message)],
                  applied={"revision": revision, "fingerprint": fp, "chartVersion": version,
                           "failedFingerprint": chart.fingerprint,
                           "revertedFingerprint": chart.fingerprint,
                           "lastAppliedTime": now_rfc3339()},
                  event=("Normal", "RolloutReverted", message))
