"""The fleet as a person sees it (SPEC O7, O16): one row per Tenant x cluster, what its cell
says in one word, the summary above a matrix and the filters of a view. Pure: Tenants in,
rows out; ``krypton status`` and the fleet page both show these, so they say the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from krypton.decisions.model import release_name
from krypton.decisions.rollouts.rollout import COMPLETE, RolloutState
from krypton.decisions.rollouts.rollout import PROGRESSING as ROLLING


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
    message: str = ""  # the Tenant's Ready message (status --wide)
    ready: bool = False  # ClusterReady/<cluster> is True
    replica: str = ""  # under --sharding: the replica serving the cluster
    source: str = ""  # what the cluster was found as: Secret or ClusterProfile (D10)
    state: str = ""  # the release's state on the cluster in one word (:func:`state`)
    since: str = ""  # when ClusterReady/<cluster> last changed (RFC 3339)
    held: str = ""  # what holds its next change back (a window, the rollout): "reason: message"



def tenant_rows(cluster: str, tenants: Iterable[Mapping[str, Any]]) -> list[Row]:
    """One row per Tenant on `cluster`, sorted by namespace and name."""
    rows = []
    for t in sorted(tenants, key=lambda t: (t["metadata"].get("namespace", ""),
                                            t["metadata"]["name"])):
        status = t.get("status") or {}
        mine = (status.get("clusters") or {}).get(cluster) or {}
        meta = t["metadata"]
        by_type = {c.get("type"): c for c in status.get("conditions") or []}
        ready_cond = by_type.get(f"ClusterReady/{cluster}") or {}
        rows.append(Row(cluster, meta.get("namespace", ""), meta["name"],
                        phase=status.get("phase") or "Pending",
                        release=mine.get("release") or release_name(meta["name"], cluster),
                        chart_version=with_digest(mine.get("chartVersion", ""),
                                                  mine.get("chartDigest", "")),
                        fingerprint=(mine.get("fingerprint") or "")[:12],
                        detail=joined(detail(by_type, cluster) + attempts(mine, by_type, cluster),
                                      update_notice(mine.get("chartVersion") or "",
                                                    mine.get("newerVersion") or "")),
                        message=(by_type.get("Ready") or {}).get("message", ""),
                        ready=ready_cond.get("status") == "True",
                        state=state(by_type, cluster),
                        since=str(ready_cond.get("lastTransitionTime") or ""),
                        held=held(by_type, cluster)))
    return rows



HELD = ("OutsideMaintenanceWindow", "RolloutAwaitingApproval", "RolloutPaused",
        "RolloutPending", "RolloutHalted")  # a ClusterProgress reason that holds a change back


def held(by_type: Mapping[str, Mapping[str, Any]], cluster: str) -> str:
    """What holds the release's next change back on `cluster`, as its ClusterProgress says
    it (not progressing, with one of the HELD reasons); "" when nothing does."""
    progress = by_type.get(f"ClusterProgress/{cluster}") or {}
    if progress.get("status") == "False" and progress.get("reason") in HELD:
        return f"{progress.get('reason')}: {progress.get('message')}"
    return ""


def attempts(mine: Mapping[str, Any], by_type: Mapping[str, Mapping[str, Any]],
             cluster: str) -> str:
    """A failing release's retry state (R18): how often it failed and when it is tried
    again; nothing once it succeeded or stalled (RetriesExhausted says it all)."""
    error = by_type.get(f"ClusterError/{cluster}") or {}
    failures = mine.get("failures")
    if error.get("status") != "True" or not isinstance(failures, int) or failures <= 0 \
            or error.get("reason") == "RetriesExhausted":
        return ""
    return f" [failed {failures}x; next attempt {mine.get('nextAttemptTime') or 'soon'}]"


def update_notice(version: str, newer: str) -> str:
    """What a row says of a newer chart in the repository that the settings do not take."""
    return f"chart {newer} is available (the settings take {version})" if newer else ""


def joined(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def with_digest(version: str, digest: str) -> str:
    """A chart version as shown, with the start of its OCI digest: ``1.2.3@sha256:0a1b2c3d4e5f``."""
    return f"{version}@{digest[:19]}" if version and digest else version


def detail(by_type: Mapping[str, Mapping[str, Any]], cluster: str) -> str:
    """What a row says about the Tenant on `cluster`: its error, else what is in progress
    (an install that takes minutes says so), else NotTargeted or Suspended."""
    for kind in ("ClusterError/", "ClusterProgress/"):
        c = by_type.get(f"{kind}{cluster}")
        if c and c.get("status") == "True":
            return f"{c.get('reason')}: {c.get('message')}"
    progress = by_type.get(f"ClusterProgress/{cluster}") or {}
    if progress.get("reason") == "NotTargeted":
        return "NotTargeted"
    if progress.get("reason") == "UnknownCluster":
        return f"UnknownCluster: {progress.get('message')}"
    paused = by_type.get("Paused") or {}
    if paused.get("status") == "True":
        return f"Suspended: {paused.get('message')}"
    return ""


# what a cell says, in the order they win: a word a person reads, and the reason behind it
STALLED, UNTRUSTED, FAILED = "Stalled", "Untrusted", "Failed"
PROGRESSING, READY, PENDING = "Progressing", "Ready", "Pending"
NOT_TARGETED, SUSPENDED = "NotTargeted", "Suspended"
STATES = (READY, PROGRESSING, PENDING, FAILED, STALLED, UNTRUSTED, SUSPENDED, NOT_TARGETED)
WAITING = (PROGRESSING, PENDING)
FAILING = (FAILED, STALLED, UNTRUSTED)


def state(by_type: Mapping[str, Mapping[str, Any]], cluster: str) -> str:
    """The release's state on `cluster` in one word, from the Tenant's conditions."""
    error = by_type.get(f"ClusterError/{cluster}") or {}
    if error.get("status") == "True":
        return {"RetriesExhausted": STALLED, "ReleaseRecordUntrusted": UNTRUSTED}.get(
            str(error.get("reason")), FAILED)
    progress = by_type.get(f"ClusterProgress/{cluster}") or {}
    if progress.get("reason") in ("NotTargeted", "UnknownCluster"):
        return NOT_TARGETED
    if (by_type.get("Paused") or {}).get("status") == "True":
        return SUSPENDED
    if progress.get("status") == "True":
        return PROGRESSING
    if (by_type.get(f"ClusterReady/{cluster}") or {}).get("status") == "True":
        return READY
    return PENDING


@dataclass(frozen=True)
class Summary:
    """The line above the matrix: releases by chart version and by state."""

    releases: int
    versions: tuple[tuple[str, int], ...]  # (version, releases), most first
    states: tuple[tuple[str, int], ...]  # (state, releases), in STATES' order

    @property
    def ready(self) -> int:
        return dict(self.states).get(READY, 0)

    @property
    def failing(self) -> int:
        return sum(n for s, n in self.states if s in FAILING)

    @property
    def waiting(self) -> int:
        return sum(n for s, n in self.states if s in WAITING)


def summary(rows: Iterable[Row]) -> Summary:
    """How many releases on each chart version and in each state (a Tenant a cluster does
    not target is no release of it)."""
    targeted = [r for r in rows if r.state != NOT_TARGETED]
    versions = Counter(r.chart_version or "no version yet" for r in targeted)
    states = Counter(r.state for r in targeted)
    return Summary(len(targeted), tuple(sorted(versions.items(), key=lambda v: (-v[1], v[0]))),
                   tuple((s, states[s]) for s in STATES if states[s]))


FILTER_KEYS = ("cluster", "tenant", "state", "version")
FILTER_MAX = 200  # characters of one filter's value: a longer one is cut there


@dataclass(frozen=True)
class Filters:
    """What a view shows (each in its URL): a row matches when every filter given is a part
    of its field (the Tenant's as namespace/name), case ignored."""

    cluster: str = ""
    tenant: str = ""
    state: str = ""
    version: str = ""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        """From a query's parameters: the known ones, each bounded; the others ignored."""
        return cls(**{k: str(query.get(k) or "")[:FILTER_MAX].strip() for k in FILTER_KEYS})

    def given(self) -> dict[str, str]:
        return {k: v for k in FILTER_KEYS if (v := getattr(self, k))}

    def keep(self, row: Row) -> bool:
        fields = {"cluster": row.cluster, "tenant": f"{row.namespace}/{row.tenant}",
                  "state": row.state, "version": row.chart_version}
        return all(v.lower() in fields[k].lower() for k, v in self.given().items())


def matrix(rows: Iterable[Row]) -> tuple[list[str], list[str], dict[tuple[str, str], Row]]:
    """The rows as a matrix: the clusters, the Tenants (namespace/name) and the cell of each
    (cluster, Tenant) that has one."""
    cells = {(r.cluster, f"{r.namespace}/{r.tenant}"): r for r in rows if r.tenant}
    return (sorted({c for c, _ in cells}), sorted({t for _, t in cells}), cells)


@dataclass(frozen=True)
class Wave:
    """A wave of the rollout as the page shows it: its clusters, how many of their releases
    are Ready at the rollout's version, and where it stands (done, current or to come)."""

    number: int
    clusters: tuple[str, ...]
    at_version: int
    releases: int
    place: str
    windows: tuple[str, ...] = ()  # its clusters' closed maintenance windows, as they say them


def waves(rollout: RolloutState, rows: Iterable[Row]) -> list[Wave]:
    """The rollout's waves in order, each with its releases' progress."""
    targeted = [r for r in rows if r.state != NOT_TARGETED]
    out = []
    for i, clusters in enumerate(rollout.waves):
        mine = [r for r in targeted if r.cluster in clusters]
        place = "current" if i == rollout.wave and rollout.phase != COMPLETE else \
            "done" if i < rollout.wave else "next"
        windows = sorted({f"{r.cluster}: {r.held.partition(': ')[2]}" for r in mine
                          if r.held.startswith("OutsideMaintenanceWindow")})
        out.append(Wave(i + 1, tuple(clusters),
                        sum(r.state == READY and r.chart_version.split("@")[0] == rollout.version
                            for r in mine), len(mine), place, tuple(windows)))
    return out


def actions(rollout: RolloutState) -> list[tuple[str, str, str]]:
    """What a person may do about the rollout now (F9): each action, in words, and the
    command that does it."""
    if rollout.phase != ROLLING:
        return []
    possible = (["approve"] if rollout.awaiting else []) + \
        ["resume" if rollout.paused else "pause", "abort"]
    words = {"approve": f"approve wave {rollout.wave + 1}", "resume": "resume it",
             "pause": "pause it", "abort": "abort it"}
    return [(a, words[a], f"krypton rollout {a} --by <your name>") for a in possible]
