"""Maintenance windows (F8). Pure: the time is an argument.

A window is written ``<cron> <duration> [<time zone>]``: five cron fields for when a window
opens, how long it stays open (``90m``, ``4h``), and the IANA time zone the cron fields are
read in (UTC when left out). ``0 22 * * 1-5 6h Europe/Berlin`` opens at 22:00 Berlin time on
weekdays and closes at 04:00; ``always`` is no window (a cluster that opts out of
``--maintenance-window``). Outside its window a cluster starts no upgrade, revert or
uninstall (SPEC F8); a rollout wave's deadline counts only the time its clusters' windows
were open.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from krypton.decisions.errors import KryptonError
from krypton.decisions.options import duration

ALWAYS = "always"
SEARCH = 1000  # window openings looked through at most, by any one question


class WindowInvalid(KryptonError):
    reason = "MaintenanceWindowInvalid"


@dataclass(frozen=True)
class Window:
    cron: str
    length: float  # seconds a window stays open
    zone: str
    text: str  # as written

    def _starts(self, after: float, reverse: bool = False) -> CronSim:
        at = dt.datetime.fromtimestamp(int(after) + (1 if reverse else 0), ZoneInfo(self.zone))
        return CronSim(self.cron, at, reverse=reverse)

    def state(self, now: float) -> tuple[bool, float]:
        """Whether the window is open at `now`, and when that changes: when it closes if it
        is open, when it next opens if not (epoch seconds)."""
        end = self._open_until(now)
        if end is not None:
            return True, end
        return False, next(self._starts(now)).timestamp()

    def _open_until(self, now: float) -> float | None:
        """When the window open at `now` closes (windows that overlap count as one), or
        None when it is closed."""
        latest = next(self._starts(now, reverse=True)).timestamp()  # at or before now
        end = latest + self.length
        if end <= now:
            return None
        for start in itertools.islice(self._starts(now), SEARCH):  # later ones it runs into
            if start.timestamp() > end:
                break
            end = max(end, start.timestamp() + self.length)
        return end

    def open_seconds(self, start: float, end: float) -> float:
        """How long the window was open between `start` and `end`."""
        total, covered = 0.0, start
        first = next(self._starts(start, reverse=True)).timestamp()
        openings = [first]
        for opening in itertools.islice(self._starts(start), SEARCH):
            if opening.timestamp() >= end:
                break
            openings.append(opening.timestamp())
        for s in openings:
            lo, hi = max(s, covered), min(s + self.length, end)
            if hi > lo:
                total += hi - lo
                covered = hi
        return total


def parse(text: str) -> Window | None:
    """The window `text` describes, None for ``always`` or nothing; WindowInvalid saying
    what is wrong otherwise."""
    text = text.strip()
    if not text or text == ALWAYS:
        return None
    parts = text.split()
    if len(parts) not in (6, 7):
        raise WindowInvalid(f"maintenance window {text!r}: expected five cron fields, a "
                            "duration and optionally a time zone (e.g. '0 22 * * 1-5 6h "
                            "Europe/Berlin')")
    cron, zone = " ".join(parts[:5]), parts[6] if len(parts) == 7 else "UTC"
    try:
        length = duration(parts[5])
    except ValueError as exc:
        raise WindowInvalid(f"maintenance window {text!r}: duration: {exc}") from None
    if length <= 0:
        raise WindowInvalid(f"maintenance window {text!r}: the duration must be positive")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowInvalid(f"maintenance window {text!r}: unknown time zone {zone!r}") from None
    try:
        CronSim(cron, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    except CronSimError as exc:
        raise WindowInvalid(f"maintenance window {text!r}: cron {cron!r}: {exc}") from None
    return Window(cron, length, zone, text)
