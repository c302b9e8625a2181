"""Who writes a Tenant (SPEC A1): its status only the status writer of the passes
(krypton/runtime/reconcile/status.py), in the pass's commit or when a cluster leaves;
its metadata also the CLI commands that ask the operator for something (`retry`,
`adopt-records`), through an annotation and nothing else. Read from the source, so that
a new writer elsewhere fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .sources import parse

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "krypton"
STATUS_WRITER = "runtime/reconcile/status.py"
ASKING = ("cli/records.py",)  # krypton retry, krypton adopt-records


def _calls(name: str) -> dict[str, int]:
    """The modules of the package calling a function or method `name`, with how often."""
    found: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = parse(path.read_text(), str(path))
        count = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call) and (
            isinstance(node.func, ast.Attribute) and node.func.attr == name or
            isinstance(node.func, ast.Name) and node.func.id == name))
        if count:
            found[str(path.relative_to(PACKAGE))] = count
    return found


def test_only_the_status_writer_writes_a_tenants_status() -> None:
    assert set(_calls("patch_tenant_status")) == {STATUS_WRITER}


def test_only_the_status_writer_says_anything_of_a_tenant() -> None:
    """A pass's Events on its Tenant (the fingerprint written, the helm run started) go out
    with its commit, from the status writer alone."""
    assert set(_calls("involved_tenant")) == {STATUS_WRITER}
    assert set(_calls("write_status")) == {STATUS_WRITER}


def test_elsewhere_a_tenant_is_only_asked_through_its_annotations() -> None:
    assert set(_calls("patch_tenant")) == {STATUS_WRITER, *ASKING}
    for node in (n for m in ASKING for n in ast.walk(parse((PACKAGE / m).read_text()))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "patch_tenant":
            patch = node.args[1]
            assert isinstance(patch, ast.Dict) and [ast.literal_eval(k) for k in patch.keys
                                                    if k is not None] == ["metadata"]
            meta = patch.values[0]
            assert isinstance(meta, ast.Dict) and [ast.literal_eval(k) for k in meta.keys
                                                   if k is not None] == ["annotations"]
