"""Roll back a release that failed on a halted rollout's target (F1 with
--rollout-auto-revert). Precondition: the rollout asks for it and this release failed on the
target after a revision krypton recorded.
"""

from __future__ import annotations

from typing import Any

from krypton.adapters import metrics
from krypton.adapters.kube import now_rfc3339
from krypton.decisions import crd, verdicts
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.errors import (
    HelmFailed,
    ReleaseLocked,
    TemporaryError,
)
from krypton.decisions.model import (
    ReleaseStatus,
)
from krypton.decisions.trust.records import Use
from krypton.decisions.verdicts import Outcome, Verdict
from krypton.runtime.reconcile import history
from krypton.runtime.reconcile.model import Pass, Report, release_labels
from krypton.runtime.reconcile.view import ClusterRuntime, fenced


async def revert(rt: ClusterRuntime, p: Pass) -> Report:
    """Roll a release back on a halted rollout (--rollout-auto-revert), from the work queue
    like any helm action, so never beside a retry of the same release:

    - a release that failed on the target goes back to the last revision krypton applied;
      when helm's rollback trips over what the failed upgrade left, the last good chart
      version is applied again;
    - a release Ready on the target whose wave failed the metric gate (F7) goes back to the
      revision before it, and is recorded as failed on the target and reverted.
    """
    chart, healthy = p.chart, p.obs.rollout.revert_healthy_to
    why = "failed the rollout's metric gate" if healthy else "failed and the rollout halted"
    version: str | None
    try:
        async with rt.slots.slot(rt.name):
            fenced(rt)
            if healthy:
                result, seal = await _rolled_back(rt, p)
                fp, version = fingerprint(chart.repo, chart.name, healthy, chart.values), healthy
                how = "rolled back to the previous revision"
                seals = history.sealed(rt, p, result, seal)
            else:
                result, fp, version, how, seals = await _back_to_recorded(rt, p)
            revision = int(result.get("version") or 0)
    except ReleaseLocked as exc:
        p.log.info("release busy, waiting", detail=str(exc))
        return Report(outcome=Outcome(retry=True, reason=exc.reason))
    except (HelmFailed, TemporaryError) as exc:
        message = f"rolling back after chart {chart.version} {why}: {exc}"
        p.log.error("rollout revert failed", error=str(exc))
        metrics.RECONCILE_ERRORS.labels(rt.name, "RevertFailed").inc()
        return Report.of(verdicts.tell(rt.name, Verdict.ERROR, "RevertFailed", message,
                                       event="RolloutRevertFailed"))
    rt.releases.note(p.namespace, p.release, revision, ReleaseStatus.DEPLOYED, fp,
                     p.obs.tenant.uid)
    message = f"chart {chart.version} {why}: {how} (revision {revision}, chart {version})"
    p.log.info("rollout reverted", revision=revision, detail=how)
    applied = {"revision": revision, "fingerprint": fp, "revertedFingerprint": chart.fingerprint,
               "lastAppliedTime": now_rfc3339(), **crd.sealed(rt.state.seals_field, seals)}
    if healthy:
        applied |= {"chartVersion": version, "failedFingerprint": chart.fingerprint}
    return Report.of(verdicts.tell(rt.name, Verdict.APPLIED, "RolledBack", message,
                                   event="RolloutReverted", ended="RolloutHalted"),
                     applied=applied, fingerprint=fp, ran=("RolloutHalted", message))


async def _back_to_recorded(rt: ClusterRuntime, p: Pass
                            ) -> tuple[dict[str, Any], str, str | None, str, list[str]]:
    """A failed release back to the revision krypton recorded (the planner reverts only to
    one), else its chart applied again: (helm's answer, fingerprint, chart version, how, the
    seals the status keeps). The failed revision's objects that the rollback deletes must
    be this release's own (R17): krypton did not seal that record."""
    t, chart = p.obs.tenant, p.chart
    good = t.applied_revision or 0
    try:
        result, seal = await _rolled_back(rt, p, to=good)
        return (result, t.recorded_fingerprint or t.applied_fingerprint or "",
                t.recorded_version, f"rolled back to revision {good}",
                history.sealed(rt, p, result, seal))
    except HelmFailed as exc:
        if not t.recorded_version:
            raise
        p.log.warning("helm rollback failed, re-applying the last good chart", error=str(exc))
        old = await rt.chart.fetch(t.recorded_version)
        verdict = await history.judge(rt, p, Use.UPGRADE)
        fenced(rt)
        result = await rt.helm.install_or_upgrade(
            p.release, old.path, p.namespace, chart.values, operation="revert",
            skip_crds=True, labels=release_labels(rt.name, p, rt.writer),
            records=verdict.history)
        return (result, fingerprint(old.repo, old.name, old.fingerprinted, chart.values),
                old.version, f"chart {old.version} applied again",
                history.sealed(rt, p, result, verdict.seal))


async def _rolled_back(rt: ClusterRuntime, p: Pass, *, to: int = 0) -> tuple[dict[str, Any], str]:
    """helm's answer to the release's rollback (:func:`history.rollback`) and the seal of
    the revision it went to; a release without records has nothing to go back to."""
    rolled = await history.rollback(rt, p, to=to)
    if rolled is None:
        raise TemporaryError(f"release {p.release} has no record left to roll back to")
    return rolled[0], rolled[1].seal
