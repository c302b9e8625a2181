"""Reading an HTTP answer within bounds: the chart index, the registry's answers and the
metric server's are written by others, and one that is huge, endless or trickles in must
fail a fetch, not hold a pass or the rollout."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import aiohttp

from krypton.decisions.errors import ChartNotLoaded, TemporaryError


def read_bounded(resp: Any, limit: int, deadline: float, what: str,
                 error: type[TemporaryError] = ChartNotLoaded) -> bytes:
    """The body of `resp`, at most `limit` bytes, all of it within `deadline` seconds
    however slowly it trickles in; `error` naming `what` otherwise."""
    declared = resp.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise error(f"{what} is {declared} bytes, over the limit of {limit}")
    until = time.monotonic() + deadline
    chunks, size = [], 0
    while chunk := resp.read1(1 << 16):
        size += len(chunk)
        if size > limit:
            raise error(f"{what} is over the limit of {limit} bytes")
        if time.monotonic() > until:
            raise error(f"{what} did not arrive within {deadline:.0f}s")
        chunks.append(chunk)
    return b"".join(chunks)


def same_origin(one: str, other: str) -> bool:
    a, b = urllib.parse.urlsplit(one), urllib.parse.urlsplit(other)
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


class SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme and host: an answer written by others
    (a registry, a metric server) cannot send krypton, or a credential, elsewhere nor
    from https to http (SPEC S3)."""

    def allowed(self, req: Any, newurl: str) -> bool:
        return same_origin(req.full_url, newurl)

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:
        if not self.allowed(req, newurl):
            where = urllib.parse.urlsplit(newurl)
            raise urllib.error.HTTPError(req.full_url, code, f"redirect to {where.scheme}://"
                                         f"{where.netloc[:100]} not followed", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


async def read_answer(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytearray:
    """The body of `resp`, refused (TemporaryError ``AnswerTooLarge``) as soon as it passes
    `limit` bytes, whatever its Content-Length says or does not say (an HTTP/1.0 answer
    without one is read until the server closes, within the request's own deadline)."""
    if resp.content_length is not None and resp.content_length > limit:
        raise TemporaryError(f"{what}: the answer is over {limit} bytes", reason="AnswerTooLarge")
    body = bytearray()  # grown in place: no second copy of a large answer
    async for chunk in resp.content.iter_any():
        if len(body) + len(chunk) > limit:
            raise TemporaryError(f"{what}: the answer is over {limit} bytes",
                                 reason="AnswerTooLarge")
        body += chunk
    return body
