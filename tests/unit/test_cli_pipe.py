"""Issue 32.5: a reader that closed the pipe (``krypton diff | head``) ends the command
quietly, without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("args", "codes"), [
    (["crds"], {141}),  # 128 + SIGPIPE, as a shell says of a command whose pipe closed
    (["run", "--help"], {0, 141}),  # argparse's help exits on its own
])
def test_a_closed_pipe_is_no_traceback(args: list[str], codes: set[int]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails (EPIPE)
    try:
        done = subprocess.run([sys.executable, "-m", "krypton", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert done.returncode in codes, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
