"""Fleet tooling behind ``krypton plan``, ``krypton status`` and ``krypton register-cluster``
(SPEC O7). They read the same flags as ``krypton run`` and use the same code: discovery,
kubeconfig checks, chart resolution and the pure planner, so a plan shows exactly what the
operator's next pass would do.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from krypton.adapters.charts import ChartSource
from krypton.adapters.helm import Helm
from krypton.adapters.kube import Kube, configuration_for, configuration_in_cluster
from krypton.app.operator import watch_cluster
from krypton.decisions import crd, manifests, redact, safeyaml
from krypton.decisions import kubeconfig as kubeconfigs
from krypton.decisions.discovery import desired_clusters
from krypton.decisions.errors import KubeconfigRejected, TemporaryError
from krypton.decisions.fingerprint import deep_merge
from krypton.decisions.model import (
    ChartTarget,
    epoch_seconds,
    fingerprint_annotation,
    release_name,
)
from krypton.decisions.planner import HELM_ACTIONS, Action, plan
from krypton.decisions.releases import ReleaseIndex, decode_release
from krypton.decisions.settings import Settings
from krypton.runtime.fleet import SELF_CLUSTER, _cluster_values
from krypton.runtime.reconciler import ClusterView, namespace_state


@dataclass
class Row:
    cluster: str
    namespace: str
    tenant: str
    phase: str = ""
    release: str = ""
    chart_version: str = ""
    fingerprint: str = ""
    action: str = ""
    reason: str = ""
    change: str = ""  # what differs from what the release was made with (plan)
    detail: str = ""


@dataclass
class ClusterHandle:
    name: str
    kube: Kube | None
    values: dict[str, Any]
    error: str = ""


@contextlib.asynccontextmanager
async def _fleet_view(settings: Settings, prefix: str) -> AsyncIterator[
        tuple[Path, Kube, list[ClusterHandle]]]:
    """The watch cluster and a client per discovered cluster, all closed on the way out."""
    handles: list[ClusterHandle] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        home = await watch_cluster(settings, Path(tmp))
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
    handles = []
    for name, spec in sorted(specs.items()):
        try:
            kc = kubeconfigs.parse(spec.kubeconfig, trust=settings.trust_kubeconfig_secrets,
                                   allow_in_cluster=name == SELF_CLUSTER)
            values = deep_merge(settings.chart_values, _cluster_values(spec))
        except KubeconfigRejected as exc:
            handles.append(ClusterHandle(name, None, {}, f"{exc.reason}: {exc}"))
            continue
        cfg = configuration_in_cluster() if kc.in_cluster else None
        cfg = cfg or await configuration_for(kc, workdir / name,
                                             trust=settings.trust_kubeconfig_secrets)
        handles.append(ClusterHandle(name, Kube(cfg, name=name, timeout=settings.api_timeout),
                                     values))
    return handles


async def _tenants(kube: Kube, settings: Settings) -> list[dict[str, Any]]:
    tenants = await kube.list_tenants(settings.watch_namespace or None)
    return sorted(tenants, key=lambda t: (t["metadata"]["namespace"],
                                                           t["metadata"]["name"]))


FAILING_REASONS = ("WorkerFailed", "DuplicateCluster", "ClusterUnreachable", "CRDEnsureFailed",
                   "ClusterAccessDenied", "TenantCRDMissing")
FAILING_WINDOW = 600.0  # a Warning this recent on a cluster's Secret marks the cluster failing


async def _failing(home: Kube, settings: Settings) -> dict[str, str]:
    """Clusters whose Secret carries a recent failure Event from the operator (D8, D9)."""
    events = await home.list_events(settings.namespace)
    now = time.time()
    latest: dict[str, tuple[float, str]] = {}
    for e in events:
        involved = e.get("involvedObject") or {}
        stamp = e.get("lastTimestamp") or e.get("eventTime") or ""
        if involved.get("kind") != "Secret" or e.get("reason") not in FAILING_REASONS:
            continue
        when = epoch_seconds(stamp)
        if when is None:
            continue
        name = str(involved.get("name"))
        if now - when < FAILING_WINDOW and when >= latest.get(name, (0.0, ""))[0]:
            latest[name] = (when, f"{e['reason']}: {e.get('message', '')}")
    return {name: detail for name, (_, detail) in latest.items()}


async def _crd_outdated(kube: Kube) -> str | None:
    """Why the cluster's Tenant CRD is older than krypton's; None if current or unreadable."""
    try:
        served = await kube.get_crd()
    except TemporaryError:
        return None
    return crd.outdated(served) if served is not None else None


async def collect_status(settings: Settings) -> list[Row]:
    async with _fleet_view(settings, "krypton-status-") as (_, home, clusters):
        rows: list[Row] = []
        failing = await _failing(home, settings)
        for c in clusters:
            if c.name in failing:
                rows.append(Row(c.name, "", "", phase="Failing", detail=failing[c.name]))
            if c.kube is None:
                rows.append(Row(c.name, "", "", phase="-", detail=c.error))
                continue
            stale = await _crd_outdated(c.kube)
            if stale:
                rows.append(Row(c.name, "", "", phase="CRDOutdated",
                                detail=f"{stale}; fix: {crd.FIX}"))
            try:
                tenants = await _tenants(c.kube, settings)
            except TemporaryError as exc:
                rows.append(Row(c.name, "", "", phase="-", detail=f"unreachable: {exc}"))
                continue
            except Exception as exc:  # noqa: BLE001 - one cluster's garbage must not hide the fleet
                rows.append(Row(c.name, "", "", phase="-", detail=redact.describe(exc)))
                continue
            for t in tenants:
                status = t.get("status") or {}
                mine = (status.get("clusters") or {}).get(c.name) or {}
                meta = t["metadata"]
                rows.append(Row(c.name, meta["namespace"], meta["name"],
                                phase=status.get("phase") or "Pending",
                                release=mine.get("release") or release_name(meta["name"], c.name),
                                chart_version=mine.get("chartVersion", ""),
                                fingerprint=(mine.get("fingerprint") or "")[:12],
                                detail=_first_error(status, c.name)))
        return rows


def _first_error(status: dict[str, Any], cluster: str) -> str:
    for cond in status.get("conditions") or []:
        if cond["type"] == f"ClusterError/{cluster}" and cond["status"] == "True":
            return f"{cond['reason']}: {cond['message']}"
        if cond["type"] == f"ClusterProgress/{cluster}" and cond["reason"] == "NotTargeted":
            return "NotTargeted"
    return ""


async def rollout_summary(settings: Settings) -> str:
    """One line on the progressive rollout (F1), from its ConfigMap; empty when none."""
    from krypton.decisions.rollout import RolloutState
    from krypton.runtime.rollout_controller import CONFIGMAP

    with tempfile.TemporaryDirectory(prefix="krypton-status-") as tmp:
        home = await watch_cluster(settings, Path(tmp))
        try:
            cm = await home.get_configmap(settings.namespace, CONFIGMAP)
        except TemporaryError:
            return ""
        finally:
            await home.close()
    data = (cm or {}).get("data") or {}
    if "state.json" not in data:
        return ""
    state = RolloutState.from_json(data["state.json"])
    wave = min(state.wave + 1, len(state.waves))
    return (f"rollout {state.version}: {state.phase}, wave {wave}/{len(state.waves)} - "
            f"{state.message}")


def _chart_source(settings: Settings, tmp: Path) -> ChartSource:
    """The chart of the flags, pulled into `tmp` (the CLI's own cache, gone when it exits)."""
    return ChartSource(settings.chart_repo, settings.chart_name, settings.chart_version,
                       helm=Helm(settings.helm_path or settings.helm_executable),
                       cache_dir=tmp / "charts")


async def _release_records(kube: Kube, settings: Settings, release: str,
                           namespace: str) -> list[dict[str, Any]]:
    """The Helm release records of `release` in `namespace` (whole, data included)."""
    records = await kube.list_release_records(settings.helm_driver, namespace,
                                              f"owner=helm,name={release}")
    return [r for r in records if r["metadata"].get("namespace") == namespace]


async def collect_plan(settings: Settings) -> list[Row]:
    async with _fleet_view(settings, "krypton-plan-") as (tmp, _, clusters):
        chart = _chart_source(settings, tmp)
        rows: list[Row] = []
        for c in clusters:
            if c.kube is None:
                rows.append(Row(c.name, "", "", action="blocked", reason="KubeconfigRejected",
                                detail=c.error))
                continue
            try:
                rows += await _plan_cluster(c, c.kube, settings, chart)
            except TemporaryError as exc:
                rows.append(Row(c.name, "", "", action="blocked", reason="ClusterUnreachable",
                                detail=str(exc)))
        return rows


async def _plan_cluster(c: ClusterHandle, kube: Kube, settings: Settings,
                        chart: ChartSource) -> list[Row]:
    view = ClusterView(name=c.name, kube=kube, helm=chart.helm, chart=chart, settings=settings,
                       releases=ReleaseIndex(), tenants={}, values=c.values)
    rows = []
    for t in await _tenants(kube, settings):
        meta = t["metadata"]
        release = release_name(meta["name"], c.name)
        namespace = settings.release_namespace_for(meta["name"])
        records = await _release_records(kube, settings, release, namespace)
        for record in records:
            view.releases.on_event("ADDED", record)
        obs = view.observe(t)
        obs = dataclasses.replace(obs, tenant=dataclasses.replace(obs.tenant, has_finalizer=True),
                                  chart=await view.desired_chart())
        decided = plan(obs)
        if decided.action is Action.OBSERVE_NAMESPACE:
            state, owner = namespace_state(await kube.get_namespace(meta["name"]), obs.tenant.key)
            obs = dataclasses.replace(obs, namespace=state, namespace_owner=owner)
            decided = plan(obs)
        if decided.action is Action.OBSERVE_SHARED and isinstance(obs.chart, ChartTarget):
            decided = plan(dataclasses.replace(obs, shared=await view.shared_conflicts(
                obs.chart, release, namespace)))
        applied = ((t.get("status") or {}).get("clusters") or {}).get(c.name) or {}
        old_version = applied.get("chartVersion") or "-"
        old_fp = (meta.get("annotations") or {}).get(fingerprint_annotation(c.name)) or ""
        new_version = getattr(obs.chart, "version", "?")
        new_fp = getattr(obs.chart, "fingerprint", "")
        change = ""
        if isinstance(obs.chart, ChartTarget) and old_fp and old_fp != new_fp:
            deployed = deployed_release(records, settings.helm_driver)
            change = manifests.what_changed(
                (t.get("status") or {}).get("lastAppliedChart"), obs.chart.repo, obs.chart.name,
                obs.chart.version, None if deployed is None else deployed.get("config") or {},
                obs.chart.values)
        rows.append(Row(
            c.name, meta["namespace"], meta["name"], release=release,
            chart_version=f"{old_version} -> {new_version}",
            fingerprint=f"{old_fp[:12] or '-'} -> {new_fp[:12] or '-'}",
            action=_action_word(decided.action), reason=decided.reason, change=change,
            detail=decided.message))
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
        return decode_release(newest, driver)
    except ValueError:
        return None


async def collect_diff(settings: Settings) -> list[tuple[str, str]]:
    """For each Tenant x cluster the chart resolves for: (heading, unified diff) between the
    deployed manifest and what the next reconcile would apply (``helm template`` of the target
    chart with the cluster's effective values), Secrets masked. An empty diff: no change."""
    out: list[tuple[str, str]] = []
    async with _fleet_view(settings, "krypton-diff-") as (tmp, _, clusters):
        chart = _chart_source(settings, tmp)
        for c in clusters:
            if c.kube is None:
                out.append((f"{c.name}: not looked at", f"{c.error}\n"))
                continue
            view = ClusterView(name=c.name, kube=c.kube, helm=chart.helm, chart=chart,
                               settings=settings, releases=ReleaseIndex(), tenants={},
                               values=c.values)
            target = await view.desired_chart()
            if not isinstance(target, ChartTarget):
                out.append((f"{c.name}: not looked at", f"{target.reason}: {target.message}\n"))
                continue
            for t in await _tenants(c.kube, settings):
                target_cluster = ((t.get("spec") or {}).get("clusterRef") or {}).get("secretName")
                if target_cluster and target_cluster != c.name:
                    continue  # the Tenant is not this cluster's
                name = t["metadata"]["name"]
                release = release_name(name, c.name)
                namespace = settings.release_namespace_for(name)
                deployed = deployed_release(
                    await _release_records(c.kube, settings, release, namespace),
                    settings.helm_driver)
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
                new_docs = await chart.helm.template(target.path, release, namespace,
                                                     target.values)
                text = manifests.manifest_diff(old_docs, new_docs, before=before,
                                               after=f"{c.name}/{name} next (chart "
                                                     f"{target.version})")
                out.append((f"{c.name}/{t['metadata']['namespace']}/{name} ({release})", text))
    return out


def _action_word(action: Action) -> str:
    if action in HELM_ACTIONS:
        return "install" if action in (Action.INSTALL, Action.UNINSTALL_THEN_INSTALL) \
            else "upgrade"
    return {Action.SKIP: "skip", Action.BLOCKED: "blocked", Action.PAUSE: "paused",
            Action.NOT_TARGETED: "skip", Action.UNINSTALL: "uninstall",
            Action.NOTHING: "skip", Action.WAIT: "wait"}.get(action, action.value)


def changes_pending(rows: list[Row]) -> bool:
    return any(r.action in ("install", "upgrade", "uninstall", "annotate") for r in rows)


def blocked(rows: list[Row]) -> bool:
    """A row that cannot proceed (a chart that does not load, a refused Tenant): `plan`
    must not report "nothing to do" for it."""
    return any(r.action == "blocked" for r in rows)


def render(rows: list[Row], columns: list[tuple[str, str]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([dataclasses.asdict(r) for r in rows], indent=2)
    if fmt == "yaml":
        return str(yaml.safe_dump([dataclasses.asdict(r) for r in rows], sort_keys=False))
    table = [[title for title, _ in columns]]
    table += [[str(getattr(r, field)) for _, field in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in table)


STATUS_COLUMNS = [("CLUSTER", "cluster"), ("NAMESPACE", "namespace"), ("TENANT", "tenant"),
                  ("PHASE", "phase"), ("RELEASE", "release"), ("CHART", "chart_version"),
                  ("FINGERPRINT", "fingerprint"), ("DETAIL", "detail")]
PLAN_COLUMNS = [("CLUSTER", "cluster"), ("NAMESPACE", "namespace"), ("TENANT", "tenant"),
                ("ACTION", "action"), ("REASON", "reason"), ("CHART", "chart_version"),
                ("FINGERPRINT", "fingerprint"), ("CHANGE", "change"), ("DETAIL", "detail")]


async def register_cluster(settings: Settings, name: str, kubeconfig_path: str,
                           context: str | None, values_path: str | None) -> str:
    """Inline, reduce and check a kubeconfig, probe its server, write the labelled Secret."""
    path = Path(kubeconfig_path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeconfigRejected(f"cannot read {path}: {exc.strerror}") from exc
    inlined = kubeconfigs.inline_files(text, str(path.parent))
    kc = kubeconfigs.parse(inlined, context=context)
    with tempfile.TemporaryDirectory(prefix="krypton-register-") as tmp:
        probe = Kube(await configuration_for(kc, Path(tmp)), name=name,
                     timeout=settings.api_timeout)
        try:
            version = await probe.server_version()
        finally:
            await probe.close()
        data = {settings.kubeconfig_key: base64.b64encode(kc.to_yaml().encode()).decode()}
        if values_path:
            try:
                raw = Path(values_path).read_bytes()
                safeyaml.load_values(raw, what=values_path)
            except OSError as exc:
                raise KubeconfigRejected(f"cannot read {values_path}: {exc.strerror}",
                                         reason="ValuesInvalid") from exc
            except safeyaml.YamlRejected as exc:
                raise KubeconfigRejected(str(exc), reason="ValuesInvalid") from exc
            data["values.yaml"] = base64.b64encode(raw).decode()
        home = await watch_cluster(settings, Path(tmp))
        try:
            verb = await _write_cluster_secret(home, settings, name, data)
        finally:
            await home.close()
    warn = "".join(f"\nwarning: {w}" for w in kc.warnings)
    return (f"cluster {name} ({kc.server}, {version}) registered: Secret "
            f"{settings.namespace}/{name} {verb}{warn}")


async def _write_cluster_secret(home: Kube, settings: Settings, name: str,
                                data: dict[str, str]) -> str:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": {settings.kubeconfig_label: "true",
                                "app.kubernetes.io/managed-by": "krypton"}},
        "type": "Opaque", "data": data}
    existing = await home.get_secret(settings.namespace, name)
    if existing is None:
        await home.create_secret(settings.namespace, body)
        return "created"
    body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    await home.replace_secret(settings.namespace, name, body)
    return "updated"

