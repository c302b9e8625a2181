"""TLS connections that share one receive buffer still each get exactly their own bytes, and
the peer certificate is still there when asked for (real TLS over loopback)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from pathlib import Path

from krypton.adapters import tlsconn
from krypton.testing import pki

CONNECTIONS = 8
PAYLOAD = 3 * 1024 * 1024  # many receive buffers' worth per connection


def payload(i: int) -> bytes:
    """Bytes that differ per connection and per position (a mix-up shows in the digest)."""
    block = b"".join(hashlib.sha256(f"{i}-{n}".encode()).digest() for n in range(2048))
    return (block * (PAYLOAD // len(block) + 1))[:PAYLOAD]


def contexts(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = pki.make_ca("tls-test-ca")
    leaf = pki.issue(ca, "localhost", server=True)
    cert, key = pki.write(tmp_path, "server", leaf)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cadata=ca.cert.decode())
    return server, client


async def exchange(tmp_path: Path) -> tuple[list[bytes], list[object], list[object]]:
    server_ctx, client_ctx = contexts(tmp_path)

    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        i = int((await reader.readline()).decode())
        writer.write(payload(i))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(send, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        async def fetch(i: int) -> tuple[bytes, object, object]:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_ctx, server_hostname="localhost")
            writer.write(f"{i}\n".encode())
            await writer.drain()
            data = await reader.read(-1)
            info = (writer.get_extra_info("peercert"),
                    writer.transport._ssl_protocol)  # type: ignore[attr-defined]
            writer.close()
            return data, *info

        results = await asyncio.gather(*(fetch(i) for i in range(CONNECTIONS)))
    finally:
        server.close()
        await server.wait_closed()
    return [r[0] for r in results], [r[1] for r in results], [r[2] for r in results]


def test_connections_read_through_one_buffer_each_get_their_own_bytes(tmp_path: Path) -> None:
    tlsconn.install()
    received, _, protocols = asyncio.run(exchange(tmp_path))
    assert [hashlib.sha256(d).hexdigest() for d in received] == \
        [hashlib.sha256(payload(i)).hexdigest() for i in range(CONNECTIONS)]
    assert all(isinstance(p, tlsconn.LeanSSLProtocol) for p in protocols)
    buffers = {id(p._ssl_buffer) for p in protocols}  # type: ignore[attr-defined]
    assert len(buffers) == 1, "every connection of the loop's thread reads through one buffer"
    assert len(protocols[0]._ssl_buffer) == tlsconn.SIZE  # type: ignore[attr-defined]


def test_the_peer_certificate_is_decoded_when_asked_for(tmp_path: Path) -> None:
    tlsconn.install()
    _, certs, protocols = asyncio.run(exchange(tmp_path))
    subject = dict(pair[0] for pair in certs[0]["subject"])  # type: ignore[index]
    assert subject["commonName"] == "localhost"
    assert "peercert" not in protocols[0]._extra  # type: ignore[attr-defined]
