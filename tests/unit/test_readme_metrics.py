"""The README's metric table names every metric krypton exports, and no other (issue 13)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

import krypton.adapters.metrics  # noqa: F401 - registers krypton's metrics

README = Path(__file__).resolve().parents[2] / "README.md"
SUFFIX = {"counter": "_total", "info": "_info", "gauge": "", "histogram": ""}


def test_the_readme_metric_table_is_complete() -> None:
    exported = {f.name + SUFFIX[f.type] for f in REGISTRY.collect()
                if f.name.startswith("krypton_")}
    rows = [line for line in README.read_text().splitlines() if line.startswith("| `krypton_")]
    listed = {name for row in rows for name in re.findall(r"`(krypton_[a-z_]+)`",
                                                          row.split("|")[1])}
    assert listed == exported
