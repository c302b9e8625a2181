"""The test bed starts a control-plane process again only after a failure of the moment
(krypton.testing.host.RETRIED_STARTS); any other failure is an error at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from krypton.testing.controlplane import ControlPlane, ControlPlaneError
from krypton.testing.workloads import Workloads

# A stand-in for a Go program: each start counts itself in argv[2]; the starts listed in
# argv[3] fail with argv[4] followed by a goroutine dump, the others listen on argv[1].
FAKE = """
import socket, sys, time
from pathlib import Path
count = Path(sys.argv[2])
n = int(count.read_text() or 0) + 1 if count.exists() else 1
count.write_text(str(n))
if str(n) in sys.argv[3].split(","):
    print(sys.argv[4])
    print("\\n".join(f"goroutine {i} [running]:" for i in range(40)), flush=True)
    sys.exit(2)
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
time.sleep(600)
"""


def start(tmp_path: Path, failing: str, message: str) -> tuple[ControlPlane, int]:
    cp = ControlPlane("t", tmp_path, workdir=tmp_path / "w", startup_timeout=20)
    count = tmp_path / "starts"

    def argv(port: int) -> list[str]:
        return [sys.executable, "-c", FAKE, str(port), str(count), failing, message]

    proc = Workloads(cp).start_listening("fake", argv, tmp_path / "fake.log")
    try:
        assert proc.alive()
    finally:
        proc.stop()
    return cp, int(count.read_text())


def test_a_go_program_that_lost_a_race_of_its_start_is_started_again(tmp_path: Path) -> None:
    _, starts = start(tmp_path, "1,2", "fatal error: concurrent map writes")
    assert starts == 3


def test_a_port_taken_meanwhile_is_chosen_again(tmp_path: Path) -> None:
    _, starts = start(tmp_path, "1", "listen tcp 127.0.0.1:1: bind: address already in use")
    assert starts == 2


def test_any_other_failure_is_an_error_at_once(tmp_path: Path) -> None:
    with pytest.raises(ControlPlaneError, match="did not start"):
        start(tmp_path, "1", "panic: flag provided but not defined")
    assert (tmp_path / "starts").read_text() == "1"
