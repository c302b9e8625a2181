"""The bench's proxy (krypton.testing.tunnel, part (p)): a CONNECT tunnel to the named port
on loopback, whatever host the line names; anything else is refused."""

from __future__ import annotations

import asyncio

import pytest

from krypton.testing import free_port
from krypton.testing.tunnel import start

pytestmark = pytest.mark.unit


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(await reader.readexactly(5))
    await writer.drain()
    writer.close()


async def _ask(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = await reader.readuntil(b"\r\n\r\n")
    if answer.startswith(b"HTTP/1.1 200"):
        writer.write(b"hello")
        answer += await reader.readexactly(5)
    writer.close()
    return answer


def test_a_tunnel_reaches_the_named_port_on_loopback_and_nothing_else_is_served() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
        target = echo.sockets[0].getsockname()[1]
        port = free_port()
        proxy = await start(port)
        try:
            tunnelled = await _ask(port, f"CONNECT kubernetes.default.svc:{target} HTTP/1.1"
                                         f"\r\nHost: x\r\n\r\n".encode())
            refused = await _ask(port, b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n")
            return tunnelled, refused
        finally:
            proxy.close()
            echo.close()

    tunnelled, refused = asyncio.run(scenario())
    assert tunnelled == b"HTTP/1.1 200 Connection established\r\n\r\nhello"
    assert refused.startswith(b"HTTP/1.1 405")
