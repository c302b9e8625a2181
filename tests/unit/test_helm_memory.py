"""What each helm process may use of the pod's memory (SPEC S7): the shares, the concurrency
lowered where they cannot fit, the limit read from the cgroup, quantities."""

from __future__ import annotations

from pathlib import Path

import pytest

from krypton.app.config import cgroup_memory_limit
from krypton.decisions.memory import FLOOR, OPERATOR_SHARE, divide, quantity

pytestmark = pytest.mark.unit

MiB = 1 << 20


@pytest.mark.parametrize(("cgroup", "flag", "asked", "concurrency", "share", "source"), [
    (1280 * MiB, 8 << 30, 4, 4, 256 * MiB, "cgroup"),  # the chart's default: the cgroup wins
    (None, 1280 * MiB, 4, 4, 256 * MiB, "--memory-limit"),  # no cgroup limit: the flag
    (1024 * MiB, 0, 4, 3, 256 * MiB, "cgroup"),  # 4 x 192 MiB cannot hold a bounded read
    (512 * MiB, 0, 4, 1, 256 * MiB, "cgroup"),
    (3328 * MiB, 0, 8, 8, 384 * MiB, "cgroup"),
    (256 * MiB, 0, 4, 1, FLOOR, "cgroup"),  # nothing left past the operator's: one, at the floor
])
def test_the_pod_is_shared_and_the_concurrency_lowered_where_it_cannot_fit(
        cgroup: int | None, flag: int, asked: int, concurrency: int, share: int,
        source: str) -> None:
    m = divide(cgroup, flag, asked)
    assert (m.concurrency, m.share, m.source) == (concurrency, share, source)
    assert m.concurrency * m.share <= max(m.pod - OPERATOR_SHARE, FLOOR)
    assert m.soft < m.share
    said = m.said()
    assert f"{concurrency} at once, {share // MiB} MiB each" in said
    assert ("lowered to" in said) == (concurrency < asked)


@pytest.mark.parametrize(("text", "found"), [
    ("max\n", None), ("536870912\n", 512 * MiB), ("9223372036854771712\n", None), ("", None)])
def test_the_limit_is_the_cgroups_where_it_sets_one(tmp_path: Path, text: str,
                                                    found: int | None) -> None:
    v2 = tmp_path / "memory.max"
    v2.write_text(text)
    assert cgroup_memory_limit((v2, tmp_path / "absent")) == found
    assert cgroup_memory_limit((tmp_path / "absent", v2)) == found  # v1's file, read alike
    assert cgroup_memory_limit((tmp_path / "absent",)) is None


@pytest.mark.parametrize(("text", "found"), [
    ("1Gi", 1 << 30), ("512Mi", 512 * MiB), ("1073741824", 1 << 30), ("2G", 2 * 10**9)])
def test_quantities(text: str, found: int) -> None:
    assert quantity(text) == found


@pytest.mark.parametrize("text", ["1.5Gi", "Gi", "-1", "1 GiB", "lots"])
def test_a_quantity_that_is_none_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a memory quantity"):
        quantity(text)

