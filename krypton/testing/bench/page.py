"""(v) The fleet page (SPEC O16): the server's time and bytes for the matrix of 500 clusters
x 4 Tenants, what an open event stream costs the server (memory, and CPU while idle), how
long a Tenant's status commit takes to reach an open stream, and whether 50 open streams
change the install and bump figures (a same-run A/B, taking turns)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

from krypton.decisions import fleetview
from krypton.decisions.fleetview import Row
from krypton.runtime.changes import Changes
from krypton.web.server import WebServer

from ..host import free_port
from .bed import Bed
from .fleet import fleet_run
from .process import log
from .streams import STREAMS, Streams

MATRIX = (500, 4)  # clusters x Tenants the render is timed at
RENDERS = 20  # GETs of the matrix timed
IDLE = 20.0  # seconds the open streams are watched idle
TURNS = 3  # runs with and without open streams, taking turns
AB_N = 200  # Tenants per cluster in the A/B


def _tenant(name: str, cluster: str, i: int) -> dict[str, Any]:
    ready = i % 5 != 0
    conditions = [{"type": f"ClusterReady/{cluster}", "status": "True" if ready else "False",
                   "reason": "Upgraded", "message": "", "lastTransitionTime":
                   "2026-12-06T04:00:00Z"}]
    if i % 7 == 0:
        conditions.append({"type": f"ClusterError/{cluster}", "status": "True",
                           "reason": "UpgradeFailed", "message": "context deadline exceeded"})
    return {"metadata": {"namespace": "team", "name": name},
            "status": {"phase": "Ready" if ready else "Error", "conditions": conditions,
                       "clusters": {cluster: {"chartVersion": "0.3.0" if i % 3 else "0.2.0"}}}}


class _Fleet:
    """A fleet in memory, the operator's source's shape: 500 clusters of 4 Tenants."""

    def __init__(self, clusters: int, tenants: int) -> None:
        self.changes = Changes()
        self._rows = [r for c in range(clusters) for r in fleetview.tenant_rows(
            f"cluster-{c:03d}", [_tenant(f"tenant-{t}", f"cluster-{c:03d}", c + t)
                                 for t in range(tenants)])]

    def rows(self) -> list[Row]:
        return self._rows

    def clusters(self) -> dict[str, dict[str, str]]:
        return {r.cluster: {"state": "engaged"} for r in self._rows}

    def tenant(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {}

    async def plan(self, namespace: str, name: str, *, diff: bool = False
                   ) -> dict[str, tuple[str, str, str]]:
        return {}

    def journal(self, namespace: str, name: str) -> dict[str, Any]:
        return {}

    def rollout(self) -> None:
        return None

    def scope(self) -> str:
        return ""

    def controlled_in(self) -> str:
        return ""

    async def control(self, action: str, by: str, seen: str) -> tuple[bool, str]:
        return False, "the bench's fleet has no rollout"


@contextlib.contextmanager
def _serving(server: WebServer) -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield loop
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _get(port: int, path: str) -> tuple[float, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        started = time.perf_counter()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
        return time.perf_counter() - started, b"".join(chunks).partition(b"\r\n\r\n")[2]


def render_and_streams() -> dict[str, Any]:
    """The matrix rendered (GET /, loopback) and the streams' cost, in this process."""
    source = _Fleet(*MATRIX)
    port = free_port()
    server = WebServer(f"127.0.0.1:{port}", source, streams=STREAMS)
    with _serving(server):
        _get(port, "/")  # templates compiled once
        timed = [_get(port, "/") for _ in range(RENDERS)]
        seconds = sorted(t for t, _ in timed)
        html = len(timed[0][1])
        json_bytes = len(_get(port, "/rows.json")[1])
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        with Streams(port, STREAMS):
            while server.open_streams < STREAMS:
                time.sleep(0.05)
            held = tracemalloc.get_traced_memory()[0] - before
            cpu = time.process_time()
            time.sleep(IDLE)
            idle_cpu = time.process_time() - cpu
        tracemalloc.stop()
    log(f"(v) matrix {MATRIX[0]}x{MATRIX[1]}: median {statistics.median(seconds) * 1000:.0f} ms, "
        f"{html / 1024:.0f} KiB; {STREAMS} streams {held / STREAMS / 1024:.1f} KiB each")
    return {"matrix": f"{MATRIX[0]} clusters x {MATRIX[1]} Tenants", "renders": RENDERS,
            "render_ms": {"min": round(seconds[0] * 1000, 1),
                          "median": round(statistics.median(seconds) * 1000, 1),
                          "max": round(seconds[-1] * 1000, 1)},
            "html_kib": round(html / 1024, 1), "rows_json_kib": round(json_bytes / 1024, 1),
            "streams": STREAMS, "stream_kib_each": round(held / STREAMS / 1024, 1),
            "idle_seconds": IDLE, "idle_cpu_seconds_all_streams": round(idle_cpu, 3)}


def streams_ab(bed: Bed) -> dict[str, Any]:
    """(v) with the operator: install and bump of AB_N x 2 releases, TURNS times with
    STREAMS open event streams and TURNS times without, taking turns (each side going first
    in every other turn, as every run leaves the control planes fuller)."""
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    sides = (("without", 0), ("with", STREAMS))
    for turn in range(TURNS):  # each side first in turn: the bed fills as the runs go
        for side, count in sides if turn % 2 == 0 else sides[::-1]:
            log(f"(v) turn {turn + 1}/{TURNS}: {count} open streams")
            runs[side].append(fleet_run(bed, AB_N, prefix=f"v{turn}{count}-", bump=True,
                                        streams=count))

    def spread(side: str, *path: str) -> dict[str, float]:
        values = []
        for r in runs[side]:
            value: Any = r
            for p in path:
                value = value[p]
            values.append(float(value))
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}
    figures = {side: {"seconds_to_ready": spread(side, "seconds_to_ready"),
                      "bump_seconds": spread(side, "version_bump", "seconds"),
                      "operator_cpu_seconds": spread(side, "operator_cpu_seconds")}
               for side in runs}
    latency = [r["commit_to_stream"] for r in runs["with"] if "commit_to_stream" in r]
    return {"releases": 2 * AB_N, "turns": TURNS, "streams": STREAMS, **figures,
            "commit_to_stream": latency}


def page_costs(bed: Bed) -> dict[str, Any]:
    return {"server": render_and_streams(), "operator": streams_ab(bed)}
