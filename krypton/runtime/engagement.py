"""An engaged cluster's engagement: what it is served with while engaged (SPEC R2, R3), made
whole by :meth:`krypton.runtime.clusterworker.ClusterWorker._engage` and dropped in one
step, and what is done with it as a whole: the engagement's checks (D9, the Tenant CRD), a
look at the rollout's target (F1), the withdrawal from its Tenants when the cluster leaves
the fleet.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from krypton.adapters.charts import ChartSource
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.decisions import crd
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.clusters.execplugins import CredentialPluginFailed
from krypton.decisions.crd import crd_manifest
from krypton.decisions.errors import HOSTILE_ANSWERS, KryptonError, TemporaryError
from krypton.decisions.planner import admission
from krypton.decisions.rollouts import rollout
from krypton.decisions.rollouts.rollout import ClusterObservation
from krypton.decisions.settings import Settings
from krypton.decisions.windows import Window
from krypton.runtime import recordguard
from krypton.runtime.clusterhealth import ClusterHealth
from krypton.runtime.reconcile import ClusterRuntime, Reconciler


async def withdraw_from_tenants(rt: ClusterRuntime, log: Any, timeout: float) -> None:
    """Remove a cluster that left the fleet from each of its Tenants (best effort, within
    `timeout` seconds)."""
    reconciler = Reconciler(rt)

    async def withdraw_all() -> None:
        for obj in list(rt.tenants.values()):
            try:
                await reconciler.withdraw(obj)
            except KryptonError as exc:
                log.warning("could not clear the cluster from a Tenant",
                            tenant=f"{obj['metadata'].get('namespace')}/"
                                   f"{obj['metadata'].get('name')}", error=str(exc))

    try:
        async with asyncio.timeout(timeout):
            await withdraw_all()
    except TimeoutError:
        log.warning("clearing the cluster from its Tenants timed out", timeout=timeout)
    log.info("cluster cleared from its Tenants")


def observe_for_rollout(rt: ClusterRuntime, chart: ChartSource, values: dict[str, Any],
                        window: Window | None) -> ClusterObservation:
    """What a cluster's Tenants say of the rollout's target (F1): only those it serves, by
    the planner's own admission rules (a paused, deleted, elsewhere-targeted or permanently
    refused Tenant is not waited for by a rollout wave)."""
    resolved = chart.cached
    desired = None if resolved is None else \
        fingerprint(resolved.repo, resolved.name, resolved.fingerprinted, values)
    served = [t for t in list(rt.tenants.values()) if admission(rt.observe(t)) is None]
    seen = rollout.observe_cluster(rt.name, served, desired)
    return dataclasses.replace(seen, window=window.text if window else "")


async def crd_applied(kube: Kube, health: ClusterHealth, rt: ClusterRuntime) -> bool:
    """Whether the outdated Tenant CRD was replaced by a current one (an administrator
    applied krypton's): said, and the phases it accepts taken."""
    try:
        served = await kube.get_crd()
    except KryptonError as exc:
        if exc.reason in HOSTILE_ANSWERS:
            health.answer_refused(exc)  # a strike, as for any request (SPEC S5)
        return False  # looked at again in CRD_CHECK seconds
    if served is None:
        return False
    await health.judge_crd(served)
    if health.crd_outdated:
        return False
    rt.state.crd_served(served)
    return True


async def checked(kube: Kube, name: str, settings: Settings, health: ClusterHealth,
                  claims: dict[str, str]) -> tuple[str, str, dict[str, Any] | None, str | None]:
    """Cluster `name` answers, is no other engaged cluster, serves krypton's Tenant CRD: its
    version, what was done of the CRD, the CRD served (None: not looked at), and the
    identity of its API server claimed for it (None: not claimed)."""
    try:
        version = await kube.server_version()
    except CredentialPluginFailed:
        raise  # its own reason: the plugin, not the server
    except TemporaryError as exc:
        raise TemporaryError(f"cluster {name} unreachable: {exc}",
                             reason="ClusterUnreachable") from exc
    identity = None
    if not settings.allow_duplicate_clusters:
        identity = await kube.cluster_identity(by_uid=settings.shared_release_namespace is None)
        claim(claims, identity, name)
    result, served = "not checked (--crd-policy=skip)", None
    if settings.crd_policy != "skip":
        result, served = await kube.ensure_crd(
            crd_manifest(), replace=lambda live: crd.replaces(live, settings.crd_policy))
        await health.judge_crd(served)
    return version, result, served, identity


def claim(claims: dict[str, str], identity: str, name: str) -> None:
    """One worker per API server: cluster `name` may not engage while another engaged
    cluster reaches the same API server (`identity`), or every Tenant there would be
    installed twice (SPEC D9)."""
    owner = claims.setdefault(identity, name)
    if owner != name:
        raise TemporaryError(
            f"cluster {name} reaches the same API server as engaged cluster {owner} "
            f"({identity.split('|')[0]}); not engaged while {owner} is", reason="DuplicateCluster")


@dataclass(frozen=True)
class Engagement:
    """What an engaged cluster is served with: made whole when it engages
    (:meth:`ClusterWorker._engage`), closed and dropped in one step when it stops being engaged."""

    kube: Kube
    runtime: ClusterRuntime  # what its passes use: frozen ports, and state of their own
    guard: recordguard.Keeper  # its release records' guard, kept
    tenants: Informer
    releases: Informer  # its release records

    async def close(self) -> None:
        await self.runtime.helm.close()
        if self.runtime.readiness is not None:
            await self.runtime.readiness.close()
        await self.kube.close()
