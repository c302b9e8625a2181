"""Every reason the code can emit has an entry in the reason table: the docs'
reason reference is generated from that table, so a reason missing there is a reason a
user cannot look up.

The emitted reasons are found in the source: the reason argument of a Plan, a condition
Change, an Event (a ("Warning"|"Normal", reason, message) triple or an emit/report call),
any ``reason=`` keyword, a ``reason``/``event`` variable (an error class's ``reason`` too) and the
Events of a reason-to-Event table. Reasons built from a
pattern (``Helm{verb}Failed``) are listed by their expansions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from krypton.decisions.reasons import HELM_VERBS, REASONS

from .sources import parse

ROOT = Path(__file__).resolve().parents[2] / "krypton"
NAME = re.compile(r"^[A-Z][A-Za-z0-9]+$")
EVENT_TYPES = ("Warning", "Normal")
PATTERNS = {"Helm{verb}Start", "Helm{verb}Failed", "{verb}Failed", "Helm{done}"}


def _constant(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
        return node.value
    return None


def emitted() -> dict[str, str]:
    found: dict[str, str] = {}

    def add(node: ast.AST, where: str) -> None:
        name = _constant(node)
        if name:
            found.setdefault(name, where)

    for path in sorted(ROOT.rglob("*.py")):
        if "testing" in path.parts:
            continue  # the test bed's own words
        for node in ast.walk(parse(path.read_text())):
            where = f"{path.relative_to(ROOT.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Tuple) and len(node.elts) == 3 and \
                    isinstance(node.elts[0], ast.Constant) and node.elts[0].value in EVENT_TYPES:
                add(node.elts[1], where)
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "Plan" and len(node.args) > 1:
                    add(node.args[1], where)
                if name == "Change" and len(node.args) > 2:
                    add(node.args[2], where)
                for i, arg in enumerate(node.args[:-1]):
                    if isinstance(arg, ast.Constant) and arg.value in EVENT_TYPES:
                        add(node.args[i + 1], where)
                for keyword in node.keywords:
                    if keyword.arg == "reason":
                        add(keyword.value, where)
            elif isinstance(node, ast.Assign):
                targets = {getattr(t, "id", "") for t in node.targets}
                if targets & {"reason", "event"}:  # a class's reason, a local reason
                    values = [node.value.body, node.value.orelse] \
                        if isinstance(node.value, ast.IfExp) else [node.value]
                    for value in values:
                        add(value, where)
                if any(t.endswith("EVENTS") for t in targets) and isinstance(node.value, ast.Dict):
                    for value in node.value.values:
                        add(value, where)
    return found


def test_every_emitted_reason_has_an_entry() -> None:
    found = emitted()
    assert len(found) > 60, "the scan must find the reasons it looks for"
    missing = {name: where for name, where in found.items() if name not in REASONS}
    assert missing == {}


def test_the_reasons_built_from_a_pattern_have_entries() -> None:
    """The patterns in the source are the ones listed here, and each expansion has an
    entry; a new pattern fails the first assertion until it is listed."""
    text = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if "testing" not in p.parts)
    used = set(re.findall(r'f"((?:Helm)?\{(?:verb|done)\}(?:Start|Failed)?)"', text))
    assert used == PATTERNS
    for verb in HELM_VERBS:
        for name in (f"Helm{verb}Start", f"Helm{verb}Failed", f"{verb}Failed"):
            assert name in REASONS
    for done in ("Installed", "Upgraded"):
        assert done in REASONS and f"Helm{done}" in REASONS


def test_every_entry_says_where_it_is_seen_and_what_it_means() -> None:
    for name, reason in REASONS.items():
        assert NAME.match(name), name
        assert reason.meaning and set(reason.where) <= {"condition", "Event", "plan", "error"}
