"""The test bed's chart repository holds its port from its making to its closing: while it
is down a client is refused there, no other server can take the port, and the repository
starts again on it (an outage test once found another server answering on the port of a
repository that was not started yet)."""

from __future__ import annotations

import errno
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from krypton.testing.chartrepo import ChartRepository


def answer(url: str) -> int | str:
    """The HTTP status of GET `url`, or the reason it got none."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError as exc:
        return str(exc.reason)


def another_server_takes(port: int) -> bool:
    """Whether a server of this process (SO_REUSEADDR, as http.server sets it) can listen
    on `port`."""
    try:
        HTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler).server_close()
    except OSError as exc:
        assert exc.errno == errno.EADDRINUSE, exc
        return False
    return True


def test_the_repository_holds_its_port_while_it_is_down(tmp_path: Path) -> None:
    (tmp_path / "index.yaml").write_text("apiVersion: v1\nentries: {}\n")
    repo = ChartRepository("helm", tmp_path)
    try:
        refused = answer(f"{repo.url}/index.yaml")
        assert "refused" in str(refused).lower(), refused  # made, not started: down
        assert not another_server_takes(repo.port)
        repo.start()
        assert answer(f"{repo.url}/index.yaml") == 200
        repo.stop()
        assert "refused" in str(answer(f"{repo.url}/index.yaml")).lower()
        assert not another_server_takes(repo.port)
        repo.start()  # the same port again
        assert answer(f"{repo.url}/index.yaml") == 200
    finally:
        repo.close()
