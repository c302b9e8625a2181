"""The fleet page (SPEC O16) on a fleet source of the test's own: what a cell and the summary
say, the filters, the headers every answer carries, what a cluster wrote shown as text, the
downloads, and the bounds on queries and event streams. The page against a real operator:
tests/integration/test_fleet_page.py."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession

from krypton.decisions import fleetview
from krypton.decisions.fleetview import Filters, Row
from krypton.runtime.changes import Changes
from krypton.testing import free_port
from krypton.web.server import HEADERS, WebServer

pytestmark = pytest.mark.unit

HOSTILE = "<img src=x onerror=alert(1)></script><script>alert(2)</script>"


def tenant(name: str, cluster: str, *, ready: bool = True, error: str = "",
           version: str = "0.2.0", namespace: str = "team") -> dict[str, Any]:
    conditions = [{"type": f"ClusterReady/{cluster}", "status": "True" if ready else "False",
                   "reason": "Installed", "message": "", "lastTransitionTime":
                   "2026-12-06T04:00:00Z"}]
    if error:
        conditions.append({"type": f"ClusterError/{cluster}", "status": "True",
                           "reason": "InstallFailed", "message": error})
    return {"metadata": {"namespace": namespace, "name": name},
            "status": {"phase": "Ready" if ready else "Error", "conditions": conditions,
                       "clusters": {cluster: {"chartVersion": version}}}}


class Source:
    """A fleet source of the test's own: Tenants per cluster, in memory."""

    def __init__(self, held: dict[str, list[dict[str, Any]]]) -> None:
        self.held, self.changes = held, Changes()

    def rows(self) -> list[Row]:
        return [r for c, ts in sorted(self.held.items()) for r in fleetview.tenant_rows(c, ts)]

    def clusters(self) -> dict[str, dict[str, str]]:
        return {c: {"state": "engaged"} for c in self.held} | {
            "away": {"state": f"failing: ClusterUnreachable: {HOSTILE}"}}

    def tenant(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {c: t for c, ts in self.held.items() for t in ts
                if t["metadata"]["name"] == name and t["metadata"]["namespace"] == namespace}

    def rollout(self) -> None:
        return None

    def scope(self) -> str:
        return ""


def serving(source: Source, check: Callable[[ClientSession, str], Awaitable[None]],
            **kw: Any) -> None:
    async def main() -> None:
        port = free_port()
        server = WebServer(f"127.0.0.1:{port}", source, **kw)
        await server.start()
        try:
            async with ClientSession() as session:
                await check(session, f"http://127.0.0.1:{port}")
        finally:
            await server.stop()
    asyncio.run(main())


def fleet() -> Source:
    return Source({"c1": [tenant("calm", "c1"), tenant("evil", "c1", ready=False, error=HOSTILE)],
                   "c2": [tenant("calm", "c2", version="0.3.0")]})


def test_what_a_cell_and_the_summary_say() -> None:
    rows = fleet().rows()
    assert [(r.cluster, r.tenant, r.state) for r in rows] == [
        ("c1", "calm", "Ready"), ("c1", "evil", "Failed"), ("c2", "calm", "Ready")]
    s = fleetview.summary(rows)
    assert (s.releases, s.ready, s.failing, s.waiting) == (3, 2, 1, 0)
    assert s.versions == (("0.2.0", 2), ("0.3.0", 1))
    clusters, tenants, cells = fleetview.matrix(rows)
    assert clusters == ["c1", "c2"] and tenants == ["team/calm", "team/evil"]
    assert ("c2", "team/evil") not in cells


@pytest.mark.parametrize(("query", "kept"), [
    ({}, 3), ({"cluster": "C1"}, 2), ({"tenant": "team/ev"}, 1), ({"state": "ready"}, 2),
    ({"version": "0.3"}, 1), ({"cluster": "c2", "state": "Failed"}, 0),
    ({"colour": "red"}, 3),  # not a filter: ignored
])
def test_filters_keep_what_matches_each_part(query: dict[str, str], kept: int) -> None:
    assert len([r for r in fleet().rows() if Filters.of(query).keep(r)]) == kept


def test_every_answer_carries_the_pages_headers_and_a_cluster_writes_only_text() -> None:
    async def check(session: ClientSession, url: str) -> None:
        for path in ("/", "/tenants/team/evil", "/clusters/c1", "/rows.json", "/rows.csv"):
            async with session.get(url + path) as resp:
                body = await resp.text()
                assert resp.status == 200, (path, body)
                for name, value in HEADERS.items():
                    assert resp.headers[name] == value, (path, name)
                if path in ("/", "/tenants/team/evil"):
                    assert "<img" not in body and "<script>alert" not in body, path
                    assert "&lt;img src=x onerror=alert(1)&gt;&lt;/script&gt;" in body, path
        assert "script-src 'self'" in HEADERS["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in HEADERS["Content-Security-Policy"]
    serving(fleet(), check)


def test_downloads_hold_the_rows_of_the_view() -> None:
    source = fleet()
    source.held["c1"].append(tenant("sheet", "c1", error="=cmd|' /C calc'!A0"))

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/rows.json?cluster=c1") as resp:
            rows = json.loads(await resp.text())
        async with session.get(url + "/rows.csv?cluster=c1") as resp:
            table = list(csv.DictReader(io.StringIO(await resp.text())))
        assert [r["tenant"] for r in rows] == [r["tenant"] for r in table] == \
            ["calm", "evil", "sheet"]
        detail = next(r["detail"] for r in table if r["tenant"] == "sheet")
        assert detail.startswith("InstallFailed: =cmd")  # the formula is inside a sentence
        assert all(not v.startswith(("=", "+", "@")) for r in table for v in r.values())
    serving(source, check)


def test_a_query_past_its_bound_is_refused_and_a_filter_is_cut() -> None:
    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/?tenant=" + "x" * 3000) as resp:
            assert resp.status == 414
        assert len(Filters.of({"tenant": "x" * 1000}).tenant) == fleetview.FILTER_MAX
    serving(fleet(), check)


def test_changes_stream_to_open_pages_and_streams_are_capped() -> None:
    source = fleet()

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/events?tenant=calm") as stream:
            assert stream.headers["Content-Type"] == "text/event-stream"
            async with session.get(url + "/events") as refused:  # one stream is the cap
                assert refused.status == 503
            while not source.changes.listeners:
                await asyncio.sleep(0)
            source.changes.tell("c1", tenant("evil", "c1", ready=False, error="x"))  # filtered
            source.changes.tell("c2", tenant("calm", "c2", version="0.4.0"))
            line = b""
            while not line.startswith(b"data: "):
                line = await stream.content.readline()
            row = json.loads(line[6:])
            assert (row["cluster"], row["tenant"], row["chart_version"], row["state"]) == \
                ("c2", "calm", "0.4.0", "Ready")
    serving(source, check, streams=1)


def test_a_listener_that_falls_behind_is_told_once_to_read_the_whole_again() -> None:
    changes = Changes(queued=3)

    async def main() -> list[str]:
        with changes.listen() as queue:
            for i in range(10):
                changes.tell("c", {"n": i})
            return [c or "LOST" for c, _ in [queue.get_nowait() for _ in range(queue.qsize())]]
    assert asyncio.run(main()) == ["c", "c", "LOST"]
