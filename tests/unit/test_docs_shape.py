"""The docs read in one sitting (SPEC O15): every page opens with what it is for in at most
five lines, no paragraph runs over twelve lines (lists, tables and code aside), every spec ID
the code or the docs use is defined on the site, and the README stays a page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
FEATURES = ROOT / "docs" / "reference" / "features.md"
SPEC_ID = re.compile(r"\b([ADFHOPRST]\d{1,2}b?)\b")


def _blocks(text: str) -> list[str]:
    """The page's blocks between blank lines, code blocks removed, list items apart."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    blocks = []
    for block in re.split(r"\n[ \t]*\n", text):
        blocks += [b for b in re.split(r"\n(?=[ \t]*(?:[*-]|\d+\.) )", block) if b.strip()]
    return blocks


def _prose(block: str) -> bool:
    return not block.lstrip().startswith(("|", "#", "<", "!["))


def test_no_paragraph_runs_over_twelve_lines() -> None:
    long = [f"{page.relative_to(ROOT)}: {len(b.splitlines())} lines: {b.strip()[:60]!r}"
            for page in PAGES for b in _blocks(page.read_text())
            if _prose(b) and len(b.splitlines()) > 12]
    assert not long, "\n".join(long)


def test_every_page_opens_with_what_it_is_for() -> None:
    bad = []
    for page in PAGES:
        blocks = _blocks(page.read_text())
        opening = blocks[1] if len(blocks) > 1 and blocks[0].startswith("# ") else ""
        if not opening or not _prose(opening) or opening.lstrip()[:1] in "*-" or \
                len(opening.splitlines()) > 5:
            bad.append(f"{page.relative_to(ROOT)}: {opening.strip()[:60]!r}")
    assert not bad, "\n".join(bad)


def test_every_spec_id_in_the_code_and_the_docs_is_defined_on_the_site() -> None:
    defined = set(re.findall(r"^\| ([A-Z]\d{1,2}b?) \|", FEATURES.read_text(), re.M))
    sources = [*(ROOT / "krypton").rglob("*.py"), *(ROOT / "krypton").rglob("*.yaml"), *PAGES,
               ROOT / "README.md"]
    used = {m: path for path in sources for m in SPEC_ID.findall(path.read_text())}
    missing = {i: str(p.relative_to(ROOT)) for i, p in used.items() if i not in defined}
    assert len(defined) > 60 and not missing, missing


def test_the_readme_stays_a_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 80
