"""The event-loop informer and the client façade against a real API server (issue 11, item 1):
paginated lists, watches resumed from the last resourceVersion instead of listing again,
stalled watches dropped, every request bounded."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from krypton.adapters import metrics
from krypton.adapters.kube import Informer, Kube, configuration_for, configuration_from_file, core_path
from krypton.decisions.errors import ClusterUnreachable, TemporaryError
from krypton.decisions.kubeconfig import parse
from krypton.testing import ControlPlane


async def _kube(cp: ControlPlane, name: str) -> Kube:
    return Kube(await configuration_from_file(str(cp.kubeconfig)), name=name, timeout=10)


async def _create_configmaps(kube: Kube, namespace: str, label: str, count: int) -> None:
    for i in range(count):
        await kube.create_configmap(namespace, {"metadata": {
            "name": f"cm-{i}", "namespace": namespace, "labels": {"krypton-test": label}}})


def _api_requests(cluster: str, verb: str) -> float:
    return metrics.API_REQUESTS.labels(cluster, verb)._value.get()  # type: ignore[no-any-return]


def test_lists_are_read_in_pages(remote: ControlPlane) -> None:
    async def run() -> None:
        name = f"pages-{uuid.uuid4().hex[:6]}"
        kube = await _kube(remote, name)
        try:
            await kube.create_namespace(name, {}, {})
            await _create_configmaps(kube, name, name, 7)
            before = _api_requests(name, "list")
            body = await kube.list_all("list configmaps", core_path("configmaps", name),
                                       label_selector=f"krypton-test={name}", page_size=2)
            assert sorted(i["metadata"]["name"] for i in body["items"]) == \
                [f"cm-{i}" for i in range(7)]
            assert _api_requests(name, "list") - before == 4  # pages of 2, 2, 2, 1
        finally:
            await kube.delete_namespace(name)
            await kube.close()

    asyncio.run(run())


def test_a_stalled_watch_is_resumed_not_relisted(remote: ControlPlane) -> None:
    """A watch that delivers nothing for `stall_timeout` is dropped and opened again from the
    last resourceVersion: the collection is listed once, and changes made between two
    connections are still delivered, in order."""
    async def run() -> None:
        name = f"stall-{uuid.uuid4().hex[:6]}"
        kube = await _kube(remote, name)
        seen: list[tuple[str, str]] = []
        errors: list[Exception] = []
        healthy: list[float] = []
        await kube.create_namespace(name, {}, {})
        informer = Informer(kube, "configmaps", core_path("configmaps", name),
                            lambda t, o: seen.append((t, o["metadata"]["name"])),
                            label_selector=f"krypton-test={name}", stall_timeout=1.0,
                            on_error=errors.append, on_healthy=lambda: healthy.append(1))
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            async with asyncio.timeout(60):
                while len(errors) < 3:  # three stalls, three resumed watches
                    await asyncio.sleep(0.05)
            await _create_configmaps(kube, name, name, 2)
            async with asyncio.timeout(30):
                while len(seen) < 2:
                    await asyncio.sleep(0.05)
        finally:
            await informer.stop()
            await kube.delete_namespace(name)
            await kube.close()
        assert all(isinstance(e, ClusterUnreachable) and "stalled" in str(e) for e in errors)
        assert informer.lists == 1
        assert seen == [("ADDED", "cm-0"), ("ADDED", "cm-1")]
        assert set(informer.store) == {(name, "cm-0"), (name, "cm-1")}
        assert len(healthy) >= 2  # the list, then each watch accepted after a stall

    asyncio.run(run())


def test_a_server_that_never_answers_costs_one_bounded_request(tmp_path: Path) -> None:
    """A black-holed API server (TCP accepted, no answer): the request ends after the client
    timeout with ClusterUnreachable, and meanwhile the event loop keeps running."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    kc = parse(f"""
apiVersion: v1
kind: Config
current-context: dead
clusters: [{{name: dead, cluster: {{server: "https://127.0.0.1:{port}",
                                   insecure-skip-tls-verify: true}}}}]
users: [{{name: dead, user: {{token: abc}}}}]
contexts: [{{name: dead, context: {{cluster: dead, user: dead}}}}]
""".encode())

    async def run() -> tuple[Any, float, int]:
        kube = Kube(await configuration_for(kc, tmp_path), name="dead", timeout=1.5)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        start = time.monotonic()
        try:
            await kube.server_version()
        except TemporaryError as exc:
            error: Any = exc
        else:
            error = None
        finally:
            elapsed = time.monotonic() - start
            ticker.cancel()
            await kube.close()
        return error, elapsed, ticks

    try:
        error, elapsed, ticks = asyncio.run(run())
    finally:
        listener.close()
    assert isinstance(error, ClusterUnreachable), error
    assert 1.5 <= elapsed < 10, elapsed
    assert ticks >= 10  # the loop was free while the request waited


def test_a_server_that_ends_every_watch_at_once_is_not_hammered(tmp_path: Path) -> None:
    """A proxy that answers every watch with an empty 200 at once: resuming is right, but
    resuming at once would spin. Over 3 s the informer opens a handful of watches, not
    thousands, and still lists only once."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    watches = 0

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            nonlocal watches
            body = b"" if "watch=true" in self.path else json.dumps(
                {"kind": "ConfigMapList", "metadata": {"resourceVersion": "1"},
                 "items": []}).encode()
            watches += "watch=true" in self.path
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kc = parse(f"""
apiVersion: v1
kind: Config
current-context: p
clusters: [{{name: p, cluster: {{server: "http://127.0.0.1:{server.server_address[1]}"}}}}]
users: [{{name: p, user: {{}}}}]
contexts: [{{name: p, context: {{cluster: p, user: p}}}}]
""".encode(), trust=True)

    async def run() -> int:
        kube = Kube(await configuration_for(kc, tmp_path), name="closing-proxy", timeout=5)
        informer = Informer(kube, "configmaps", core_path("configmaps", "default"),
                            lambda _t, _o: None).start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            await asyncio.sleep(3)
        finally:
            await informer.stop()
            await kube.close()
        return informer.lists

    try:
        lists = asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert lists == 1
    assert 2 <= watches <= 8, watches  # backoff 0.5, 1, 2 s (+ jitter) within 3 s
