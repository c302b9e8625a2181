"""Metric gates of the progressive rollout (SPEC F7): what one PromQL evaluation says about
one cluster, and what a wave's evaluations add up to. Pure.

The semantics follow the metric analysis of Argo Rollouts and Flagger:

- The query is evaluated as an instant query, once per cluster of the wave, with every
  ``$cluster`` replaced by that cluster's name (as the inside of a PromQL string: ``"`` and
  ``\\`` escaped). The wave's releases must be Ready first: evaluations run during the soak,
  every ``--rollout-gate-interval``.
- One evaluation *passes* when the server answers with a non-empty result and every value
  in it is a finite number other than 0: a comparison such as ``rate(errors[1m]) < 0.01``
  returns its samples only when it holds, the ``bool`` form returns 1 or 0. An empty result
  (no data, or the comparison does not hold) or a 0/NaN/Inf value *fails* it.
- The wave fails, and the rollout halts (reverting with ``--rollout-auto-revert``), once a
  cluster's failed evaluations reach ``--rollout-gate-failures``.
- An evaluation the server does not answer (unreachable, an HTTP error, an error status) is
  neither: it is retried at the next interval. A cluster that got no answer for longer than
  ``--rollout-wave-deadline`` fails the wave.
- The wave passes when the soak is over and every cluster of the wave has a passing last
  evaluation made during the soak (at least one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PASSED, FAILED, UNANSWERED = "passed", "failed", "unanswered"
MAX_SHOWN = 5  # samples quoted in a value


@dataclass(frozen=True)
class Reading:
    """One evaluation for one cluster."""

    result: str  # PASSED, FAILED or UNANSWERED
    value: str  # what the server said, short: "0.003", "empty", "HTTP 503", ...


def query_for(query: str, cluster: str) -> str:
    """The query with every ``$cluster`` replaced by `cluster` as a PromQL string's inside."""
    return query.replace("$cluster", cluster.replace("\\", "\\\\").replace('"', '\\"'))


def _number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _shown(value: float) -> str:
    return f"{value:.6g}"


def judge(answer: Any) -> Reading:
    """The Reading of a Prometheus HTTP API answer (``/api/v1/query``'s JSON document)."""
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        return Reading(UNANSWERED, f"error: {str(error)[:120]}" if error else "no valid answer")
    data = answer.get("data")
    if not isinstance(data, dict):
        return Reading(UNANSWERED, "no data in the answer")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        values = [_number(result[1])]
    elif kind == "vector" and isinstance(result, list):
        values = [_number(s.get("value", [None, None])[1]) if isinstance(s, dict) else None
                  for s in result]
    else:
        return Reading(UNANSWERED, f"result type {str(kind)[:20]!r} is not a vector or scalar")
    if not values:
        return Reading(FAILED, "empty")
    shown = ", ".join("?" if v is None else _shown(v) for v in values[:MAX_SHOWN])
    shown += f" (+{len(values) - MAX_SHOWN})" if len(values) > MAX_SHOWN else ""
    good = all(v is not None and math.isfinite(v) and v != 0 for v in values)
    return Reading(PASSED if good else FAILED, shown)


@dataclass(frozen=True)
class GatePolicy:
    query: str = ""
    failures: int = 1  # failed evaluations of one cluster that fail the wave
    deadline: float = 600.0  # seconds without an answer that fail the wave

    @property
    def enabled(self) -> bool:
        return bool(self.query)


def record(seen: dict[str, Any] | None, reading: Reading, now: float) -> dict[str, Any]:
    """A cluster's gate record (as kept in the rollout state) after `reading` at `now`."""
    seen = dict(seen or {"failures": 0, "passes": 0, "unanswered_since": None})
    seen["value"], seen["result"], seen["at"] = reading.value, reading.result, now
    if reading.result == UNANSWERED:
        if seen.get("unanswered_since") is None:
            seen["unanswered_since"] = now
        return seen
    seen["unanswered_since"] = None
    seen["failures" if reading.result == FAILED else "passes"] += 1
    return seen


def cleaned(raw: Any) -> dict[str, Any] | None:
    """A gate record as read back from the rollout ConfigMap, well-typed, or None (that
    cluster is evaluated afresh). Whoever may write ConfigMaps in the namespace can write
    it: what it says is believed only as far as such a writer could set the rollout's phase
    anyway; a value of the wrong type must not stop the rollout controller."""
    if not isinstance(raw, dict) or raw.get("result") not in (PASSED, FAILED, UNANSWERED):
        return None
    try:
        failures, passes = int(raw.get("failures", 0)), int(raw.get("passes", 0))
        at = float(raw.get("at", 0.0))
        since = raw.get("unanswered_since")
        since = None if since is None else float(since)
    except (TypeError, ValueError, OverflowError):
        return None
    if failures < 0 or passes < 0 or not math.isfinite(at) or \
            (since is not None and not math.isfinite(since)):
        return None
    return {"result": raw["result"], "value": str(raw.get("value", ""))[:200],
            "failures": failures, "passes": passes, "at": at, "unanswered_since": since}


def failing(gates: dict[str, dict[str, Any]], wave: tuple[str, ...], policy: GatePolicy,
            now: float) -> list[tuple[str, str]]:
    """(cluster, why) for each cluster of the wave whose gate failed: too many failed
    evaluations, or no answer for longer than the deadline."""
    out = []
    for cluster in wave:
        seen = gates.get(cluster) or {}
        since = seen.get("unanswered_since")
        if seen.get("failures", 0) >= policy.failures:
            out.append((cluster, f"metric gate failed on {cluster}: {policy.query!r} gave "
                                 f"{seen.get('value')} ({seen.get('failures')} failed "
                                 f"evaluation(s), {policy.failures} allowed)"[:900]))
        elif since is not None and now - since > policy.deadline:
            out.append((cluster, f"metric gate failed on {cluster}: no answer for "
                                 f"{now - since:.0f}s (deadline {policy.deadline:.0f}s): "
                                 f"{seen.get('value')}"[:900]))
    return out


def waiting_for(gates: dict[str, dict[str, Any]], wave: tuple[str, ...], soaked: bool) -> str:
    """What a wave whose gate has not failed still waits for ("" once it passed): the soak,
    or a passing last evaluation of each of its clusters."""
    pending = [c for c in wave if (gates.get(c) or {}).get("result") != PASSED]
    if pending:
        return f"metric gate: waiting for {', '.join(pending)}"
    return "" if soaked else "metric gate: soaking"
