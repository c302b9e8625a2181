"""One reconcile pass for one Tenant on one cluster: observe and decide (:mod:`.view`), one
action (one module per kind: :mod:`.install`, :mod:`.revert`, :mod:`.uninstall`, and the
actions that start no helm in :mod:`.reports`), then one status write (:mod:`.status`), also
when the action raised.

Nothing is written unless something changed: the status is patched only when the computed
status differs from the stored one, Events accompany condition changes and actions, and the
fingerprint annotation is patched only after a successful helm run (SPEC R13).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from krypton.adapters.events import involved_tenant
from krypton.decisions import conditions as cond
from krypton.decisions.conditions import Change
from krypton.decisions.errors import Conflict, Fenced, KryptonError
from krypton.decisions.model import TenantKey, release_name
from krypton.decisions.planner import Action
from krypton.runtime.reconcile import install, look, reports, revert, status, uninstall
from krypton.runtime.reconcile.model import Outcome, Pass, Report, has_condition
from krypton.runtime.reconcile.view import ClusterRuntime

# no Resumed with these: they do not act on the Tenant
QUIET = {Action.NOTHING, Action.WAIT, Action.PAUSE, Action.UNINSTALL, Action.DROP_FINALIZER}

Act = Callable[[ClusterRuntime, Pass], Awaitable[Report]]
ACTIONS: dict[Action, Act] = {
    Action.NOTHING: reports.nothing, Action.WAIT: reports.wait, Action.PAUSE: reports.pause,
    Action.NOT_TARGETED: reports.not_targeted, Action.BLOCKED: reports.blocked,
    Action.HOLD: reports.hold, Action.SKIP: reports.skip, Action.ANNOTATE: reports.annotate,
    Action.AWAIT_READY: reports.await_ready, Action.UNHEALTHY: reports.unhealthy,
    Action.BACKOFF: reports.backoff, Action.STALLED: reports.stalled,
    Action.REVERT: revert.revert,
    **{a: install.helm for a in (Action.INSTALL, Action.UPGRADE, Action.UNINSTALL_THEN_INSTALL,
                                 Action.ROLLBACK_THEN_UPGRADE)},
}


class Reconciler:
    """observe -> decide (``planner.plan``) -> one action -> one status write."""

    def __init__(self, rt: ClusterRuntime) -> None:
        self.rt = rt

    async def reconcile(self, key: TenantKey) -> Outcome:
        rt = self.rt
        obj = rt.tenants.get((key.namespace, key.name))
        if obj is None:
            return Outcome()
        p = await self.decide(obj)
        p.log.debug("planned", action=p.plan.action.value, reason=p.plan.reason)
        if p.plan.action is Action.UNINSTALL:
            return await uninstall.uninstall(rt, p)  # ends with the finalizer, not a status
        if p.plan.action is Action.DROP_FINALIZER:
            return await uninstall.drop_finalizer(rt, p)
        if p.plan.action not in QUIET and has_condition(p.obj, cond.PAUSED):
            p.changes.append(Change(cond.PAUSED, False, "Resumed", "reconciliation active"))
        try:
            report = await ACTIONS[p.plan.action](rt, p)
        except (Fenced, Conflict):
            raise  # nothing may be written (fenced), or the Tenant moved on: a new pass
        except KryptonError as exc:
            report = reports.raised(rt, p, exc)
        changes = p.changes + report.changes
        if changes or report.applied is not None:
            p.obj, _ = await status.commit(rt, p.obj, changes, p.log, event=report.event,
                                           applied=report.applied, last_chart=report.last_chart,
                                           chart_version=report.chart_version)
        for event in report.events:
            await rt.recorder.emit(involved_tenant(p.obj), *event)
        return report.outcome

    async def decide(self, obj: dict[str, Any]) -> Pass:
        rt = self.rt

        async def add_finalizer(tenant: dict[str, Any]) -> dict[str, Any]:
            return await status.add_finalizer(rt, tenant)

        async def look_in_sync(obs: Any) -> Any:
            return await look.look_in_sync(rt, obs)

        obj, obs, decided = await rt.decide(obj, rt.gate(rt.name), add_finalizer=add_finalizer,
                                            look=look_in_sync, create_namespace=True)
        key = obs.tenant.key
        release = release_name(key.name, rt.name)
        return Pass(obj, obs, decided, release, rt.settings.release_namespace_for(key.name),
                    rt.log.bind(tenant=str(key), release=release))

    async def forget(self, obj: dict[str, Any]) -> None:
        """Remove this cluster's traces from a Tenant when the cluster leaves the fleet."""
        await status.forget(self.rt, obj)

    def unpublish(self, key: TenantKey) -> None:
        self.rt.unpublish(key)
