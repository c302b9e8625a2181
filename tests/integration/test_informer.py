"""The event-loop informer and the client façade against a real API server:
paginated lists, watches resumed from the last resourceVersion instead of listing again,
stalled watches dropped, every request bounded."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from krypton.adapters import metrics
from krypton.adapters.clientconfig import configuration_for, configuration_from_file
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import core_path
from krypton.decisions import retry
from krypton.decisions.clusters.kubeconfig import parse
from krypton.decisions.errors import ClusterUnreachable, TemporaryError
from krypton.testing import BlackHole, ControlPlane
from tests.reliability.test_hostile_input import Responder


async def _kube(cp: ControlPlane, name: str) -> Kube:
    return Kube(await configuration_from_file(str(cp.kubeconfig), workdir=cp.workdir / name),
                name=name, timeout=10)


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
        three_stalls, two_seen = asyncio.Event(), asyncio.Event()

        def on_event(type_: str, obj: dict[str, Any]) -> None:
            seen.append((type_, obj["metadata"]["name"]))
            if len(seen) >= 2:
                two_seen.set()

        def on_error(exc: Exception) -> None:
            errors.append(exc)
            if len(errors) >= 3:
                three_stalls.set()

        await kube.create_namespace(name, {}, {})
        informer = Informer(kube, "configmaps", core_path("configmaps", name), on_event,
                            label_selector=f"krypton-test={name}", stall_timeout=1.0,
                            on_error=on_error, on_healthy=lambda: healthy.append(1))
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            await asyncio.wait_for(three_stalls.wait(), 60)  # three stalls, three resumes
            await _create_configmaps(kube, name, name, 2)
            await asyncio.wait_for(two_seen.wait(), 30)
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


def test_relist_takes_what_the_server_serves_now(remote: ControlPlane) -> None:
    """relist() ends the watch followed, without an error, and lists again: an object kept
    as another schema decoded it (a field dropped, the same resourceVersion) is replaced
    and delivered as MODIFIED; the watch then goes on from the new list."""
    async def run() -> None:
        name = f"relist-{uuid.uuid4().hex[:6]}"
        kube = await _kube(remote, name)
        seen: list[tuple[str, dict[str, Any]]] = []
        errors: list[Exception] = []
        changed = asyncio.Event()

        def on_event(type_: str, obj: dict[str, Any]) -> None:
            seen.append((type_, obj))
            changed.set()

        await kube.create_namespace(name, {}, {})
        await kube.create_configmap(name, {"metadata": {"name": "kept", "namespace": name},
                                           "data": {"records": "sealed"}})
        informer = Informer(kube, "configmaps", core_path("configmaps", name), on_event,
                            on_error=errors.append)
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            # as an older schema decoded it: the field pruned, the version the same
            del informer.store[(name, "kept")]["data"]
            seen.clear()
            changed.clear()
            informer.relist()
            await asyncio.wait_for(changed.wait(), 30)
            assert [(t, o["metadata"]["name"], o.get("data")) for t, o in seen] == \
                [("MODIFIED", "kept", {"records": "sealed"})]
            assert informer.store[(name, "kept")]["data"] == {"records": "sealed"}
            changed.clear()
            await _create_configmaps(kube, name, name, 1)  # the new watch delivers
            await asyncio.wait_for(changed.wait(), 30)
        finally:
            await informer.stop()
            await kube.delete_namespace(name)
            await kube.close()
        assert informer.lists == 2 and errors == []
        assert seen[-1][0] == "ADDED" and seen[-1][1]["metadata"]["name"] == "cm-0"

    asyncio.run(run())


def test_a_server_that_never_answers_costs_one_bounded_request(tmp_path: Path) -> None:
    """A black-holed API server (TCP accepted, no answer): the request ends after the client
    timeout with ClusterUnreachable, and meanwhile the event loop keeps running: a callback
    scheduled while the request waits runs before the request ends."""
    hole = BlackHole()
    kc = parse(f"""
apiVersion: v1
kind: Config
current-context: dead
clusters: [{{name: dead, cluster: {{server: "{hole.url}",
                                   insecure-skip-tls-verify: true}}}}]
users: [{{name: dead, user: {{token: abc}}}}]
contexts: [{{name: dead, context: {{cluster: dead, user: dead}}}}]
""".encode())

    async def run() -> tuple[Any, float, bool]:
        kube = Kube(await configuration_for(kc, tmp_path), name="dead", timeout=1.5)
        request = asyncio.create_task(kube.server_version())
        meanwhile = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, meanwhile.set)
        start = time.monotonic()
        await meanwhile.wait()
        loop_was_free = not request.done()  # the loop ran our callback during the request
        try:
            await request
        except TemporaryError as exc:
            error: Any = exc
        else:
            error = None
        finally:
            elapsed = time.monotonic() - start
            await kube.close()
        return error, elapsed, loop_was_free

    try:
        error, elapsed, loop_was_free = asyncio.run(run())
    finally:
        hole.close()
    assert isinstance(error, ClusterUnreachable), error
    assert 1.0 <= elapsed < 10, elapsed
    assert loop_was_free


def test_a_server_that_ends_every_watch_at_once_is_not_hammered(tmp_path: Path) -> None:
    """A proxy that answers every watch with an empty 200 at once: resuming is right, but
    resuming at once would spin. Consecutive watches are spaced by the WATCH retry policy
    (0.5 s, 1 s, 2 s, ...: jitter only lengthens them), and the collection is listed once."""
    import json
    import threading

    watches: list[float] = []
    four = threading.Event()
    listing = json.dumps({"kind": "ConfigMapList", "metadata": {"resourceVersion": "1"},
                          "items": []}).encode()

    def answer(path: str) -> bytes:
        if "watch=true" not in path:
            return listing
        watches.append(time.monotonic())
        if len(watches) >= 4:
            four.set()
        return b""  # 200, and the watch is over

    proxy = Responder(answer, content_type="application/json")
    kc = _plain(proxy.url)

    async def run() -> int:
        kube = Kube(await configuration_for(kc, tmp_path), name="closing-proxy", timeout=5)
        informer = Informer(kube, "configmaps", core_path("configmaps", "default"),
                            lambda _t, _o: None).start()
        try:
            assert await asyncio.to_thread(four.wait, 30), "four watches"
        finally:
            await informer.stop()
            await kube.close()
        return informer.lists

    try:
        lists = asyncio.run(run())
    finally:
        proxy.close()
    assert lists == 1
    gaps = [b - a for a, b in zip(watches, watches[1:4], strict=False)]
    assert all(gap >= retry.WATCH.first * 2 ** n for n, gap in enumerate(gaps)), gaps


def _throttling(throttled: int) -> tuple[Responder, list[float]]:
    """An API server stand-in answering /version: 429 with Retry-After for the first
    `throttled` requests (as kube-apiserver does while a new CRD's storage initializes),
    then 200; and the times of the requests."""
    times: list[float] = []

    def answer(_path: str) -> Any:
        times.append(time.monotonic())
        if len(times) <= throttled:
            return 429, {"Retry-After": "1"}, (b'{"kind":"Status","status":"Failure","message":'
                                               b'"storage is (re)initializing","code":429}')
        return b'{"major":"1","minor":"34","gitVersion":"v1.34.4"}'
    return Responder(answer, content_type="application/json"), times


def _plain(url: str) -> Any:
    """A kubeconfig for a plain-HTTP stand-in at `url`, without credentials."""
    return parse(f"""
apiVersion: v1
kind: Config
current-context: p
clusters: [{{name: p, cluster: {{server: "{url}"}}}}]
users: [{{name: p, user: {{}}}}]
contexts: [{{name: p, context: {{cluster: p, user: p}}}}]
""".encode(), trust=True)


def _version_through(server: Responder, tmp_path: Path) -> Any:
    kc = _plain(server.url)

    async def run() -> Any:
        kube = Kube(await configuration_for(kc, tmp_path), name="throttling", timeout=5)
        try:
            return await kube.server_version()
        except TemporaryError as exc:
            return exc
        finally:
            await kube.close()

    try:
        return asyncio.run(run())
    finally:
        server.close()


def test_a_throttled_request_waits_as_told_and_succeeds(tmp_path: Path) -> None:
    """"HTTP 429: storage is (re)initializing" while a CRD just created comes up
    is no failure: the request is repeated after Retry-After, and the caller sees only the
    answer."""
    server, times = _throttling(2)
    assert _version_through(server, tmp_path) == "v1.34.4"
    assert len(times) == 3
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # Retry-After: 1


def test_a_server_that_keeps_throttling_is_an_error_in_the_end(tmp_path: Path) -> None:
    from krypton.adapters.kubeapi import THROTTLED_RETRIES

    server, times = _throttling(100)
    error = _version_through(server, tmp_path)
    assert isinstance(error, TemporaryError) and "429" in str(error), error
    assert len(times) == THROTTLED_RETRIES + 1


def test_tls_server_name_is_the_name_verified(remote: ControlPlane) -> None:
    """The server is reached at its address (127.0.0.1); a kubeconfig's tls-server-name is
    the name its certificate must carry instead (it names 127.0.0.1, localhost and
    kubernetes.default.svc), for requests and watches alike."""
    async def reach(name: str | None) -> list[str]:
        doc = yaml.safe_load(remote.kubeconfig.read_text())
        if name is not None:
            doc["clusters"][0]["cluster"]["tls-server-name"] = name
        kc = parse(yaml.safe_dump(doc).encode())
        kube = Kube(await configuration_for(kc, remote.workdir / f"sni-{name}"), name="sni",
                    timeout=10)
        outcomes = []
        try:
            for attempt in ("request", "watch"):
                try:
                    if attempt == "request":
                        outcomes.append(await kube.server_version())
                    else:
                        watch = await kube.watch("watch namespaces", core_path("namespaces"),
                                                 resource_version="0", label_selector=None,
                                                 accept="application/json", server_timeout=5)
                        watch.close()
                        outcomes.append("watched")
                except ClusterUnreachable as exc:
                    outcomes.append(f"unreachable: {exc}")
        finally:
            await kube.close()
        return outcomes

    for name in (None, "kubernetes.default.svc"):
        version, watched = asyncio.run(reach(name))
        assert version.startswith("v1.") and watched == "watched", (name, version, watched)
    refused = asyncio.run(reach("elsewhere.example"))
    assert all("CERTIFICATE_VERIFY_FAILED" in outcome for outcome in refused), refused
