"""An API server of the tests' own that misbehaves on purpose (SPEC S3): TLS on loopback with
its own CA, forwarding every request to a real control plane except those its `rule` answers
itself (an answer without end, a body too large, JSON nested past any parser, a watch line
that never ends, a redirect to another origin), each answer's time kept."""

from __future__ import annotations

import base64
import functools
import gzip
import http.client
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from krypton.testing import free_port, pki

# (method, path with query) -> None to forward, or a function that answers on the handler
Rule = Callable[[str, str], Callable[[BaseHTTPRequestHandler], None] | None]


class HostileAPI:
    """A TLS front of the control plane whose admin kubeconfig is `upstream`."""

    def __init__(self, upstream: Path, rule: Rule) -> None:
        doc = yaml.safe_load(upstream.read_text())
        cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
        files = tempfile.TemporaryDirectory(prefix="hostile-api-")  # keys, read once below
        self._dir = Path(files.name)
        url = urlsplit(cluster["server"])
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 443
        up = ssl.create_default_context(cadata=base64.b64decode(
            cluster["certificate-authority-data"]).decode())
        self._headers = {}
        if user.get("token"):
            self._headers["Authorization"] = f"Bearer {user['token']}"
        else:
            cert, key = self._dir / "client.crt", self._dir / "client.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            up.load_cert_chain(cert, key)
        self._upstream_tls = up
        self.ca = pki.make_ca("hostile-api")
        crt, key = pki.write(self._dir, "serving", pki.issue(self.ca, "hostile", server=True))
        self.rule, self.answered = rule, 0
        self.times: list[tuple[float, float]] = []  # (start, end) of each answer of the rule
        self.forwarded: list[tuple[float, str]] = []  # (time, method) of the other requests
        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        serving.load_cert_chain(crt, key)
        self.server.socket = serving.wrap_socket(self.server.socket, server_side=True)
        files.cleanup()
        self.closing = threading.Event()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kubeconfig(self) -> str:
        """A kubeconfig for this server (its token is never checked: it forwards as admin)."""
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "hostile",
            "clusters": [{"name": "hostile", "cluster": {
                "server": f"https://127.0.0.1:{self.port}",
                "certificate-authority-data": base64.b64encode(self.ca.cert).decode()}}],
            "users": [{"name": "hostile", "user": {"token": "hostile-api-token-0000"}}],
            "contexts": [{"name": "hostile", "context": {"cluster": "hostile",
                                                         "user": "hostile"}}]})

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                answer = api.rule(self.command, self.path)
                if answer is not None:
                    api.answered += 1
                    start = time.monotonic()
                    try:
                        answer(self)
                    except OSError:
                        pass  # krypton hung up, as it should
                    api.times.append((start, time.monotonic()))
                    self.close_connection = True
                    return
                api.forwarded.append((time.monotonic(), self.command))
                api.forward(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        return Handler

    def forward(self, h: BaseHTTPRequestHandler) -> None:
        """The request as the real API server answers it, streamed (watches too), one
        request per connection."""
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        headers = {k: v for k, v in h.headers.items()
                   if k.lower() in ("accept", "content-type", "user-agent")}
        conn = http.client.HTTPSConnection(self._host, self._port, context=self._upstream_tls,
                                           timeout=400)
        try:
            conn.request(h.command, h.path, body=body, headers={**headers, **self._headers})
            resp = conn.getresponse()
            h.send_response(resp.status)
            for name, value in resp.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    h.send_header(name, value)
            h.send_header("Connection", "close")
            h.end_headers()
            while not self.closing.is_set():
                chunk = resp.read1(65536)
                if not chunk:
                    break
                h.wfile.write(chunk)
                h.wfile.flush()
        except (OSError, http.client.HTTPException):
            pass  # either side hung up (a watch cut short ends in a chunk never finished)
        finally:
            conn.close()
            h.close_connection = True


def stream(h: BaseHTTPRequestHandler, head: bytes, filler: bytes, total: int, *,
           length: bool = True, tail: bytes = b"", status: int = 200) -> None:
    """Answer `status` with `head`, then `filler` repeated up to `total` bytes, then `tail`;
    with or without a Content-Length (without: an HTTP/1.0 answer that ends when the
    connection does)."""
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    if length:
        h.send_header("Content-Length", str(len(head) + total + len(tail)))
    h.end_headers()
    h.wfile.write(head)
    sent = 0
    while sent < total:
        h.wfile.write(filler)
        sent += len(filler)
    h.wfile.write(tail)


@functools.cache
def _zeros() -> bytes:
    return gzip.compress(b"\0" * (64 << 20), compresslevel=9)  # 64 MiB in about 64 KiB


def gzip_bomb(h: BaseHTTPRequestHandler, total: int) -> None:
    """Answer 200 with a gzip body that inflates to `total` bytes of zeros (the same member
    repeated: a gzip stream may hold many), about 64 KiB for each 64 MiB of it."""
    member = _zeros()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Encoding", "gzip")
    h.send_header("Content-Length", str(len(member) * (total >> 26)))
    h.end_headers()
    for _ in range(total >> 26):
        h.wfile.write(member)


def answer(h: BaseHTTPRequestHandler, status: int, body: bytes,
           headers: dict[str, str] | None = None) -> None:
    h.send_response(status)
    for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
        h.send_header(name, value)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def is_list(method: str, path: str, plural: str) -> bool:
    return method == "GET" and f"/{plural}?" in path and "watch=true" not in path


def is_watch(method: str, path: str, plural: str) -> bool:
    return method == "GET" and f"/{plural}?" in path and "watch=true" in path
