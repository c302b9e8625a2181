"""What a pass came to, as the conditions of its cluster, its Event and the next attempt.
Pure.

An action reports a :class:`Verdict` with a reason and a message; :func:`tell` turns it
into what the pass's one commit says (:class:`Told`): the ``ClusterReady/<c>``,
``ClusterError/<c>`` and ``ClusterProgress/<c>`` changes (:func:`changes`, from one table,
:data:`SHAPES`), the Event that goes with them and when the key comes back
(:class:`Outcome`). A helm run that failed is counted against its target by
:func:`failed_attempt`, which says when the next attempt is due and whether the release is
stalled (SPEC R18).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from krypton.decisions import conditions as cond
from krypton.decisions import retry
from krypton.decisions.conditions import Change

NO_ERROR = "no error"


class Verdict(enum.Enum):
    FAILED = "failed"  # an error that leaves the release not Ready (helm failed, stalled,
    #                    the workload unhealthy, an uninstall refused)
    BLOCKED = "blocked"  # an error before anything changed: Ready stays as it was
    ERROR = "error"  # an error beside the rest (a revert that failed)
    NOTED = "noted"  # nothing to do here, and why (another cluster's, held)
    ANNOUNCED = "announced"  # a helm run under way
    WAITING = "waiting"  # applied before, its workload not ready yet
    APPLIED = "applied"  # applied now, Ready
    APPLIED_WAITING = "applied-waiting"  # applied now, its workload not ready yet
    UNRECORDED = "unrecorded"  # applied now, the fingerprint annotation not written


ERRORS = frozenset({Verdict.FAILED, Verdict.BLOCKED, Verdict.ERROR, Verdict.UNRECORDED})

# Verdict -> (Ready, Error, Progress); None leaves the condition as it is
SHAPES: dict[Verdict, tuple[bool | None, bool | None, bool | None]] = {
    Verdict.FAILED: (False, True, False),
    Verdict.BLOCKED: (None, True, False),
    Verdict.ERROR: (None, True, None),
    Verdict.NOTED: (None, None, False),
    Verdict.ANNOUNCED: (None, None, True),
    Verdict.WAITING: (False, None, True),
    Verdict.APPLIED: (True, False, False),
    Verdict.APPLIED_WAITING: (False, False, True),
    Verdict.UNRECORDED: (None, True, False),
}


def changes(cluster: str, verdict: Verdict, reason: str, message: str, *,
            cleared: str | None = None, ended: str | None = None) -> list[Change]:
    """The condition changes of `verdict` on `cluster`, with `reason` and `message`; a
    cleared error says `cleared` (the run's outcome, ``Installed`` beside
    ``WaitingForReadiness``) and an ended progress says `ended` (``InstallComplete`` beside
    ``Installed``) where they differ from `reason`."""
    ready, error, progress = SHAPES[verdict]
    out = []
    if ready is not None:
        out.append(Change(cond.cluster_type(cond.READY, cluster), ready, reason, message))
    if error is not None:
        out.append(Change(cond.cluster_type(cond.ERROR, cluster), error,
                          reason if error else cleared or reason,
                          message if error else NO_ERROR))
    if progress is not None:
        out.append(Change(cond.cluster_type(cond.PROGRESS, cluster), progress,
                          reason if progress else ended or reason, message))
    return out


@dataclass(frozen=True)
class Outcome:
    """How the work queue treats the pass's key next."""

    requeue_after: float | None = None  # seconds, a fixed delay (no backoff growth)
    retry: bool = False  # on the queue's growing schedule
    reason: str = ""


@dataclass(frozen=True)
class Told:
    """What the pass's one commit says of a verdict."""

    changes: list[Change]
    event: tuple[str, str, str] | None  # (type, reason, message), sent when the status changed
    outcome: Outcome


def tell(cluster: str, verdict: Verdict, reason: str, message: str, *,
         event: str | None = None, warning: bool | None = None, again: float | None = None,
         permanent: bool = False, cleared: str | None = None,
         ended: str | None = None) -> Told:
    """The conditions, Event and next attempt of `verdict` on `cluster`.

    The Event is named `event` (the reason unless given; ``""`` for none) and is a Warning
    for an error verdict (unless `warning` says otherwise). The key comes back after
    `again` seconds where that is given; otherwise an error comes back on the queue's
    growing schedule unless it is `permanent` (it waits for a change of its input), and
    anything else only when something changes."""
    error = verdict in ERRORS
    severity = "Warning" if (error if warning is None else warning) else "Normal"
    said = None if event == "" else (severity, event or reason, message)
    outcome = Outcome(requeue_after=again, reason=reason) if again is not None \
        else Outcome(retry=error and not permanent, reason=reason)
    return Told(changes(cluster, verdict, reason, message, cleared=cleared, ended=ended),
                said, outcome)


def guarded(cluster: str, guard: tuple[bool, str]) -> Change:
    """The condition RecordsGuarded/<cluster> a pass that ran helm on the release's history
    writes in its commit (SPEC S4): whether the release records are guarded, and how."""
    on, how = guard
    return Change(cond.cluster_type(cond.GUARD, cluster), on,
                  "RecordsGuarded" if on else "RecordsUnguarded", how)


def withdrawn(cluster: str) -> list[Change]:
    """The changes that take a cluster that left the fleet off a Tenant: its conditions
    removed (its record in ``status.clusters`` goes in the same write)."""
    return [Change(cond.cluster_type(kind, cluster), None, "", "")
            for kind in (cond.READY, cond.ERROR, cond.PROGRESS, cond.GUARD)]


def in_sync(cluster: str, conditions: Iterable[Mapping[str, Any]], reason: str,
            message: str) -> list[Change]:
    """The changes that make a release found in sync say so, given the conditions it has:
    Ready True where it is not (a Ready one keeps its reason and time), the error cleared
    where there is one (or none was ever written), a progress that is over ended."""
    status = {c.get("type"): c.get("status") for c in conditions}
    ready, error, progress = (cond.cluster_type(p, cluster)
                              for p in (cond.READY, cond.ERROR, cond.PROGRESS))
    out = []
    if status.get(ready) != "True":
        out.append(Change(ready, True, reason, message))
    if status.get(error, "True") == "True":
        out.append(Change(error, False, reason, NO_ERROR))
    if status.get(progress) == "True":
        out.append(Change(progress, False, reason, message))
    return out


@dataclass(frozen=True)
class Attempt:
    """A failed helm run, counted against its target."""

    failures: int  # consecutive failures of the target, this one included
    delay: float  # seconds until the next attempt
    stalled: bool  # more failures than --max-retries: no next attempt until the target changes


def failed_attempt(previous: int, same_target: bool, *, max_retries: int,
                   backoff_max: float) -> Attempt:
    """One more failure of a target that failed `previous` times before (counted afresh
    when the target changed)."""
    failures = (previous if same_target else 0) + 1
    return Attempt(failures, retry.helm_failure(backoff_max).delay(failures),
                   retry.exhausted(failures, max_retries))
