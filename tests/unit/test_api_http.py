"""krypton's client at the HTTP level, against a server on loopback: an API server's
cookies are neither kept nor sent back; requests and watches share the connections answers
left open, a write is never sent twice, and a gzip answer is bounded by what it inflates to;
a proxy named by the operator's own environment is used, for requests and watches, unless
NO_PROXY names the cluster."""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
from collections.abc import Callable

import pytest

from krypton.adapters import kubeapi
from krypton.adapters.clientconfig import ClientConfig
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import Limits
from krypton.decisions.errors import ClusterUnreachable, TemporaryError

NAMESPACE = json.dumps({"kind": "Namespace", "metadata": {"name": "x"}}).encode()



def answer(body: bytes, *headers: bytes) -> bytes:
    return b"\r\n".join([b"HTTP/1.1 200 OK", b"Content-Type: application/json", *headers,
                          b"Content-Length: %d" % len(body), b"", body])


def namespace(n: int) -> bytes | None:
    """A Namespace with a cookie named after the request's number."""
    return answer(NAMESPACE, b"Set-Cookie: session%d=%s; Path=/" % (n, b"v" * 64))


class Server:
    """Answers the n-th request (from 0) with `answer(n)`, or closes its connection without
    an answer when that is None; keeps each request's first line and Cookie header, and
    counts connections: those opened, and those the client has closed."""

    def __init__(self, answer: Callable[[int], bytes | None] = namespace,
                 close_after: frozenset[int] = frozenset()) -> None:
        self.answer = answer
        self.close_after = close_after  # requests after whose answer the connection is closed
        self.requests: list[tuple[str, str | None]] = []
        self.encodings: list[str] = []  # each request's Accept-Encoding
        self.connections = 0
        self.closed_by_client = asyncio.Queue[int]()  # each a connection's number
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                cookies = [ln.split(":", 1)[1].strip() for ln in lines
                           if ln.lower().startswith("cookie:")]
                self.requests.append((lines[0], cookies[0] if cookies else None))
                self.encodings.append(next((ln.split(":", 1)[1].strip() for ln in lines
                                            if ln.lower().startswith("accept-encoding:")), ""))
                length = next((int(ln.split(":", 1)[1]) for ln in lines
                               if ln.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                answer = self.answer(len(self.requests) - 1)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if len(self.requests) - 1 in self.close_after:
                    return
        except asyncio.IncompleteReadError:
            self.closed_by_client.put_nowait(number)
        except ConnectionError:
            pass
        finally:
            writer.close()


async def exchange(requests: int) -> list[tuple[str, str | None]]:
    """The requests the server got."""
    server = Server()
    async with server as port:
        kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
        try:
            for _ in range(requests):
                assert (await kube.request("get namespace", "GET", "/api/v1/namespaces/x"))[
                    "kind"] == "Namespace"
        finally:
            await kube.close()
    return server.requests


def test_an_api_servers_cookies_are_neither_kept_nor_sent_back(
        no_proxy: pytest.MonkeyPatch) -> None:
    seen = asyncio.run(exchange(3))
    assert len(seen) == 3, seen  # each request reached the server
    assert [cookie for _, cookie in seen] == [None, None, None], seen


def test_a_proxy_named_by_the_environment_is_used_unless_no_proxy_names_the_cluster(
        no_proxy: pytest.MonkeyPatch) -> None:
    """The cluster's name does not resolve: only the proxy can answer for it."""
    async def run(skip: bool) -> tuple[list[tuple[str, str | None]], bytes]:
        proxy = Server()
        async with proxy as port:
            no_proxy.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
            if skip:
                no_proxy.setenv("NO_PROXY", "cluster.invalid")
            kube = Kube(ClientConfig(host="http://cluster.invalid:6443"), name="c")
            try:
                await kube.request("get namespace", "GET", "/api/v1/namespaces/x")
                watch = await kube.watch("watch namespaces", "/api/v1/namespaces",
                                         resource_version="1", label_selector=None,
                                         accept="application/json", server_timeout=5)
                try:
                    line = await watch.readline(1 << 20)
                finally:
                    watch.close()
            finally:
                await kube.close()
        return proxy.requests, line

    seen, line = asyncio.run(run(skip=False))
    assert [request.split("?")[0] for request, _ in seen] == [
        "GET http://cluster.invalid:6443/api/v1/namespaces/x HTTP/1.1",
        "GET http://cluster.invalid:6443/api/v1/namespaces"], seen
    assert json.loads(line)["kind"] == "Namespace"
    with pytest.raises(ClusterUnreachable):
        asyncio.run(run(skip=True))


@pytest.mark.parametrize(("disabled", "asked"), [(False, "gzip"), (True, "identity")])
def test_a_kubeconfigs_disable_compression_is_followed_as_client_go_follows_it(
        disabled: bool, asked: str) -> None:
    """client-go asks for gzip unless the cluster sets disable-compression; so does
    krypton's client (the bounds count what the answer inflates to)."""
    async def run() -> list[str]:
        server = Server()
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}", compress=not disabled),
                        name="c")
            try:
                await kube.get_namespace("x")
            finally:
                await kube.close()
        return server.encodings

    encodings = asyncio.run(run())
    assert len(encodings) == 1 and asked in encodings[0], encodings


def test_requests_and_a_watch_after_them_share_the_connection_answers_left_open() -> None:
    """As client-go keeps its connections: three requests, then a watch, on one connection."""
    async def run() -> tuple[int, int, list[str]]:
        server = Server()
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
            try:
                for _ in range(3):
                    await kube.get_namespace("x")
                watch = await kube.watch("watch namespaces", "/api/v1/namespaces",
                                         resource_version="1", label_selector=None,
                                         accept="application/json", server_timeout=5)
                assert json.loads(await watch.readline(1 << 20))["kind"] == "Namespace"
                watch.close()
            finally:
                await kube.close()
        return server.connections, len(server.requests), [r for r, _ in server.requests]

    connections, requests, seen = asyncio.run(run())
    assert (connections, requests) == (1, 4), seen


def test_a_kept_connection_is_closed_after_its_idle_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubeapi, "IDLE_SECONDS", 0.2)

    async def run() -> int:
        server = Server()
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
            try:
                await kube.get_namespace("x")
                closed = await asyncio.wait_for(server.closed_by_client.get(), 5)
                await kube.get_namespace("x")  # on a new connection
                assert server.connections == 2
                return closed
            finally:
                await kube.close()

    assert asyncio.run(run()) == 0


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_kept_connection_that_fails_sends_a_read_again_and_a_write_never(method: str) -> None:
    """The server takes the second request and closes without an answer, as a server that
    closed a kept connection at that moment would look: a GET goes again on a new
    connection; a write may have been done, so it is not sent twice (client-go's rule)."""
    async def run() -> tuple[list[str], BaseException | None]:
        server = Server(lambda n: None if n == 1 else namespace(n))
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
            try:
                await kube.get_namespace("x")
                try:
                    await kube.request("a request", method, "/api/v1/namespaces/x",
                                       body=None if method == "GET" else {"metadata": {}})
                except ClusterUnreachable as exc:
                    return [r for r, _ in server.requests], exc
                return [r for r, _ in server.requests], None
            finally:
                await kube.close()

    seen, error = asyncio.run(run())
    if method == "GET":
        assert (len(seen), error) == (3, None), (seen, error)
    else:
        assert len(seen) == 2 and isinstance(error, ClusterUnreachable), (seen, error)


def test_a_connection_the_server_closed_while_it_was_kept_carries_no_write() -> None:
    """The server closes the connection after its answer without saying so beforehand, as
    an API server does past its idle timeout: the write after it goes on a new one."""
    async def run() -> list[str]:
        server = Server(close_after=frozenset({0}))
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
            try:
                await kube.get_namespace("x")
                async with asyncio.timeout(5):  # until the client has seen the close
                    while any(kept.usable for kept, _ in kube._idle):
                        await asyncio.sleep(0.01)
                await kube.request("a write", "POST", "/api/v1/namespaces", body={})
            finally:
                await kube.close()
        return [r for r, _ in server.requests]

    assert len(asyncio.run(run())) == 2


BOMB = gzip.compress(b" " * (64 << 20))  # 64 MiB of JSON's white space, 64 KiB on the wire


@pytest.mark.parametrize(("body", "headers", "reason"), [
    (gzip.compress(NAMESPACE), [b"Content-Encoding: gzip"], None),
    (BOMB, [b"Content-Encoding: gzip"], "AnswerTooLarge"),
    (NAMESPACE, [b"Content-Encoding: gzip"], "BadResponse"),  # not gzip at all
    (gzip.compress(NAMESPACE)[:-8], [b"Content-Encoding: gzip"], "BadResponse"),  # no trailer
    (NAMESPACE, [b"Content-Encoding: br"], "BadResponse"),  # not asked for
], ids=["gzip", "bomb", "not-gzip", "no-trailer", "brotli"])
def test_a_gzip_answer_is_inflated_and_bounded_by_what_it_inflates_to(
        body: bytes, headers: list[bytes], reason: str | None) -> None:
    """The bomb is refused having inflated at most a little over the bound (1 MiB)."""
    async def run() -> str | None:
        server = Server(lambda _: answer(body, *headers))
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c",
                        limits=Limits(answer=1 << 20))
            try:
                assert (await kube.get_namespace("x"))["kind"] == "Namespace"
            except TemporaryError as exc:
                return exc.reason
            finally:
                await kube.close()
        return None

    tracemalloc.start()
    try:
        assert asyncio.run(run()) == reason
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_an_answer_in_gzip_to_a_client_that_disabled_compression_is_refused() -> None:
    async def run() -> str | None:
        server = Server(lambda _: answer(gzip.compress(NAMESPACE), b"Content-Encoding: gzip"))
        async with server as port:
            kube = Kube(ClientConfig(host=f"http://localhost:{port}", compress=False), name="c")
            try:
                await kube.get_namespace("x")
            except TemporaryError as exc:
                return exc.reason
            finally:
                await kube.close()
        return None

    assert asyncio.run(run()) == "BadResponse"
