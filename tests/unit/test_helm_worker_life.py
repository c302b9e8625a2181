"""A helm worker's life where the worker misbehaves (SPEC P5), against a stand-in program
that says the protocol's hello and then does one wrong thing: it ends on its own at once,
again at every start, or it never answers a request, not even its cancel. Each costs that
cluster's worker only: said once per end, started again only on the growing schedule, never
a request left waiting. The real worker's life is tests/integration/test_helm_worker.py."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from krypton.adapters import helmworkerprocess
from krypton.adapters.helmworkerprocess import HelmWorkerPool, HelmWorkerProcess
from krypton.decisions.errors import HelmWorkerFailed

pytestmark = pytest.mark.unit

HELLO = 'print(\'{"protocol": 2, "helm": "stand-in"}\', flush=True)'


def _stand_in(tmp_path: Path, body: str) -> str:
    program = tmp_path / "stand-in-worker"
    program.write_text(f"#!{sys.executable}\nimport sys\n{HELLO}\n{body}\n")
    program.chmod(0o755)
    return str(program)


def test_a_worker_that_ends_at_every_start_is_started_on_the_growing_schedule_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its exit status 0 is no stop krypton asked for: a failure, said, and the next start
    waits. Requests asked meanwhile fail at once with why; none waits for an answer."""
    monkeypatch.setattr(helmworkerprocess, "BACKOFF_FIRST", 0.1)
    said: list[str] = []

    async def ended(reason: str, _message: str) -> None:
        said.append(reason)

    async def hammer(seconds: float) -> tuple[int, int, int]:
        process = HelmWorkerProcess(_stand_in(tmp_path, "sys.exit(0)"), None, {}, on_exit=ended)
        asked = failed = 0
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until:
                asked += 1
                with pytest.raises(HelmWorkerFailed):
                    async with asyncio.timeout(5):  # an answer that never comes: red
                        await process.ask({"op": "status", "release": "r", "namespace": "n"})
                failed += 1
                await asyncio.sleep(0.01)  # a caller's pace, not a synchronisation
        finally:
            await process.close()
        return process.starts, asked, failed

    starts, asked, failed = asyncio.run(hammer(1.0))
    assert asked == failed > 20  # every request failed, none was left waiting
    # starts at 0, then after 0.1, 0.2, 0.4 s of waiting: at most 4 in the second
    assert 1 <= starts <= 4, starts
    assert said and set(said) == {"HelmWorkerFailed"} and len(said) <= starts


def test_a_worker_that_does_not_end_a_cancelled_request_is_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It reads its requests and answers none, its cancel neither: within the grace it is
    killed and said as HelmWorkerStuck; the next request starts a new process (after the
    delay) and the stuck one is gone."""
    monkeypatch.setattr(helmworkerprocess, "STOP_GRACE", 0.5)
    said: list[str] = []

    async def ended(reason: str, _message: str) -> None:
        said.append(reason)

    async def cancel_one() -> tuple[int | None, int | None]:
        process = HelmWorkerProcess(_stand_in(tmp_path, "for line in sys.stdin: pass"), None, {},
                                on_exit=ended)
        try:
            asking = asyncio.ensure_future(process.ask({"op": "status"}))
            async with asyncio.timeout(5):
                while not (process._run and process._run.waiting):  # noqa: SLF001 - sent
                    await asyncio.sleep(0)
            stuck = process._run  # noqa: SLF001 - the process to see killed
            asking.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(5):
                    await asking
            return stuck.proc.returncode, process.pid
        finally:
            await process.close()

    returncode, running = asyncio.run(cancel_one())
    assert returncode is not None and returncode < 0  # killed by a signal
    assert running is None  # nothing takes requests until the next one starts a worker
    assert said == ["HelmWorkerStuck"]


ANSWERS = """import json
for line in sys.stdin:
    print(json.dumps({"id": json.loads(line)["id"], "manifest": ""}), flush=True)"""


def test_a_worker_just_started_for_a_request_is_not_stopped_to_make_room(
        tmp_path: Path) -> None:
    """The fleet's pool stops the worker idle longest when another must start. A worker
    whose request is on its way (started for it, the request not sent yet) is at work, not
    idle: stopped there, the request went to a closed input and failed when it ended."""
    said: list[str] = []

    async def ended(reason: str, _message: str) -> None:
        said.append(reason)

    async def ask_while_room_is_made() -> dict[str, object]:
        pool = HelmWorkerPool(1)
        process = HelmWorkerProcess(_stand_in(tmp_path, ANSWERS), None, {}, on_exit=ended,
                                pool=pool)
        try:
            asking = asyncio.ensure_future(process.ask({"op": "manifest"}))
            async with asyncio.timeout(5):
                while process.pid is None:  # started, its request not sent yet
                    await asyncio.sleep(0)
                pool.make_room()  # as another cluster's worker about to start does
                return await asking
        finally:
            await process.close()

    answer = asyncio.run(ask_while_room_is_made())
    assert answer.get("manifest") == "" and said == [], (answer, said)



@pytest.mark.parametrize("pieces", [
    [b"fatal error: runtime: out of memory\n\ngoroutine 1"],
    [b"E1206 a log line\nfatal error: ", b"runtime: out of memory", b"\n", b"goroutine 1 [running]:"],
    [b"fatal er", b"ror: runtime: out of memory\n" + b"x" * 5000],
])
def test_the_go_runtimes_fatal_line_is_found_however_it_was_written(pieces: list[bytes]) -> None:
    """Go's runtime writes "fatal error: " and its words in pieces: the line is taken once
    whole, wherever the reads cut it."""
    seen, line = b"", ""
    for piece in pieces:
        if not line:
            seen, line = helmworkerprocess._fatal_line(seen + piece)
    assert line == "fatal error: runtime: out of memory"
