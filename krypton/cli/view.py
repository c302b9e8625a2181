"""What ``krypton status`` and ``plan`` print: rows, tables, the rollout's progress and the
frames of ``status --watch``. Pure: Tenants and the rollout state in, text out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from krypton.decisions import crd
from krypton.decisions.clusters.discovery import PROFILE
from krypton.decisions.fleetview import (
    Row,
)
from krypton.decisions.model import REPORTING_CONTROLLER, epoch_seconds
from krypton.decisions.rollouts.rollout import COMPLETE, HALTED, RolloutState
from krypton.decisions.trust.printable import escape, escape_lines

STATUS_COLUMNS = [("CLUSTER", "cluster"), ("NAMESPACE", "namespace"), ("TENANT", "tenant"),
                  ("PHASE", "phase"), ("RELEASE", "release"), ("CHART", "chart_version"),
                  ("FINGERPRINT", "fingerprint"), ("DETAIL", "detail")]
WIDE_COLUMNS = STATUS_COLUMNS + [("MESSAGE", "message")]
PLAN_COLUMNS = [("CLUSTER", "cluster"), ("NAMESPACE", "namespace"), ("TENANT", "tenant"),
                ("ACTION", "action"), ("REASON", "reason"), ("CHART", "chart_version"),
                ("FINGERPRINT", "fingerprint"), ("CHANGE", "change"), ("DETAIL", "detail")]


def with_replicas(columns: list[tuple[str, str]], rows: list[Row]) -> list[tuple[str, str]]:
    """The columns, with REPLICA after CLUSTER when a sharded fleet said who serves what."""
    if not any(r.replica for r in rows):
        return columns
    return [columns[0], ("REPLICA", "replica"), *columns[1:]]


def with_sources(columns: list[tuple[str, str]], rows: list[Row]) -> list[tuple[str, str]]:
    """The columns, with SOURCE after CLUSTER when a cluster was found as a ClusterProfile."""
    if not any(r.source == PROFILE for r in rows):
        return columns
    return [columns[0], ("SOURCE", "source"), *columns[1:]]


def assign_sources(rows: list[Row], sources: Mapping[str, str]) -> list[Row]:
    for row in rows:
        row.source = sources.get(row.cluster, "")
    return rows


def assign_replicas(rows: list[Row], replicas: Mapping[str, str]) -> list[Row]:
    for row in rows:
        row.replica = replicas.get(row.cluster, "-" if replicas else "")
    return rows


FAILING_REASONS = ("WorkerFailed", "DuplicateCluster", "ClusterUnreachable", "CRDEnsureFailed",
                   "ClusterAccessDenied", "TenantCRDMissing", "CredentialPluginFailed")
FAILING_WINDOW = 600.0  # a Warning this recent on a cluster's Secret marks the cluster failing
CLUSTER_KINDS = ("Secret", PROFILE)  # what a cluster was found as (D10)


def failing_clusters(events: Iterable[Mapping[str, Any]], now: float) -> dict[str, str]:
    """Clusters whose Secret or profile carries a recent failure Event from the operator (D8,
    D9, D10), with
    the newest such Event's reason and message. Only Events whose reporting controller is
    krypton's count (SPEC S2): anyone who may create Events in the namespace can write one
    with any reason and message, and an administrator must not read it as the operator's."""
    latest: dict[str, tuple[float, str]] = {}
    for e in events:
        involved = e.get("involvedObject") or {}
        stamp = e.get("lastTimestamp") or e.get("eventTime") or ""
        if involved.get("kind") not in CLUSTER_KINDS or e.get("reason") not in FAILING_REASONS \
                or e.get("reportingComponent") != REPORTING_CONTROLLER:
            continue
        when = epoch_seconds(stamp)
        if when is None:
            continue
        name = str(involved.get("name"))
        if now - when < FAILING_WINDOW and when >= latest.get(name, (0.0, ""))[0]:
            latest[name] = (when, f"{e['reason']}: {e.get('message', '')}")
    return {name: text for name, (_, text) in latest.items()}


def standing_notes(events: Iterable[Mapping[str, Any]], said: str, ended: str
                   ) -> dict[str, str]:
    """Clusters on which the operator's newest Event of the pair (`said`, `ended`) is
    `said`, with what it said: a standing state, such as releases of undiscovered cluster
    names (OrphanedReleases / OrphanedReleasesGone) or release records without their guard
    (RecordsUnguarded / RecordsGuarded). Only krypton's own Events count."""
    latest: dict[str, tuple[float, str, str]] = {}
    for e in events:
        involved = e.get("involvedObject") or {}
        if involved.get("kind") not in CLUSTER_KINDS \
                or e.get("reportingComponent") != REPORTING_CONTROLLER \
                or e.get("reason") not in (said, ended):
            continue
        when = epoch_seconds(e.get("lastTimestamp") or e.get("eventTime") or "")
        name = str(involved.get("name"))
        if when is not None and when >= latest.get(name, (0.0, "", ""))[0]:
            latest[name] = (when, str(e["reason"]), str(e.get("message", "")))
    return {name: message for name, (_, reason, message) in latest.items() if reason == said}


def orphan_notes(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    return standing_notes(events, "OrphanedReleases", "OrphanedReleasesGone")


def unguarded_notes(events: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    return standing_notes(events, "RecordsUnguarded", "RecordsGuarded")


def cluster_rows(cluster: str, *, failing: str = "", rejected: str = "", stale: str = "",
                 unreachable: str = "", orphans: str = "", unguarded: str = "") -> list[Row]:
    """The rows about the cluster itself, before its Tenants' rows: failing (its Secret's
    recent Warning), a refused kubeconfig, an outdated Tenant CRD, an unreachable server,
    releases left by a cluster name no longer discovered, release records without their
    guard."""
    rows = []
    if failing:
        rows.append(Row(cluster, "", "", phase="Failing", detail=failing))
    if orphans:
        rows.append(Row(cluster, "", "", phase="Orphans", detail=f"OrphanedReleases: {orphans}"))
    if unguarded:
        rows.append(Row(cluster, "", "", phase="Unguarded",
                        detail=f"RecordsUnguarded: {unguarded}"))
    if rejected:
        rows.append(Row(cluster, "", "", phase="-", detail=rejected))
    if stale:
        rows.append(Row(cluster, "", "", phase="CRDOutdated", detail=f"{stale}; fix: {crd.FIX}"))
    if unreachable:
        rows.append(Row(cluster, "", "", phase="-", detail=unreachable))
    return rows


def render(rows: list[Row], columns: list[tuple[str, str]], fmt: str) -> str:
    """The rows as a table (every cell escaped for the terminal), JSON or YAML (whose
    encoders escape control characters themselves)."""
    if fmt == "json":
        return json.dumps([dataclasses.asdict(r) for r in rows], indent=2)
    if fmt == "yaml":
        return str(yaml.safe_dump([dataclasses.asdict(r) for r in rows], sort_keys=False))
    table = [[title for title, _ in columns]]
    table += [[escape(str(getattr(r, field))) for _, field in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in table)


def diff_section(heading: str, text: str) -> str:
    """One Tenant x cluster of ``krypton diff``: its heading and the unified diff, both
    escaped for the terminal (a manifest holds whatever a chart or values put there)."""
    return escape(f"=== {heading}: {'differs' if text else 'no change'}") + "\n" + \
        escape_lines(text)


def bar(done: int, total: int, width: int = 20) -> str:
    """``[#########-----------] 9/20``: `done` of `total`, in `width` cells."""
    filled = width if total and done >= total else (width * done // total if total else 0)
    return f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}"


def progress(rows: list[Row], rollout: RolloutState | None) -> list[str]:
    """The fleet's progress: with a progressive rollout, its waves and the releases of its
    clusters at the target version and ready; without one, the releases ready."""
    tenants = [r for r in rows if r.tenant and r.detail != "NotTargeted"
               and not r.detail.startswith("UnknownCluster")]
    if rollout is None or not rollout.waves:
        ready = sum(r.ready for r in tenants)
        return [f"releases ready  {bar(ready, len(tenants))}"]
    clusters = {c for wave in rollout.waves for c in wave}
    targeted = [r for r in tenants if r.cluster in clusters]
    done = sum(r.ready and r.chart_version == rollout.version for r in targeted)
    waves = len(rollout.waves) if rollout.phase == COMPLETE else rollout.wave
    said = f" - {rollout.message}" if rollout.message and rollout.phase != HALTED else ""
    lines = [f"rollout to {rollout.version}: {rollout.phase}{said}",
             f"  waves     {bar(waves, len(rollout.waves))}",
             f"  releases  {bar(done, len(targeted))} at {rollout.version} and ready"]
    if rollout.budget_unit:  # the failure budget of the wave in progress (F8)
        lines.append(f"  failures  {rollout.budget_used} of {rollout.budget} "
                     f"{rollout.budget_unit} allowed in the wave")
    for cluster, seen in sorted(rollout.gates.items()):  # the metric gate of the wave (F7)
        lines.append(f"  gate      {cluster}: {seen.get('result', '?')} "
                     f"({str(seen.get('value', ''))[:80]}; {seen.get('failures', 0)} failed, "
                     f"{seen.get('passes', 0)} passed)")
    if rollout.phase == HALTED:
        lines.append(f"  halted: {rollout.message}")
    return [escape(line) for line in lines]  # the rollout ConfigMap is written by others too


def frame(rows: list[Row], rollout: RolloutState | None, *, wide: bool, when: str,
          width: int | None = None) -> str:
    """One screen of ``krypton status --watch``; lines clipped to `width` (a terminal's)."""
    lines = [f"krypton status --watch  {when}  (Ctrl-C to quit)", ""]
    lines += progress(rows, rollout)
    lines += ["", render(rows, with_sources(with_replicas(WIDE_COLUMNS if wide else STATUS_COLUMNS,
                                                          rows), rows),
                         "table")]
    text = "\n".join(lines)
    if width:
        text = "\n".join(line[:width] for line in text.splitlines())
    return text
