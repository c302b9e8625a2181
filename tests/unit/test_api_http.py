"""krypton's client at the HTTP level, against a server on loopback: an API server's
cookies are neither kept nor sent back, and a proxy named by the operator's own environment
is used, for requests and watches, unless NO_PROXY names the cluster."""

from __future__ import annotations

import asyncio
import json

import pytest

from krypton.adapters.clientconfig import ClientConfig
from krypton.adapters.kube import Kube
from krypton.decisions.errors import ClusterUnreachable

PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "ALL_PROXY")


class Server:
    """Answers every request with a Namespace and a cookie of its own name; keeps each
    request's first line and Cookie header."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.encodings: list[str] = []  # each request's Accept-Encoding
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                cookies = [ln.split(":", 1)[1].strip() for ln in lines
                           if ln.lower().startswith("cookie:")]
                self.requests.append((lines[0], cookies[0] if cookies else None))
                self.encodings.append(next((ln.split(":", 1)[1].strip() for ln in lines
                                            if ln.lower().startswith("accept-encoding:")), ""))
                body = json.dumps({"kind": "Namespace", "metadata": {"name": "x"}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Set-Cookie: session%d=%s; Path=/\r\n"
                             b"Content-Length: %d\r\n\r\n" % (len(self.requests), b"v" * 64,
                                                              len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def exchange(requests: int) -> tuple[list[tuple[str, str | None]], int]:
    """The requests the server got, and how many cookies the client holds afterwards."""
    server = Server()
    async with server as port:
        kube = Kube(ClientConfig(host=f"http://localhost:{port}"), name="c")
        try:
            for _ in range(requests):
                assert (await kube.request("get namespace", "GET", "/api/v1/namespaces/x"))[
                    "kind"] == "Namespace"
            held = len(kube._session().cookie_jar)
        finally:
            await kube.close()
    return server.requests, held


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def test_an_api_servers_cookies_are_neither_kept_nor_sent_back(
        no_proxy: pytest.MonkeyPatch) -> None:
    seen, held = asyncio.run(exchange(3))
    assert len(seen) == 3, seen  # each request reached the server
    assert [cookie for _, cookie in seen] == [None, None, None], seen
    assert held == 0


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
