"""A real Helm chart repository on loopback or a test bridge (SPEC T3).

Chart directories are packaged with ``helm package`` (optionally under several versions),
indexed with ``helm repo index`` and served over HTTP by a small threaded server. Stopping
and starting the server again on the same port simulates a repository outage. The port is
the repository's from its making to its closing: while it does not serve, a socket bound to
it (not listening) keeps any other server from taking it, so a client is refused there, not
answered by someone else, and the repository can always start again.
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _QuietHandler(SimpleHTTPRequestHandler):
    counter: list[int]

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.counter[0] += 1
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Server(ThreadingHTTPServer):
    allow_reuse_port = True  # bound beside the repository's reservation of its port


def _reserve_port(host: str, port: int) -> socket.socket:
    """A TCP socket on `host` bound to `port` (any free one for 0) and not listening:
    connections to that port are refused, and only a socket of this user that also sets
    SO_REUSEPORT (the repository's own server) can bind it too."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class ChartRepository:
    """Packages charts with a real helm and serves them as a chart repository."""

    def __init__(self, helm: str | Path, directory: str | Path | None = None, *,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        """`host`: the address to serve on, loopback unless the pods of a real node must
        reach it (then the node's bridge address, :attr:`krypton.testing.node.Node.ip`);
        `port`: its port, any free one when 0."""
        self.helm = str(helm)
        self.host = host
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="krypton-charts-"))
        self._reservation = _reserve_port(host, port)
        self.port: int = self._reservation.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._server: ThreadingHTTPServer | None = None
        self._requests = [0]
        self._thread: threading.Thread | None = None

    def publish(self, chart_dir: str | Path, version: str | None = None,
                sign: tuple[str, Path] | None = None) -> Path:
        """Package `chart_dir` (as `version` when given) and refresh the index. With `sign`
        (a key name and the secret keyring holding it), helm signs the package and writes
        its provenance file beside it (``helm package --sign``)."""
        argv = [self.helm, "package", str(chart_dir), "--destination", str(self.directory)]
        if version:
            argv += ["--version", version, "--app-version", version]
        if sign:
            argv += ["--sign", "--key", sign[0], "--keyring", str(sign[1])]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        self._index()
        return Path(out.strip().rsplit(":", 1)[-1].strip())

    def _index(self) -> None:
        subprocess.run([self.helm, "repo", "index", str(self.directory), "--url", self.url],
                       check=True, capture_output=True)

    def start(self) -> ChartRepository:
        """Serve the directory on its host (the same port across restarts)."""
        if self._server is not None:
            return self
        handler_cls = type("Handler", (_QuietHandler,), {"counter": self._requests})
        handler = functools.partial(handler_cls, directory=str(self.directory))
        self._server = _Server((self.host, self.port), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"chart-repo-{self.port}")
        self._thread.start()
        return self

    @property
    def requests(self) -> int:
        """GET requests served so far (to check that clients do not hammer the repository)."""
        return self._requests[0]

    def stop(self) -> None:
        """Stop serving: connections are refused (the packaged charts stay and the port
        stays reserved, so start() brings the repository back)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def close(self) -> None:
        """Stop, give the port up and remove the packaged charts."""
        self.stop()
        self._reservation.close()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ChartRepository:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
