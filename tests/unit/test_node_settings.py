"""A real node changes the machine's kernel settings and writes back, when it stops, what it
found: the test bed runs one node at a time on the machine, whichever test process starts
it (`hold_kernel_settings`, taken by `Node.start` and let go by `Node.stop`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from krypton.testing import host

TRY = """
import fcntl, sys
with open(sys.argv[1], "ab") as f:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(3)
"""


def other_process_may_hold(path: Path) -> bool:
    return subprocess.run([sys.executable, "-c", TRY, str(path)]).returncode == 0


def test_a_second_process_waits_until_the_node_lets_go(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "SETTINGS_LOCK", tmp_path / "settings.lock")
    assert other_process_may_hold(host.SETTINGS_LOCK)
    held = host.hold_kernel_settings()
    assert not other_process_may_hold(host.SETTINGS_LOCK)
    held.close()
    assert other_process_may_hold(host.SETTINGS_LOCK)
