"""One reconcile pass for one Tenant on one cluster: observe and decide (:mod:`.view`), one
action (one module per kind: :mod:`.install`, :mod:`.revert`, :mod:`.uninstall`, and the
actions that start no helm in :mod:`.reports`), then one commit (:mod:`.status`) on every
exit, also when the action raised. A Tenant without the finalizer has it committed first;
the pass then decides again from the Tenant as written.

Nothing is written unless something changed: the status is patched only when the computed
status differs from the stored one, Events accompany condition changes and actions, and the
fingerprint annotation is patched only after a successful helm run (SPEC R13).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from krypton.decisions import conditions as cond
from krypton.decisions import verdicts
from krypton.decisions.conditions import Change
from krypton.decisions.errors import Conflict, Fenced, KryptonError
from krypton.decisions.model import FINALIZER, TenantKey, release_name
from krypton.decisions.planner import Action
from krypton.decisions.verdicts import Outcome
from krypton.runtime.reconcile import install, look, reports, revert, status, uninstall
from krypton.runtime.reconcile.model import Pass, Report, has_condition
from krypton.runtime.reconcile.view import ClusterRuntime

# no Resumed with these: they do not act on the Tenant
QUIET = {Action.NOTHING, Action.WAIT, Action.PAUSE, Action.UNINSTALL, Action.DROP_FINALIZER,
         Action.ADD_FINALIZER, Action.OUTSIDE_WINDOW, Action.YIELD}

# the helm runs that write or act on the release's history (SPEC S4)
HELM_ON_HISTORY = {Action.INSTALL, Action.UPGRADE, Action.UNINSTALL_THEN_INSTALL,
                   Action.ROLLBACK_THEN_UPGRADE, Action.REVERT}

Act = Callable[[ClusterRuntime, Pass], Awaitable[Report]]
ACTIONS: dict[Action, Act] = {
    Action.NOTHING: reports.nothing, Action.WAIT: reports.wait, Action.PAUSE: reports.pause,
    Action.NOT_TARGETED: reports.not_targeted, Action.BLOCKED: reports.blocked,
    Action.HOLD: reports.hold, Action.SKIP: reports.skip, Action.ANNOTATE: reports.annotate,
    Action.AWAIT_READY: reports.await_ready, Action.UNHEALTHY: reports.unhealthy,
    Action.BACKOFF: reports.backoff, Action.STALLED: reports.stalled,
    Action.YIELD: reports.another_writer,
    Action.OUTSIDE_WINDOW: reports.outside_window,
    Action.REVERT: revert.revert, Action.ADD_FINALIZER: reports.add_finalizer,
    Action.UNINSTALL: uninstall.uninstall, Action.DROP_FINALIZER: uninstall.drop_finalizer,
    **{a: install.helm for a in (Action.INSTALL, Action.UPGRADE, Action.UNINSTALL_THEN_INSTALL,
                                 Action.ROLLBACK_THEN_UPGRADE)},
}


class Reconciler:
    """observe -> decide (``planner.plan``) -> one action -> one commit."""

    def __init__(self, rt: ClusterRuntime) -> None:
        self.rt = rt

    async def reconcile(self, key: TenantKey) -> Outcome:
        rt = self.rt
        obj = rt.tenants.get((key.namespace, key.name))
        if obj is None:
            return Outcome()
        p = await self.decide(obj)
        if p.plan.action is Action.ADD_FINALIZER:
            # on before anything is installed (R14): committed, then the pass goes on from
            # the Tenant as written
            outcome = await self.act(p)
            if FINALIZER not in (p.obj["metadata"].get("finalizers") or []):
                return outcome
            p = await self.decide(p.obj)
        return await self.act(p)

    async def act(self, p: Pass) -> Outcome:
        """The plan's action, then the pass's one commit (also when the action raised)."""
        rt, action = self.rt, p.plan.action
        assert isinstance(action, Action)  # decide() satisfies every Need
        p.log.debug("planned", action=action.value, reason=p.plan.reason)
        if action not in QUIET and has_condition(p.obj, cond.PAUSED):
            p.changes.append(Change(cond.PAUSED, False, "Resumed", "reconciliation active"))
        try:
            report = await ACTIONS[action](rt, p)
        except (Fenced, Conflict):
            raise  # nothing may be written (fenced), or the Tenant moved on: a new pass
        except KryptonError as exc:
            report = reports.raised(rt, p, exc)
        except Exception as exc:
            await status.commit(rt, p, reports.defect(rt, p, exc))
            raise  # logged by the consumer, retried on the queue's growing schedule
        return await status.commit(rt, p, self._guarded(action, report))

    def _guarded(self, action: Action, report: Report) -> Report:
        """A helm run on the release's history says in its own commit whether the release
        records are guarded, and how (SPEC S4)."""
        guard = self.rt.record_guard()
        if action not in HELM_ON_HISTORY or guard is None:
            return report
        return dataclasses.replace(report, changes=[*report.changes,
                                                    verdicts.guarded(self.rt.name, guard)])

    async def decide(self, obj: dict[str, Any]) -> Pass:
        rt = self.rt

        async def look_in_sync(obs: Any) -> Any:
            return await look.look_in_sync(rt, obs)

        obs, decided = await rt.decide(obj, rt.gate(rt.name), look=look_in_sync, operator=True)
        key = obs.tenant.key
        release = release_name(key.name, rt.name)
        return Pass(obj, obs, decided, release, rt.settings.release_namespace_for(key.name),
                    rt.log.bind(tenant=str(key), release=release))

    async def withdraw(self, obj: dict[str, Any]) -> None:
        """Remove this cluster's traces from a Tenant when the cluster leaves the fleet."""
        await status.withdraw(self.rt, obj)

    def unpublish(self, key: TenantKey) -> None:
        self.rt.unpublish(key)
