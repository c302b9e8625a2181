"""S2: no control character from a cluster or a chart reaches the terminal raw,
whatever the output path: status, status --watch --wide, plan's CHANGE column, diff."""

from __future__ import annotations

import json

import pytest
import yaml

from krypton.cli.view import (
    PLAN_COLUMNS,
    STATUS_COLUMNS,
    WIDE_COLUMNS,
    Row,
    diff_section,
    frame,
    progress,
    render,
)
from krypton.decisions.fleetview import tenant_rows
from krypton.decisions.rollouts.rollout import HALTED, RolloutState
from krypton.decisions.trust.printable import escape, escape_lines

pytestmark = pytest.mark.unit

OSC_LINK = "\x1b]8;;https://evil.example/\x07click\x1b]8;;\x07"  # a hyperlink
TITLE = "\x1b]0;pwned\x1b\\"  # window title, ST-terminated
CSI_CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
C1_CSI = "\x9b31m"  # the one-byte CSI
BIDI = "abc\u202edcb"  # right-to-left override
HOSTILE = [OSC_LINK, TITLE, CSI_CLEAR, C1_CSI, "\x7f", BIDI, "bell\x07", "nul\x00"]
RAW = {chr(c) for c in [*range(0x00, 0x20), *range(0x7f, 0xa0)]} | {"\u202e", "\u2028"}


def raw_controls(text: str, *, allow: str = "\n") -> set[str]:
    return {ch for ch in text if ch in RAW and ch not in allow}


@pytest.mark.parametrize("text", HOSTILE)
def test_escape_leaves_no_control_character_and_keeps_the_rest(text: str) -> None:
    shown = escape(text)
    assert raw_controls(shown, allow="") == set()
    # the printable characters pass unchanged and in order ('click', 'pwned' stay readable)
    rest = iter(shown)
    assert all(ch in rest for ch in text if ch not in RAW)


def test_escape_shows_each_control_as_its_code() -> None:
    # the notation is the one Python and helm users read: \x1b for ESC, \u202e for RLO
    assert escape("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert escape("x\x9by") == "x\\x9by"
    assert escape("r\u202el") == "r\\u202el"
    assert escape("one\ntwo\tthree") == "one\\x0atwo\\x09three"
    assert escape_lines("one\ntwo\tthree\x1b") == "one\ntwo\tthree\\x1b"


def tenant(message: str) -> dict[str, object]:
    return {"metadata": {"namespace": "team", "name": "t1"},
            "status": {"phase": "Error", "conditions": [
                {"type": "ClusterError/a", "status": "True", "reason": "InstallFailed",
                 "message": message},
                {"type": "Ready", "status": "False", "reason": "Error", "message": message}],
                "clusters": {"a": {"chartVersion": "1.0.0" + TITLE}}}}


@pytest.mark.parametrize("text", HOSTILE)
def test_status_table_escapes_what_a_chart_failure_said(text: str) -> None:
    rows = tenant_rows("a", [tenant(f"execution error: {text}")])
    for columns in (STATUS_COLUMNS, WIDE_COLUMNS):
        out = render(rows, columns, "table")
        assert raw_controls(out) == set(), repr(out)
        assert "execution error" in out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_json_and_yaml_keep_the_text_but_never_raw(fmt: str) -> None:
    rows = tenant_rows("a", [tenant("fail: " + OSC_LINK + CSI_CLEAR + C1_CSI + BIDI)])
    out = render(rows, WIDE_COLUMNS, fmt)
    assert raw_controls(out) == set(), repr(out)
    loaded = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    # machine-readable output is faithful: the consumer gets the exact text back
    assert loaded[0]["message"] == "fail: " + OSC_LINK + CSI_CLEAR + C1_CSI + BIDI


def test_status_watch_wide_frame_escapes_messages_and_the_rollout() -> None:
    rows = tenant_rows("a", [tenant("bad " + OSC_LINK)])
    halted = RolloutState(target="f", version="2.0.0" + CSI_CLEAR, phase=HALTED, wave=1,
                          waves=(("a",),), message="wave 1 failed: " + TITLE)
    text = frame(rows, halted, wide=True, when="T")
    assert raw_controls(text) == set(), repr(text)
    assert "wave 1 failed" in text
    assert raw_controls("\n".join(progress(rows, halted))) == set()


def test_plan_change_column_escapes_a_values_key_name() -> None:
    rows = [Row("a", "team", "t1", action="upgrade", reason="Upgrading",
                change="values: data." + CSI_CLEAR + "key", detail="upgrade " + C1_CSI)]
    out = render(rows, PLAN_COLUMNS, "table")
    assert raw_controls(out) == set(), repr(out)
    assert "values: data.\\x1b[2J" in out


def test_diff_keeps_lines_and_escapes_the_rest() -> None:
    text = "--- deployed\n+++ next\n-  note: old\n+  note: " + OSC_LINK + "\n"
    out = diff_section("a team/t1" + TITLE, text)
    assert raw_controls(out) == set(), repr(out)
    assert out.splitlines()[0].startswith("=== a team/t1\\x1b]0;pwned")
    assert out.splitlines()[1:3] == ["--- deployed", "+++ next"]
    assert diff_section("a team/t1", "") == "=== a team/t1: no change\n"


def test_a_tenant_field_of_a_megabyte_is_quoted_short() -> None:
    """spec.workspace of 1 MiB was written whole, twice, into the condition and
    one log line per retry."""
    from krypton.decisions.model import Observation, TenantKey, TenantView
    from krypton.decisions.planner import plan
    from krypton.decisions.trust.printable import short

    assert short("abc") == "'abc'"
    huge = "w" * (1 << 20)
    decided = plan(Observation("c1", TenantView(TenantKey("ns", "t"), workspace=huge,
                                                target_cluster="c1"), None))
    assert decided.reason == "WorkspaceMismatch"
    assert len(decided.message) < 1000 and "(1048576 characters)" in decided.message
    decided = plan(Observation("c1", TenantView(TenantKey("ns", "t"), target_cluster=huge),
                               None, known_clusters=frozenset({"c1"})))
    assert decided.reason == "UnknownCluster" and len(decided.message) < 1000
