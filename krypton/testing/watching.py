"""``krypton status --watch`` as a child process whose frames can be waited for (the tests
and the demo)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping

from .operator import wait_for

HEADER = "krypton status --watch"
# `python -m krypton`, taking Ctrl-C as a terminal delivers it: a process started with SIGINT
# ignored (a background job of a shell without job control, as some CI runners start the
# suite) passes that on to its children, and Python then leaves it ignored, so that Ctrl-C
# would never reach the command.
KRYPTON_TAKING_CTRL_C = ("import runpy, signal; "
                         "signal.signal(signal.SIGINT, signal.default_int_handler); "
                         "runpy.run_module('krypton', run_name='__main__', alter_sys=True)")


class Watching:
    """`krypton status --watch ARGS` with its output on a pipe: each frame is printed whole,
    starting with its header line, when it differs from the one before."""

    def __init__(self, *args: str, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", KRYPTON_TAKING_CTRL_C, "status",
                                      "--watch", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                     env=dict(env))
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def frames(self) -> list[str]:
        text = "\n".join(self.lines)
        return [(HEADER + f).rstrip("\n") for f in text.split(HEADER)[1:]]

    def wait_frame(self, match: Callable[[str], bool], what: str, timeout: float = 20) -> str:
        """The first frame for which `match(frame)` holds."""
        def matching() -> str:
            return next((f for f in self.frames() if match(f)), "")

        return wait_for(matching, timeout, what=what)

    def stop(self) -> int:
        """Ctrl-C; the exit status. A command still running 30 s later is killed, and that
        is an error."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self._reader.join(timeout=5)
        return code

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr else ""


def row(frame: str, tenant: str, cluster: str | None = None) -> list[str]:
    """The table cells of `tenant`'s row (on `cluster`, if given) in a frame or a table
    (cells are two or more spaces apart)."""
    for line in frame.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) > 3 and cells[2] == tenant and cluster in (None, cells[0]):
            return cells
    return []
