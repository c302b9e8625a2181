"""Event streams open on the fleet page (SPEC O16) during a bench run, read as a browser
reads them: what each row's arrival tells of the page's delay."""

from __future__ import annotations

import json
import selectors
import socket
import statistics
import threading
import time
from typing import Any

STREAMS = 50  # event streams open at once


class Streams:
    """`count` event streams open on a page at `port`, read by one thread as a browser
    would; each row event's arrival time kept (by cluster, namespace/name, state)."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        # (cluster, namespace/name, state) -> (when told by the operator, when it arrived)
        self.arrived: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> Streams:
        deadline = time.monotonic() + 30  # an operator just started may not listen yet
        while len(self._socks) < self.count:
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
                continue
            s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            self._socks.append(s)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self._socks:
            s.close()

    def _read(self) -> None:
        sel = selectors.DefaultSelector()
        pending = {s: b"" for s in self._socks}
        for s in self._socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(1 << 16)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(sock)
                    continue
                now = time.time()
                *lines, pending[sock] = (pending[sock] + data).split(b"\n")
                for line in lines:
                    if line.startswith(b"data: {\"cluster\""):
                        row = json.loads(line[6:])
                        self.arrived.setdefault((row["cluster"], f"{row['namespace']}/"
                                                 f"{row['tenant']}", row["state"]),
                                                (row["at"], now))


def commit_to_stream(streams: Streams) -> dict[str, Any]:
    """Seconds from each Tenant's Ready commit (when the status patch was answered and the
    change told, the row's `at`) to the row's arrival on an open stream (one of them)."""
    delays = [arrived - told for (_c, _t, state), (told, arrived) in streams.arrived.items()
              if state == "Ready"]
    if not delays:
        return {"releases": 0}
    delays.sort()
    return {"releases": len(delays), "median_ms": round(statistics.median(delays) * 1000, 1),
            "p95_ms": round(delays[int(0.95 * (len(delays) - 1))] * 1000, 1),
            "max_ms": round(delays[-1] * 1000, 1)}
