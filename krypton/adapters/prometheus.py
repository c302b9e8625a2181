"""Instant queries against a Prometheus-compatible HTTP API (``/api/v1/query``) for the
metric gates of the progressive rollout (SPEC F7), on the operator's event loop with aiohttp.
Answers are bounded in size and time; TLS is verified (against ``--rollout-gate-ca-file``
when given); a redirect is followed only to the same scheme and host, without the
credentials; credentials never appear in a message.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from krypton.adapters import http
from krypton.decisions.errors import TemporaryError
from krypton.decisions.rollouts import gates

TIMEOUT = 10.0
MAX_ANSWER = 4 << 20
# what a query that got no answer raises
UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError, ValueError)


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


def _json(body: bytes | bytearray) -> Any:
    """A server's JSON answer; ValueError for one that is not JSON or nests past the
    parser's depth (SPEC S3: it must not end the rollout controller)."""
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise ValueError("the answer nests too deep") from exc


class QueryRejected(Exception):
    """The server refused the query itself (``bad_data``: a PromQL syntax error)."""


class Unanswered(Exception):
    """The server could not be asked, or gave no usable answer."""


class Prometheus:
    def __init__(self, url: str, *, ca_file: str = "", timeout: float = TIMEOUT) -> None:
        self.url, self.timeout = url.rstrip("/"), timeout
        self._tls: ssl.SSLContext | bool = (ssl.create_default_context(cafile=ca_file or None)
                                            if url.startswith("https://") else False)

    async def query(self, promql: str, auth: ServerAuth | None = None) -> Any:
        """The server's JSON answer to an instant query (an error document for an HTTP
        error); raises Unanswered (a TemporaryError for an answer over MAX_ANSWER bytes),
        all within `timeout` seconds."""
        header = auth.header() if auth else None
        async with http.session(self.timeout) as client:
            answer = await http.fetch(
                client, f"{self.url}/api/v1/query", method="POST", data={"query": promql},
                headers={"Authorization": header} if header else {}, tls=self._tls,
                limit=MAX_ANSWER, what=f"the answer of {self.url}",
                keep_authorization=lambda _from, _to: False)  # it stays with the first URL
        if answer.refused:
            raise Unanswered(f"HTTP {answer.status}: {answer.refused}")
        try:  # Prometheus answers a bad query with 400 and a JSON error document
            return _json(answer.body)
        except ValueError:
            if answer.status < 400:
                raise
            return {"status": "error", "error": f"HTTP {answer.status}: {answer.reason}"[:200]}

    async def _ask(self, promql: str, auth: ServerAuth | None) -> Any:
        try:
            return await self.query(promql, auth)
        except TemporaryError as exc:
            raise Unanswered(exc.message) from exc
        except Unanswered:
            raise
        except UNREACHABLE as exc:
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or \
                type(exc).__name__
            raise Unanswered(f"{self.url} unreachable: {reason}") from exc

    async def read(self, promql: str, auth: ServerAuth | None = None) -> gates.Reading:
        """One evaluation: what the answer says, or why there is none."""
        try:
            answer = await self._ask(promql, auth)
        except Unanswered as exc:
            return gates.Reading(gates.UNANSWERED, str(exc)[:200])
        return gates.judge(answer)

    async def check(self, promql: str, auth: ServerAuth | None = None) -> str | None:
        """Ask the server to evaluate `promql` once: raises QueryRejected with the server's
        words for a query it cannot parse; returns why it could not be asked (None: asked)."""
        try:
            answer = await self._ask(promql, auth)
        except Unanswered as exc:
            return str(exc)
        if isinstance(answer, dict) and answer.get("errorType") == "bad_data":
            raise QueryRejected(str(answer.get("error"))[:300])
        return None
