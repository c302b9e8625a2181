"""krypton's own HTTP/1.1 connections to an API server (SPEC S5): one request at a time on
each, its answer read whole or line by line, over TLS kept on memory buffers.

A watch holds its connection for minutes while nothing arrives, and an engaging cluster's
requests hold theirs until the last one is answered. On asyncio's own TLS every connection
keeps a receive buffer of 256 KiB, zeroed and resident, for as long as it is open. Here TLS
runs on :class:`ssl.MemoryBIO` over a plain TCP stream, which holds only what arrived and was
not yet read. It speaks only what krypton's client needs: a request with or without a body,
the answer's head, a chunked, sized or close-delimited body, gzip when asked for, each part
bounded; through the proxy the operator's environment names for the cluster, as client-go
goes (:func:`proxy_for`).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ipaddress
import os
import re
import ssl
import zlib
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

from krypton.decisions.errors import RequestUnsendable, TemporaryError

HEAD_LIMIT = 64 << 10  # the answer's status line and headers together
CHUNK_LINE = 1024  # a chunk's size line, its extensions included
READ = 1 << 16  # bytes taken from the socket, or from TLS, at a time
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")
_LENGTH = re.compile(r"[0-9]{1,15}")  # ASCII digits only: str.isdigit takes others
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header's name (RFC 9110 section 5.1)
# what a header's value may not hold (RFC 9110 section 5.5): a control character but HTAB (a
# NUL, a VT, a FF, a bare LF that a lax parser takes as the line's end)
_NOT_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: .*)?")
REPLAYABLE = frozenset({"GET", "HEAD"})  # sent again on a new connection if a kept one fails


@dataclasses.dataclass(frozen=True)
class Proxy:
    """A proxy the operator's environment names: reached over TCP, or TLS when its URL is
    https; a cluster served over https is reached through a CONNECT tunnel, one over http by
    requests in absolute form, as Go's transport does. Its credentials, if its URL has
    them, go only to it, in Proxy-Authorization; it is never named in an error with them."""

    scheme: str
    host: str
    port: int
    authorization: str | None = dataclasses.field(default=None, repr=False)


def proxy_for(url: str) -> Proxy | None:
    """The proxy for `url` as client-go's ``http.ProxyFromEnvironment`` picks it:
    HTTPS_PROXY for an https server, HTTP_PROXY for an http one (either case, the upper
    first), none for localhost, a loopback address or a host NO_PROXY names."""
    target = urlsplit(url)
    chosen = _environment(f"{target.scheme}_proxy")
    if not chosen or _bypassed(target.hostname or "", target.port, _environment("no_proxy")):
        return None
    parts = urlsplit(chosen if "://" in chosen else f"http://{chosen}")
    authorization = None
    if parts.username is not None:
        user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(user.encode()).decode("ascii")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # not a port: refused at use, as a proxy of another scheme is
        return Proxy("", parts.hostname or "", 0)
    return Proxy(parts.scheme, parts.hostname or "", port, authorization)


def _environment(name: str) -> str:
    return os.environ.get(name.upper()) or os.environ.get(name) or ""


_WITH_PORT = re.compile(r"([^:\[\]]+|\[[^\]]+\]):([0-9]{1,5})")


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """localhost or a loopback address, or a host NO_PROXY names as Go reads it: "*" every
    host; an address or a CIDR block; a name with its subdomains ("example.com") or its
    subdomains only (".example.com", "*.example.com"); each with ":port" for that port
    alone."""
    host = host.lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = \
            ipaddress.ip_address(host)
    except ValueError:
        address = None
    if host == "localhost" or (address is not None and address.is_loopback):
        return True
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        with_port = _WITH_PORT.fullmatch(entry)
        if with_port:
            if port != int(with_port.group(2)):
                continue
            entry = with_port.group(1).strip("[]")
        if not entry:
            continue
        try:
            block = ipaddress.ip_network(entry, strict=False)
        except ValueError:  # a name
            block = None
        if block is not None:
            if address is not None and address in block:
                return True
            continue
        name = entry.removeprefix("*").rstrip(".")
        if host.endswith(name) if name.startswith(".") else \
                host == name or host.endswith(f".{name}"):
            return True
    return False


def bad_answer(what: str, detail: str) -> TemporaryError:
    return TemporaryError(f"{what}: {detail}", reason="BadResponse")


def too_large(what: str, limit: int) -> TemporaryError:
    return TemporaryError(f"{what}: the answer is over {limit} bytes", reason="AnswerTooLarge")


class Wire:
    """Bytes to and from one server, plain or in TLS on memory buffers, with what arrived
    and was not read yet."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 tls: ssl.SSLObject | None, what: str) -> None:
        self._reader, self._writer, self._tls, self._what = reader, writer, tls, what
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._buf = bytearray()

    @classmethod
    async def open(cls, url: str, context: ssl.SSLContext | None, server_name: str | None,
                   what: str, proxy: Proxy | None = None) -> Wire:
        """Connected to `url`'s host, or to `proxy` and through it; TLS shaken hands when
        `context` is given."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if proxy is None:
            reader, writer = await asyncio.open_connection(parts.hostname, port, limit=READ)
        elif proxy.scheme in ("http", "https"):
            reader, writer = await asyncio.open_connection(
                proxy.host, proxy.port, limit=READ,
                ssl=ssl.create_default_context() if proxy.scheme == "https" else None)
        else:
            raise ConnectionRefusedError("the proxy the environment names is neither http "
                                         "nor https, the schemes krypton speaks to a proxy")
        wire = cls(reader, writer, None, what)
        try:
            if proxy is not None and parts.scheme == "https":
                await wire._tunnel(f"{_bracketed(parts.hostname or '')}:{port}", proxy)
            if context is not None:
                wire._tls = context.wrap_bio(wire._incoming, wire._outgoing,
                                             server_hostname=server_name or parts.hostname)
                await wire._handshake()
        except BaseException:
            wire.close()
            raise
        return wire

    async def _tunnel(self, authority: str, proxy: Proxy) -> None:
        """Asks `proxy` for a tunnel to `authority` (RFC 9110 section 9.3.6): its answer's
        head is read as strictly as a server's; anything but 2xx is a refusal."""
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        status, _, _ = await _head(self, f"{self._what} (the proxy's CONNECT)", gzip=False)
        if not 200 <= status < 300:
            raise ConnectionRefusedError(f"the proxy refused a tunnel to {authority}: "
                                         f"HTTP {status}")
        if self._buf:
            raise bad_answer(self._what, "the proxy sent more than its answer to CONNECT")

    async def _handshake(self) -> None:
        assert self._tls is not None
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            await self._flush()
            data = await self._reader.read(READ)
            if not data:
                raise ConnectionResetError("the server closed the connection in the TLS "
                                           "handshake")
            self._incoming.write(data)
        await self._flush()

    async def _flush(self) -> None:
        if self._outgoing.pending:
            self._writer.write(self._outgoing.read())
            await self._writer.drain()

    async def send(self, data: bytes) -> None:
        if self._tls is None:
            self._writer.write(data)
            await self._writer.drain()
            return
        self._tls.write(data)
        await self._flush()

    async def _receive(self) -> bytes:
        """What arrives next, b"" when the server has closed."""
        if self._tls is None:
            return await self._reader.read(READ)
        while True:
            try:
                data = self._tls.read(READ)
                await self._flush()  # a key update or a session ticket answered
                return data
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                return b""
            data = await self._reader.read(READ)
            if not data:
                return b""  # closed without TLS's close_notify: the body says if it ended
            self._incoming.write(data)

    async def _fill(self) -> bool:
        data = await self._receive()
        self._buf += data
        return bool(data)

    async def line(self, limit: int) -> bytes:
        """The next line ended by CRLF, without it; at most `limit` bytes."""
        start = 0
        while (end := self._buf.find(b"\r\n", start)) < 0:
            if len(self._buf) > limit:
                raise bad_answer(self._what, f"a line of the answer's head or chunks is over "
                                             f"{limit} bytes")
            start = max(len(self._buf) - 1, 0)
            if not await self._fill():
                raise ConnectionResetError("the server closed the connection mid-answer")
        if end > limit:
            raise bad_answer(self._what, f"a line of the answer's head or chunks is over "
                                         f"{limit} bytes")
        line = bytes(self._buf[:end])
        del self._buf[:end + 2]
        return line

    async def some(self, most: int) -> bytes:
        """Up to `most` bytes as they arrive, b"" when the server has closed."""
        if not self._buf and not await self._fill():
            return b""
        piece = bytes(self._buf[:most])
        del self._buf[:len(piece)]
        return piece

    @property
    def buffered(self) -> bool:
        """Whether bytes arrived that no answer has read."""
        return bool(self._buf) or bool(self._incoming.pending)

    @property
    def usable(self) -> bool:
        """Whether a kept connection can carry the next request: open, and the server has
        neither closed it nor sent anything while it was idle."""
        return not (self._writer.is_closing() or self._reader.at_eof() or self.buffered)

    def close(self) -> None:
        self._writer.close()  # nothing is pending: a request was drained before its answer


class Body:
    """The body of one answer on its :class:`Wire`, read as lines or whole."""

    def __init__(self, wire: Wire, headers: dict[str, str], what: str, deadline: float,
                 keep: Callable[[Wire], None] | None = None, *,
                 framed: tuple[bool, int] = (False, -1)) -> None:
        self._wire, self._what = wire, what
        self._keep = keep  # takes the connection back once the body has ended cleanly
        self._deadline = deadline  # on the loop's clock: the answer ends by then at the latest
        self._lines = bytearray()  # decoded, not yet handed out
        self._chunked, length = framed  # :func:`framing`
        self._chunk_seen = False
        # bytes left of the current chunk, or of a sized body; -1: until the server closes
        self._left = 0 if self._chunked else length
        self._ended = not self._chunked and self._left == 0
        self._gzip = headers.get("content-encoding", "").lower() == "gzip"

    async def _piece(self) -> bytes:
        """The next part of the decoded body, b"" at its end."""
        if self._ended:
            return b""
        if self._chunked and self._left == 0:
            if self._chunk_seen and await self._wire.line(2):
                raise bad_answer(self._what, "a chunk is not followed by CRLF")
            # the size, then only spaces and tabs before its extensions (h11's rule)
            size_line = (await self._wire.line(CHUNK_LINE)).split(b";", 1)[0].rstrip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size_line):
                raise bad_answer(self._what, "a chunk's size is not a hexadecimal number")
            self._left, self._chunk_seen = int(size_line, 16), True
            if self._left == 0:
                while await self._wire.line(HEAD_LIMIT):  # trailers, unused
                    pass
                self._ended = True
                return b""
        piece = await self._wire.some(READ if self._left < 0 else min(self._left, READ))
        if not piece:
            if self._left >= 0:
                raise ConnectionResetError("the server closed the connection mid-answer")
            self._ended = True
            return b""
        if self._left > 0:
            self._left -= len(piece)
            if not self._chunked and self._left == 0:
                self._ended = True
        return piece

    async def readline(self, limit: int) -> bytes:
        """The next line, its newline included; the last without one; b"" at the end. A
        line over `limit` bytes is refused (AnswerTooLarge) before more of it is read;
        TimeoutError past the body's deadline."""
        async with asyncio.timeout_at(self._deadline):
            return await self._readline(limit)

    async def _readline(self, limit: int) -> bytes:
        start = 0
        while (end := self._lines.find(b"\n", start)) < 0:
            if len(self._lines) > limit:
                raise TemporaryError(f"{self._what}: an event is over {limit} bytes",
                                     reason="AnswerTooLarge")
            start = len(self._lines)
            piece = await self._piece()
            if not piece:
                line = bytes(self._lines)
                self._lines.clear()
                return line
            self._lines += piece
        if end >= limit:
            raise TemporaryError(f"{self._what}: an event is over {limit} bytes",
                                 reason="AnswerTooLarge")
        line = bytes(self._lines[:end + 1])
        del self._lines[:end + 1]
        return line

    async def read(self, limit: int) -> bytearray:
        """The whole body, inflated when it came in gzip; refused (AnswerTooLarge) as soon as
        it passes `limit` bytes, inflated or not; TimeoutError past the body's deadline."""
        async with asyncio.timeout_at(self._deadline):
            if not self._chunked and self._left > limit:
                raise too_large(self._what, limit)
            inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16) if self._gzip else None
            body = bytearray(self._lines)
            self._lines.clear()
            while piece := await self._piece():
                if inflate is not None:
                    try:  # never more than one byte past the bound, however well it packs
                        piece = inflate.decompress(piece, limit + 1 - len(body))
                    except zlib.error:
                        raise bad_answer(self._what, "the answer is not valid gzip") from None
                body += piece
                if len(body) > limit:
                    raise too_large(self._what, limit)
            if inflate is not None and not inflate.eof:
                raise bad_answer(self._what, "the answer's gzip stream is cut short")
            return body  # no second copy of a large answer

    def close(self) -> None:
        """Ends the body; its connection is kept for the next request or watch when the
        server said all it had to say on it and keeps it open."""
        if self._ended and self._left >= 0 and self._keep is not None and \
                not self._wire.buffered:
            self._keep(self._wire)
        else:
            self._wire.close()
        self._ended, self._keep = True, None


async def exchange(url: str, headers: dict[str, str], context: ssl.SSLContext | None,
                   server_name: str | None, what: str, *, lifetime: float, method: str = "GET",
                   body: bytes | None = None, idle: Wire | None = None,
                   keep: Callable[[Wire], None] | None = None, proxy: Proxy | None = None,
                   ) -> tuple[int, dict[str, str], Body]:
    """Send one request for `url` and read the answer's head: its status, its headers (names
    in lower case) and its body, to be read within `lifetime` seconds and closed by the
    caller. The answer may come in gzip only when `headers` ask for it. The request goes on
    the `idle` connection an earlier answer left, when there is one; if that fails, a GET
    is sent again on a new connection (the server may have closed the kept one meanwhile).
    A body that ends cleanly gives its connection to `keep`. Through `proxy`, if given."""
    parts = urlsplit(url)
    authority = parts.netloc.rpartition('@')[2]
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}",
             *(f"{name}: {value}" for name, value in headers.items())]
    if proxy is not None and parts.scheme == "http":  # no tunnel: the proxy forwards it
        lines[0] = f"{method} http://{authority}{target} HTTP/1.1"
        if proxy.authorization:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    if any(c in line for line in lines for c in "\r\n\0"):  # krypton's own fault, not the
        raise RequestUnsendable(f"{what}: a header or the path holds a line break")  # cluster's
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    gzip = "gzip" in headers.get("Accept-Encoding", "")
    while True:
        wire = idle or await Wire.open(url, context, server_name, what, proxy)
        try:
            await wire.send(request)
            status, answer_headers, persistent = await _head(wire, what, gzip)
            break
        except OSError:
            wire.close()
            if idle is None or method not in REPLAYABLE:
                raise
            idle = None  # closed by the server while it was idle: on a new connection
        except BaseException:
            wire.close()
            raise
    deadline = asyncio.get_running_loop().time() + lifetime
    try:  # answers without a body (RFC 9110), else as the head frames it
        framed = (False, 0) if method == "HEAD" or status in (204, 304) else \
            framing(answer_headers, what)
    except BaseException:
        wire.close()
        raise
    return status, answer_headers, Body(wire, answer_headers, what, deadline,
                                        keep if persistent else None, framed=framed)


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def framing(headers: dict[str, str], what: str) -> tuple[bool, int]:
    """How an answer's body is framed (RFC 9112 section 6.3), strictly: chunked, or its
    length (-1: until the server closes). A transfer coding other than chunked alone, both
    a coding and a length, or a length that is not one number (repeated with another
    value, digits other than ASCII) is a bad answer, as a strict parser has it: read
    otherwise, it would let the server frame what comes after it."""
    coding, length = headers.get("transfer-encoding"), headers.get("content-length")
    if coding is not None:
        if coding.lower() != "chunked":
            raise bad_answer(what, f"the answer's transfer coding is not chunked "
                                   f"({coding[:40]!r})")
        if length is not None:
            raise bad_answer(what, "the answer has both a transfer coding and a length")
        return True, 0
    if length is None:
        return False, -1
    values = {v.strip() for v in length.split(",")}
    if len(values) != 1 or not _LENGTH.fullmatch(value := values.pop()):
        raise bad_answer(what, f"the answer's Content-Length is not one number ({length[:40]!r})")
    return False, int(value)


async def _head(wire: Wire, what: str, gzip: bool) -> tuple[int, dict[str, str], bool]:
    """The status and headers of the answer, and whether its connection persists after it
    (RFC 9112 section 9.3)."""
    while True:  # informational answers (1xx) come before the answer
        match = _STATUS.fullmatch(await wire.line(HEAD_LIMIT))
        if not match:
            raise bad_answer(what, "the answer does not start with an HTTP/1.1 status line")
        headers: dict[str, str] = {}
        used = 0
        while line := await wire.line(HEAD_LIMIT):
            used += len(line)
            if used > HEAD_LIMIT:
                raise bad_answer(what, f"the answer's headers are over {HEAD_LIMIT} bytes")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise bad_answer(what, "a header of the answer has no colon")
            if not _TOKEN.fullmatch(name):
                raise bad_answer(what, "a header of the answer has a name that is not a token")
            name, value = name.lower(), value.strip(" \t")
            if _NOT_IN_VALUE.search(value):
                raise bad_answer(what, "a header of the answer has a control character in its "
                                       "value")
            # a header given twice is one list (RFC 9110 section 5.3)
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        status = int(match.group(2))
        if status >= 200:
            encoding = headers.get("content-encoding", "identity").lower()
            if encoding not in (("identity", "gzip") if gzip else ("identity",)):
                raise bad_answer(what, f"the answer is encoded ({encoding[:40]}), though "
                                       "not asked for so")
            persistent = match.group(1) == b"1" and \
                "close" not in headers.get("connection", "").lower()
            return status, headers, persistent
