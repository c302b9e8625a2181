"""What the test bed takes from this machine: free loopback ports for its servers, the end
of the processes it starts, and its kernel settings one real node at a time."""

from __future__ import annotations

import fcntl
import functools
import os
import secrets
import signal
import socket
import subprocess
from pathlib import Path
from typing import IO

# Ports handed out by free_port: below the kernel's ephemeral range, starting at a random
# place so that two test processes on one machine do not walk the same way.
_LOWEST_PORT = 10000
_next_port = _LOWEST_PORT + secrets.randbelow(20000)
# held by the real node that runs (a file lock: any process of this machine's test bed)
SETTINGS_LOCK = Path("/tmp/krypton-node-settings.lock")


@functools.cache
def _ephemeral_range() -> tuple[int, int]:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low, high = (int(part) for part in text.split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, for a server started later.

    It is taken below the kernel's ephemeral range, from which a port bound to 0 would come:
    the local ports of outgoing connections are taken from that range too, and one of them
    could take the port before its server binds it (the server then fails with EADDRINUSE).
    Successive calls walk through the ports below the range, so that one process does not
    hand out a port again until it has handed out all the others. Where the range leaves
    no room below it, the kernel chooses (port 0)."""
    global _next_port
    lowest, span = _share()
    for _ in range(min(span, 2000)):  # none where span <= 0
        port = lowest + (_next_port - lowest) % span
        _next_port = port + 1
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _share() -> tuple[int, int]:
    """The first port and the number of ports this process hands out: those below the
    ephemeral range, or, in a worker of a parallel test run (pytest-xdist's
    PYTEST_XDIST_WORKER gwN of PYTEST_XDIST_WORKER_COUNT), its own slice of them, so that two
    workers never hand out one port (two random walks met on 25299: a server failed with
    EADDRINUSE)."""
    low, _ = _ephemeral_range()
    span = low - _LOWEST_PORT
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.isdigit() and count.isdigit() and 0 <= int(worker) < int(count)):
        return _LOWEST_PORT, span
    share = span // int(count)
    return _LOWEST_PORT + int(worker) * share, share


def terminate(popen: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM, up to `grace` seconds, then SIGKILL; returns the exit status."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)
    return int(popen.returncode)


def hold_kernel_settings() -> IO[bytes]:
    """Wait until no other real node of this machine runs, and hold it so until the file
    returned is closed. A node changes the machine's kernel settings and iptables chains and
    writes back, when it stops, what it found when it started: two at once (two test
    processes) would undo what the other still needs, or leave its changes behind."""
    held = SETTINGS_LOCK.open("ab")
    fcntl.flock(held, fcntl.LOCK_EX)
    return held


# Start failures of a moment, after which a process is started again: the port was taken
# between choosing and binding it (another process of the machine was quicker), or a Go
# program lost a race of its own start (kwok v0.8.0's stage controllers register their CEL
# types from several goroutines at once, seen once in a clean `make test`: "fatal error:
# concurrent map writes" in easycel's getTrait, before it listened).
RETRIED_STARTS = ("address already in use", "fatal error: concurrent map")


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to start or to become ready."""


class Process:
    """One child process with its log file; started in its own process group."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is not None:
            terminate(self.popen, grace)
        self.popen = None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def said_since(self, offset: int) -> str:
        """What the process wrote to its log after `offset` bytes."""
        try:
            with self.log.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""
