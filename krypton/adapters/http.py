"""krypton's one HTTP client for what is not a cluster's API (those go over
:mod:`krypton.adapters.wire`): the chart index, the registry's answers and the metric
server's, on aiohttp. They are written by others, and one that is huge, endless, trickles in
or redirects elsewhere must fail a fetch, not hold a pass or the rollout, nor carry a
credential anywhere else."""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from krypton.decisions.errors import TemporaryError

MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)


def same_origin(one: str, other: str) -> bool:
    a, b = urllib.parse.urlsplit(one), urllib.parse.urlsplit(other)
    return (a.scheme, a.netloc) == (b.scheme, b.netloc)


def session(timeout: float, read_timeout: float | None = None, *,
            proxied: bool = False) -> aiohttp.ClientSession:
    """A session for answers written by others: each exchange whole within `timeout`
    seconds however slowly it trickles in, no cookies kept (a server cannot grow a jar or
    see one back); `proxied`, through the proxy the operator's environment names, as helm
    reaches the same chart repositories."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout, sock_read=read_timeout),
        cookie_jar=aiohttp.DummyCookieJar(), trust_env=proxied)


@dataclass(frozen=True)
class Answer:
    """An answer, read whole within its bound; `refused` names a redirect not followed."""

    status: int
    reason: str
    headers: Mapping[str, str]
    body: bytes
    refused: str = ""


async def fetch(client: aiohttp.ClientSession, url: str, *, limit: int, what: str,
                method: str = "GET", headers: Mapping[str, str] | None = None,
                data: Any = None, tls: ssl.SSLContext | bool = True,
                follow: Callable[[str, str], bool] = same_origin,
                keep_authorization: Callable[[str, str], bool] = same_origin) -> Answer:
    """One request and its answer, following a redirect only where `follow(from, to)`
    allows (SPEC S3: by default to the same scheme and host), the Authorization header
    only where `keep_authorization(from, to)` does; the body refused past `limit` bytes
    (TemporaryError ``AnswerTooLarge``)."""
    sent = dict(headers or {})
    for _ in range(MAX_REDIRECTS + 1):
        async with client.request(method, url, headers=sent, data=data, ssl=tls,
                                  allow_redirects=False) as resp:
            if resp.status in REDIRECTS:
                target = urllib.parse.urljoin(url, resp.headers.get("Location", ""))
                if not follow(url, target):
                    where = urllib.parse.urlsplit(target)
                    return Answer(resp.status, resp.reason or "", resp.headers.copy(), b"",
                                  refused=f"redirect to {where.scheme}://{where.netloc[:100]} "
                                          "not followed")
                if not keep_authorization(url, target):
                    sent.pop("Authorization", None)
                if resp.status == 303:
                    method, data = "GET", None
                url = target
                continue
            body = await read_answer(resp, limit, what)
            return Answer(resp.status, resp.reason or "", resp.headers.copy(), bytes(body))
    raise TemporaryError(f"{what}: more than {MAX_REDIRECTS} redirects", reason="BadResponse")


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
