"""Install or upgrade (R9), after recovering what an interrupted run left (uninstall then
install, rollback then upgrade). Preconditions, all checked by the planner: the Tenant is
admitted on this cluster, its namespace is its own, no shared object of the chart belongs
to another release, the release is not locked, and the target's next attempt is due. The
chart's crds/ go first (--chart-crds); Helm 4's field conflicts follow
--helm-force-conflicts (H2); every start is fenced.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from krypton.adapters import metrics
from krypton.adapters.charts import read_chart_crds
from krypton.adapters.kube import now_rfc3339
from krypton.decisions import crd, verdicts
from krypton.decisions.charts import chartcrds
from krypton.decisions.charts import conflicts as fields
from krypton.decisions.errors import (
    HOSTILE_ANSWERS,
    AlreadyExists,
    FieldConflict,
    Forbidden,
    HelmFailed,
    KryptonError,
    ReleaseLocked,
    TemporaryError,
)
from krypton.decisions.model import (
    ADOPTED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    OWNER_ANNOTATION,
    OWNER_LABEL,
    ChartTarget,
    NamespaceState,
    ReleaseStatus,
    TenantKey,
    namespace_refusal,
)
from krypton.decisions.planner import INSTALLING, Action, announced
from krypton.decisions.releases import BUSY
from krypton.decisions.trust.records import Record, Trust, Use
from krypton.decisions.verdicts import Outcome, Verdict
from krypton.runtime.reconcile import history, look, reports, status
from krypton.runtime.reconcile.model import (
    NamespaceNotOwned,
    Pass,
    Report,
    namespace_state,
    release_labels,
)
from krypton.runtime.reconcile.view import ClusterRuntime, fenced

ANNOUNCE_AFTER = 2.0  # seconds a helm run may take before the status says it is under way



async def helm(rt: ClusterRuntime, p: Pass) -> Report:
    """Install or upgrade (after uninstalling or rolling back what an interrupted run
    left), in the pass that decided it. A run still going after ANNOUNCE_AFTER seconds (a
    slot to wait for, CRDs, ``--helm-wait``) is announced while it runs: the status says
    ``ClusterProgress/<c>`` True and the Event ``Helm<Verb>Start`` goes out. A quick run
    is told by its outcome alone: one status write and its Event, no second pass."""
    key = p.key
    installing = p.plan.action in INSTALLING
    verb = "Install" if installing else "Upgrade"
    fenced(rt)
    await ensure_namespace(rt, key, p.obs.namespace,
                           first=p.obs.release.status is ReleaseStatus.ABSENT)
    # what the run does to the release's records is this pass's to tell, not a new pass's
    rt.state.running.add((p.namespace, p.release))
    try:
        work = asyncio.ensure_future(run_helm(rt, p, verb))
        try:
            if not announced(p.obs, p.plan):
                done, _ = await asyncio.wait({work}, timeout=ANNOUNCE_AFTER)
                if not done:
                    await announce(rt, p, verb)
            outcome = await work
        except BaseException:
            work.cancel()  # the pass was cancelled (shutdown, fenced): so is its helm
            await asyncio.gather(work, return_exceptions=True)
            raise
        if isinstance(outcome, Report):
            return outcome
        result, taken, seen = outcome
        # the outcome of krypton's own run, in the index before the watch brings its record
        rt.releases.note(p.namespace, p.release, int(result.get("version") or 0),
                         ReleaseStatus.parse((result.get("info") or {}).get("status")),
                         p.chart.fingerprint, p.obs.tenant.uid)
        return await succeeded(rt, p, verb, installing, result, taken, seen)
    finally:
        rt.state.running.discard((p.namespace, p.release))


async def announce(rt: ClusterRuntime, p: Pass, verb: str) -> None:
    """Say in the status and an Event that the pass's helm run is under way; best effort
    (the run goes on, and its outcome is written when it ends)."""
    told = verdicts.tell(rt.name, Verdict.ANNOUNCED, p.plan.reason, p.plan.message,
                         event=f"Helm{verb}Start")
    await status.interim(rt, p, Report.of(told))


async def run_helm(rt: ClusterRuntime, p: Pass, verb: str
                   ) -> tuple[dict[str, Any], str | None, list[str]] | Report:
    """The chart's CRDs, then a helm slot and the helm run(s), once the release's history
    is judged (:mod:`.history`): helm's answer, what a forced apply took over and the seals
    of the records the run started from, or the Report of a run that did not succeed."""
    chart, c = p.chart, rt.name
    try:
        await apply_chart_crds(rt, chart, p.log)
    except KryptonError as exc:
        message = f"applying the CRDs of chart {chart.version}'s crds/ failed: {exc}"
        p.log.error("chart CRDs not applied", error=str(exc))
        metrics.RECONCILE_ERRORS.labels(c, "ChartCRDsFailed").inc()
        return Report.of(verdicts.tell(c, Verdict.BLOCKED, "ChartCRDsFailed", message))
    p.log.info(f"helm {verb.lower()} start", chart_version=chart.version,
               action=p.plan.action.value)
    namespace, status = p.namespace, p.obs.release.status
    try:
        async with rt.slots.slot(c):
            fenced(rt)  # waiting for the slot may have outlasted the Lease
            seen: list[str] = []  # seals of records this run starts from
            judged: tuple[Record, ...] = ()  # the records helm may read (SPEC S7)
            again = history.as_read  # for a second run: the records as the first left them
            await unlock(rt, p, namespace)
            if p.plan.action is Action.UNINSTALL_THEN_INSTALL and status is not ReleaseStatus.ABSENT:
                verdict = await history.judge(rt, p, Use.UNINSTALL)
                if verdict.trust is not Trust.ABSENT:
                    await look.check_ownership(rt, p.release, namespace, verdict.history)
                    await rt.helm.uninstall(p.release, namespace, records=verdict.history,
                                            hooks=verdict.trust is Trust.TRUSTED)
            elif p.plan.action is Action.ROLLBACK_THEN_UPGRADE:
                rolled = await history.rollback(rt, p)
                if rolled is not None:
                    seen.append(rolled[1].seal)
                judged = await history.as_read(rt, p)  # as the rollback left them
            elif status is ReleaseStatus.UNINSTALLED:
                judged = await history.as_read(rt, p)
            elif status is not ReleaseStatus.ABSENT:
                verdict = await history.judge(rt, p, Use.UPGRADE)
                judged = verdict.history
                if verdict.seal:  # adopted by its content
                    seen.append(verdict.seal)
                again = _judged_again  # a second run starts from a history judged anew
            result, taken = await apply(rt, p, verb, namespace, judged, again)
            return result, taken, seen
    except ReleaseLocked as exc:
        # Another helm operation holds the release (it took the lock after this pass
        # looked): nothing failed, so no failedFingerprint, and a progressive rollout
        # never counts it as a failed release. Retried with backoff, like a planned wait.
        p.log.info("release busy, waiting", detail=str(exc))
        return Report(outcome=Outcome(retry=True, reason=exc.reason))
    except HelmFailed as exc:
        if exc.reason in HOSTILE_ANSWERS:  # the cluster's answer (struck against its budget
            raise  # by the helm engine), not the release's: no failure of its target
        return reports.failed(rt, p, verb, exc)


async def unlock(rt: ClusterRuntime, p: Pass, namespace: str) -> None:
    """A record left pending by krypton's own run, which ended with its helm worker (killed,
    out of memory, a crash), marked failed before the run that recovers the release, as
    Flux's helm-controller unlocks one: its history then tells the truth (SPEC S7). A pending
    record krypton did not interrupt is never touched here."""
    rel = p.obs.release
    why = rt.helm.interrupted(namespace, p.release)
    if not why or rel.status not in BUSY:
        return
    await rt.helm.unlock(p.release, namespace, rel.revision, why, await history.as_read(rt, p))
    p.log.info("release unlocked", revision=rel.revision, status=rel.status.value)
    p.events.append(("Normal", "ReleaseUnlocked",
                     f"revision {rel.revision} of {p.release} was left {rel.status.value} by "
                     f"krypton's own run, which ended with it ({why[:300]}): marked failed"))


async def succeeded(rt: ClusterRuntime, p: Pass, verb: str, installing: bool,
                    result: dict[str, Any], taken: str | None, seen: list[str]) -> Report:
    """A successful helm run (its outcome noted in the release index): the release sealed,
    its fingerprint annotation to write, the workload followed (F6) or the release Ready."""
    chart, key, c, namespace = p.chart, p.key, rt.name, p.namespace
    events = [*p.events, *([] if taken is None else [("Normal", "FieldsTakenOver", taken)])]
    if p.obs.adopt:  # SPEC F5b: said once, by the run that took them
        events.append(("Normal", "SharedObjectsAdopted",
                       f"release {p.release} took over {'; '.join(p.obs.adopt)}"))
    revision = int(result.get("version") or 0)
    done = "Installed" if installing else "Upgraded"
    message = f"chart {chart.name} {chart.version} {done.lower()} as {p.release} revision {revision}"
    p.log.info(f"helm {verb.lower()} success", chart_version=chart.version, revision=revision)
    applied = {"release": p.release, **chart.applied, **chart.notice(reports.recorded(rt, p)),
               "fingerprint": chart.fingerprint, "revision": revision,
               "failedFingerprint": "", "revertedFingerprint": "", "failures": 0,
               "failedTarget": "", "lastAppliedTime": now_rfc3339(),
               **crd.sealed(rt.state.seals_field, history.sealed(rt, p, result, *seen))}
    memory = rt.memory.of(key)
    memory.retry, memory.gone = None, ()
    memory.yielded_to = ""  # the release is this instance's again: a new yield is said again
    rt.publish(key, p.release, chart)
    # the record of the run, and the fingerprint annotation the commit writes before it
    recorded: dict[str, Any] = {"applied": applied, "last_chart": chart.ref,
                                "fingerprint": chart.fingerprint,
                                "ran": (f"{verb}Complete", message)}
    waiting = None if rt.settings.helm_wait else await look.not_ready(
        rt, key, p.release, namespace, str(result.get("manifest") or ""))
    if waiting is not None:
        # helm did not wait: the workload is tracked by the passes that follow (F6)
        wait = f"{message}; waiting for {waiting.summary()}"
        return Report.of(verdicts.tell(c, Verdict.APPLIED_WAITING, "WaitingForReadiness", wait,
                                       event=f"Helm{done}", cleared=done,
                                       again=look.readiness_requeue(rt, key, 0.0)),
                         events=events, **recorded)
    report = Report.of(verdicts.tell(c, Verdict.APPLIED, done, message, event=f"Helm{done}",
                                     ended=f"{verb}Complete"), **recorded)
    if p.plan.drift:
        p.log.info("drift repaired", detail=p.plan.message)
        report.events.append(("Normal", "DriftRepaired", f"{p.plan.message}; now {message}"))
    report.events += events
    return report



async def _judged_again(rt: ClusterRuntime, p: Pass) -> tuple[Record, ...]:
    return (await history.judge(rt, p, Use.UPGRADE)).history


async def apply(rt: ClusterRuntime, p: Pass, verb: str, namespace: str,
                judged: Sequence[Record],
                again: Callable[[ClusterRuntime, Pass], Awaitable[tuple[Record, ...]]]
                ) -> tuple[dict[str, Any], str | None]:
    """``helm upgrade --install`` of the pass's chart, helm given the `judged` records; with
    Helm 4, fields other field managers own are taken over under --helm-force-conflicts (the
    default, as Flux and Sveltos do on every upgrade) by a second run with
    --force-conflicts, from the records as `again` reads and judges them after the first
    (which wrote one), and what was taken over is returned for an Event; without it the run
    fails with FieldConflict, naming them and the way out (SPEC H2)."""
    chart = p.chart
    run = functools.partial(rt.helm.install_or_upgrade, p.release, chart.path,
                            namespace, chart.values, operation=verb.lower(), skip_crds=True,
                            labels=release_labels(rt.name, p, rt.writer),
                            take_ownership=bool(p.obs.adopt))
    try:
        return await run(records=judged), None
    except FieldConflict as exc:
        if not rt.settings.helm_force_conflicts:
            raise FieldConflict(
                f"{exc}; krypton does not take them over (--helm-force-conflicts=false): "
                "give the fields back (e.g. kubectl apply --server-side of the release's "
                "values for them, or remove them from the other manager) or let krypton "
                "take them (--helm-force-conflicts=true), then krypton retry",
                exc.conflicts) from exc
        found = [fields.Conflict(*c) for c in exc.conflicts]
        taken = (f"took over {len(found)} field(s) that other field managers owned: "
                 f"{fields.describe(found)}")
        p.log.warning("taking over fields of other managers", detail=str(exc))
        fenced(rt)
        return await run(force_conflicts=True, records=await again(rt, p)), taken



async def apply_chart_crds(rt: ClusterRuntime, chart: ChartTarget, log: Any) -> None:
    """The chart's crds/ under --chart-crds, once per cluster and chart version, before
    any release of that version (helm itself runs with --skip-crds)."""
    policy = rt.settings.chart_crds
    if policy == "skip" or chart.version in rt.state.crds_applied:
        return
    async with rt.state.crds_lock:
        if chart.version in rt.state.crds_applied:
            return
        for crd in read_chart_crds(chart.path):
            name = crd["metadata"]["name"]
            live = await rt.kube.crd(name)
            action = chartcrds.crd_action(policy, live, crd)
            if action == "create":
                try:
                    await rt.kube.create_crd(crd)
                except AlreadyExists:
                    continue  # created meanwhile by someone else: theirs
            elif action == "replace":
                assert live is not None
                await rt.kube.replace_crd(crd, live["metadata"]["resourceVersion"])
            else:
                continue
            metrics.API_WRITES.labels(rt.name, "crd").inc()
            log.info("chart CRD applied", crd=name, action=action,
                     chart_version=chart.version)
        rt.state.crds_applied.add(chart.version)



async def ensure_namespace(rt: ClusterRuntime, key: TenantKey, state: NamespaceState, *,
                           first: bool) -> None:
    """The Tenant's namespace, made or adopted for the run. Not looked up (UNKNOWN), it is
    created for a `first` install (no release yet), and judged by its owner only if it
    already exists; otherwise it holds the release labelled as the Tenant's, and is left
    as it is."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY, OWNER_LABEL: f"{key.namespace}.{key.name}"[:63]}
    annotations = {OWNER_ANNOTATION: str(key)}
    owner: str | None = None  # another Tenant's, found when the create finds the namespace
    if state is NamespaceState.ABSENT or (state is NamespaceState.UNKNOWN and first):
        try:
            await rt.kube.create_namespace(key.name, labels, annotations)
            metrics.API_WRITES.labels(rt.name, "namespace").inc()
            rt.log.info("workspace namespace created", tenant=str(key), namespace=key.name)
            return
        except (AlreadyExists, Forbidden) as exc:
            # It exists: made since it was looked at (by another pass of this Tenant, a
            # second name of the same cluster; by another Tenant; by someone else), or never
            # looked at. Or, not looked at, krypton may not create namespaces on this cluster
            # (credentials without that right, where namespaces are made for it): one that
            # exists is judged like any other, and an absent one stays refused.
            if isinstance(exc, Forbidden) and state is not NamespaceState.UNKNOWN:
                raise
            found = await rt.kube.get_namespace(key.name)
            state, owner = namespace_state(found, key)
            if found is not None and (found.get("metadata") or {}).get("deletionTimestamp"):
                # deleted by hand (SPEC S3): helm would fail in it; the pass comes back on
                # the queue's backoff and installs once it is gone
                raise TemporaryError(f"namespace {key.name!r} is being deleted; the release "
                                     "is installed again once it is gone",
                                     reason="NamespaceTerminating") from None
            if state is NamespaceState.OWNED:
                return
            if state is NamespaceState.ABSENT:
                if isinstance(exc, Forbidden):
                    raise
                raise TemporaryError(f"namespace {key.name!r} went again while it was being "
                                     "created; trying again") from None
    why = namespace_refusal(key.name, state, owner, rt.settings.adopt_namespaces)
    if why is not None:
        raise NamespaceNotOwned(why)
    if state is NamespaceState.UNMANAGED:
        annotations[ADOPTED_ANNOTATION] = "true"  # adopted namespaces are never deleted
        await rt.kube.patch_namespace(
            key.name, {"metadata": {"labels": labels, "annotations": annotations}})
        metrics.API_WRITES.labels(rt.name, "namespace").inc()
