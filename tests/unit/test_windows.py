"""Maintenance windows (F8): parsed, open or closed at a time, and the time they were open."""

from __future__ import annotations

import datetime as dt

import pytest

from krypton.decisions.windows import WindowInvalid, parse


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


BERLIN_NIGHTS = "0 22 * * 1-5 6h Europe/Berlin"  # weekdays 22:00-04:00 Berlin time


@pytest.mark.parametrize(("now", "open_", "changes"), [
    ("2026-11-27T21:59:59+01:00", False, "2026-11-27T22:00:00+01:00"),  # a Friday
    ("2026-11-27T22:00:00+01:00", True, "2026-11-28T04:00:00+01:00"),
    ("2026-11-28T03:59:00+01:00", True, "2026-11-28T04:00:00+01:00"),
    ("2026-11-28T04:00:00+01:00", False, "2026-11-30T22:00:00+01:00"),  # the weekend
    ("2026-11-27T21:30:00+00:00", True, "2026-11-28T04:00:00+01:00"),  # read in Berlin time
])
def test_a_window_is_open_or_says_when_it_opens(now: str, open_: bool, changes: str) -> None:
    window = parse(BERLIN_NIGHTS)
    assert window is not None
    assert window.state(at(now)) == (open_, at(changes))


def test_windows_that_run_into_each_other_count_as_one() -> None:
    window = parse("0 * * * * 90m")  # every hour, for an hour and a half: always open
    assert window is not None
    is_open, closes = window.state(at("2026-11-27T10:30:00+00:00"))
    assert is_open and closes > at("2026-11-28T00:00:00+00:00")  # not at 11:30


def test_the_time_a_window_was_open() -> None:
    window = parse(BERLIN_NIGHTS)
    assert window is not None
    # Friday 20:00 to Saturday 06:00 Berlin: 22:00-04:00 open
    assert window.open_seconds(at("2026-11-27T20:00:00+01:00"),
                               at("2026-11-28T06:00:00+01:00")) == 6 * 3600
    # begun inside a window: only the rest counts
    assert window.open_seconds(at("2026-11-28T03:00:00+01:00"),
                               at("2026-11-28T05:00:00+01:00")) == 3600
    # a weekend: nothing
    assert window.open_seconds(at("2026-11-28T05:00:00+01:00"),
                               at("2026-11-30T21:00:00+01:00")) == 0
    every = parse("*/2 * * * * 1m")
    assert every is not None and every.open_seconds(at("2026-11-27T10:00:00+00:00"),
                                                    at("2026-11-27T10:10:00+00:00")) == 300


@pytest.mark.parametrize("text", ["", "always", "  always "])
def test_always_is_no_window(text: str) -> None:
    assert parse(text) is None


@pytest.mark.parametrize(("text", "problem"), [
    ("0 22 * * 1-5", "expected five cron fields"),
    ("0 25 * * * 1h", "cron '0 25 * * *'"),
    ("0 22 * * * soon", "duration"),
    ("0 22 * * * 1h Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
])
def test_a_bad_window_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(WindowInvalid, match="maintenance window") as caught:
        parse(text)
    assert problem in str(caught.value)


def test_a_clusters_window_is_worked_out_again_only_when_it_changes() -> None:
    """Every pass asks whether its cluster's window is open: the answer holds until the
    time it gives, and only then is the cron expression looked through again."""
    from types import SimpleNamespace

    from krypton.runtime.reconcile.view import ClusterView

    window = parse("0 22 * * 1-5 6h Europe/Berlin")
    assert window is not None
    asked: list[float] = []

    def state(now: float) -> tuple[bool, float]:
        asked.append(now)
        return window.state(now)

    view = SimpleNamespace(window=SimpleNamespace(state=state),
                           state=SimpleNamespace(window_seen=None))
    friday = at("2026-11-27T12:00:00+01:00")
    for minutes in range(0, 600, 10):  # 12:00 to 21:50: closed, opening at 22:00
        assert ClusterView.window_state(view, friday + 60 * minutes) == \
            (False, at("2026-11-27T22:00:00+01:00"))  # type: ignore[arg-type]
    assert ClusterView.window_state(view, at("2026-11-27T22:00:00+01:00")) == \
        (True, at("2026-11-28T04:00:00+01:00"))  # type: ignore[arg-type]
    assert len(asked) == 2
    assert ClusterView.window_state(SimpleNamespace(window=None), friday) == \
        (True, friday)  # type: ignore[arg-type]
