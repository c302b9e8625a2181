"""The test bed's servers get their ports from `free_port` and bind them later. The ports
come from below the kernel's ephemeral range, so that the local port of an outgoing
connection made in between cannot take them, and one process does not hand out a port twice
in a row."""

from __future__ import annotations

import socket

import pytest

from krypton.testing import host
from krypton.testing.host import free_port


def ephemeral_range() -> tuple[int, int]:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(part) for part in f.read().split())
    return low, high


def test_ports_are_below_the_ephemeral_range_distinct_and_free() -> None:
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(host._LOWEST_PORT <= port < low for port in ports), ports
    assert len(set(ports)) == len(ports)
    for port in ports:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        monkeypatch.setattr(host, "_next_port", port)
        other = free_port()
    assert other != port
    assert host._LOWEST_PORT <= other < ephemeral_range()[0]


def test_the_kernel_chooses_when_there_is_no_room_below_the_range(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "_ephemeral_range", lambda: (host._LOWEST_PORT, 60999))
    low, high = ephemeral_range()
    assert low <= free_port() <= high


def test_the_workers_of_a_parallel_run_hand_out_ports_of_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pytest-xdist worker walks its own slice: wherever its walk starts, it never
    hands out a port another worker may."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    handed: dict[str, set[int]] = {}
    for worker, start in (("gw0", 20000), ("gw1", 20000)):  # the same random start
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setattr(host, "_next_port", start)
        handed[worker] = {free_port() for _ in range(200)}
    assert len(handed["gw0"]) == len(handed["gw1"]) == 200
    assert not handed["gw0"] & handed["gw1"]
