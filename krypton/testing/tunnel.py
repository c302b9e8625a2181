"""A CONNECT proxy on loopback, for clusters reached through a proxy (SPEC S5): each tunnel
it is asked for goes to the same port on 127.0.0.1, whatever host the CONNECT line names, so
that a kubeconfig may name a control plane by a name only the proxy resolves (a loopback
address is never proxied). It runs as a process of its own, its CPU apart from the
operator's: ``python -m krypton.testing.tunnel PORT``.
"""

from __future__ import annotations

import asyncio
import sys

HEAD_LIMIT = 8192


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].split(b" ", 2)
        if method != b"CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", int(target.rsplit(b":", 1)[1]))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_relay(reader, up_writer), _relay(up_reader, writer))
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError):
        pass
    finally:
        writer.close()


async def start(port: int) -> asyncio.Server:
    """The proxy, listening on `port` of loopback."""
    return await asyncio.start_server(_tunnel, "127.0.0.1", port, limit=HEAD_LIMIT)


async def serve(port: int) -> None:
    async with await start(port) as server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
