"""Answers written by others are bounded as they arrive: an API server's answer,
a metric gate's, a registry's tag list; and none of them may send krypton elsewhere. Each
against a server on loopback that answers one way."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from krypton.adapters import registry
from krypton.adapters.clientconfig import ClientConfig
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import ENGAGED, Limits
from krypton.adapters.prometheus import Prometheus
from krypton.decisions.charts import oci
from krypton.decisions.errors import ChartNotLoaded, KryptonError
from krypton.decisions.rollouts import gates

Handler = Callable[[BaseHTTPRequestHandler], None]


@contextlib.contextmanager
def _serve(handle: Handler) -> Iterator[tuple[str, list[str]]]:
    paths: list[str] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def _any(self) -> None:
            paths.append(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            try:
                handle(self)
            except OSError:
                pass

        do_GET = do_POST = _any  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[tuple[str, list[str]]]:
    def ok(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "2")
        h.end_headers()
        h.wfile.write(b"{}")
    with _serve(ok) as served:
        yield served


def _redirect(to: str) -> Handler:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", to)
        h.send_header("Content-Length", "0")
        h.end_headers()
    return send


def _body(body: bytes, *, length: bool = True) -> Handler:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        if length:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return send


DEEP = b"[" * 100_000 + b"]" * 100_000


SMALL = Limits(answer=1 << 16)


def _kube_answer(handle: Handler, limits: Limits = SMALL) -> KryptonError:
    async def ask(url: str) -> None:
        kube = Kube(ClientConfig(host=url), name="c", limits=limits)
        try:
            await kube.request("get namespace", "GET", "/api/v1/namespaces/x")
        finally:
            await kube.close()
    with _serve(handle) as (url, _paths), pytest.raises(KryptonError) as raised:
        asyncio.run(ask(url))
    return raised.value


@pytest.mark.parametrize("length", [True, False])
def test_an_api_answer_over_its_bound_is_refused(length: bool) -> None:
    error = _kube_answer(_body(b"{" + b" " * (1 << 17) + b"}", length=length))
    assert error.reason == "AnswerTooLarge", error


def test_an_api_answer_nested_past_the_parser_is_a_bad_response() -> None:
    assert _kube_answer(_body(DEEP), Limits()).reason == "BadResponse"


def test_an_api_redirect_is_not_followed(elsewhere: tuple[str, list[str]]) -> None:
    url, paths = elsewhere
    error = _kube_answer(_redirect(f"{url}/api/v1/namespaces/x"))
    assert "HTTP 302" in str(error), error
    assert paths == []


def test_a_gate_answer_nested_past_the_parser_is_no_answer() -> None:
    with _serve(_body(DEEP)) as (url, _paths):
        reading = asyncio.run(Prometheus(url).read("up"))
        assert reading.result == gates.UNANSWERED, reading


def test_a_gate_never_follows_a_redirect_elsewhere(elsewhere: tuple[str, list[str]]) -> None:
    other, paths = elsewhere
    with _serve(_redirect(f"{other}/api/v1/query")) as (url, _):
        reading = asyncio.run(Prometheus(url).read("up"))
        assert reading.result == gates.UNANSWERED, reading
        assert "not followed" in reading.value, reading
    assert paths == []


def _tag_pages(body: bytes, next_page: Callable[[str], str]) -> Handler:
    """A tag list page holding `body`, linking to `next_page(this page's path)`."""
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Link", f'<{next_page(h.path)}>; rel="next"')
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return send


def _tags(url: str) -> list[str]:
    host = url.removeprefix("http://")

    async def read() -> list[str]:
        async with registry.Registry(host, plain_http=True) as reg:
            return await reg.versions(oci.reference(f"oci://{host}/charts", "sample"))
    return asyncio.run(read())


def test_a_tag_list_that_links_to_itself_is_read_once() -> None:
    with _serve(_tag_pages(b'{"tags": ["1.0.0"]}', lambda path: path)) as (url, paths):
        with pytest.raises(ChartNotLoaded, match="links back to a page already read"):
            _tags(url)
        assert len(paths) == 1


def test_a_tag_list_is_bounded_in_all_its_pages() -> None:
    big = b'{"tags": ["' + b"t" * (1 << 18) + b'"]}'
    with _serve(_tag_pages(big, lambda path: path + "x")) as (url, paths):
        with pytest.raises(ChartNotLoaded, match="over the limit"):
            _tags(url)
        assert len(paths) == 4  # 1 MiB in all, not 1 MiB a page for 50 pages


# -- lists that never complete, writes answered without an object (SPEC S5) ------------------

def _json(h: BaseHTTPRequestHandler, status: int, doc: object) -> None:
    body = json.dumps(doc).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _list_answer(handle: Handler, limits: Limits = ENGAGED) -> tuple[KryptonError, list[str]]:
    async def ask(url: str) -> None:
        kube = Kube(ClientConfig(host=url), name="c", limits=limits)
        try:
            await kube.list_all("list tenants", "/apis/mesh.openkcm.io/v1alpha1/tenants")
        finally:
            await kube.close()
    with _serve(handle) as (url, paths), pytest.raises(KryptonError) as raised:
        asyncio.run(ask(url))
    return raised.value, paths


def test_a_list_handing_out_the_same_page_token_again_ends_at_the_second_page() -> None:
    error, paths = _list_answer(lambda h: _json(h, 200, {"metadata": {"continue": "again"},
                                                         "items": []}))
    assert error.reason == "ListNeverCompletes", error
    assert len(paths) == 2


def test_a_list_of_empty_pages_without_end_ends_at_its_page_bound() -> None:
    pages = itertools.count()
    error, paths = _list_answer(lambda h: _json(h, 200, {
        "metadata": {"continue": f"page-{next(pages)}"}, "items": []}))
    assert error.reason == "ListNeverCompletes", error
    assert len(paths) == 100


def test_a_list_whose_continued_pages_are_always_gone_restarts_three_times_in_all() -> None:
    def send(h: BaseHTTPRequestHandler) -> None:
        if "continue=" in h.path:
            _json(h, 410, {"kind": "Status", "code": 410, "message": "expired"})
        else:
            _json(h, 200, {"metadata": {"continue": "next"}, "items": []})
    error, paths = _list_answer(send)
    assert error.reason == "ListNeverCompletes", error
    assert len(paths) == 6  # three lists of a first page and a continued one


def test_many_small_objects_cost_more_than_their_bytes() -> None:
    items = [{"metadata": {"name": f"t{i}"}} for i in range(40)]  # 1 KiB of JSON in all
    error, _ = _list_answer(lambda h: _json(h, 200, {"metadata": {}, "items": items}),
                            Limits(store=64 << 10))
    assert error.reason == "TooManyObjects", error


def test_a_write_answered_without_the_object_written_is_a_bad_response() -> None:
    async def ask(url: str) -> None:
        kube = Kube(ClientConfig(host=url), name="c")
        try:
            await kube.create_event("ns", {"metadata": {"generateName": "x."}})
        finally:
            await kube.close()
    with _serve(lambda h: _json(h, 201, {"kind": "Event", "metadata": {}})) as (url, _), \
            pytest.raises(KryptonError) as raised:
        asyncio.run(ask(url))
    assert raised.value.reason == "BadResponse", raised.value


# -- a chart's registry and repository: redirects (SPEC S3) ---------------------------------

def test_a_blob_follows_its_redirect_to_storage_without_the_credentials() -> None:
    """A registry sends a blob to storage on another host: followed (the blob is checked
    against its digest), the Authorization header left behind; a manifest is not."""
    blob = b"chart archive"
    digest = oci.digest_of(blob)
    seen: list[str | None] = []

    def storage(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization"))
        _body(blob)(h)

    def registry_answer(to: str) -> Handler:
        def send(h: BaseHTTPRequestHandler) -> None:
            if h.headers.get("Authorization") != "Basic dTpzZWNyZXQ=":  # u:secret
                h.send_response(401)
                h.send_header("WWW-Authenticate", 'Basic realm="r"')
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            _redirect(f"{to}{h.path}")(h)
        return send

    async def fetch(host: str) -> tuple[bytes, BaseException | None]:
        ref = oci.reference(f"oci://{host}/charts", "sample")
        async with registry.Registry(host, plain_http=True,
                                     credentials=registry.Credentials("u", "secret")) as reg:
            got = await reg.blob(ref, digest, 1 << 20)
            try:
                await reg.manifest(ref, "1.0.0")
            except ChartNotLoaded as exc:
                return got, exc
            return got, None

    with _serve(storage) as (other, stored), _serve(registry_answer(other)) as (url, _):
        got, refused = asyncio.run(fetch(url.removeprefix("http://")))
    assert got == blob and seen == [None], seen  # the blob, without the credentials
    assert refused is not None and "not followed" in str(refused), refused
    assert stored == [f"/v2/charts/sample/blobs/{digest}"]  # the manifest never went there


@pytest.mark.parametrize(("https_elsewhere", "followed"), [(False, False), (True, True)])
def test_an_index_follows_a_redirect_elsewhere_only_over_https(
        https_elsewhere: bool, followed: bool) -> None:
    """A chart repository may send its index to a CDN over https, never to plain HTTP
    elsewhere: followed to the first, refused with its reason for the second."""
    from krypton.adapters import charts

    target = "https://127.0.0.1:1/index.yaml" if https_elsewhere else None  # refused at once
    index = b"apiVersion: v1\nentries:\n  sample:\n  - version: 1.0.0\n"
    with _serve(_body(index)) as (other, _), \
            _serve(_redirect(target or f"{other}/index.yaml")) as (url, _):
        source = charts.ChartSource(url, "sample", "1.0.0", helm=None,  # type: ignore[arg-type]
                                    cache_dir=None)  # type: ignore[arg-type]
        with pytest.raises(ChartNotLoaded) as raised:
            asyncio.run(source._index_versions())
    # followed: the "CDN" (nothing listens there) is tried; refused: the reason says so
    assert ("not followed" in str(raised.value)) is not followed, raised.value
    assert ("unreachable" in str(raised.value)) is followed, raised.value
