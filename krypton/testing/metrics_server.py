"""A Prometheus-compatible server for the test bed (SPEC F7): the real Prometheus, built by
``hack/testbin.sh``, on loopback, scraping every second a small exporter whose values the
tests set per cluster (for example an error ratio that turns bad during a canary's soak).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from krypton.testing import pki
from krypton.testing.host import free_port, terminate

METRIC = "krypton_test_error_ratio"


class Exporter:
    """Serves ``krypton_test_error_ratio{cluster="<name>"} <value>`` for every cluster set."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.port = free_port()
        values = self.values

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                body = "".join(f'{METRIC}{{cluster="{c}"}} {v}\n'
                               for c, v in sorted(values.items())).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="gate-exporter")
        self._thread.start()

    def set(self, cluster: str, value: float) -> None:
        self.values[cluster] = value

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class PrometheusServer:
    """One Prometheus process scraping `exporter` every second; stop() and start() keep its
    port and data (the server down, then up)."""

    username = "gate-reader"

    def __init__(self, tools: Path, exporter: Exporter, *, password: str = "") -> None:
        """With `password`, the server serves HTTPS with a certificate of a CA of its own
        (``ca_file``) and asks for basic auth as ``username``/`password`."""
        self.tools, self.exporter, self.password = tools, exporter, password
        self.dir = Path(tempfile.mkdtemp(prefix="krypton-prometheus-"))
        self.port = free_port()
        self.url = f"{'https' if password else 'http'}://127.0.0.1:{self.port}"
        self.ca_file = self.dir / "ca.crt"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "gate-exporter", "static_configs": [
                      {"targets": [f"127.0.0.1:{exporter.port}"]}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._flags = []
        if password:
            import bcrypt

            ca = pki.make_ca("krypton-prometheus-ca")
            self.ca_file.write_bytes(ca.cert)
            cert, key = pki.write(self.dir, "prometheus", pki.issue(ca, "127.0.0.1", server=True))
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            web = {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                   "basic_auth_users": {self.username: hashed}}
            (self.dir / "web.yml").write_text(yaml.safe_dump(web))
            self._flags = [f"--web.config.file={self.dir / 'web.yml'}"]
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        if self._proc is not None:
            return self
        log = (self.dir / "prometheus.log").open("ab")
        self._proc = subprocess.Popen(
            [str(self.tools / "prometheus"), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *self._flags],
            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with self._open(f"{self.url}/-/ready"):
                    return self
            except (urllib.error.URLError, OSError) as exc:
                if self._proc.poll() is not None:
                    raise RuntimeError("prometheus exited: "
                                       f"{(self.dir / 'prometheus.log').read_text()[-2000:]}"
                                       ) from exc
                time.sleep(0.2)
        raise TimeoutError("prometheus was not ready within 60s")

    def has(self, promql: str) -> bool:
        """The server's answer to `promql` has at least one sample (it scraped the values)."""
        import json
        import urllib.parse

        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with self._open(url) as resp:
                return bool(json.loads(resp.read())["data"]["result"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def _open(self, url: str) -> Any:
        request = urllib.request.Request(url)
        context = None
        if self.password:
            import base64
            import ssl

            context = ssl.create_default_context(cafile=str(self.ca_file))
            raw = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {raw}")
        return urllib.request.urlopen(request, timeout=5, context=context)  # noqa: S310

    def stop(self) -> None:
        if self._proc is None:
            return
        terminate(self._proc, 20)
        self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
