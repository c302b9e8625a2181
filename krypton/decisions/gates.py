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
    seen = dict(seen or {"failures": 0, "passes": 0})
    seen["value"], seen["result"], seen["at"] = reading.value, reading.result, now
    if reading.result == UNANSWERED:
        seen.setdefault("unanswered_since", now)
        if seen["unanswered_since"] is None:
            seen["unanswered_since"] = now
        return seen
    seen["unanswered_since"] = None
    seen["failures" if reading.result == FAILED else "passes"] += 1
    if reading.result == PASSED:
        seen["last_passed"] = now
    return seen


def verdict(gates: dict[str, dict[str, Any]], wave: tuple[str, ...], policy: GatePolicy,
            soaked: bool, now: float) -> tuple[str, str]:
    """("failed", why) when the wave's gate failed, ("passed", "") when it passed (needs the
    soak over), else ("waiting", what for)."""
    for cluster in wave:
        seen = gates.get(cluster) or {}
        if int(seen.get("failures", 0)) >= policy.failures:
            return "failed", (f"metric gate failed on {cluster}: {policy.query!r} gave "
                              f"{seen.get('value')} ({seen.get('failures')} failed "
                              f"evaluation(s), {policy.failures} allowed)")[:900]
        since = seen.get("unanswered_since")
        if since is not None and now - float(since) > policy.deadline:
            return "failed", (f"metric gate failed on {cluster}: no answer for "
                              f"{now - float(since):.0f}s (deadline {policy.deadline:.0f}s): "
                              f"{seen.get('value')}")[:900]
    pending = [c for c in wave if (gates.get(c) or {}).get("result") != PASSED]
    if not soaked or pending:
        return "waiting", (f"metric gate: waiting for {', '.join(pending)}" if pending
                           else "metric gate: soaking")
    return "passed", ""
