"""``krypton plan`` and ``krypton diff`` (SPEC O7, SPEC O12): what the operator's next pass
would do per Tenant x cluster, and the manifest it would apply. They use the operator's own
discovery, chart resolution and pure planner. Kept apart from ``tools`` so that ``status``
and ``register-cluster`` do not load helm's wrapper and the runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from krypton.adapters.charts import ChartSource, chart_access
from krypton.adapters.helm import Helm, HelmEngine
from krypton.adapters.helmworker import HelmWorkerEngine
from krypton.adapters.kube import Kube
from krypton.cli.fleet import ClusterHandle, fleet_view, tenants_of
from krypton.cli.status import rollout_state
from krypton.cli.view import Row, assign_sources
from krypton.decisions.charts import manifests
from krypton.decisions.charts.fingerprint import fingerprint
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
from krypton.runtime.diffs import (
    Decided,
    deployed_release,
    fixed_objects_dropped,
    release_records,
    tenant_diff,
)
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
    worker = HelmWorkerEngine(settings.helm_worker_path or settings.helm_worker,
                        timeout=settings.helm_timeout)
    try:
        yield worker
    finally:
        await worker.close()


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
        records = await release_records(kube, settings, release, namespace)
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
                gone = await fixed_objects_dropped(view, kube, obs.chart, deployed, release)
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
            said = await tenant_diff(c.name, c.kube, settings, render, d)
            if said is not None:
                out.append(said)
    return out


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
