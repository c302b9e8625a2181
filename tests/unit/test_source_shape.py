"""krypton's source stays in pieces a reader can hold: no module over 500 lines, no class
over 300, no function over 60 (docstrings included), in the operator and in its test bed
(krypton/testing) alike. Read from the source, so that a piece growing past its limit
fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .sources import parse

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "krypton"
MODULE, CLASS, FUNCTION = 500, 300, 60


def _product() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _over(path: Path, root: Path = PACKAGE) -> list[str]:
    text = path.read_text()
    name = str(path.relative_to(root))
    found = [f"{name}: {text.count(chr(10))} lines"] if text.count("\n") > MODULE else []
    for node in ast.walk(parse(text, str(path))):
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        limit = CLASS if isinstance(node, ast.ClassDef) else FUNCTION
        size = (node.end_lineno or node.lineno) - node.lineno + 1
        if size > limit:
            found.append(f"{name}: {node.name} is {size} lines")
    return found


def test_no_module_class_or_function_is_over_its_limit() -> None:
    assert len(_product()) > 80  # the package was found
    over = [line for path in _product() for line in _over(path)]
    assert over == [], over


def test_a_function_over_the_limit_is_found(tmp_path: Path) -> None:
    body = "\n".join(f"    x{n} = {n}" for n in range(FUNCTION))
    long = tmp_path / "long.py"
    long.write_text(f"def f() -> None:\n{body}\n")
    assert _over(long, tmp_path) == [f"long.py: f is {FUNCTION + 1} lines"]
