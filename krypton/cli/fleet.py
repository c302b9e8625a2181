"""The fleet as the operator sees it, for the CLI (SPEC O7): discovery, kubeconfig checks
and a client per cluster, read with the same flags as ``krypton run`` and the same code
(:func:`fleet_view`); and the operator Deployment whose settings a command takes
(``--from-deployment``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krypton.adapters.clientconfig import configuration_for, configuration_in_cluster
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import profiles_path
from krypton.app.home import watch_cluster
from krypton.decisions import crd, deployed
from krypton.decisions.charts.fingerprint import deep_merge
from krypton.decisions.clusters import inventory
from krypton.decisions.clusters import kubeconfig as kubeconfigs
from krypton.decisions.clusters.discovery import (
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
from krypton.decisions.deployed import Deployed
from krypton.decisions.errors import (
    KubeconfigRejected,
    NotFound,
    SettingsError,
    TemporaryError,
)
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


async def crd_outdated(kube: Kube) -> str | None:
    """Why the cluster's Tenant CRD is older than krypton's; None if current or unreadable."""
    try:
        served = await kube.get_crd()
    except TemporaryError:
        return None
    return crd.outdated(served) if served is not None else None


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
