"""One cluster's helm worker process (SPEC P5, S7): started on the first request, stopped
when idle or closed, its requests matched to its answers by id; a worker that ends, stalls or
passes its bounds costs that cluster's worker only. :mod:`krypton.adapters.helmworker` drives
it through the Helm port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import structlog

from krypton.adapters import metrics
from krypton.adapters.helm import STOP_GRACE, hold_to, stop_process
from krypton.decisions.errors import HelmFailed, HelmWorkerFailed
from krypton.decisions.memory import HelmMemory

_log = structlog.get_logger("krypton.helmworker")

PROTOCOL = 2
ANSWER_LIMIT = 64 << 20  # bytes of one answer line: a release's manifest and hooks
MEMORY_LIMIT = 1 << 30  # bytes a worker may use, without a share of the pod (tests)
MEMORY_LOOK = 1.0  # seconds between two looks at a running worker's resident memory
OVER = 1.1  # resident memory past its limit by this much: killed (the kernel's limit is on
# its data segment, which the resident memory follows; the look is the last line)
IDLE = 60.0  # seconds without a request before a worker stops
START_TIMEOUT = 10.0  # seconds a new worker has to say which protocol it speaks
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0  # seconds before a start after a worker ended badly
STDERR_KEPT = 4096  # bytes of a worker's stderr kept to say why it ended
WRITES = frozenset({"upgrade", "rollback", "uninstall"})  # requests that write a record


def _rss(pid: int) -> int:
    """Resident bytes of process `pid` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


@dataclass(eq=False)
class _Run:
    """One worker process and the requests it has not answered yet."""

    proc: asyncio.subprocess.Process
    waiting: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    stderr: collections.deque[bytes] = field(default_factory=collections.deque)
    ended: bool = False
    stopping: bool = False  # asked to end (idle, retired, closed): its exit is no failure
    fatal: str = ""  # the Go runtime's "fatal error:" line, kept whatever follows it
    asked: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # op, namespace, release

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message, separators=(",", ":"), default=str).encode()
                              + b"\n")

    async def drain(self) -> None:
        """The worker's stderr: its last `STDERR_KEPT` bytes kept (a Go panic, a fatal error),
        and the Go runtime's "fatal error:" line wherever it came (Go writes it in pieces, so
        it is looked for across reads, and taken once its line ends)."""
        assert self.proc.stderr is not None
        kept, scan = 0, b""
        while chunk := await self.proc.stderr.read(4096):
            if not self.fatal:
                scan, self.fatal = _fatal_line(scan + chunk)
            self.stderr.append(chunk)
            kept += len(chunk)
            while kept - len(self.stderr[0]) >= STDERR_KEPT:
                kept -= len(self.stderr.popleft())
        if not self.fatal and scan.startswith(b"fatal error:"):  # its line never ended
            self.fatal = scan[:200].decode(errors="replace")

    def last_words(self) -> str:
        tail = b"".join(self.stderr).decode(errors="replace").strip().splitlines()[-3:]
        return " / ".join(tail)[:600]


def _fatal_line(seen: bytes) -> tuple[bytes, str]:
    """What to keep looking at of a worker's stderr, and the Go runtime's "fatal error:"
    line in it once whole ("" until then)."""
    at = seen.find(b"fatal error:")
    if at < 0:
        return seen[-16:], ""  # the words may be cut between two reads
    line = seen[at:at + 512]
    end = line.find(b"\n")
    if end < 0 and len(line) < 200:
        return line, ""
    return line, line[:end if end >= 0 else 200].decode(errors="replace")


class HelmWorkerPool:
    """The fleet's helm workers: at most `limit` running at once. A worker about to start
    when `limit` run first stops the one idle longest (it would have stopped after `IDLE`):
    a fleet whose clusters each have a little helm work keeps a few workers, not one per
    cluster. Workers at work are never stopped for another."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.members: set[HelmWorkerProcess] = set()

    def make_room(self) -> None:
        running = [p for p in self.members if p.running]
        excess = len(running) + 1 - self.limit
        if excess <= 0:
            return
        idle = sorted((p for p in running if p.idle_now), key=lambda p: p.last_used)
        for process in idle[:excess]:
            process.stop_idle()


class HelmWorkerProcess:
    """One cluster's worker: started on the first request, stopped when idle or closed.

    A cancelled request is cancelled inside the worker, which answers at once; Helm's
    library may still be at work behind that answer (as in the helm binary, whose process
    exits there), so that process takes no new request: it is retired, ends when its other
    requests have, and the next request starts a new one. A process that has not answered
    a cancelled request within `STOP_GRACE` is killed."""

    def __init__(self, executable: str, kubeconfig: Path | None, env: Mapping[str, str], *,
                 cluster: str = "", idle: float = IDLE, memory: HelmMemory | None = None,
                 memory_limit: int = MEMORY_LIMIT, answer_limit: int = ANSWER_LIMIT,
                 pool: HelmWorkerPool | None = None,
                 on_exit: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        self.executable, self.kubeconfig, self.env = executable, kubeconfig, dict(env)
        self.cluster, self.idle, self.on_exit = cluster, idle, on_exit
        self.memory = memory  # its share of the pod, held by the kernel (SPEC S7)
        self.memory_limit = memory.share if memory is not None else memory_limit
        self.answer_limit = answer_limit
        self._run: _Run | None = None
        self._retired: set[_Run] = set()
        self._starting: asyncio.Future[_Run] | None = None
        self._ids = itertools.count(1)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._not_before, self._backoff, self._last_exit = 0.0, 0.0, ""
        self._closed = False
        self._asking = 0  # requests on their way to the process (waiting for it to start)
        self.starts = 0  # processes started (tests and the bench read it)
        # releases whose run ended with the process that ran it (killed, out of memory, a
        # crash): why, until their records are unlocked (SPEC S7)
        self.interrupted: dict[tuple[str, str], str] = {}
        self.last_used = 0.0  # time.monotonic() of the last request
        self.pool = pool
        if pool is not None:
            pool.members.add(self)

    @property
    def running(self) -> bool:
        return self._run is not None

    @property
    def idle_now(self) -> bool:
        return self._run is not None and not self._run.waiting and not self._asking

    @property
    def pid(self) -> int | None:
        """The process taking requests now (None: none running)."""
        return self._run.proc.pid if self._run is not None else None

    async def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """`request`'s answer (see the class for cancellation)."""
        self._asking += 1  # at work from now on: never stopped to make room for another
        try:
            run = await self._started()
        finally:
            self._asking -= 1
        if run.ended:  # it ended on its own between its start and this request
            raise HelmWorkerFailed(self._last_exit)
        self.last_used = time.monotonic()
        ident = next(self._ids)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        run.waiting[ident] = answer
        run.asked[ident] = (str(request.get("op")), str(request.get("namespace")),
                            str(request.get("release")))
        self._no_idle()
        try:
            run.send({**request, "id": ident})
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            await self._cancel(run, ident, answer)
            raise
        except (OSError, RuntimeError) as exc:  # its input closed under us: it ended
            await self._end(run, "HelmWorkerFailed", f"its input is closed ({exc})")
            return await answer
        finally:
            run.waiting.pop(ident, None)
            run.asked.pop(ident, None)
            if answer.done() and not answer.cancelled():
                answer.exception()  # looked at: a failure nobody awaits is not logged
            self._maybe_idle()

    async def _cancel(self, run: _Run, ident: int,
                      answer: asyncio.Future[dict[str, Any]]) -> None:
        if run.ended:
            return
        with contextlib.suppress(OSError, RuntimeError):
            run.send({"op": "cancel", "target": ident})
        try:
            async with asyncio.timeout(STOP_GRACE):
                await asyncio.shield(answer)
        except TimeoutError:
            await self._end(run, "HelmWorkerStuck", "a cancelled request did not end "
                            f"within {STOP_GRACE:.0f}s")
            return
        except HelmFailed:
            return
        self._retire(run)

    def _retire(self, run: _Run) -> None:
        run.stopping = True
        if run is self._run:
            self._run = None
            self._retired.add(run)
            if run.proc.stdin is not None:
                run.proc.stdin.close()  # it exits once its other requests are answered

    async def _started(self) -> _Run:
        if self._closed:
            raise HelmWorkerFailed(f"the helm worker of cluster {self.cluster} is stopped")
        if self._run is not None:
            return self._run
        if self._starting is None:
            wait = self._not_before - time.monotonic()
            if wait > 0:
                raise HelmWorkerFailed(f"{self._last_exit}; started again in {wait:.0f}s")
            self._starting = asyncio.ensure_future(self._start())
        starting = self._starting
        try:
            return await asyncio.shield(starting)
        finally:
            if starting.done() and self._starting is starting:
                self._starting = None

    async def _start(self) -> _Run:
        if self.pool is not None:
            self.pool.make_room()
        argv = [self.executable, *(("--kubeconfig", str(self.kubeconfig))
                                   if self.kubeconfig else ())]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env, limit=self.answer_limit)
        except OSError as exc:
            await self._failed_start(f"the helm worker {self.executable} cannot start: {exc}")
        hold_to(proc.pid, self.memory)
        self.starts += 1
        metrics.HELM_WORKERS.inc()
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT):
                line = await proc.stdout.readline()
            hello = _json(line)
            if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
                raise ValueError(f"its first line {line[:80]!r} is not protocol {PROTOCOL}'s")
        except (TimeoutError, ValueError) as exc:
            await stop_process(proc, STOP_GRACE)
            metrics.HELM_WORKERS.dec()
            await self._failed_start(f"the helm worker {self.executable} did not start: "
                                     f"{exc or 'no answer in time'}")
        run = _Run(proc)
        loop = asyncio.get_running_loop()
        run.tasks = [loop.create_task(self._read(run)), loop.create_task(run.drain()),
                     loop.create_task(self._watch_memory(run))]
        self._run = run
        _log.debug("helm worker started", cluster=self.cluster, pid=proc.pid,
                   helm=hello.get("helm"))
        return run

    async def _failed_start(self, message: str) -> NoReturn:
        self._later(message)
        await self._say("HelmWorkerFailed", message)
        raise HelmWorkerFailed(message)

    def _later(self, message: str) -> None:
        """The next start waits, twice as long as the last time (up to `BACKOFF_MAX`)."""
        self._backoff = min(BACKOFF_MAX, self._backoff * 2 or BACKOFF_FIRST)
        self._not_before, self._last_exit = time.monotonic() + self._backoff, message

    async def _say(self, reason: str, message: str) -> None:
        metrics.HELM_WORKER_EXITS.labels(self.cluster, reason).inc()
        _log.warning("helm worker ended", cluster=self.cluster, reason=reason, error=message)
        if self.on_exit is not None:
            try:
                await self.on_exit(reason, message)
            except Exception as exc:  # noqa: BLE001 - an Event not written loses no work
                _log.debug("helm worker's end not reported", error=str(exc))

    async def _read(self, run: _Run) -> None:
        assert run.proc.stdout is not None
        why = ""
        try:
            while line := await run.proc.stdout.readline():
                answer = json.loads(line)
                future = run.waiting.get(int(answer.get("id") or 0)) \
                    if isinstance(answer, dict) else None
                if future is not None and not future.done():
                    future.set_result(answer)
                    self._backoff = 0.0  # it works: the next failure waits from the start
        except ValueError as exc:  # also an answer longer than the limit
            why = f"an answer krypton does not take: {str(exc)[:120]}"
        await self._end(run, "HelmWorkerFailed", why)

    async def _watch_memory(self, run: _Run) -> None:
        while not run.ended:
            await asyncio.sleep(MEMORY_LOOK)
            rss = _rss(run.proc.pid)
            if rss > self.memory_limit * OVER:
                await self._end(run, "HelmWorkerOutOfMemory", f"it used {rss >> 20} MiB, "
                                f"more than {self.memory_limit >> 20} MiB")

    async def _end(self, run: _Run, reason: str, why: str) -> None:
        """`run` ends: stopped (`why` empty, nothing waiting, a clean exit) or failed, its
        requests failing with the reason and the next start delayed."""
        if run.ended:
            return
        run.ended = True
        if run is self._run:
            self._run = None
            self._no_idle()
        self._retired.discard(run)
        if why and run.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                run.proc.kill()
        try:
            # A worker whose output ended is exiting: waited for, not signalled (a signal
            # polls the process first, and a poll that reaps it leaves the child watcher an
            # unknown pid, reported as exit status 255)
            async with asyncio.timeout(STOP_GRACE):
                await run.proc.wait()
        except TimeoutError:
            await stop_process(run.proc, STOP_GRACE)
        metrics.HELM_WORKERS.dec()
        quiet = not why and not run.waiting and run.stopping and \
            (self._closed or run.proc.returncode == 0)
        current = asyncio.current_task()
        drain = run.tasks[1] if len(run.tasks) > 1 else None
        if not quiet and drain is not None and drain is not current:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(1.0):  # its last words, written as it ended
                    await asyncio.shield(drain)
        for task in run.tasks:
            if task is not current:
                task.cancel()
        if quiet:
            return
        words = run.last_words()
        if reason == "HelmWorkerFailed" and "out of memory" in run.fatal:  # its share of the
            reason = "HelmWorkerOutOfMemory"  # pod, held by the kernel (hold_to)
            words = f"{run.fatal} (its share: {self.memory_limit >> 20} MiB)"
        message = (f"the helm worker of cluster {self.cluster} ended "
                   f"({why or f'exit status {run.proc.returncode}'})" +
                   (f": {words}" if words else ""))
        self._later(message)
        for ident, future in run.waiting.items():
            op, namespace, release = run.asked.get(ident, ("", "", ""))
            if op in WRITES and not future.done():  # helm may have left its record pending
                self.interrupted[(namespace, release)] = message
        for future in run.waiting.values():
            if not future.done():  # a worker past its memory says so to its requests too
                future.set_exception(HelmWorkerFailed(
                    message, reason="HelmWorkerOutOfMemory" if "Memory" in reason else None))
        await self._say(reason, message)

    def _no_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _maybe_idle(self) -> None:
        run = self._run
        if run is None or run.waiting or self._closed:
            return
        self._no_idle()
        self._idle_timer = asyncio.get_running_loop().call_later(self.idle, self.stop_idle)

    def stop_idle(self) -> None:
        self._idle_timer = None
        run = self._run
        if run is None or run.waiting or self._asking:
            return
        _log.debug("helm worker idle, stopped", cluster=self.cluster)
        self._retire(run)

    async def close(self) -> None:
        """Stop for good (the cluster disengages, the operator stops): requests under way
        are cancelled inside the worker (SIGTERM, as the helm binary gets), which then has
        `STOP_GRACE` to exit before it is killed."""
        self._closed = True
        self._no_idle()
        if self.pool is not None:
            self.pool.members.discard(self)
        runs = [*self._retired, *([self._run] if self._run else [])]
        for run in runs:
            run.stopping = True
            if run.waiting:
                with contextlib.suppress(ProcessLookupError):
                    run.proc.terminate()
            if run.proc.stdin is not None:
                run.proc.stdin.close()
        for run in runs:
            try:
                async with asyncio.timeout(STOP_GRACE):
                    await run.proc.wait()
            except TimeoutError:
                pass
            await self._end(run, "HelmWorkerFailed", "")
