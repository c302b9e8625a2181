"""A reader that closed the pipe (``krypton diff | head``) ends the command
quietly, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_a_closed_pipe_is_no_traceback() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails (EPIPE)
    try:
        done = subprocess.run([sys.executable, "-m", "krypton", "crds"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 141, done.stderr  # 128 + SIGPIPE, as a shell says of it
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
