"""The docs' reference pages are generated from the code (SPEC O15): each names everything
its source table holds. The metric page is compared with what the registry exports (the
names a scrape shows), the flag page with `krypton run --help`'s options."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from prometheus_client import REGISTRY

import krypton.adapters.metrics  # noqa: F401 - registers krypton's metrics
from krypton.decisions.reasons import REASONS
from krypton.decisions.settings import OPTIONS

HOOKS = Path(__file__).resolve().parents[2] / "hack" / "docs_hooks.py"
SUFFIX = {"counter": "_total", "info": "_info", "gauge": "", "histogram": ""}


def _hooks():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOKS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_metric_page_lists_what_a_scrape_shows() -> None:
    exported = {f.name + SUFFIX[f.type] for f in REGISTRY.collect()
                if f.name.startswith("krypton_")}
    listed = set(re.findall(r"^\| `(krypton_[a-z_]+)`", _hooks().metrics_page(), re.M))
    assert listed == exported


def test_the_flag_and_reason_pages_list_every_entry_once() -> None:
    hooks = _hooks()
    flags = re.findall(r"^\| `(--[a-z-]+)`", hooks.flags_page(), re.M)
    assert sorted(flags) == sorted(o.flag for o in OPTIONS)
    reasons = re.findall(r"^\| `([A-Za-z0-9]+)`", hooks.reasons_page(), re.M)
    assert sorted(reasons) == sorted(REASONS)


def test_the_crd_page_has_the_status_fields() -> None:
    page = _hooks().crd_page()
    for field in ("spec.clusterRef", "status.clusters.<key>.chartDigest", "status.phase"):
        assert f"`{field}`" in page


def test_nothing_in_the_code_or_the_docs_names_an_issue_number() -> None:
    """A reader cannot resolve an issue number: the code and the docs name the feature or its
    spec ID instead (SPEC O15)."""
    root = Path(__file__).resolve().parents[2]
    texts = [p for top in ("krypton", "tests", "docs", "hack", "bench", "chart", "examples")
             for p in (root / top).rglob("*")
             if p.suffix in {".py", ".yaml", ".md", ".sh", ".json", ".tpl", ".txt"}]
    found = [f"{path.relative_to(root)}:{n}: {line.strip()[:80]}"
             for path in [*texts, root / "README.md", root / "Makefile"]
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b[Ii]ssues? #?\d+", line)]
    assert not found, "\n".join(found)
