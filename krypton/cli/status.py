"""``krypton status``: the fleet's table, once or on every change (``--watch``), with the
rollout's progress (SPEC O7, F1).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import core_path, tenants_path
from krypton.cli.fleet import ClusterHandle, crd_outdated, fleet_view, tenants_of
from krypton.cli.view import (
    Row,
    assign_replicas,
    assign_sources,
    cluster_rows,
    failing_clusters,
    orphan_notes,
    unguarded_notes,
)
from krypton.decisions.clusters import sharding
from krypton.decisions.errors import (
    NotFound,
    TemporaryError,
)
from krypton.decisions.fleetview import tenant_rows
from krypton.decisions.rollouts.rollout import CONFIGMAP, RolloutState
from krypton.decisions.settings import Settings
from krypton.decisions.trust import redact


async def collect_status(settings: Settings) -> tuple[list[Row], int, RolloutState | None]:
    """The fleet's rows, how many clusters were discovered, and the rollout's state."""
    async with fleet_view(settings, "krypton-status-") as (_, home, clusters):
        rows: list[Row] = []
        events = await home.list_events(settings.namespace)
        profile_ns = settings.cluster_profile_namespace or settings.namespace
        if settings.cluster_profiles and profile_ns != settings.namespace:
            events += await home.list_events(profile_ns)
        failing = failing_clusters(events, time.time())
        orphans, unguarded = orphan_notes(events), unguarded_notes(events)
        for c in clusters:
            if c.kube is None:
                rows += cluster_rows(c.name, failing=failing.get(c.name, ""), rejected=c.error)
                continue
            stale = await crd_outdated(c.kube) or ""
            try:
                tenants = await tenants_of(c.kube, settings)
            except NotFound:
                unreachable = ("no Tenant CRD on this cluster (the operator creates it when it "
                               "engages the cluster, unless --crd-policy=skip)")
            except TemporaryError as exc:
                unreachable = f"unreachable: {exc}"
            except Exception as exc:  # noqa: BLE001 - one cluster's garbage must not hide the fleet
                unreachable = redact.describe(exc)
            else:
                unreachable = ""
            rows += cluster_rows(c.name, failing=failing.get(c.name, ""), stale=stale,
                                 unreachable=unreachable, orphans=orphans.get(c.name, ""),
                                 unguarded=unguarded.get(c.name, ""))
            if not unreachable:
                rows += tenant_rows(c.name, tenants)
        assign_replicas(rows, await _replicas(home, settings))
        assign_sources(rows, {c.name: c.source for c in clusters})
        return rows, len(clusters), await rollout_state(home, settings)


async def _replicas(home: Kube, settings: Settings) -> dict[str, str]:
    """Under --sharding, cluster -> the replica serving it, from the Leases (empty when the
    fleet is not sharded or the Leases cannot be read)."""
    ns, group = settings.lease_namespace, settings.leader_election_id
    try:
        clusters = await home.list_leases(ns, f"{sharding.CLUSTER_LABEL}={group}")
        members = await home.list_leases(ns, f"{sharding.MEMBER_LABEL}={group}") \
            if clusters else []
    except TemporaryError:
        return {}
    return sharding.owners(clusters, members, time.time(), settings.lease_duration)


WATCH_DEBOUNCE = 0.3  # a burst of changes (a rollout wave) makes one frame
WATCH_REFRESH = 30.0  # a frame at least this often (a Failing mark ages out)


async def watch_status(settings: Settings,
                       show: Callable[[list[Row], RolloutState | None], None]) -> None:
    """``krypton status --watch``: call `show` with the fleet's rows and the rollout state
    whenever a watched object changes: the Tenants on every discovered cluster, and the
    cluster Secrets, Events and rollout ConfigMap in --namespace of the watch cluster. A
    change to the set of cluster Secrets reopens the fleet. Runs until cancelled."""
    while True:
        async with fleet_view(settings, "krypton-watch-") as (_, home, clusters):
            await _watch_fleet(settings, home, clusters, show)
        await asyncio.sleep(WATCH_DEBOUNCE)  # Secrets changing in a burst reopen it once


def _leases(settings: Settings, home: Kube, what: str, label: str,
            on_change: Callable[[str, dict[str, Any]], None]) -> Informer:
    """The sharding Leases of this operator's group with `label` (SPEC S3), if any."""
    return Informer(home, what, home.lease_path(settings.lease_namespace), on_change,
                    label_selector=f"{label}={settings.leader_election_id}",
                    on_error=lambda _exc: None)


def _frame(clusters: list[ClusterHandle], events: list[dict[str, Any]],
           tenants: dict[str, Informer], stale: dict[str, str],
           unreachable: dict[str, str]) -> list[Row]:
    """The rows of one frame of `krypton status --watch`, from what the informers hold."""
    failing = failing_clusters(events, time.time())
    orphans, unguarded = orphan_notes(events), unguarded_notes(events)
    rows: list[Row] = []
    for c in clusters:
        rows += cluster_rows(c.name, failing=failing.get(c.name, ""), rejected=c.error,
                             stale=stale.get(c.name, ""), unreachable=unreachable.get(c.name, ""),
                             orphans=orphans.get(c.name, ""), unguarded=unguarded.get(c.name, ""))
        watched = tenants.get(c.name)
        if watched is not None and watched.synced.is_set():
            rows += tenant_rows(c.name, watched.store.values())
    assign_sources(rows, {c.name: c.source for c in clusters})
    return rows


async def _watch_fleet(settings: Settings, home: Kube, clusters: list[ClusterHandle],
                       show: Callable[[list[Row], RolloutState | None], None]) -> None:
    changed, reopen = asyncio.Event(), asyncio.Event()
    names = {c.name for c in clusters}
    unreachable: dict[str, str] = {}

    def poke(_type: str, _obj: dict[str, Any]) -> None:
        changed.set()

    def secret_changed(_type: str, _obj: dict[str, Any]) -> None:
        if secrets.synced.is_set():
            reopen.set()
            changed.set()

    def reached(name: str, exc: Exception | None = None) -> None:
        if exc is None:
            unreachable.pop(name, None)
        else:
            unreachable[name] = f"unreachable: {redact.describe(exc)}"
        changed.set()

    ns = settings.namespace
    secrets = Informer(home, "secrets", core_path("secrets", ns), secret_changed,
                       label_selector=f"{settings.kubeconfig_label}=true", metadata_only=True)
    configmaps = Informer(home, "configmaps", core_path("configmaps", ns), poke)
    owners = _leases(settings, home, "cluster leases", sharding.CLUSTER_LABEL, poke)
    members = _leases(settings, home, "member leases", sharding.MEMBER_LABEL,
                      lambda _t, _o: None)  # renewed every retry period: no frame for that
    events = Informer(home, "events", core_path("events", ns), poke)
    tenants = {c.name: Informer(c.kube, "tenants", tenants_path(settings.watch_namespace or None),
                                poke, on_error=functools.partial(reached, c.name),
                                on_healthy=functools.partial(reached, c.name))
               for c in clusters if c.kube is not None}
    informers = [secrets, configmaps, events, owners, members, *tenants.values()]
    for informer in informers:
        informer.start()
    try:
        stale = {c.name: await crd_outdated(c.kube) or "" for c in clusters
                 if c.kube is not None}
        await secrets.synced.wait()
        listed = {key[1] for key, obj in secrets.store.items()
                  if not obj["metadata"].get("deletionTimestamp")}  # as desired_clusters
        if listed != names:
            return  # a cluster came or went since the fleet was opened
        while not reopen.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_REFRESH):
                    await changed.wait()
            await asyncio.sleep(WATCH_DEBOUNCE)
            changed.clear()
            rows = _frame(clusters, list(events.store.values()), tenants, stale, unreachable)
            assign_replicas(rows, sharding.owners(owners.store.values(), members.store.values(),
                                                  time.time(), settings.lease_duration))
            show(rows, RolloutState.from_configmap(configmaps.store.get((ns, CONFIGMAP))))
    finally:
        for informer in informers:
            await informer.stop()


async def rollout_state(home: Kube, settings: Settings) -> RolloutState | None:
    """The progressive rollout's state (F1), from its ConfigMap; None when there is none."""
    try:
        return RolloutState.from_configmap(await home.get_configmap(settings.namespace,
                                                                    CONFIGMAP))
    except TemporaryError:
        return None
