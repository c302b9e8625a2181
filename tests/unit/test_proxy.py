"""A proxy the operator's environment names (SPEC S5): picked for a cluster as client-go
picks it, and gone through on krypton's own connections: a CONNECT tunnel to a cluster over
https, its TLS shaken hands with the cluster inside it, the proxy's credentials sent to it
alone; a refusal or a malformed answer of the proxy is the cluster's error, never a hang."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from krypton.adapters import wire
from krypton.adapters.clientconfig import ClientConfig, tls_context
from krypton.adapters.kube import Kube
from krypton.decisions.errors import ClusterUnreachable, TemporaryError
from krypton.testing import pki

pytestmark = pytest.mark.unit

CLUSTER = "kubernetes.default.svc"  # in the serving certificate; not resolved here
T = TypeVar("T")
NAMESPACE = json.dumps({"kind": "Namespace", "metadata": {"name": "x"}}).encode()


@pytest.mark.parametrize(("variables", "url", "expected"), [
    ({}, "https://c.example:6443", None),
    ({"NO_PROXY": "10.0.0.0/8"}, "https://c.example:6443", None),
    ({"HTTP_PROXY": "http://p:3128"}, "https://c.example:6443", None),  # http's only
    ({"HTTPS_PROXY": "http://p:3128"}, "https://c.example:6443", ("http", "p", 3128)),
    ({"https_proxy": "p:3128"}, "https://c.example", ("http", "p", 3128)),
    ({"HTTPS_PROXY": "http://a:1", "https_proxy": "http://b:2"}, "https://c.example",
     ("http", "a", 1)),
    ({"HTTP_PROXY": "https://p"}, "http://c.example", ("https", "p", 443)),
    ({"HTTPS_PROXY": "http://p:3128"}, "https://127.0.0.1:6443", None),
    ({"HTTPS_PROXY": "http://p:3128"}, "https://[::1]:6443", None),
    ({"HTTPS_PROXY": "http://p:3128"}, "https://localhost:6443", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*"}, "https://c.example", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}, "https://11.1.2.3",
     ("http", "p", 3128)),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "example"}, "https://c.example", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "ample"}, "https://c.example",
     ("http", "p", 3128)),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".c.example"}, "https://c.example",
     ("http", "p", 3128)),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "*.example"}, "https://c.example", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "c.example:6443"},
     "https://c.example:6443", None),
    ({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": "c.example:443"},
     "https://c.example:6443", ("http", "p", 3128)),
])
def test_the_proxy_is_picked_as_client_go_picks_it(
        no_proxy: pytest.MonkeyPatch, variables: dict[str, str], url: str,
        expected: tuple[str, str, int] | None) -> None:
    for name, value in variables.items():
        no_proxy.setenv(name, value)
    proxy = wire.proxy_for(url)
    assert (proxy.scheme, proxy.host, proxy.port) == expected if proxy else expected is None


def test_the_proxys_credentials_go_in_its_authorization_and_nowhere_else(
        no_proxy: pytest.MonkeyPatch) -> None:
    no_proxy.setenv("HTTPS_PROXY", "http://us%40er:pa%3Ass@p:3128")
    proxy = wire.proxy_for("https://c.example")
    assert proxy is not None and proxy.authorization == "Basic dXNAZXI6cGE6c3M="  # us@er:pa:ss
    assert "pa:ss" not in repr(proxy) and "dXNAZXI6cGE6c3M" not in repr(proxy)


class Tunnel:
    """A proxy on loopback that answers CONNECT with `answer` and, if that is a 200, relays
    the tunnel to `target` (the cluster's API server, on loopback); keeps each request's
    head."""

    def __init__(self, target: int, answer: bytes = b"HTTP/1.1 200 Connection established\r\n"
                 b"\r\n") -> None:
        self.target, self.answer, self.heads = target, answer, list[str]()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append((await reader.readuntil(b"\r\n\r\n")).decode())
            writer.write(self.answer)
            await writer.drain()
            if not self.answer.startswith(b"HTTP/1.1 200"):
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(_relay(reader, up_writer), _relay(up_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def through_proxy(tmp_path: Path, no_proxy: pytest.MonkeyPatch,
                        proxy_answer: bytes | None,
                        use: Callable[[Kube], Awaitable[T]]) -> tuple[T, Tunnel]:
    """`use` of a cluster at CLUSTER:6443 served over TLS on loopback, reached only
    through a proxy of the environment (with credentials) that tunnels to it."""
    ca = pki.make_ca("proxy-test")
    crt, key = pki.write(tmp_path, "serving", pki.issue(ca, CLUSTER, server=True))
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(crt, key)

    async def api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(NAMESPACE), NAMESPACE))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(api, "127.0.0.1", 0, ssl=serving)
    tunnel = Tunnel(server.sockets[0].getsockname()[1],
                    *(() if proxy_answer is None else (proxy_answer,)))
    proxy = await asyncio.start_server(tunnel.serve, "127.0.0.1", 0)
    no_proxy.setenv("HTTPS_PROXY", f"http://krypton:s3cret@127.0.0.1:"
                              f"{proxy.sockets[0].getsockname()[1]}")
    kube = Kube(ClientConfig(host=f"https://{CLUSTER}:6443",
                             ssl=tls_context(ca.cert, None, None)), name="c", timeout=5)
    try:
        return await use(kube), tunnel
    finally:
        await kube.close()
        proxy.close()
        server.close()


async def _namespace_and_watch(kube: Kube) -> tuple[object, bytes]:
    found = await kube.get_namespace("x")
    watch = await kube.watch("watch namespaces", "/api/v1/namespaces", resource_version="1",
                             label_selector=None, accept="application/json",
                             server_timeout=5)
    try:
        return found, await watch.readline(1 << 20)
    finally:
        watch.close()


def test_a_cluster_over_https_is_reached_through_the_proxys_tunnel(
        tmp_path: Path, no_proxy: pytest.MonkeyPatch) -> None:
    (found, line), tunnel = asyncio.run(through_proxy(tmp_path, no_proxy, None,
                                                      _namespace_and_watch))
    assert found == json.loads(NAMESPACE) and json.loads(line) == json.loads(NAMESPACE)
    # the request and the watch after it on one tunnel, kept as a direct connection is
    assert len(tunnel.heads) == 1, tunnel.heads
    head = tunnel.heads[0].split("\r\n")
    assert head[0] == f"CONNECT {CLUSTER}:6443 HTTP/1.1"
    assert "Proxy-Authorization: Basic a3J5cHRvbjpzM2NyZXQ=" in head  # krypton:s3cret


@pytest.mark.parametrize(("answer", "error", "said"), [
    (b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
     ClusterUnreachable, f"the proxy refused a tunnel to {CLUSTER}:6443: HTTP 407"),
    (b"HTTP/1.1 403 Forbidden\r\n\r\n", ClusterUnreachable, "HTTP 403"),
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", TemporaryError, "does not start with an HTTP/1.1 status"),
    (b"HTTP/1.1 200 OK\r\nX\r\n\r\n", TemporaryError, "has no colon"),
    (b"HTTP/1.1 200 OK\r\n\r\nextra", TemporaryError, "more than its answer to CONNECT"),
])
def test_a_proxy_that_refuses_or_answers_badly_is_the_clusters_error(
        tmp_path: Path, no_proxy: pytest.MonkeyPatch, answer: bytes, error: type[Exception],
        said: str) -> None:
    async def get(kube: Kube) -> object:
        return await kube.get_namespace("x")

    with pytest.raises(error) as caught:
        asyncio.run(through_proxy(tmp_path, no_proxy, answer, get))
    assert said in str(caught.value) and "s3cret" not in str(caught.value)
    if error is TemporaryError:
        assert caught.value.reason == "BadResponse"  # type: ignore[attr-defined]


def test_a_proxy_of_another_scheme_is_refused_with_why(no_proxy: pytest.MonkeyPatch) -> None:
    no_proxy.setenv("HTTPS_PROXY", "socks5://krypton:s3cret@127.0.0.1:1080")

    async def run() -> None:
        kube = Kube(ClientConfig(host=f"https://{CLUSTER}:6443"), name="c", timeout=5)
        try:
            await kube.get_namespace("x")
        finally:
            await kube.close()

    with pytest.raises(ClusterUnreachable, match="neither http nor https") as caught:
        asyncio.run(run())
    assert "s3cret" not in str(caught.value)
