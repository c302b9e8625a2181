"""A Lease is believed only within bounds (krypton.decisions.trust.leases)."""

from __future__ import annotations

import datetime as dt

import pytest

from krypton.decisions.trust.leases import (
    TRUST_FACTOR,
    believed_duration,
    describe,
    doubts,
    live_by_wall_clock,
)

pytestmark = pytest.mark.unit

OWN = 15.0
NOW = dt.datetime(2026, 11, 23, 12, 0, 0, tzinfo=dt.UTC).timestamp()


@pytest.mark.parametrize(("written", "used", "doubted"), [
    (None, OWN, False),  # not said: ours
    (15, 15.0, False),
    (2, 2.0, False),  # shorter than ours: believed (the holder is only stricter)
    (TRUST_FACTOR * OWN, TRUST_FACTOR * OWN, False),  # the bound itself is believed
    (TRUST_FACTOR * OWN + 1, OWN, True),
    (2147483647, OWN, True),  # the ghost member of the issue
    (0, OWN, True),
    (-5, OWN, True),
    ("soon", OWN, True),
])
def test_a_duration_is_believed_up_to_a_multiple_of_ours(written: object, used: float,
                                                          doubted: bool) -> None:
    spec = {} if written is None else {"leaseDurationSeconds": written}
    duration, why = believed_duration(spec, OWN)
    assert duration == used
    assert bool(why) is doubted


def test_a_renew_time_in_the_future_is_doubted_and_keeps_nobody_live() -> None:
    spec = {"holderIdentity": "ghost", "renewTime": "2099-01-01T00:00:00.000000Z",
            "leaseDurationSeconds": 15}
    assert doubts(spec, OWN, NOW) == ["renewTime 2099-01-01T00:00:00.000000Z is in the future"]
    assert not live_by_wall_clock(spec, OWN, NOW)
    # a few seconds ahead is clock skew between machines, not a lie
    skewed = dict(spec, renewTime="2026-11-23T12:00:03.000000Z")
    assert doubts(skewed, OWN, NOW) == []
    assert live_by_wall_clock(skewed, OWN, NOW)


def test_a_holder_is_live_within_the_believed_duration_only() -> None:
    spec = {"renewTime": "2026-11-23T11:59:00.000000Z", "leaseDurationSeconds": 2147483647}
    assert not live_by_wall_clock(spec, OWN, NOW)  # 60 s ago, judged with our 15 s
    assert live_by_wall_clock(dict(spec, leaseDurationSeconds=60), OWN, NOW)
    assert not live_by_wall_clock({"renewTime": "not a time"}, OWN, NOW)


def test_the_written_duration_is_quoted_as_written() -> None:
    assert believed_duration({"leaseDurationSeconds": 2147483647}, OWN)[1] == \
        "leaseDurationSeconds 2147483647 is over 4 times ours (15s)"


def test_the_holder_is_named() -> None:
    assert describe("r1", []) == "held by r1"
    assert describe("ghost", ["a", "b"]) == "held by ghost; not believed: a; b"
    assert describe("", []) == "held by (nobody)"


def test_a_renewtime_rewritten_into_the_future_is_one_doubt_not_one_a_second() -> None:
    """A holder that writes another far-future renewTime at every renewal changes the
    words, not what is doubted: the warning is not repeated."""
    from krypton.decisions.trust.leases import kinds

    first = doubts({"renewTime": "2099-01-01T00:00:00.000000Z"}, OWN, NOW)
    again = doubts({"renewTime": "2099-01-01T00:00:01.000000Z"}, OWN, NOW)
    assert first != again and kinds(first) == kinds(again) == ("renewTime",)
    both = doubts({"renewTime": "2099-01-01T00:00:00.000000Z", "leaseDurationSeconds": 9e9},
                  OWN, NOW)
    assert kinds(both) == ("leaseDurationSeconds", "renewTime")
