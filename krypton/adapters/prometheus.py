"""Instant queries against a Prometheus-compatible HTTP API (``/api/v1/query``) for the
metric gates of the progressive rollout (SPEC F7). Blocking: the rollout controller runs it
in a thread. Answers are bounded in size and time; TLS is verified (against
``--rollout-gate-ca-file`` when given); credentials never appear in a message.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from krypton.adapters.http import SameOrigin, read_bounded
from krypton.decisions import gates
from krypton.decisions.errors import TemporaryError

TIMEOUT = 10.0
MAX_ANSWER = 4 << 20


@dataclass(frozen=True)
class ServerAuth:
    username: str = ""
    password: str = ""
    token: str = ""

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.username:
            raw = f"{self.username}:{self.password}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def __repr__(self) -> str:
        return f"ServerAuth(username={self.username!r}, <hidden>)"


def _json(body: bytes) -> Any:
    """A server's JSON answer; ValueError for one that is not JSON or nests past the
    parser's depth (issue 46: it must not end the rollout controller)."""
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise ValueError("the answer nests too deep") from exc


class QueryRejected(Exception):
    """The server refused the query itself (``bad_data``: a PromQL syntax error)."""


class Prometheus:
    def __init__(self, url: str, *, ca_file: str = "", timeout: float = TIMEOUT) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        handlers: list[Any] = [SameOrigin()]
        if url.startswith("https://"):
            context = ssl.create_default_context(cafile=ca_file or None)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def query(self, promql: str, auth: ServerAuth | None = None) -> Any:
        """The server's JSON answer to an instant query (an error document for an HTTP
        error); raises URLError/OSError/ValueError, or TemporaryError for an answer over
        MAX_ANSWER bytes or `timeout` seconds."""
        body = urllib.parse.urlencode({"query": promql}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=body, method="POST",
                                         headers={"Content-Type":
                                                  "application/x-www-form-urlencoded"})
        header = auth.header() if auth else None
        if header:
            request.add_unredirected_header("Authorization", header)
        try:
            with self._opener.open(request, timeout=self.timeout) as resp:
                return _json(read_bounded(resp, MAX_ANSWER, self.timeout,
                                          f"the answer of {self.url}", TemporaryError))
        except urllib.error.HTTPError as exc:
            try:  # Prometheus answers a bad query with 400 and a JSON error document
                return _json(exc.read(MAX_ANSWER))
            except (ValueError, OSError):
                return {"status": "error", "error": f"HTTP {exc.code}: {exc.msg}"[:200]}

    def read(self, promql: str, auth: ServerAuth | None = None) -> gates.Reading:
        """One evaluation: what the answer says, or why there is none."""
        try:
            answer = self.query(promql, auth)
        except TemporaryError as exc:
            return gates.Reading(gates.UNANSWERED, exc.message[:200])
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return gates.Reading(gates.UNANSWERED, f"{self.url} unreachable: {reason}"[:200])
        return gates.judge(answer)

    def check(self, promql: str, auth: ServerAuth | None = None) -> str | None:
        """Ask the server to evaluate `promql` once: raises QueryRejected with the server's
        words for a query it cannot parse; returns why it could not be asked (None: asked)."""
        try:
            answer = self.query(promql, auth)
        except TemporaryError as exc:
            return exc.message
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return f"{self.url} unreachable: {getattr(exc, 'reason', exc)}"
        if isinstance(answer, dict) and answer.get("errorType") == "bad_data":
            raise QueryRejected(str(answer.get("error"))[:300])
        return None
