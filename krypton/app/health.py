"""/healthz, /readyz and /metrics (SPEC O3), served from one small thread of their own.

The servers run on a private event loop in one thread, so they answer while the operator's
own loop is busy, and they are bounded: each listener (health, metrics) has its own budget
of `MAX_CONNECTIONS` connections waiting for their request, a request head must arrive
within `READ_TIMEOUT` seconds and fit in 8 KiB, and a new connection past the budget closes
the one that has waited longest. So idle connections, on either port, can neither exhaust
the other port nor keep a fresh probe out: /healthz keeps answering under a flood of the
metrics port (issue 25.6), and under a flood of its own port a probe's connection still gets
its turn.

/healthz reports the operator's event loop, not this thread: a :class:`LoopWatch` ticks on
the main loop, and /healthz fails (503) once no tick has been seen for `STALL_LIMIT`
seconds, i.e. when the loop is blocked. /readyz answers 200 once the watch cluster is
reachable and discovery has synced, with one line per cluster that is not serving (a
failing cluster is reported, not made a reason to take the pod out of service).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable

import prometheus_client

from krypton.adapters import metrics

MAX_CONNECTIONS = 32
READ_TIMEOUT = 5.0
MAX_HEAD = 8192
STALL_LIMIT = 10.0
TICK = 0.5

Readiness = Callable[[], tuple[bool, list[str]]]


class LoopWatch:
    """A heartbeat on the operator's event loop; its lag is a metric and feeds /healthz."""

    def __init__(self) -> None:
        self.last_tick = time.monotonic()

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            self.last_tick = before
            await asyncio.sleep(TICK)
            lag = max(0.0, time.monotonic() - before - TICK)
            metrics.EVENT_LOOP_LAG.set(round(lag, 3))

    def stalled_for(self) -> float:
        return max(0.0, time.monotonic() - self.last_tick - TICK)


class HealthServer:
    def __init__(self, health_address: str, metrics_address: str, ready: Readiness,
                 watch: LoopWatch) -> None:
        self.addresses = {"health": health_address, "metrics": metrics_address}
        self.ready, self.watch = ready, watch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        # per listener: the handlers still waiting for a request head, and since when
        self._waiting: dict[str, dict[asyncio.Task[None], float]] = {
            "health": {}, "metrics": {}}

    def start(self) -> None:
        """Bind the listeners (raising OSError if a port is taken) and serve in a thread."""
        wanted = {k: a for k, a in self.addresses.items() if a != "0"}
        if not wanted:
            return
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(wanted, started))
            except BaseException as exc:  # noqa: BLE001 - handed to start()
                failure.append(exc)
                started.set()
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, daemon=True, name="health")
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]

    async def _serve(self, wanted: dict[str, str], started: threading.Event) -> None:
        self._stop = asyncio.Event()
        servers = []
        for kind, address in wanted.items():
            host, _, port = address.rpartition(":")
            server = await asyncio.start_server(
                functools.partial(self._handle, kind), host or "0.0.0.0", int(port),
                limit=MAX_HEAD)
            servers.append(server)
        started.set()
        await self._stop.wait()
        for server in servers:
            server.close()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _handle(self, kind: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        waiting = self._waiting[kind]
        if len(waiting) >= MAX_CONNECTIONS:  # make room: the one idle longest goes
            oldest = min(waiting, key=waiting.__getitem__)
            del waiting[oldest]
            oldest.cancel()
        me = asyncio.current_task()
        assert me is not None
        waiting[me] = time.monotonic()
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    head = await reader.readuntil(b"\r\n\r\n")
            finally:
                waiting.pop(me, None)
            parts = head.split(b"\r\n", 1)[0].split()
            path = parts[1].decode("ascii", "replace") if len(parts) >= 2 else ""
            code, ctype, body = self._answer(kind, path.split("?", 1)[0])
            writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % (
                             code, _REASONS[code], ctype.encode(), len(body)) + body)
            async with asyncio.timeout(READ_TIMEOUT):
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _answer(self, kind: str, path: str) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if kind == "metrics":
            if path != "/metrics":
                return 404, text, b"not found\n"
            return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest()
        if path == "/healthz":
            stalled = self.watch.stalled_for()
            if stalled > STALL_LIMIT:
                return 503, text, f"event loop blocked for {stalled:.1f}s\n".encode()
            return 200, text, b"ok"
        if path == "/readyz":
            ok, details = self.ready()
            body = ("ok" if ok else "not ready") + "".join(f"\n{d}" for d in details)
            return (200 if ok else 503), text, body.encode()
        return 404, text, b"not found\n"

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        if self._thread is not None:
            self._thread.join(5)
        self._loop = self._thread = None


_REASONS = {200: b"OK", 404: b"Not Found", 503: b"Service Unavailable"}
