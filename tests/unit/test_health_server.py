"""The health and metrics server on the operator's event loop (SPEC O3), in-process on
loopback: /healthz answers only while the loop runs, idle connections go after the head
timeout, and a flood of idle connections on either port does not keep a probe out."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable

import pytest

from krypton.app import health
from krypton.testing import free_port


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def serving(health_address: str, metrics_address: str,
            scenario: Callable[[], Awaitable[None]]) -> None:
    async def run() -> None:
        server = health.HealthServer(health_address, metrics_address,
                                     lambda: (True, ["cluster x: failing"]))
        await server.start()
        try:
            await scenario()
        finally:
            await server.stop()

    asyncio.run(run())


def closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_healthz_gets_no_answer_while_the_event_loop_is_blocked() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    results: list[object] = []

    def probe() -> None:  # the kubelet's, with a timeout of 1 s
        try:
            results.append(get(f"{url}/healthz", timeout=1.0))
        except TimeoutError as exc:
            results.append(exc)

    async def scenario() -> None:
        results.append(await asyncio.to_thread(get, f"{url}/healthz"))
        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(3.0)  # the loop is blocked: the probe runs in another thread meanwhile
        prober.join()
        results.append(await asyncio.to_thread(get, f"{url}/healthz"))
        results.append(await asyncio.to_thread(get, f"{url}/readyz"))

    serving(f"127.0.0.1:{port}", "0", scenario)
    assert results[0] == (200, "ok")
    assert isinstance(results[1], TimeoutError), results[1]
    assert results[2:] == [(200, "ok"), (200, "ok\ncluster x: failing")]


def test_a_probe_is_answered_under_a_flood_of_idle_connections_on_both_ports() -> None:
    health_port, metrics_port = free_port(), free_port()

    async def scenario() -> None:
        flood = await asyncio.to_thread(lambda: [  # the loop accepts them meanwhile
            socket.create_connection(("127.0.0.1", port), timeout=5)
            for port in (health_port, metrics_port) for _ in range(150)])
        try:
            assert await asyncio.to_thread(
                get, f"http://127.0.0.1:{health_port}/healthz") == (200, "ok")
            status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200 and "krypton_event_loop_lag_seconds" in text
        finally:
            for s in flood:
                s.close()

    serving(f"127.0.0.1:{health_port}", f"127.0.0.1:{metrics_port}", scenario)


def test_connections_without_a_whole_request_in_time_are_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle ones and one trickling its request head: closed after HEAD_TIMEOUT; an
    answered request closes its connection too."""
    monkeypatch.setattr(health, "HEAD_TIMEOUT", 1.0)
    port = free_port()
    closed: list[bool] = []

    async def scenario() -> None:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
        trickle = socket.create_connection(("127.0.0.1", port), timeout=5)
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        answered = socket.create_connection(("127.0.0.1", port), timeout=5)
        answered.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            for s in [*idle, trickle]:
                closed.append(await asyncio.to_thread(closed_by_server, s, 4.0))
            head = await asyncio.to_thread(answered.recv, 4096)
            assert head.startswith(b"HTTP/1.1 200"), head
            closed.append(await asyncio.to_thread(closed_by_server, answered, 1.0))
        finally:
            for s in [*idle, trickle, answered]:
                s.close()

    serving(f"127.0.0.1:{port}", "0", scenario)
    assert closed == [True] * 7
