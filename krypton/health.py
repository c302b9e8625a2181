"""/healthz and /readyz on --health-probe-bind-address (SPEC O3).

/healthz answers 200 while the process serves; /readyz answers 200 once the watch cluster
is reachable and discovery has synced, 503 before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HealthServer:
    def __init__(self, address: str, ready: Callable[[], bool]) -> None:
        self.address, self.ready = address, ready
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        if self.address == "0":
            return
        host, _, port = self.address.rpartition(":")
        ready = self.ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path == "/healthz":
                    code, body = 200, b"ok"
                elif self.path == "/readyz":
                    code, body = (200, b"ok") if ready() else (503, b"not ready")
                else:
                    code, body = 404, b"not found"
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="health").start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
