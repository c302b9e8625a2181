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

from krypton.testing.chartrepo import free_port
from krypton.testing.controlplane import terminate

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

    def __init__(self, tools: Path, exporter: Exporter) -> None:
        self.tools, self.exporter = tools, exporter
        self.dir = Path(tempfile.mkdtemp(prefix="krypton-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": [{"job_name": "gate-exporter", "static_configs": [
                      {"targets": [f"127.0.0.1:{exporter.port}"]}]}]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PrometheusServer:
        if self._proc is not None:
            return self
        log = (self.dir / "prometheus.log").open("ab")
        self._proc = subprocess.Popen(
            [str(self.tools / "prometheus"), f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):  # noqa: S310
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
            with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310
                return bool(json.loads(resp.read())["data"]["result"])
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False

    def stop(self) -> None:
        if self._proc is None:
            return
        terminate(self._proc, 20)
        self._proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
