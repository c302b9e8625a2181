"""R6: pins and semver ranges in Helm's constraint syntax."""

from __future__ import annotations

import pytest

from krypton.decisions.charts.versions import is_exact, newer_than, resolve
from krypton.decisions.errors import VersionInvalid, VersionNotFound
from krypton.decisions.model import ChartTarget

AVAILABLE = ["0.1.0", "0.2.0", "0.2.5", "0.3.0", "1.0.0", "1.2.3", "1.2.9", "1.3.0",
             "2.0.0-rc.1", "2.0.0", "v2.1.0", "junk"]


@pytest.mark.parametrize(("spec", "expected"), [
    ("1.2.3", "1.2.3"),
    ("v1.2.3", "1.2.3"),
    ("=1.2.3", "1.2.3"),
    ("~1.2", "1.2.9"),
    ("~1.2.3", "1.2.9"),
    ("^1.2", "1.3.0"),
    ("^0.2", "0.2.5"),
    ("^0.2.0", "0.2.5"),
    ("1.2.x", "1.2.9"),
    ("1.x", "1.3.0"),
    ("*", "v2.1.0"),
    (">=1.0.0 <2.0.0", "1.3.0"),
    (">=1.0.0, <1.3", "1.2.9"),
    (">1.2", "v2.1.0"),
    ("<=1.2", "1.2.9"),
    ("<1.2", "1.0.0"),
    ("!=2.1.0 >=2.0.0", "2.0.0"),
    ("1.0.0 - 1.2.5", "1.2.3"),
    ("~0.2 || ^0.1", "0.2.5"),
    (">=2.0.0-rc.0 <2.0.0", "2.0.0-rc.1"),
    ("2.0.0-rc.1", "2.0.0-rc.1"),
])
def test_resolve(spec: str, expected: str) -> None:
    assert resolve(spec, AVAILABLE) == expected


@pytest.mark.parametrize("spec", ["", "  ", "not-a-version", "1.2.3.4", ">=", "~>x.y.z.w",
                                  "1.2 ||", "latest"])
def test_invalid(spec: str) -> None:
    with pytest.raises(VersionInvalid):
        resolve(spec, AVAILABLE)


@pytest.mark.parametrize("spec", ["9.9.9", "^3", "<0.1.0", "1.2.4"])
def test_not_found(spec: str) -> None:
    with pytest.raises(VersionNotFound):
        resolve(spec, AVAILABLE)


@pytest.mark.parametrize(("spec", "exact"), [("1.2.3", True), ("v1.0.0", True), ("^1.2", False),
                                             ("1.2", False), ("1.2.3 || 1.2.4", False)])
def test_is_exact(spec: str, exact: bool) -> None:
    assert is_exact(spec) is exact


@pytest.mark.parametrize(("version", "available", "newer"), [
    ("1.0.0", ["0.9.0", "1.0.0"], ""),  # nothing newer
    ("1.0.0", ["1.0.0", "1.2.0", "1.10.0", "1.9.9"], "1.10.0"),  # by semver, not by text
    ("1.0.0", ["v1.1.0"], "v1.1.0"),  # as spelled in the repository
    ("1.0.0", ["2.0.0-rc.1", "1.0.1"], "1.0.1"),  # a pre-release is no notice for a release
    ("2.0.0-rc.1", ["2.0.0-rc.2"], "2.0.0-rc.2"),  # but it is for a pre-release
    ("1.0.0", ["not-a-version", "latest"], ""),
    ("garbage", ["1.0.0"], ""),
])
def test_the_newer_version_of_an_update_notice(version: str, available: list[str],
                                               newer: str) -> None:
    assert newer_than(version, available) == newer


def test_the_notice_is_written_while_there_is_one_and_cleared_once_only() -> None:
    def chart(newer: str) -> ChartTarget:
        return ChartTarget("https://r", "c", "1.0.0", {}, "f" * 64, newer=newer)

    assert chart("1.1.0").notice({}) == {"newerVersion": "1.1.0"}
    assert chart("").notice({"newerVersion": "1.1.0"}) == {"newerVersion": ""}  # cleared
    assert chart("").notice({"newerVersion": ""}) == {}  # cleared before: not again
    assert chart("").notice({}) == {}  # never had one: no field
