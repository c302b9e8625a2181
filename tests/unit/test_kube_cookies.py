"""An API server's cookies are neither kept nor sent back (a server on loopback, reached by
a host name, for which an ordinary cookie jar would keep them)."""

from __future__ import annotations

import asyncio
import json

from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import ClientConfig


async def exchange(requests: int) -> tuple[list[str | None], int]:
    """The Cookie header of each request the server got, and how many cookies the client
    holds afterwards; every answer sets a cookie of its own name."""
    seen: list[str | None] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.decode().split("\r\n")
            cookies = [ln.split(":", 1)[1].strip() for ln in lines
                       if ln.lower().startswith("cookie:")]
            seen.append(cookies[0] if cookies else None)
            body = json.dumps({"kind": "Namespace", "metadata": {"name": "x"}}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Set-Cookie: session%d=%s; Path=/\r\n"
                         b"Content-Length: %d\r\n\r\n" % (len(seen), b"v" * 64, len(body))
                         + body)
            await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
    try:
        for _ in range(requests):
            assert (await kube.request("get namespace", "GET", "/api/v1/namespaces/x"))[
                "kind"] == "Namespace"
        held = len(kube._session().cookie_jar)
    finally:
        await kube.close()
        server.close()
        await server.wait_closed()
    return seen, held


def test_an_api_servers_cookies_are_neither_kept_nor_sent_back() -> None:
    seen, held = asyncio.run(exchange(3))
    assert len(seen) == 3, seen  # each request reached the server
    assert seen == [None, None, None], seen
    assert held == 0
