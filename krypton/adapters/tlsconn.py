"""Less memory per TLS connection: one receive buffer per thread, the peer certificate decoded
when asked for.

asyncio's ``SSLProtocol`` reads a TLS connection's socket into a receive buffer of its own,
``max_size`` bytes (256 KiB) allocated and zero-filled when the connection opens, and copies
each read into the connection's ``MemoryBIO`` at once. An engaged cluster holds two watch
connections and often a pooled request connection: at 256 KiB each that was about 0.7 MiB per
cluster, and still 32 KiB per cluster with a 16 KiB buffer (32 MiB at 1000 clusters).

On a selector event loop (Linux's, the only one krypton runs on) the socket is read into that
buffer and the bytes are handed on in the same synchronous call
(``_read_ready__get_buffer``: ``get_buffer``, ``recv_into``, ``buffer_updated``), so nothing
else can use the buffer in between: every connection of a thread can read through the same
one. That buffer keeps asyncio's full size, so a large list is read in as few pieces as
before. A connection of any other event loop (a proactor reads asynchronously into the buffer
it was given) keeps a buffer of its own.

asyncio also keeps the peer's certificate decoded into nested tuples (``peercert``, about
1.6 KiB per connection) for ``get_extra_info("peercert")``, which nothing here asks for; it
is decoded from the TLS object when asked for instead.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import threading
from typing import Any

_BaseProtocol = asyncio.sslproto.SSLProtocol
SIZE = _BaseProtocol.max_size  # asyncio's receive buffer: 256 KiB


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.buffer = bytearray(SIZE)
        self.view = memoryview(self.buffer)


_shared = _PerThread()


class LeanSSLProtocol(_BaseProtocol):  # type: ignore[misc,valid-type]
    def __init__(self, loop: asyncio.AbstractEventLoop, *args: Any, **kwargs: Any) -> None:
        super().__init__(loop, *args, **kwargs)  # its own buffer, dropped here at once
        if isinstance(loop, asyncio.SelectorEventLoop):
            self._ssl_buffer, self._ssl_buffer_view = _shared.buffer, _shared.view
        else:
            self._ssl_buffer = bytearray(SIZE)
            self._ssl_buffer_view = memoryview(self._ssl_buffer)

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        super()._on_handshake_complete(handshake_exc)
        self._extra.pop("peercert", None)

    def _get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peercert" and "ssl_object" in self._extra:
            return self._extra["ssl_object"].getpeercert()
        return super()._get_extra_info(name, default)


def install() -> None:
    """Make asyncio open TLS connections with :class:`LeanSSLProtocol` (base_events looks
    ``sslproto.SSLProtocol`` up each time it opens one)."""
    asyncio.sslproto.SSLProtocol = LeanSSLProtocol  # type: ignore[misc]
