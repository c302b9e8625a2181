"""A watch's own connection (SPEC S5), against servers on loopback that write raw HTTP/1.1:
the lines of a chunked, sized or close-delimited answer come out whole whatever the chunks
cut, and every answer that breaks HTTP or a bound is an error of that watch, said precisely."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from krypton.adapters import wire
from krypton.adapters.clientconfig import ClientConfig, tls_context
from krypton.adapters.kube import Kube
from krypton.decisions.errors import ClusterUnreachable, Forbidden, RequestUnsendable, TemporaryError
from krypton.testing import pki

pytestmark = pytest.mark.unit

EVENTS = [{"type": "ADDED", "object": {"metadata": {"name": f"n{i}", "resourceVersion": str(i)}}}
          for i in range(3)]
BODY = b"".join(json.dumps(event).encode() + b"\n" for event in EVENTS)
Answer = Callable[[asyncio.StreamWriter], Awaitable[None]]


def chunked(body: bytes, cuts: list[int]) -> bytes:
    """`body` in chunks cut at `cuts`, as RFC 9112 section 7.1 frames them."""
    out, start = b"", 0
    for end in [*cuts, len(body)]:
        out += b"%x\r\n" % (end - start) + body[start:end] + b"\r\n"
        start = end
    return out + b"0\r\n\r\n"


def head(status: str = "200 OK", *headers: str) -> bytes:
    return ("\r\n".join([f"HTTP/1.1 {status}", "Content-Type: application/json", *headers])
            + "\r\n\r\n").encode()


async def watched(answer: Answer, *, limit: int = 1 << 20, tls: Path | None = None,
                  requests: list[bytes] | None = None, timeout: float = 5) -> list[bytes]:
    """The lines a watch of `answer`'s server gives, until its end."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen = await reader.readuntil(b"\r\n\r\n")
        if requests is not None:
            requests.append(seen)
        try:
            await answer(writer)
            await writer.drain()
        finally:
            writer.close()

    context = None
    trust: ssl.SSLContext | bool = True
    if tls is not None:
        ca = pki.make_ca("watch-test")
        crt, key = pki.write(tls, "serving", pki.issue(ca, "127.0.0.1", server=True))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(crt, key)
        trust = tls_context(ca.cert, None, None)
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    scheme = "https" if tls else "http"
    kube = Kube(ClientConfig(host=f"{scheme}://127.0.0.1:{port}", ssl=trust), name="c",
                timeout=timeout)
    lines = []
    try:
        body = await kube.watch("watch things", "/api/v1/things", resource_version="7",
                                label_selector="a=b", accept="application/json",
                                server_timeout=60)
        try:
            while line := await body.readline(limit):
                lines.append(line)
        finally:
            body.close()
    finally:
        await kube.close()
        server.close()
    return lines


def run(answer: Answer, **kwargs: object) -> list[bytes]:
    return asyncio.run(watched(answer, **kwargs))  # type: ignore[arg-type]


def writes(*parts: bytes) -> Answer:
    async def answer(writer: asyncio.StreamWriter) -> None:
        for part in parts:
            writer.write(part)
            await writer.drain()
    return answer


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize("cuts", [[], [1], [5, 6, 7, 60], list(range(1, len(BODY)))])
def test_the_lines_of_a_chunked_answer_come_out_whole_wherever_the_chunks_cut(
        cuts: list[int]) -> None:
    lines = run(writes(head("200 OK", "Transfer-Encoding: chunked"), chunked(BODY, cuts)))
    assert [json.loads(line) for line in lines] == EVENTS


def test_an_answer_that_trickles_in_byte_by_byte_is_read_as_one_sent_at_once() -> None:
    async def trickle(writer: asyncio.StreamWriter) -> None:
        for byte in head("200 OK", "Transfer-Encoding: chunked") + chunked(BODY, [30, 31]):
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0)  # the client may read it alone (a CRLF cut in two)

    assert [json.loads(line) for line in run(trickle)] == EVENTS


def test_a_sized_and_a_close_delimited_answer_are_read_to_their_end() -> None:
    sized = run(writes(head("200 OK", f"Content-Length: {len(BODY)}"), BODY))
    closed = run(writes(head("200 OK"), BODY[:10], BODY[10:]))
    assert [json.loads(line) for line in sized] == EVENTS
    assert [json.loads(line) for line in closed] == EVENTS


def test_the_request_is_one_get_with_its_query_host_and_no_compression() -> None:
    requests: list[bytes] = []
    run(writes(head("200 OK", "Content-Length: 0")), requests=requests)
    first, *headers = requests[0].decode().split("\r\n")
    assert first.startswith("GET /api/v1/things?watch=true&resourceVersion=7&"), first
    assert first.endswith(" HTTP/1.1") and "labelSelector=a%3Db" in first, first
    names = {line.split(":")[0].lower(): line.split(":", 1)[1].strip() for line in headers if line}
    assert names["host"].startswith("127.0.0.1:")
    assert names["accept-encoding"] == "identity"


def test_over_tls_the_watch_is_read_as_over_plain_http(tmp_path: Path) -> None:
    lines = run(writes(head("200 OK", "Transfer-Encoding: chunked"), chunked(BODY, [9])),
                tls=tmp_path)
    assert [json.loads(line) for line in lines] == EVENTS


def test_a_line_over_the_bound_is_refused_before_the_rest_arrives() -> None:
    async def endless(writer: asyncio.StreamWriter) -> None:
        writer.write(head("200 OK", "Transfer-Encoding: chunked"))
        for _ in range(10_000):  # 640 MB without a newline, if it were all read
            writer.write(chunked(b"x" * 65536, [])[:-5])
            await writer.drain()

    with pytest.raises(TemporaryError) as refused:
        run(endless, limit=1 << 20)
    assert refused.value.reason == "AnswerTooLarge"


@pytest.mark.parametrize(("framing", "says"), [
    (b"zz\r\n", "not a hexadecimal number"),
    (b"0x10\r\n", "not a hexadecimal number"),
    (b"5\r\nhello!!\r\n", "not followed by CRLF"),
    (b"1" * 2000, "over 1024 bytes"),
    (b" 5\r\nhello\r\n0\r\n\r\n", "not a hexadecimal number"),  # whitespace before it
    (b"\t5\r\nhello\r\n0\r\n\r\n", "not a hexadecimal number"),
])
def test_chunks_framed_otherwise_than_http_says_are_a_bad_response(framing: bytes,
                                                                   says: str) -> None:
    with pytest.raises(TemporaryError) as bad:
        run(writes(head("200 OK", "Transfer-Encoding: chunked"), framing))
    assert bad.value.reason == "BadResponse" and says in str(bad.value), bad.value


@pytest.mark.parametrize("answer", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    head("200 OK", "Content-Encoding: gzip"),
    b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 70_000 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
])
def test_an_answer_whose_head_is_not_http_or_is_encoded_is_a_bad_response(answer: bytes) -> None:
    with pytest.raises(TemporaryError) as bad:
        run(writes(answer))
    assert bad.value.reason == "BadResponse", bad.value


@pytest.mark.parametrize(("headers", "says"), [
    (("Content-Length: 5", "Content-Length: 50"), "not one number"),  # the last won
    (("Content-Length: 5, 6",), "not one number"),
    (("Content-Length: \u00b9",), "not one number"),  # superscript 1: str.isdigit, not int()
    (("Content-Length: 1\u00b2",), "not one number"),
    (("Content-Length: -1",), "not one number"),
    (("Transfer-Encoding: gzip, chunked",), "not chunked"),  # read as close-delimited
    (("Transfer-Encoding: identity",), "not chunked"),
    (("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), "not chunked"),
    (("Transfer-Encoding: chunked", "Content-Length: 5"), "both a transfer coding"),
    (("Content-Length : 5",), "not a token"),  # space before the colon (RFC 9112 5.1)
    (("X-Note: a\x00b",), "control character"),  # NUL, VT, FF in a value (RFC 9110 5.5)
    (("X-Note: a\x0bb",), "control character"),
    (("X-Note: a\x0cb",), "control character"),
    (("X-Note: a\nContent-Length: 5",), "control character"),  # a bare LF: a line to h11
    ((" Content-Length: 5",), "not a token"),  # a folded line
])
def test_an_answer_framed_ambiguously_is_a_bad_response_not_unreachable(
        headers: tuple[str, ...], says: str) -> None:
    """A strict parser's rules: whatever the server frames beyond what it says is refused,
    as a bad answer that strikes the cluster's budget."""
    answer = ("\r\n".join(["HTTP/1.1 200 OK", *headers]) + "\r\n\r\n").encode("latin-1")
    with pytest.raises(TemporaryError) as bad:
        run(writes(answer, b"hello"))
    assert bad.value.reason == "BadResponse" and says in str(bad.value), bad.value


def test_a_length_given_twice_alike_frames_the_answer() -> None:
    body = b'{"a": 1}\n'
    answer = head("200 OK", f"Content-Length: {len(body)}", f"Content-Length: {len(body)}")
    assert run(writes(answer, body)) == [body]


def test_an_answer_cut_inside_a_chunk_is_the_clusters_error_not_an_end() -> None:
    with pytest.raises(ConnectionResetError):
        run(writes(head("200 OK", "Transfer-Encoding: chunked"), chunked(BODY, [])[:40]))


def test_a_refused_watch_says_what_the_server_said() -> None:
    message = json.dumps({"kind": "Status", "message": "things is forbidden: no"}).encode()
    with pytest.raises(Forbidden, match="things is forbidden: no"):
        run(writes(head("403 Forbidden", f"Content-Length: {len(message)}"), message))


def test_a_server_that_answers_nothing_is_unreachable_within_the_timeout() -> None:
    async def silent(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    with pytest.raises(ClusterUnreachable, match="no answer in time"):
        run(silent, timeout=0.5)


async def watches_on(persist: bool, count: int) -> tuple[int, list[list[bytes]]]:
    """`count` watches, one after another, against a server that answers each with BODY and
    then keeps the connection open (`persist`) or closes it without saying so first: how
    many connections it saw, and the lines of each watch."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(head("200 OK", "Transfer-Encoding: chunked") + chunked(BODY, [7]))
                await writer.drain()
                if not persist:
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kube = Kube(ClientConfig(host=f"http://127.0.0.1:{port}"), name="c", timeout=5)
    seen = []
    try:
        for _ in range(count):
            body = await kube.watch("watch things", "/api/v1/things", resource_version="7",
                                    label_selector=None, accept="application/json",
                                    server_timeout=60)
            lines = []
            while line := await body.readline(1 << 20):
                lines.append(line)
            body.close()
            seen.append(lines)
    finally:
        await kube.close()
        server.close()
    return connections, seen


@pytest.mark.parametrize("persist", [True, False])
def test_the_next_watch_takes_the_connection_a_clean_end_left_or_a_new_one(persist: bool) -> None:
    connections, seen = asyncio.run(watches_on(persist, 3))
    assert all([json.loads(line) for line in lines] == EVENTS for lines in seen), seen
    assert connections == (1 if persist else 3)


def test_a_watch_that_streams_past_its_lifetime_ends_there() -> None:
    """A server that keeps the watch alive with an event every 50 ms, past what was asked
    (timeoutSeconds): the body ends in a TimeoutError at its lifetime, the informer's cue
    to start again, not in an answer read for ever."""
    async def run_watch() -> tuple[int, BaseException | None]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(head("200 OK", "Transfer-Encoding: chunked"))
            try:
                while True:
                    writer.write(chunked(BODY.splitlines(keepends=True)[0], [])[:-5])
                    await writer.drain()
                    await asyncio.sleep(0.05)  # the server's pace, nothing waited for
            except (ConnectionError, asyncio.CancelledError):
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, _, body = await wire.exchange(f"http://127.0.0.1:{port}/w", {}, None, None, "w",
                                           lifetime=0.5)
        lines, ended = 0, None
        try:
            while await body.readline(1 << 20):
                lines += 1
        except TimeoutError as exc:
            ended = exc
        finally:
            body.close()
            server.close()
        return lines, ended

    lines, ended = asyncio.run(run_watch())
    assert isinstance(ended, TimeoutError)
    assert lines >= 2  # it streamed, and was ended by the deadline, not refused at once


def test_a_request_krypton_cannot_send_is_its_own_fault_not_the_clusters() -> None:
    """A header krypton built with a line break is refused before anything is sent, as
    krypton's own defect: not an error of the transport, which callers say as the cluster
    being unreachable."""
    with pytest.raises(RequestUnsendable) as refused:
        asyncio.run(wire.exchange("http://127.0.0.1:9/x", {"X-Note": "a\r\nHost: elsewhere"},
                                  None, None, "GET /x", lifetime=1))
    assert not isinstance(refused.value, (OSError, ValueError, TimeoutError))
    assert refused.value.reason == "RequestUnsendable"


def test_a_chunk_size_followed_by_spaces_is_read_as_h11_reads_it() -> None:
    assert run(writes(head("200 OK", "Transfer-Encoding: chunked"),
                      b"5 \r\nhello\r\n0\r\n\r\n")) == [b"hello"]
