"""/healthz, /readyz and /metrics (SPEC O3), served by aiohttp on the operator's event loop.

The health and the metrics listener are two sites of one small application. A connection
must bring its request within `HEAD_TIMEOUT` seconds of opening (aiohttp's keep-alive timeout
runs from the connection's start) and every answer closes it, so idle connections, on either
port, are gone after a few seconds and cost no thread; a request head is at most 8 KiB.

/healthz answers from the event loop itself: while the loop is blocked nothing answers, and
the kubelet's liveness probe fails on its timeout. A :class:`LoopWatch` ticks on the loop and
publishes its lag as a metric. /readyz answers 200 once the watch cluster is reachable and
discovery has synced, with one line per cluster that is not serving (a failing cluster is
reported, not made a reason to take the pod out of service).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import prometheus_client
from aiohttp import web

from krypton.adapters import metrics

HEAD_TIMEOUT = 5.0
MAX_HEAD = 8190  # aiohttp's bound on a request line and on each header line
TICK = 0.5

Readiness = Callable[[], tuple[bool, list[str]]]


class LoopWatch:
    """A heartbeat on the operator's event loop; its lag is a metric."""

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK)
            lag = max(0.0, time.monotonic() - before - TICK)
            metrics.EVENT_LOOP_LAG.set(round(lag, 3))


def _closing(response: web.Response) -> web.Response:
    response.force_close()
    return response


def _text(status: int, text: str) -> web.Response:
    return _closing(web.Response(status=status, text=text))


class HealthServer:
    """The health and metrics listeners ("0" turns one off), on the running event loop."""

    def __init__(self, health_address: str, metrics_address: str, ready: Readiness) -> None:
        self.addresses = {"health": health_address, "metrics": metrics_address}
        self.ready = ready
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        """Bind the listeners; OSError if a port is taken."""
        routes = {"health": [web.get("/healthz", self._healthz), web.get("/readyz", self._readyz)],
                  "metrics": [web.get("/metrics", self._metrics)]}
        try:
            for kind, address in self.addresses.items():
                if address == "0":
                    continue
                app = web.Application()
                app.add_routes(routes[kind])
                runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                       keepalive_timeout=HEAD_TIMEOUT, max_line_size=MAX_HEAD,
                                       max_field_size=MAX_HEAD)
                await runner.setup()
                self._runners.append(runner)
                host, _, port = address.rpartition(":")
                await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return _text(200, "ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, details = self.ready()
        return _text(200 if ok else 503, ("ok" if ok else "not ready") +
                     "".join(f"\n{d}" for d in details))

    async def _metrics(self, request: web.Request) -> web.Response:
        return _closing(web.Response(body=prometheus_client.generate_latest(), headers={
            "Content-Type": prometheus_client.CONTENT_TYPE_LATEST}))
