"""The fleet page's view of this operator (SPEC O16): what the page shows, read from what the
operator holds in memory (its clusters' Tenant caches, their health, the rollout); a cluster
is asked only for a Tenant's plan or diff, when a person asks, and the home cluster takes a
person's rollout control. The page itself is :mod:`krypton.web`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from krypton.adapters.events import EventRecorder
from krypton.adapters.helmworker import HelmWorkerEngine
from krypton.adapters.kube import Kube
from krypton.decisions import fleetview
from krypton.decisions.errors import KryptonError
from krypton.decisions.fleetview import Row
from krypton.decisions.model import TenantKey, release_name
from krypton.decisions.rollouts.rollout import CONFIGMAP, RolloutState
from krypton.decisions.settings import Settings
from krypton.runtime.changes import Changes
from krypton.runtime.diffs import Decided, release_records, tenant_diff
from krypton.runtime.fleet import Fleet
from krypton.runtime.reconcile.memory import TenantMemory
from krypton.runtime.rollout_controller import ask
from krypton.runtime.shards import Shards
from krypton.web.auth import Access
from krypton.web.server import WebServer

PLAN_TIMEOUT = 10.0  # seconds a cluster's plan (or diff) of one Tenant may take on the page


class OperatorFleet:
    """A :class:`krypton.web.server.FleetSource` on this operator's fleet, which may not be
    made yet when the page starts serving (`fleet` says None until then)."""

    def __init__(self, fleet: Callable[[], Fleet | None], changes: Changes,
                 rollout: Callable[[], Any], home: Callable[[], Kube | None], namespace: str,
                 scope: str = "",
                 sharing: Callable[[], tuple[Shards | None, Iterable[str] | None]] = lambda: (
                     None, None)) -> None:
        self._fleet, self.changes, self._rollout, self._scope = fleet, changes, rollout, scope
        self._home, self._namespace = home, namespace
        self._sharing = sharing  # under --sharding: the shards and every discovered cluster

    def _runtimes(self) -> list[Any]:
        fleet = self._fleet()
        return [] if fleet is None else [
            (name, w.runtime) for name, w in sorted(fleet.workers.items())
            if w.runtime is not None]

    def rows(self) -> list[Row]:
        return [row for name, rt in self._runtimes()
                for row in fleetview.tenant_rows(name, list(rt.tenants.values()))]

    def tenant(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {cluster: obj for cluster, rt in self._runtimes()
                if (obj := rt.tenants.get((namespace, name))) is not None}

    def journal(self, namespace: str, name: str) -> dict[str, TenantMemory]:
        return {cluster: kept for cluster, rt in self._runtimes()
                if (kept := rt.memory.peek(TenantKey(namespace, name))) is not None}

    async def plan(self, namespace: str, name: str, *, diff: bool = False
                   ) -> dict[str, tuple[str, str, str]]:
        """What each engaged cluster's next pass would do with the Tenant, decided as the
        operator and ``krypton plan`` decide (:meth:`ClusterView.decide`, which may look the
        cluster up: the Tenant's namespace, its shared objects): (action, reason, message);
        with `diff`, the message is ``krypton diff``'s for it (the release's records read,
        the chart rendered by the cluster's helm engine)."""
        out = {}
        for cluster, rt in self._runtimes():
            obj = rt.tenants.get((namespace, name))
            if obj is None:
                continue
            try:
                async with asyncio.timeout(PLAN_TIMEOUT):
                    obs, decided = await rt.decide(obj, rt.gate(cluster))
                    said = decided.message
                    if diff:
                        said = await self._diff(cluster, rt, obj, obs, decided)
                out[cluster] = (decided.action.value, decided.reason, said)
            except (KryptonError, TimeoutError) as exc:
                out[cluster] = ("unknown", "PlanFailed", str(exc) or "timed out")
        return out

    @staticmethod
    async def _diff(cluster: str, rt: Any, obj: dict[str, Any], obs: Any, decided: Any) -> str:
        release = release_name(obj["metadata"]["name"], cluster)
        namespace = rt.settings.release_namespace_for(obj["metadata"]["name"])
        records = await release_records(rt.kube, rt.settings, release, namespace)
        said = await tenant_diff(cluster, rt.kube, rt.settings, rt.helm,
                                 Decided(obj, release, records, obs, decided))
        if said is None:
            return "not this cluster's"
        heading, text = said
        return text or f"{heading}: no change in the manifest"

    def clusters(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        fleet = self._fleet()
        for name, state in (fleet.health() if fleet is not None else {}).items():
            about = {"state": state}
            entry = fleet.clusters.get(name) if fleet is not None else None
            if entry is not None:
                about["found as"] = entry.spec.source
            worker = entry.worker if entry is not None else None
            if worker is not None:
                health = worker.health
                if health.guard_known:
                    about["release records"] = health.guard.message
                if health.budget.over:
                    about["budget"] = f"over, {health.budget.strikes} answers past a bound"
                helm = worker.runtime.helm if worker.runtime is not None else None
                if isinstance(helm, HelmWorkerEngine):
                    pid = helm.process.pid
                    about["helm worker"] = f"running (pid {pid})" if pid else "not running"
                    about["helm worker starts"] = str(helm.process.starts)
            out[name] = about
        for name, replica in self._elsewhere().items():  # under --sharding
            out.setdefault(name, {"state": f"served by another replica ({replica or 'none yet'})"})
        return out

    def _elsewhere(self) -> dict[str, str]:
        """The discovered clusters another replica serves, each with the replica holding its
        Lease ("" when none does)."""
        shards, discovered = self._sharing()
        if shards is None:
            return {}
        fleet = self._fleet()
        here = set(fleet.workers) if fleet is not None else set()
        return {c: shards.owner(c) for c in sorted(discovered or ()) if c not in here}

    def rollout(self) -> RolloutState | None:
        """The rollout as this replica follows it (its controller's or follower's state)."""
        return getattr(self._rollout(), "state", None)

    def scope(self) -> str:
        return self._scope

    def controlled_in(self) -> str:
        return self._namespace

    async def control(self, action: str, by: str, seen: str) -> tuple[bool, str]:
        """Asked as ``krypton rollout`` asks, by someone the home cluster named; an Event on
        the rollout's ConfigMap says who asked, through the page."""
        home = self._home()
        if home is None:
            return False, "the operator has not reached its home cluster yet; nothing changed"
        wrote, said = await ask(home, self._namespace, action, by, seen=seen)
        if wrote:
            await EventRecorder(home).emit(
                {"apiVersion": "v1", "kind": "ConfigMap", "name": CONFIGMAP,
                 "namespace": self._namespace}, "Normal", "RolloutControlAsked",
                f"{by} asked to {action} the rollout on the fleet page: {said}")
        return wrote, said


def fleet_page(settings: Settings, fleet: Callable[[], Fleet | None], changes: Changes,
               rollout: Callable[[], Any], home: Callable[[], Kube | None],
               sharing: Callable[[], tuple[Shards | None, Iterable[str] | None]]) -> WebServer:
    """The page of this operator, on --web-address ("0": none); with --web-auth=kubernetes,
    who may see what is asked of the home cluster (`home`, None until it is reached)."""
    scope = ("the Tenants of this replica's clusters only (--sharding); the clusters the "
             "other replicas serve are listed with theirs; krypton status --from-deployment "
             "shows the whole fleet") if settings.sharding else ""
    access = Access(home) if settings.web_auth == "kubernetes" else None
    source = OperatorFleet(fleet, changes, rollout, home, settings.namespace, scope, sharing)
    return WebServer(settings.web_address, source, access=access)
