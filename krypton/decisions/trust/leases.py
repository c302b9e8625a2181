"""How much of a coordination.k8s.io Lease krypton believes (SPEC S2). Pure.

A Lease is written by whoever may update Leases in its namespace, not only by krypton's
replicas. Its ``leaseDurationSeconds`` decides how long the others wait before they take
over: a hand-written membership with a duration of 68 years would leave every cluster
unserved, a leader Lease renewed "in 2099" would keep every replica standing by. So a
duration above `TRUST_FACTOR` times krypton's own (--lease-duration) is not believed and
our own is used instead, and a ``renewTime`` in the future (beyond `CLOCK_SKEW`) does not
make a holder live. Expiry itself is judged on the reader's clock from when it saw the
record change (client-go's rule), so a stopped holder is noticed either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from krypton.decisions.model import epoch_seconds

TRUST_FACTOR = 4  # a Lease may ask the others to wait at most this many of our durations
CLOCK_SKEW = 5.0  # seconds a renewTime may lie ahead of our clock before it is not believed


def believed_duration(spec: Mapping[str, Any], own: float) -> tuple[float, str]:
    """The duration to judge the Lease by, and why the written one is not believed ("")."""
    raw = spec.get("leaseDurationSeconds")
    if raw is None:
        return own, ""
    try:
        written = float(raw)
    except (TypeError, ValueError):
        return own, f"leaseDurationSeconds {raw!r} is not a number"
    said = f"leaseDurationSeconds {int(written) if written.is_integer() else written}"
    if written <= 0:
        return own, f"{said} is not positive"
    if written > TRUST_FACTOR * own:
        return own, f"{said} is over {TRUST_FACTOR} times ours ({own:g}s)"
    return written, ""


def doubts(spec: Mapping[str, Any], own: float, now: float) -> list[str]:
    """Everything in the Lease that is not believed as written (empty: nothing)."""
    found = [why] if (why := believed_duration(spec, own)[1]) else []
    renewed = epoch_seconds(spec.get("renewTime"))
    if renewed is not None and renewed > now + CLOCK_SKEW:
        found.append(f"renewTime {spec.get('renewTime')} is in the future")
    return found


def live_by_wall_clock(spec: Mapping[str, Any], own: float, now: float) -> bool:
    """The holder renewed the Lease within its believed duration, by the wall clock `now`
    (for readers that saw no change happen, such as ``krypton status``)."""
    renewed = epoch_seconds(spec.get("renewTime"))
    if renewed is None or renewed > now + CLOCK_SKEW:
        return False
    return now - renewed <= believed_duration(spec, own)[0]


def left_by_wall_clock(spec: Mapping[str, Any], own: float, now: float) -> float:
    """For how many seconds more the holder is believed to hold the Lease, by the wall clock
    `now` (0: it is not)."""
    renewed = epoch_seconds(spec.get("renewTime"))
    if renewed is None or renewed > now + CLOCK_SKEW:
        return 0.0
    return max(0.0, renewed + believed_duration(spec, own)[0] - now)


def describe(holder: str, problems: list[str]) -> str:
    """One line naming the holder and what is not believed, for a log, an Event, /readyz."""
    said = f"held by {holder or '(nobody)'}"
    return said + (f"; not believed: {'; '.join(problems)}" if problems else "")


def kinds(problems: list[str]) -> tuple[str, ...]:
    """What is not believed, without the values written: a holder that writes another
    far-future renewTime at every renewal is warned about once, not every second."""
    return tuple(p.split(" ", 1)[0] for p in problems)
