"""What the next pass would change (SPEC O7, O12): the deployed manifest of a Tenant's
release against what the next pass would apply, with what it would take from other field
managers and the cluster-scoped objects it would delete. ``krypton plan`` and ``krypton diff``
and the fleet page (O16) show the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from krypton.adapters.helm import HelmEngine
from krypton.adapters.kube import Kube
from krypton.decisions.charts import conflicts as fields
from krypton.decisions.charts import manifests, ownership
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import TemporaryError
from krypton.decisions.model import ChartTarget, Observation
from krypton.decisions.planner import HELM_ACTIONS, Action, Plan
from krypton.decisions.settings import Settings
from krypton.decisions.trust import safeyaml
from krypton.decisions.trust.records import decode
from krypton.runtime.reconcile import ClusterView


async def release_records(kube: Kube, settings: Settings, release: str,
                           namespace: str) -> list[dict[str, Any]]:
    """The Helm release records of `release` in `namespace` (whole, data included)."""
    records = await kube.list_release_records(settings.helm_driver, namespace,
                                              f"owner=helm,name={release}")
    return [r for r in records if r["metadata"].get("namespace") == namespace]


@dataclass(frozen=True)
class Decided:
    """One Tenant of a cluster as the operator would decide about it now: the Tenant, the
    records of its release there, the observation and the plan (``ClusterView.decide``,
    the operator's own)."""

    tenant: dict[str, Any]
    release: str
    records: list[dict[str, Any]]
    obs: Observation
    plan: Plan


def deployed_release(records: list[dict[str, Any]], driver: str) -> dict[str, Any] | None:
    """The release (decoded) of the newest record labelled deployed; None if there is none or
    it cannot be read."""
    deployed = [r for r in records
                if (r["metadata"].get("labels") or {}).get("status") == "deployed"]
    if not deployed:
        return None
    newest = max(deployed, key=lambda r: int((r["metadata"].get("labels") or {})
                                             .get("version") or 0))
    try:
        return decode(newest, driver)
    except ValueError:
        return None


# plans that run nothing because the release is as the target wants it (or only its
# annotation or its workload's health is looked after): `diff` shows "no change"
IN_SYNC = {Action.SKIP, Action.NOTHING, Action.ANNOTATE, Action.AWAIT_READY, Action.UNHEALTHY}


async def tenant_diff(cluster: str, kube: Kube, settings: Settings, render: HelmEngine,
                      d: Decided) -> tuple[str, str] | None:
    """``krypton diff`` of one Tenant on `cluster`: (heading, unified diff) between the
    deployed manifest and what the next pass would apply (the target chart rendered by
    `render` with the cluster's effective values), Secrets masked; "" when nothing would
    change; None when the Tenant is not the cluster's."""
    name, target = d.tenant["metadata"]["name"], d.obs.chart
    release, namespace = d.release, settings.release_namespace_for(name)
    heading = f"{cluster}/{d.tenant['metadata']['namespace']}/{name} ({release})"
    if d.plan.action is Action.NOT_TARGETED:
        return None
    if d.plan.action is Action.PAUSE:
        return f"{heading} paused by annotation", ""
    if d.plan.action not in HELM_ACTIONS:
        # nothing would run: the manifest stays as deployed, and why is said
        why = "" if d.plan.action in IN_SYNC else \
            f" not changed: {d.plan.reason} ({d.plan.message})"
        return heading + why, ""
    assert isinstance(target, ChartTarget)
    deployed = deployed_release(d.records, settings.helm_driver)
    before = f"{cluster}/{name} deployed"
    old_docs: list[Any] = []
    if deployed is not None:
        before += f" (revision {deployed.get('version')})"
        try:
            old_docs = safeyaml.load_all(str(deployed.get("manifest") or ""),
                                         safeyaml.CHART_CRDS, what=f"manifest of {release}")
        except safeyaml.YamlRejected as exc:
            return f"{cluster}/{name}: not looked at", f"{exc}\n"
    new_docs = await render.template(target.path, release, namespace, target.values)
    text = manifests.manifest_diff(old_docs, new_docs, before=before,
                                   after=f"{cluster}/{name} next (chart {target.version})")
    text += await owned_elsewhere(kube, new_docs, namespace)
    text += await deleted_cluster_objects(kube, old_docs, new_docs)
    return heading, text


async def cluster_objects_dropped(kube: Kube, deployed: list[Any],
                                   still: Callable[[ObjectRef], bool]) -> list[str]:
    """The cluster-scoped objects of the deployed manifest that the next one no longer has
    (`still` says which it has): an upgrade deletes them for every release on the cluster
    that uses them (an IngressClass, a CRD and its objects; SPEC F5b). Objects marked
    ``helm.sh/resource-policy: keep`` stay."""
    gone = []
    for ref in ownership.manifest_objects(d for d in deployed if not ownership.kept(d)):
        if ref.namespace or still(ref):
            continue
        try:
            if await kube.cluster_scoped(ref.api_version, ref.kind):
                gone.append(f"{ref.kind} {ref.name}")
        except TemporaryError:
            continue
    return gone


async def fixed_objects_dropped(view: ClusterView, kube: Kube, chart: ChartTarget,
                                 deployed: dict[str, Any], release: str) -> list[str]:
    """For `plan`: the fixed-name (not named after the release) cluster-scoped objects the
    next chart version and values no longer render, read from the chart's shared objects,
    rendered once per fingerprint: a plan starts no helm per Tenant."""
    try:
        docs = safeyaml.load_all(str(deployed.get("manifest") or ""), safeyaml.CHART_CRDS,
                                 what=f"manifest of {release}")
    except safeyaml.YamlRejected:
        return []
    rendered = set(await view.chart.shared_objects(chart.fingerprint,
                                                   lambda: view.candidates(chart)))
    return await cluster_objects_dropped(kube, docs,
                                          lambda ref: release in ref.name or ref in rendered)


async def deleted_cluster_objects(kube: Kube, old_docs: list[Any], new_docs: list[Any]) -> str:
    """For `diff`: the same, against the manifest it rendered, as comment lines."""
    kept = {(ref.kind, ref.name) for ref in ownership.manifest_objects(new_docs)}
    gone = await cluster_objects_dropped(kube, old_docs,
                                          lambda ref: (ref.kind, ref.name) in kept)
    if not gone:
        return ""
    lines = "".join(f"#   {g}\n" for g in gone)
    return ("# cluster-scoped objects this upgrade deletes (whoever else uses them loses them "
            f"too):\n{lines}")


async def owned_elsewhere(kube: Kube, docs: list[Any], namespace: str) -> str:
    """The fields of the next apply that other field managers own on the live objects (H2):
    what Helm 4 meets as conflicts (taken over under --helm-force-conflicts)."""
    found: list[fields.Conflict] = []
    for doc in docs:
        if not isinstance(doc, dict) or not doc.get("kind") or not doc.get("apiVersion"):
            continue
        meta = doc.get("metadata") or {}
        try:
            live = await kube.get_object(str(doc["apiVersion"]), str(doc["kind"]),
                                         str(meta.get("name")), meta.get("namespace") or namespace)
        except TemporaryError:
            continue
        found += fields.owned_elsewhere(doc, live)
    if not found:
        return ""
    lines = "".join(f"#   {c.object} {c.field} ({c.manager})\n" for c in found)
    return ("# fields of the next apply that other field managers own (Helm 4 takes them over "
            f"with --helm-force-conflicts, else FieldConflict):\n{lines}")
