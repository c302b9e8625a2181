"""The bench's process tree: what is counted as the operator's processes (krypton.testing.bench)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from krypton.testing.bench.process import spawned

# A parent with two children: one still running the parent's executable (as a child started
# with vfork does until its exec), one running a program of its own
PARENT = f"""
import subprocess, sys, time
same = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
other = subprocess.Popen([{shutil.which("sleep")!r}, "60"])
print(same.pid, other.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def parent() -> Iterator[tuple[int, int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    same, other = (int(p) for p in proc.stdout.readline().split())
    yield proc.pid, same, other
    for pid in (same, other):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    proc.kill()
    proc.wait()


def test_a_child_still_running_the_parents_executable_is_not_counted(
        parent: tuple[int, int, int]) -> None:
    pid, same, other = parent  # both started: Popen returns after the child's exec
    # the name of the program it runs (its executable's, as /proc gives it)
    assert spawned(pid) == {other: os.path.basename(os.path.realpath(shutil.which("sleep") or ""))}
