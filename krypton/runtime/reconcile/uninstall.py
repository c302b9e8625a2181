"""A Tenant being deleted (R14): its release uninstalled, then the finalizer removed.
Preconditions: the release is this Tenant's (by its UID label, else its namespace), and no
object of its manifest belongs to another release (R17). A release that is another
Tenant's is left, and only the finalizer goes (:func:`drop_finalizer`). Both report the
finalizer's removal for the pass's one commit.
"""

from __future__ import annotations

from krypton.decisions import verdicts
from krypton.decisions.errors import (
    Fenced,
    KryptonError,
    OwnershipConflict,
    ReleaseRecordUntrusted,
)
from krypton.decisions.model import (
    SYSTEM_NAMESPACES,
    ReleaseStatus,
)
from krypton.decisions.trust.records import Trust, Use
from krypton.decisions.verdicts import Verdict
from krypton.runtime.reconcile import history, look
from krypton.runtime.reconcile.model import Pass, Report, created_by_krypton
from krypton.runtime.reconcile.view import ClusterRuntime, fenced


async def uninstall(rt: ClusterRuntime, p: Pass) -> Report:
    release, log, key = p.release, p.log, p.key
    namespace = rt.settings.release_namespace_for(key.name)
    present = p.obs.release.status not in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED)
    try:
        if present:  # nothing to uninstall is not a helm run (a second pass, SPEC F5b)
            async with rt.slots.slot(rt.name):
                fenced(rt)
                verdict = await history.judge(rt, p, Use.UNINSTALL)
                if verdict.trust is not Trust.ABSENT:  # gone already (a namespace deleted)
                    await look.check_ownership(rt, release, namespace, verdict.history,
                                               why="is not uninstalled (the finalizer stays)")
                    await rt.helm.uninstall(release, namespace, records=verdict.history,
                                            hooks=verdict.trust is Trust.TRUSTED)
        if rt.readiness is not None:
            rt.readiness.unfollow(key)
        if rt.settings.delete_namespace_on_uninstall and \
                rt.settings.shared_release_namespace is None:
            ns = await rt.kube.get_namespace(key.name)
            if created_by_krypton(ns, key) and \
                    key.name not in rt.settings.reserved_namespaces | SYSTEM_NAMESPACES:
                await rt.kube.delete_namespace(key.name)
    except Fenced:
        raise
    except KryptonError as exc:
        log.error("helm uninstall failed", error=str(exc))
        # what blocks the deletion, in the status (SPEC F5b): not the progress the Tenant
        # last reported; retried with backoff whatever it was (a Tenant must stay deletable)
        reason = exc.reason if isinstance(exc, (OwnershipConflict, ReleaseRecordUntrusted)) \
            else "UninstallFailed"
        told = verdicts.tell(rt.name, Verdict.FAILED, reason, f"deletion blocked: {exc}",
                             event="HelmUninstallFailed")
        # its Event on every attempt, changed status or not: the deletion is waiting on it
        return Report(told.changes, events=[told.event] if told.event else [],
                      outcome=told.outcome)
    rt.releases.drop(namespace, release)
    rt.state.manifest_objects.pop((namespace, release), None)
    rt.unpublish(key)
    log.info("helm uninstall success")
    return Report(events=[("Normal", "HelmUninstalled", f"release {release} uninstalled")],
                  finalizer=False)


async def drop_finalizer(rt: ClusterRuntime, p: Pass) -> Report:
    """A Tenant being deleted whose release is another Tenant's (SPEC S2): the
    release stays as it is, the finalizer goes, and an Event says why."""
    p.log.warning("release not uninstalled: not this Tenant's", detail=p.plan.message)
    rt.unpublish(p.key)
    return Report(events=[("Warning", p.plan.reason, p.plan.message)], finalizer=False)
