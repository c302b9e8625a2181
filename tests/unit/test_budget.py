"""A cluster over its budget waits longer after each strike, and is within it again only
after its turn came and passed quietly (SPEC S5); a watch that breaks resumes where it was
(replaying nothing), and a store over its bound lists again from scratch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from krypton.adapters import budget as budget_module
from krypton.adapters.budget import Budget
from krypton.adapters.clientconfig import ClientConfig
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import ENGAGED, Limits
from krypton.decisions import retry

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(budget_module.time, "monotonic", fake)
    return fake


def test_each_strike_waits_twice_as_long_as_the_one_before(clock: Clock) -> None:
    budget = Budget(retry.Policy(first=2.0, cap=600.0))
    assert [budget.strike() for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert budget.over


def test_a_cluster_is_within_its_budget_again_only_after_a_quiet_turn(clock: Clock) -> None:
    budget = Budget(retry.Policy(first=2.0, cap=600.0))
    budget.strike()
    budget.strike()  # its turn comes 4 s from now
    clock.now += 4 + budget_module.QUIET - 1
    assert not budget.settled()
    assert budget.over
    clock.now += 1
    assert budget.settled()
    assert not budget.over
    assert not budget.settled()  # said once
    assert budget.strike() == 2.0  # a new episode starts from the first wait


def test_a_strike_at_the_cap_never_settles_before_its_turn(clock: Clock) -> None:
    budget = Budget(retry.Policy(first=2.0, cap=600.0))
    for _ in range(12):
        budget.strike()
    clock.now += 599 + budget_module.QUIET
    assert not budget.settled()


def test_passes_beyond_the_burst_wait_for_the_rate(clock: Clock) -> None:
    budget = Budget(rate=20.0, burst=500)
    assert [budget.take_pass() for _ in range(500)] == [0.0] * 500
    assert budget.take_pass() == pytest.approx(1 / 20)  # the 501st waits a twentieth
    assert budget.take_pass() == pytest.approx(2 / 20)  # and the next one after it
    clock.now += 10  # ten quiet seconds give back 200 passes, less the two owed
    assert [budget.take_pass() for _ in range(198)] == [0.0] * 198
    assert budget.take_pass() > 0
    clock.now += 3600  # an hour gives back no more than the burst
    assert sum(budget.take_pass() == 0.0 for _ in range(600)) == 500


# -- a watch keeps its place -------------------------------------------------------------------

def _tenant(rv: int) -> dict[str, Any]:
    return {"metadata": {"name": f"t{rv}", "namespace": "ns", "resourceVersion": str(rv)}}


@contextlib.contextmanager
def _api(last: int, break_first_watch: bool) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A collection at resourceVersion 5 with events up to `last`: a list answers version 5,
    a watch sends every event after the version asked for; the first watch then breaks
    (its chunked answer cut off), later ones stay open with nothing to say."""
    asked: list[dict[str, str]] = []
    stop = threading.Event()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            asked.append(query)
            if query.get("watch") != "true":
                body = json.dumps({"metadata": {"resourceVersion": "5"}, "items": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for rv in range(int(query["resourceVersion"]) + 1, last + 1):
                line = json.dumps({"type": "ADDED", "object": _tenant(rv)}).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            if break_first_watch and sum(q.get("watch") == "true" for q in asked) == 1:
                self.wfile.write(b"ff\r\n{\"type\"")  # a chunk that never completes
                self.wfile.flush()
                self.close_connection = True
                return
            stop.wait(30)
            self.close_connection = True

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


async def _follow(url: str, asked: list[dict[str, str]], watches: int,
                  limits: Limits = ENGAGED) -> list[tuple[str, str]]:
    heard: list[tuple[str, str]] = []
    kube = Kube(ClientConfig(host=url), name="c", limits=limits)
    informer = Informer(kube, "tenants", "/apis/mesh.openkcm.io/v1alpha1/tenants",
                        lambda kind, obj: heard.append((kind, obj["metadata"]["name"])))
    informer.start()
    try:
        async with asyncio.timeout(20):
            while sum(q.get("watch") == "true" for q in asked) < watches:
                await asyncio.sleep(0.02)
    finally:
        await informer.stop()
        await kube.close()
    return heard


def test_a_broken_watch_resumes_where_it_was_and_replays_nothing() -> None:
    with _api(8, break_first_watch=True) as (url, asked):
        heard = asyncio.run(_follow(url, asked, watches=2))
    watches = [q["resourceVersion"] for q in asked if q.get("watch") == "true"]
    assert watches[:2] == ["5", "8"]
    assert heard == [("ADDED", "t6"), ("ADDED", "t7"), ("ADDED", "t8")]
    assert sum(q.get("watch") != "true" for q in asked) == 1  # listed once


def test_a_store_over_its_bound_lists_again_from_scratch() -> None:
    limits = Limits(store=3 * 2048 + 200)  # room for about three small objects
    with _api(12, break_first_watch=False) as (url, asked):
        asyncio.run(_follow(url, asked, watches=2, limits=limits))
    lists = [q for q in asked if q.get("watch") != "true"]
    watches = [q["resourceVersion"] for q in asked if q.get("watch") == "true"]
    assert len(lists) == 2  # a real list after the bound, not a resume
    assert watches[:2] == ["5", "5"]


# -- every request of a cluster strikes its budget --------------------------------------------

@pytest.mark.parametrize(("reason", "strikes"), [("AnswerTooLarge", 1), ("BadResponse", 1),
                                                 ("APIError", 0), ("ClusterUnreachable", 0)])
def test_the_outdated_crds_second_look_strikes_on_an_answer_past_a_bound(
        tmp_path: Path, reason: str, strikes: int) -> None:
    """The look at an outdated Tenant CRD every 10 s is a request like the others: an
    answer past a bound is a strike of the cluster; an error status or a network fault
    is only looked at again."""
    from krypton.decisions.errors import TemporaryError
    from krypton.decisions.settings import Settings
    from krypton.runtime.engagement import crd_applied
    from tests.unit.workers import workers

    class Kube:
        async def get_crd(self) -> dict[str, Any]:
            raise TemporaryError("the CRD's answer", reason=reason)

    async def said(*_report: str) -> None:
        return None

    async def look() -> tuple[bool, int]:
        worker = workers(tmp_path, Settings(), 1)[0]
        worker.health.report = said
        applied = await crd_applied(Kube(), worker.health, object())  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the report's task
        return applied, worker.health.budget.strikes

    assert asyncio.run(look()) == (False, strikes)
