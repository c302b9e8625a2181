"""Per-cluster status conditions, the phase and the aggregate Ready condition. Pure.

Conditions have the metav1.Condition shape. Per cluster ``c`` krypton owns
``ClusterReady/c``, ``ClusterError/c`` and ``ClusterProgress/c``, and ``RecordsGuarded/c``
(whether the release's records were guarded at admission when helm last ran on them, SPEC
S4: set by the helm runs' own commits, never a write of its own); the Tenant-wide ones are
``Paused`` and ``Ready`` (the summary, so that ``kubectl wait --for=condition=Ready`` works).
``lastTransitionTime`` changes only when a condition's status flips (SPEC R10).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from krypton.decisions import reasons

Condition = dict[str, Any]

READY = "ClusterReady/"
ERROR = "ClusterError/"
PROGRESS = "ClusterProgress/"
GUARD = "RecordsGuarded/"
PAUSED = "Paused"
SUMMARY = "Ready"

# An error with one of these reasons puts the Tenant in phase Error.
FATAL_REASONS = reasons.FATAL
# Chart errors that do not block Ready when ALLOW_CHART_SKIP=true.
CHART_REASONS = reasons.CHART


@dataclass(frozen=True)
class Change:
    """A condition to set: type, "True"/"False", reason, message; or, with status None, a
    condition to remove."""

    type: str
    status: bool | None
    reason: str
    message: str


def cluster_type(prefix: str, cluster: str) -> str:
    return f"{prefix}{cluster}"


def apply(
    conditions: Iterable[Mapping[str, Any]],
    changes: Iterable[Change],
    *,
    generation: int,
    now: str,
) -> list[Condition]:
    """A new condition list with `changes` applied; untouched conditions are kept as they are."""
    by_type: dict[str, Condition] = {c["type"]: dict(c) for c in conditions}
    for ch in changes:
        if ch.status is None:
            by_type.pop(ch.type, None)
            continue
        status = "True" if ch.status else "False"
        old = by_type.get(ch.type)
        transition = old["lastTransitionTime"] if old and old.get("status") == status else now
        by_type[ch.type] = {
            "type": ch.type,
            "status": status,
            "reason": ch.reason,
            "message": ch.message,
            "lastTransitionTime": transition,
            "observedGeneration": generation,
        }
    return sorted(by_type.values(), key=lambda c: str(c["type"]))


def holds(obj: Mapping[str, Any], type_: str, reason: str) -> bool:
    """Whether the object's condition `type_` is True with `reason`."""
    return any(c.get("type") == type_ and c.get("status") == "True" and c.get("reason") == reason
               for c in (obj.get("status") or {}).get("conditions") or [])


def remove(conditions: Iterable[Mapping[str, Any]], types: Iterable[str]) -> list[Condition]:
    gone = set(types)
    return [dict(c) for c in conditions if c["type"] not in gone]


def _true(conditions: Iterable[Mapping[str, Any]], prefix: str) -> list[Mapping[str, Any]]:
    return [c for c in conditions if str(c["type"]).startswith(prefix) and c["status"] == "True"]


# The Ready condition's message is the MESSAGE column of `kubectl get tenants`: kept to
# one short line (the per-cluster conditions keep the whole text).
SUMMARY_MESSAGE_LIMIT = 160
PHASES = ("Pending", "Ready", "Error", "Suspended")


def phase(conditions: Iterable[Mapping[str, Any]], *, allow_chart_skip: bool) -> str:
    """Suspended while paused by annotation; Error if a fatal error is true; Ready if a
    cluster is ready and nothing blocks; else Pending."""
    conditions = list(conditions)
    if _true(conditions, PAUSED):
        return "Suspended"
    return _working_phase(conditions, allow_chart_skip=allow_chart_skip)


def _working_phase(conditions: list[Mapping[str, Any]], *, allow_chart_skip: bool) -> str:
    errors = _true(conditions, ERROR)
    if any(c["reason"] in FATAL_REASONS for c in errors):
        return "Error"
    blocking = [c for c in errors if not (allow_chart_skip and c["reason"] in CHART_REASONS)]
    if _true(conditions, READY) and not blocking:
        return "Ready"
    return "Pending"


def servable(current_phase: str, accepted: frozenset[str] | None) -> str:
    """`current_phase`, or Pending when the cluster's (older) Tenant CRD does not accept it:
    `accepted` is the served CRD's phase enum, None when it accepts every phase."""
    return current_phase if accepted is None or current_phase in accepted else "Pending"


def summary(conditions: Iterable[Mapping[str, Any]], current_phase: str,
            *, allow_chart_skip: bool = False) -> Change:
    """The aggregate Ready condition for `current_phase`, its message one short line."""
    conditions = list(conditions)
    if current_phase == "Suspended":
        underneath = _working_phase(conditions, allow_chart_skip=allow_chart_skip)
        below = _summary(conditions, underneath)
        return Change(SUMMARY, below.status, "Suspended", _short(
            f"suspended by annotation (nothing is installed, upgraded or repaired); "
            f"{below.message}"))
    found = _summary(conditions, current_phase)
    return dataclasses.replace(found, message=_short(found.message))


def _short(message: str) -> str:
    line = message.splitlines()[0] if message else ""
    if len(line) > SUMMARY_MESSAGE_LIMIT or line != message:
        return line[:SUMMARY_MESSAGE_LIMIT - 3].rstrip() + "..."
    return line


def _summary(conditions: list[Mapping[str, Any]], current_phase: str) -> Change:
    if current_phase == "Ready":
        clusters = sorted(str(c["type"])[len(READY):] for c in _true(conditions, READY))
        return Change(SUMMARY, True, "Ready", f"ready on {', '.join(clusters)}")
    errors = _true(conditions, ERROR)
    if errors:
        first = sorted(errors, key=lambda c: str(c["type"]))[0]
        cluster = str(first["type"])[len(ERROR):]
        return Change(SUMMARY, False, str(first["reason"]), f"{cluster}: {first['message']}")
    progress = _true(conditions, PROGRESS)
    if progress:
        first = progress[0]
        return Change(SUMMARY, False, str(first["reason"]), str(first["message"]))
    return Change(SUMMARY, False, "Pending", "not installed on any cluster yet")


def summarize(
    conditions: Iterable[Mapping[str, Any]], *, allow_chart_skip: bool, generation: int, now: str
) -> tuple[str, list[Condition]]:
    """Phase and the condition list with the aggregate Ready condition refreshed."""
    conditions = list(conditions)
    current = phase(conditions, allow_chart_skip=allow_chart_skip)
    return current, apply(conditions,
                          [summary(conditions, current, allow_chart_skip=allow_chart_skip)],
                          generation=generation, now=now)


def without_times(conditions: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """Conditions reduced to what matters for "did anything change" comparisons."""
    return sorted((c["type"], c["status"], c["reason"], c["message"],
                   c.get("observedGeneration")) for c in conditions)
