"""``krypton plan`` and ``krypton diff`` (SPEC O7, SPEC O12): what the operator's next pass
would do per Tenant x cluster, and the manifest it would apply. They use the operator's own
discovery, chart resolution and pure planner. Kept apart from ``tools`` so that ``status``
and ``register-cluster`` do not load helm's wrapper and the runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from krypton.adapters.charts import ChartSource, chart_access
from krypton.adapters.helm import Helm, HelmEngine
from krypton.adapters.helmworker import WorkerHelm
from krypton.adapters.kube import Kube
from krypton.cli.fleet import ClusterHandle, fleet_view, tenants_of
from krypton.cli.status import rollout_state
from krypton.cli.view import Row, assign_sources
from krypton.decisions.charts import conflicts as fields
from krypton.decisions.charts import manifests, ownership
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import KryptonError, TemporaryError
from krypton.decisions.fleetview import joined, update_notice, with_digest
from krypton.decisions.model import (
    ChartTarget,
    Observation,
    RolloutGate,
    fingerprint_annotation,
    release_name,
)
from krypton.decisions.planner import HELM_ACTIONS, Action, Need, Plan, attempt_target
from krypton.decisions.releases import ReleaseIndex
from krypton.decisions.rollouts.rollout import Policy, gate_for
from krypton.decisions.settings import Settings
from krypton.decisions.trust import safeyaml
from krypton.decisions.trust.records import decode
from krypton.runtime.reconcile import ClusterView


def _chart_source(settings: Settings, tmp: Path, home: Kube | None) -> ChartSource:
    """The chart of the flags, pulled into `tmp` (the CLI's own cache, gone when it exits).
    Registry credentials come from the --chart-credentials-secret the user names, read with
    the user's own access to the watch cluster."""
    return ChartSource(settings.chart_repo, settings.chart_name, settings.chart_version,
                       helm=Helm(settings.helm_path or settings.helm_executable),
                       cache_dir=tmp / "charts",
                       access=chart_access(settings, home.get_secret if home else None))


@contextlib.asynccontextmanager
async def _rendering(settings: Settings, chart: ChartSource) -> AsyncIterator[HelmEngine]:
    """What renders the chart for ``plan`` and ``diff``: the engine the operator renders
    with (SPEC P5), so both show what it would apply; the helm worker is stopped at the end."""
    if settings.helm_engine != "worker":
        yield chart.helm
        return
    worker = WorkerHelm(settings.helm_worker_path or settings.helm_worker,
                        timeout=settings.helm_timeout)
    try:
        yield worker
    finally:
        await worker.close()


async def _release_records(kube: Kube, settings: Settings, release: str,
                           namespace: str) -> list[dict[str, Any]]:
    """The Helm release records of `release` in `namespace` (whole, data included)."""
    records = await kube.list_release_records(settings.helm_driver, namespace,
                                              f"owner=helm,name={release}")
    return [r for r in records if r["metadata"].get("namespace") == namespace]


async def collect_plan(settings: Settings) -> list[Row]:
    async with fleet_view(settings, "krypton-plan-") as (tmp, home, clusters):
        chart = _chart_source(settings, tmp, home)
        async with _rendering(settings, chart) as render:
            return await _plan_fleet(settings, chart, render, home, clusters)


async def _plan_fleet(settings: Settings, chart: ChartSource, render: HelmEngine,
                      home: Kube, clusters: list[ClusterHandle]) -> list[Row]:
    gate = await _rollout_gate(home, settings, chart)
    rows: list[Row] = []
    known = frozenset(h.name for h in clusters)
    for c in clusters:
        if c.kube is None:
            rows.append(Row(c.name, "", "", action="blocked",
                            reason=c.error.partition(":")[0], detail=c.error))
            continue
        try:
            rows += await _plan_cluster(c, c.kube, settings, chart, render, known, gate)
        except TemporaryError as exc:
            rows.append(Row(c.name, "", "", action="blocked", reason="ClusterUnreachable",
                            detail=str(exc)))
    return assign_sources(rows, {c.name: c.source for c in clusters})


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


async def _decide_cluster(c: ClusterHandle, kube: Kube, settings: Settings,
                          chart: ChartSource, render: HelmEngine, known: frozenset[str],
                          gate: Callable[[str], RolloutGate]
                          ) -> tuple[ClusterView, list[Decided]]:
    """Every Tenant of cluster `c`, decided as the operator decides (``plan`` and ``diff``
    show the same decision the operator would make)."""
    tenants = await tenants_of(kube, settings)
    view = ClusterView(name=c.name, kube=kube, helm=render, chart=chart, settings=settings,
                       releases=ReleaseIndex(), values=c.values, window=c.window,
                       known_clusters=lambda: known,
                       tenants={(t["metadata"]["namespace"], t["metadata"]["name"]): t
                                for t in tenants})
    out = []
    for t in tenants:
        meta = t["metadata"]
        release = release_name(meta["name"], c.name)
        namespace = settings.release_namespace_for(meta["name"])
        records = await _release_records(kube, settings, release, namespace)
        for record in records:
            view.releases.on_event("ADDED", record)
        obs, decided = await view.decide(t, gate(c.name))
        out.append(Decided(t, release, records, obs, decided))
    return view, out


async def _plan_cluster(c: ClusterHandle, kube: Kube, settings: Settings,
                        chart: ChartSource, render: HelmEngine, known: frozenset[str],
                        gate: Callable[[str], RolloutGate]) -> list[Row]:
    view, decisions = await _decide_cluster(c, kube, settings, chart, render, known, gate)
    rows = []
    for d in decisions:
        t, release, records, obs, decided = d.tenant, d.release, d.records, d.obs, d.plan
        meta = t["metadata"]
        applied = ((t.get("status") or {}).get("clusters") or {}).get(c.name) or {}
        old_version = with_digest(applied.get("chartVersion") or "-", applied.get("chartDigest") or "")
        old_fp = (meta.get("annotations") or {}).get(fingerprint_annotation(c.name)) or ""
        new_version = with_digest(getattr(obs.chart, "version", "?"), getattr(obs.chart, "digest", ""))
        new_fp = getattr(obs.chart, "fingerprint", "")
        change = ""
        if isinstance(obs.chart, ChartTarget) and old_fp and old_fp != new_fp:
            deployed = deployed_release(records, settings.helm_driver)
            change = manifests.what_changed(
                (t.get("status") or {}).get("lastAppliedChart"), obs.chart.repo, obs.chart.name,
                obs.chart.version, None if deployed is None else deployed.get("config") or {},
                obs.chart.values)
            if deployed is not None and decided.action in HELM_ACTIONS:
                gone = await _fixed_objects_dropped(view, kube, obs.chart, deployed, release)
                if gone:
                    change = "; ".join(filter(None, (change, f"deletes {', '.join(gone)}")))
        rows.append(Row(
            c.name, meta["namespace"], meta["name"], release=release,
            chart_version=f"{old_version} -> {new_version}",
            fingerprint=f"{old_fp[:12] or '-'} -> {new_fp[:12] or '-'}",
            action=_action_word(decided.action), reason=decided.reason, change=change,
            detail=joined(_with_attempts(decided, obs),
                          update_notice(getattr(obs.chart, "version", ""),
                                        getattr(obs.chart, "newer", "")))))
    return rows


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


async def collect_diff(settings: Settings) -> list[tuple[str, str]]:
    """For each Tenant x cluster the chart resolves for: (heading, unified diff) between the
    deployed manifest and what the next reconcile would apply (``helm template`` of the target
    chart with the cluster's effective values), Secrets masked. An empty diff: no change."""
    async with fleet_view(settings, "krypton-diff-") as (tmp, home, clusters):
        chart = _chart_source(settings, tmp, home)
        async with _rendering(settings, chart) as render:
            return await _diff_fleet(settings, chart, render, home, clusters)


async def _diff_fleet(settings: Settings, chart: ChartSource, render: HelmEngine,
                      home: Kube, clusters: list[ClusterHandle]
                      ) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    gate = await _rollout_gate(home, settings, chart)
    known = frozenset(h.name for h in clusters)
    for c in clusters:
        if c.kube is None:
            out.append((f"{c.name}: not looked at", f"{c.error}\n"))
            continue
        _, decisions = await _decide_cluster(c, c.kube, settings, chart, render, known,
                                             gate)
        for d in decisions:
            name, target = d.tenant["metadata"]["name"], d.obs.chart
            release, namespace = d.release, settings.release_namespace_for(name)
            heading = f"{c.name}/{d.tenant['metadata']['namespace']}/{name} ({release})"
            if d.plan.action is Action.NOT_TARGETED:
                continue  # the Tenant is not this cluster's
            if d.plan.action is Action.PAUSE:
                out.append((f"{heading} paused by annotation", ""))
                continue
            if d.plan.action not in HELM_ACTIONS:
                # nothing would run: the manifest stays as deployed, and why is said
                why = "" if d.plan.action in IN_SYNC else \
                    f" not changed: {d.plan.reason} ({d.plan.message})"
                out.append((heading + why, ""))
                continue
            assert isinstance(target, ChartTarget)
            deployed = deployed_release(d.records, settings.helm_driver)
            before = f"{c.name}/{name} deployed"
            old_docs: list[Any] = []
            if deployed is not None:
                before += f" (revision {deployed.get('version')})"
                try:
                    old_docs = safeyaml.load_all(str(deployed.get("manifest") or ""),
                                                 safeyaml.CHART_CRDS,
                                                 what=f"manifest of {release}")
                except safeyaml.YamlRejected as exc:
                    out.append((f"{c.name}/{name}: not looked at", f"{exc}\n"))
                    continue
            new_docs = await render.template(target.path, release, namespace,
                                             target.values)
            text = manifests.manifest_diff(old_docs, new_docs, before=before,
                                           after=f"{c.name}/{name} next (chart "
                                                 f"{target.version})")
            text += await _owned_elsewhere(c.kube, new_docs, namespace)
            text += await _deleted_cluster_objects(c.kube, old_docs, new_docs)
            out.append((heading, text))
    return out


# plans that run nothing because the release is as the target wants it (or only its
# annotation or its workload's health is looked after): `diff` shows "no change"
IN_SYNC = {Action.SKIP, Action.NOTHING, Action.ANNOTATE, Action.AWAIT_READY, Action.UNHEALTHY}


async def _cluster_objects_dropped(kube: Kube, deployed: list[Any],
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


async def _fixed_objects_dropped(view: ClusterView, kube: Kube, chart: ChartTarget,
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
    return await _cluster_objects_dropped(kube, docs,
                                          lambda ref: release in ref.name or ref in rendered)


async def _deleted_cluster_objects(kube: Kube, old_docs: list[Any], new_docs: list[Any]) -> str:
    """For `diff`: the same, against the manifest it rendered, as comment lines."""
    kept = {(ref.kind, ref.name) for ref in ownership.manifest_objects(new_docs)}
    gone = await _cluster_objects_dropped(kube, old_docs,
                                          lambda ref: (ref.kind, ref.name) in kept)
    if not gone:
        return ""
    lines = "".join(f"#   {g}\n" for g in gone)
    return ("# cluster-scoped objects this upgrade deletes (whoever else uses them loses them "
            f"too):\n{lines}")


async def _owned_elsewhere(kube: Kube, docs: list[Any], namespace: str) -> str:
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


async def _rollout_gate(home: Kube, settings: Settings, chart: ChartSource
                        ) -> Callable[[str], RolloutGate]:
    """The progressive rollout's gate per cluster, as the operator sets it (F1): from its
    written state and the fleet's target (the central chart with the central values)."""
    policy = Policy.from_settings(settings)
    if not policy.enabled:
        return lambda _cluster: RolloutGate()
    state = await rollout_state(home, settings)
    try:
        resolved = await chart.get()
        target: str | None = fingerprint(resolved.repo, resolved.name, resolved.fingerprinted,
                                         settings.chart_values)
    except KryptonError:
        target = None
    return lambda cluster: gate_for(state, target, cluster, policy)


def _with_attempts(decided: Plan, obs: Observation) -> str:
    """A release that failed before says how often, and when it is tried again (R18); a
    stalled one says it in its own message."""
    t = obs.tenant
    if decided.action is Action.STALLED or t.failures <= 0 or \
            not isinstance(obs.chart, ChartTarget) or \
            t.failed_target != attempt_target(obs.chart.fingerprint, t):
        return decided.message
    when = f"; next attempt in {obs.retry_wait:.0f}s" if obs.retry_wait > 0 else ""
    return f"{decided.message} (failed {t.failures} time(s){when})"


def _action_word(action: Action | Need) -> str:
    if action in HELM_ACTIONS:
        return "install" if action in (Action.INSTALL, Action.UNINSTALL_THEN_INSTALL) \
            else "upgrade"
    words: dict[Action | Need, str] = {
        Action.SKIP: "skip", Action.BLOCKED: "blocked", Action.PAUSE: "paused",
        Action.NOT_TARGETED: "skip", Action.UNINSTALL: "uninstall", Action.NOTHING: "skip",
        Action.WAIT: "wait", Action.HOLD: "held", Action.STALLED: "blocked",
        Action.BACKOFF: "backoff", Action.DROP_FINALIZER: "uninstall",
        Action.OUTSIDE_WINDOW: "held"}
    return words.get(action, action.value)


def changes_pending(rows: list[Row]) -> bool:
    return any(r.action in ("install", "upgrade", "uninstall", "annotate") for r in rows)


def blocked(rows: list[Row]) -> bool:
    """A row that cannot proceed (a chart that does not load, a refused Tenant): `plan`
    must not report "nothing to do" for it."""
    return any(r.action == "blocked" for r in rows)
