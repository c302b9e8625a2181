"""Fleet tooling behind ``krypton plan``, ``krypton status`` and ``krypton retry``
(SPEC O7): the fleet as the operator sees it (:func:`fleet_view`), read
with the same flags as ``krypton run`` and the same code: discovery, kubeconfig checks,
chart resolution and the pure planner, so a plan shows exactly what the operator's next
pass would do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import functools
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krypton.adapters.clientconfig import configuration_for, configuration_in_cluster
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube, now_rfc3339
from krypton.adapters.kubeapi import core_path, profiles_path, tenants_path
from krypton.app.home import watch_cluster
from krypton.cli.view import (
    Row,
    assign_replicas,
    assign_sources,
    cluster_rows,
    failing_clusters,
    orphan_notes,
    tenant_rows,
    unguarded_notes,
)
from krypton.decisions import (
    crd,
    deployed,
    inventory,
    redact,
    sharding,
)
from krypton.decisions import kubeconfig as kubeconfigs
from krypton.decisions.deployed import Deployed
from krypton.decisions.discovery import (
    PROFILE,
    SECRET,
    SELF_CLUSTER,
    ClusterSpec,
    cluster_values,
    cluster_window,
    combined,
    desired_clusters,
    desired_profiles,
    profile_fields,
)
from krypton.decisions.errors import (
    KubeconfigRejected,
    NotFound,
    SettingsError,
    TemporaryError,
)
from krypton.decisions.fingerprint import deep_merge
from krypton.decisions.model import RETRY_ANNOTATION, TenantKey
from krypton.decisions.rollout import CONFIGMAP, RolloutState
from krypton.decisions.settings import Settings
from krypton.decisions.windows import Window


@dataclass
class ClusterHandle:
    name: str
    kube: Kube | None
    values: dict[str, Any]
    error: str = ""
    window: Window | None = None  # its maintenance window (None: always open)
    source: str = SECRET  # found as a Secret or a ClusterProfile (D10)


@contextlib.asynccontextmanager
async def fleet_view(settings: Settings, prefix: str) -> AsyncIterator[
        tuple[Path, Kube, list[ClusterHandle]]]:
    """The watch cluster and a client per discovered cluster, all closed on the way out."""
    handles: list[ClusterHandle] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        home = await watch_cluster(settings, Path(tmp), trust_secret=False)
        try:
            handles = await _clusters(home, settings, Path(tmp))
            yield Path(tmp), home, handles
        finally:
            for c in handles:
                if c.kube is not None:
                    await c.kube.close()
            await home.close()


async def _clusters(home: Kube, settings: Settings, workdir: Path) -> list[ClusterHandle]:
    secrets = await home.list_secrets(settings.namespace, f"{settings.kubeconfig_label}=true")
    specs = desired_clusters(secrets, settings.kubeconfig_key)
    if settings.cluster_profiles:
        specs, _ = combined(specs, desired_profiles(await _profiles(home, settings)))
    handles = []
    for name, spec in sorted(specs.items()):
        try:
            kc = _kubeconfig(spec, settings)
            values = deep_merge(settings.chart_values, cluster_values(spec))
            window = cluster_window(spec, settings.maintenance_window)
        except KubeconfigRejected as exc:
            handles.append(ClusterHandle(name, None, {}, f"{exc.reason}: {exc}",
                                         source=spec.source))
            continue
        cfg = configuration_in_cluster() if kc.in_cluster else None
        cfg = cfg or await configuration_for(kc, workdir / name,
                                             trust=settings.trust_kubeconfig_secrets)
        handles.append(ClusterHandle(name, Kube(cfg, name=name, timeout=settings.api_timeout),
                                     values, window=window, source=spec.source))
    return handles


async def _profiles(home: Kube, settings: Settings) -> list[dict[str, Any]]:
    """The ClusterProfiles the operator takes (none where their CRD is not installed)."""
    namespace = settings.cluster_profile_namespace or settings.namespace
    try:
        found = await home.list_all("list ClusterProfiles", profiles_path(namespace),
                                    label_selector=settings.cluster_profile_selector or None)
    except NotFound:
        return []
    return [profile_fields(p) for p in found["items"]]


def _kubeconfig(spec: ClusterSpec, settings: Settings) -> kubeconfigs.Kubeconfig:
    """How the CLI reaches a discovered cluster: a Secret's kubeconfig, or a profile with
    the plugins of the user's own --cluster-profile-providers (never the operator's)."""
    if spec.source != PROFILE:
        return kubeconfigs.parse(spec.kubeconfig, trust=settings.trust_kubeconfig_secrets,
                                 allow_in_cluster=spec.name == SELF_CLUSTER,
                                 pod_server=settings.pod_server)
    if not settings.profile_providers:
        raise KubeconfigRejected("a ClusterProfile's cluster is reached with exec plugins: "
                                 "pass --cluster-profile-providers FILE to run them here",
                                 reason="CredentialProviderUnknown")
    return kubeconfigs.for_profile(spec.name, inventory.profile_access(
        spec.profile or {}, settings.profile_providers))


async def tenants_of(kube: Kube, settings: Settings) -> list[dict[str, Any]]:
    tenants = await kube.list_tenants(settings.watch_namespace or None)
    return sorted(tenants, key=lambda t: (t["metadata"]["namespace"],
                                                           t["metadata"]["name"]))


async def _crd_outdated(kube: Kube) -> str | None:
    """Why the cluster's Tenant CRD is older than krypton's; None if current or unreadable."""
    try:
        served = await kube.get_crd()
    except TemporaryError:
        return None
    return crd.outdated(served) if served is not None else None


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
            stale = await _crd_outdated(c.kube) or ""
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
        stale = {c.name: await _crd_outdated(c.kube) or "" for c in clusters
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


async def find_operator(settings: Settings, ref: str, look_in: str | None
                        ) -> tuple[Deployed | None, dict[str, bytes]]:
    """The operator Deployment `ref` (namespace/name), or with "" the one labelled by its
    chart in namespace `look_in` (None: nowhere), read from the user's cluster
    (--watch-kubeconfig, else the kube context), and the files it mounts for
    --chart-values-file, by their path in the pod. None when `ref` is "" and no single
    operator is found there or the cluster cannot be asked."""
    local = dataclasses.replace(settings, watch_kubeconfig_secret="")
    with tempfile.TemporaryDirectory(prefix="krypton-from-") as tmp:
        try:
            home = await watch_cluster(local, Path(tmp), trust_secret=False)
        except (SettingsError, TemporaryError):
            if ref:
                raise
            return None, {}
        try:
            if ref:
                namespace, _, name = ref.partition("/")
                obj = await home.get_deployment(namespace, name)
                if obj is None:
                    raise SettingsError(f"invalid --from-deployment: Deployment {ref} not found")
            else:
                if look_in is None:
                    return None, {}
                try:
                    listed = await home.list_deployments(look_in, deployed.NAME_LABEL)
                except TemporaryError:  # not allowed to list them, or unreachable
                    return None, {}
                obj = deployed.choose(listed)
                if obj is None:
                    return None, {}
            found = deployed.read(obj)
            return found, {path: await _mounted_file(home, found, path, f)
                           for path, f in found.files.items()}
        finally:
            await home.close()


async def _mounted_file(home: Kube, found: Deployed, path: str,
                        f: deployed.MountedFile) -> bytes:
    namespace = found.ref.partition("/")[0]
    if f.kind == "secret":
        obj = await home.get_secret(namespace, f.name)
        raw = ((obj or {}).get("data") or {}).get(f.key)
        data = base64.b64decode(raw) if raw is not None else None
    else:
        obj = await home.get_configmap(namespace, f.name)
        text = ((obj or {}).get("data") or {}).get(f.key)
        data = text.encode() if text is not None else None
    if data is None:
        raise SettingsError(f"invalid --from-deployment: {found.ref} reads {path} from key "
                            f"{f.key!r} of {f.kind} {namespace}/{f.name}, which is missing")
    return data


async def retry(settings: Settings, ref: str, only: str | None) -> list[str]:
    """Ask for a new attempt of Tenant `ref` ("namespace/name") on every discovered cluster
    that has it, or on `only`: the retry annotation gets a new value (R18). One line per
    cluster; NotFound when no cluster has the Tenant."""
    namespace, _, name = ref.partition("/")
    if not namespace or not name:
        raise SettingsError(f"invalid Tenant {ref!r}: expected NAMESPACE/NAME")
    key, token = TenantKey(namespace, name), now_rfc3339()
    lines = []
    async with fleet_view(settings, "krypton-retry-") as (_, _home, clusters):
        for c in clusters:
            if c.kube is None or (only and c.name != only):
                continue
            try:
                await c.kube.patch_tenant(key, {"metadata": {"annotations": {
                    RETRY_ANNOTATION: token}}})
            except NotFound:
                continue
            lines.append(f"{c.name}: retry of {key} asked for ({RETRY_ANNOTATION}={token})")
    if not lines:
        where = f"cluster {only}" if only else "any discovered cluster"
        raise NotFound(f"Tenant {key} not found on {where}")
    return lines


