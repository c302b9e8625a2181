"""The fleet page (SPEC O16) on a fleet source of the test's own: what a cell and the summary
say, the filters, the headers every answer carries, what a cluster wrote shown as text, the
downloads, and the bounds on queries and event streams. The page against a real operator:
tests/integration/test_fleet_page.py."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession

from krypton.decisions import fleetview
from krypton.decisions.fleetview import Filters, Row
from krypton.decisions.rollouts.rollout import RolloutState
from krypton.runtime.changes import Changes
from krypton.runtime.reconcile.memory import Judged, TenantMemory
from krypton.testing import free_port
from krypton.web import server
from krypton.web.auth import Access
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
        self.kept: dict[tuple[str, str, str], TenantMemory] = {}
        self.asked: list[tuple[str, str, str]] = []

    def rows(self) -> list[Row]:
        return [r for c, ts in sorted(self.held.items()) for r in fleetview.tenant_rows(c, ts)]

    def clusters(self) -> dict[str, dict[str, str]]:
        return {c: {"state": "engaged"} for c in self.held} | {
            "away": {"state": f"failing: ClusterUnreachable: {HOSTILE}"}}

    def tenant(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {c: t for c, ts in self.held.items() for t in ts
                if t["metadata"]["name"] == name and t["metadata"]["namespace"] == namespace}

    async def plan(self, namespace: str, name: str, *, diff: bool = False
                   ) -> dict[str, tuple[str, str, str]]:
        said = f"--- deployed\n+++ next\n+  {HOSTILE}\n" if diff else f"{HOSTILE} is as planned"
        return {c: ("upgrade" if diff else "skip", "UpToDate", said)
                for c, ts in self.held.items() if any(t["metadata"]["name"] == name for t in ts)}

    def journal(self, namespace: str, name: str) -> dict[str, Any]:
        return {c: kept for (c, ns, n), kept in self.kept.items() if (ns, n) == (namespace, name)}

    def rollout(self) -> None:
        return None

    def scope(self) -> str:
        return ""

    def controlled_in(self) -> str:
        return "krypton"

    async def control(self, action: str, by: str, seen: str) -> tuple[bool, str]:
        self.asked.append((action, by, seen))
        return True, f"{action} asked"


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


def test_a_change_is_made_into_events_once_for_every_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = fleet()
    made = 0
    rows = fleetview.tenant_rows

    def counted(cluster: str, tenants: Any) -> list[Row]:
        nonlocal made
        made += 1
        return rows(cluster, tenants)

    async def check(session: ClientSession, url: str) -> None:
        streams = [await session.get(url + "/events") for _ in range(3)]
        while source.changes.listeners < 3:
            await asyncio.sleep(0)
        source.changes.tell("c2", tenant("calm", "c2", version="0.4.0"))
        for stream in streams:
            line = b""
            while not line.startswith(b"data: "):
                line = await stream.content.readline()
            assert json.loads(line[6:])["at"] > 0  # when the commit was told
            stream.close()
    monkeypatch.setattr(fleetview, "tenant_rows", counted)
    serving(source, check)
    assert made == 1


def test_a_listener_that_falls_behind_is_told_once_to_read_the_whole_again() -> None:
    changes = Changes(kept=3)

    async def main() -> list[list[str]]:
        changes.tell("c", {"n": -1})  # nobody listens: nothing is kept
        assert not changes.log
        with changes.listen() as behind, changes.listen() as keeping:
            said = []
            for i in range(10):
                changes.tell("c", {"n": i})
                taken = [str(c.tenant["n"]) for c in keeping.take()]
                if i >= 8:
                    said.append(taken)
            said.append([c.kind for c in behind.take()])
            changes.tell("c", {"n": 10})
            await behind.wait(1)  # a change it has not taken: no wait
            said.append([c.kind for c in behind.take()])
        assert not changes.log  # nobody listens any more: what was kept goes
        return said
    assert asyncio.run(main()) == [["8"], ["9"], ["lost"], ["row"]]


class Home:
    """A home cluster of the test's own: tokens and the namespaces each user may read."""

    def __init__(self, tokens: dict[str, str], may: dict[str, set[str]]) -> None:
        self.tokens, self.allowed, self.asked = tokens, may, 0

    async def review_token(self, token: str) -> dict[str, Any] | None:
        self.asked += 1
        user = self.tokens.get(token)
        return None if user is None else {"username": user, "groups": ["g"]}

    async def may(self, user: Any, verb: str, group: str, resource: str,
                  namespace: str) -> bool:
        self.asked += 1
        assert (verb, group, resource) == ("get", "mesh.openkcm.io", "tenants")
        return namespace in self.allowed.get(user["username"], set())


def two_teams() -> Source:
    return Source({"c1": [tenant("a", "c1", namespace="red"), tenant("b", "c1", namespace="blue")],
                   "c2": [tenant("a", "c2", namespace="red")]})


def test_with_kubernetes_auth_each_identity_sees_only_the_namespaces_it_may_read() -> None:
    home = Home({"t-red": "ann", "t-all": "root", "t-none": "eve"},
                {"ann": {"red"}, "root": {""}, "eve": set()})
    source = two_teams()

    async def check(session: ClientSession, url: str) -> None:
        async def seen(token: str | None, path: str = "/rows.json") -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with session.get(url + path, headers=headers) as resp:
                body = await resp.text()
                return resp.status, json.loads(body) if path.endswith(".json") and \
                    resp.status == 200 else body

        assert (await seen(None))[0] == 401
        assert (await seen("forged"))[0] == 401
        status, rows = await seen("t-red")
        assert status == 200 and {(r["cluster"], r["namespace"]) for r in rows} == {
            ("c1", "red"), ("c2", "red")}
        assert len((await seen("t-all"))[1]) == 3
        assert (await seen("t-none"))[1] == []
        status, page = await seen("t-red", "/")
        assert status == 200 and "ann:" in page and 'data-cell="c1|red/a"' in page
        assert "blue/b" not in page
        assert (await seen("t-red", "/tenants/blue/b"))[0] == 404
        assert (await seen("t-all", "/tenants/blue/b"))[0] == 200
        assert "blue/b" not in (await seen("t-red", "/clusters/c1"))[1]
        status, table = await seen("t-red", "/rows.csv")
        assert status == 200 and ",blue," not in table and ",red," in table

        # answers are kept: the same views again ask the home cluster nothing
        asked = home.asked
        await seen("t-red")
        await seen("t-red", "/")
        assert home.asked == asked

        # a stream says only what its identity may see
        headers = {"Authorization": "Bearer t-red"}
        async with session.get(url + "/events", headers=headers) as stream:
            while not source.changes.listeners:
                await asyncio.sleep(0)
            source.changes.tell("c1", tenant("b", "c1", namespace="blue", version="9.9.9"))
            source.changes.tell("c1", tenant("a", "c1", namespace="red", version="0.5.0"))
            line = b""
            while not line.startswith(b"data: "):
                line = await stream.content.readline()
            assert json.loads(line[6:])["namespace"] == "red"
    serving(source, check, access=Access(lambda: home))


def test_without_a_home_cluster_to_ask_the_page_answers_503_and_keeps_nothing() -> None:
    access = Access(lambda: None)

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/", headers={"Authorization": "Bearer x"}) as resp:
            assert resp.status == 503
            assert resp.headers["X-Frame-Options"] == "DENY"
        assert access.kept() == 0
    serving(fleet(), check, access=access)


def test_kept_answers_are_bounded_and_expire() -> None:
    now = [0.0]
    home = Home({f"t{i}": f"u{i}" for i in range(10)}, {})
    access = Access(lambda: home, size=4, ttl=30, clock=lambda: now[0])

    async def main() -> None:
        for i in range(10):
            assert (await access.identity(f"Bearer t{i}")) is not None
        assert access.kept() == 4
        asked = home.asked
        await access.identity("Bearer t9")
        assert home.asked == asked  # kept
        now[0] = 31.0
        await access.identity("Bearer t9")
        assert home.asked == asked + 1  # expired, asked again
        assert await access.identity("Basic dTpw") is None and home.asked == asked + 1
    asyncio.run(main())


def test_the_rollout_shows_its_waves_progress_and_what_a_person_may_do() -> None:
    rolling = RolloutState(target="f" * 64, version="0.3.0", waves=(("c2",), ("c1",)),
                           wave=1, awaiting=True, message=f"waits for approval {HOSTILE}")
    source = Source({"c1": [tenant("a", "c1")], "c2": [tenant("a", "c2", version="0.3.0"),
                                                       tenant("b", "c2", ready=False)]})
    source.held["c1"][0]["status"]["conditions"].append({
        "type": "ClusterProgress/c1", "status": "False", "reason": "OutsideMaintenanceWindow",
        "message": "the change waits ...; the next one opens at 2026-12-07T22:00:00Z"})
    waves = fleetview.waves(rolling, source.rows())
    assert [(w.number, w.at_version, w.releases, w.place) for w in waves] == [
        (1, 1, 2, "done"), (2, 0, 1, "current")]
    assert waves[1].windows == ("c1: the change waits ...; the next one opens at "
                                "2026-12-07T22:00:00Z",)
    assert fleetview.actions(rolling)[0] == (
        "approve", "approve wave 2", "krypton rollout approve --by <your name>")
    paused = dataclasses.replace(rolling, awaiting=False, paused_at=1.0)
    assert [a for a, _, _ in fleetview.actions(paused)] == ["resume", "abort"]
    assert fleetview.actions(dataclasses.replace(rolling, phase="Complete")) == []
    source.rollout = lambda: rolling  # type: ignore[method-assign]

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/") as resp:
            page = await resp.text()
        assert 'class="current awaiting" data-wave="2"' in page
        assert '<span class="window">c1: the change waits ...; the next one opens' in page
        assert "<code>krypton rollout approve --by &lt;your name&gt;</code>" in page
        assert "<img" not in page
        async with session.get(url + "/events") as stream:
            while not source.changes.listeners:
                await asyncio.sleep(0)
            source.changes.rollout_changed()
            assert await stream.content.readline() == b"event: rollout\n"
    serving(source, check)


def test_a_tenants_page_shows_what_krypton_said_and_judged_of_it_as_text() -> None:
    source = fleet()
    source.kept[("c1", "team", "evil")] = TenantMemory(
        said=(("2026-12-06T04:00:00Z", "Warning", "InstallFailed", HOSTILE),),
        judged=Judged("2026-12-06T04:00:00Z", "untrusted", HOSTILE,
                      ((1, "superseded", "sealed by krypton"), (2, "deployed", "no seal"))))

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/tenants/team/evil") as resp:
            page = await resp.text()
        assert "<img" not in page and "<script>alert" not in page
        assert "<td>InstallFailed</td><td>&lt;img src=x" in page
        assert page.index("<td>2</td><td>deployed</td>") < page.index("<td>1</td>")  # newest first
        async with session.get(url + "/tenants/team/calm") as resp:
            assert "What krypton said" not in await resp.text()  # nothing kept, nothing said
    serving(source, check)


def test_a_rollout_control_comes_only_from_the_page_for_someone_allowed() -> None:
    rolling = RolloutState(target="f" * 64, version="0.3.0", waves=(("c2",), ("c1",)),
                           wave=1, awaiting=True)
    home = Home({"t-ann": "ann", "t-bob": "bob"}, {"ann": {"", "krypton"}, "bob": {""}})
    verbs: list[tuple[str, str, str, str]] = []
    may = home.may

    async def recorded(user: Any, verb: str, group: str, resource: str, ns: str) -> bool:
        if verb == "get":
            return await may(user, verb, group, resource, ns)
        verbs.append((user["username"], verb, resource, ns))
        return user["username"] == "ann" and verb == "approve" and ns == "krypton"
    home.may = recorded  # type: ignore[method-assign]
    source = fleet()
    source.rollout = lambda: rolling  # type: ignore[method-assign]

    async def check(session: ClientSession, url: str) -> None:
        def as_(token: str, origin: str | None = url) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}", **({"Origin": origin} if origin else {})}
        form = {"target": rolling.target}
        async with session.get(url + "/", headers=as_("t-ann")) as resp:
            page = await resp.text()
        assert '<button type="submit" data-action="approve">' in page
        assert 'data-action="pause"' not in page  # not hers to use: no button, the command
        async with session.get(url + "/", headers=as_("t-bob")) as resp:
            assert "data-action" not in await resp.text()
        for headers in (as_("t-ann", None), as_("t-ann", "http://evil.example")):
            async with session.post(url + "/rollout/approve", data=form,
                                    headers=headers) as resp:
                assert resp.status == 403 and "Origin" in await resp.text()
        async with session.post(url + "/rollout/approve", data=form,
                                headers={**as_("t-ann"), "Sec-Fetch-Site": "cross-site"}) as resp:
            assert resp.status == 403
        async with session.post(url + "/rollout/approve", data=form, headers=as_("t-bob")) as resp:
            assert resp.status == 403 and "bob may not approve" in await resp.text()
        async with session.post(url + "/rollout/chmod", data=form, headers=as_("t-ann")) as resp:
            assert resp.status == 403
        assert source.asked == []
        async with session.post(url + "/rollout/approve", data=form, headers=as_("t-ann"),
                                allow_redirects=False) as resp:
            assert resp.status == 303
        assert source.asked == [("approve", "ann", rolling.target)]
        assert ("ann", "approve", "rollouts", "krypton") in verbs
    serving(source, check, access=Access(lambda: home))


def test_without_kubernetes_auth_the_page_acts_for_nobody() -> None:
    source = fleet()

    async def check(session: ClientSession, url: str) -> None:
        async with session.post(url + "/rollout/approve", data={"target": "x"},
                                headers={"Origin": url}) as resp:
            assert resp.status == 403 and "--web-auth=kubernetes" in await resp.text()
        assert source.asked == []
    serving(source, check)


def test_a_tenants_plan_is_made_only_when_asked_for_and_shown_as_text() -> None:
    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/tenants/team/calm") as resp:
            page = await resp.text()
        assert "The next pass would" not in page and 'href="/tenants/team/calm/plan"' in page
        async with session.get(url + "/tenants/team/calm/plan") as resp:
            page = await resp.text()
        assert page.count("The next pass would: <strong>skip</strong> (UpToDate)") == 2
        assert "<img" not in page
        async with session.get(url + "/tenants/team/calm/diff") as resp:
            page = await resp.text()
        assert '<pre class="diff">--- deployed\n+++ next\n+  &lt;img src=x' in page
        assert "<img" not in page
    serving(fleet(), check)


def test_an_idle_stream_gets_a_heartbeat_past_its_period_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "HEARTBEAT", 0.2)
    source = fleet()

    async def check(session: ClientSession, url: str) -> None:
        async with session.get(url + "/events") as stream, asyncio.timeout(5):
            lines = [await stream.content.readline() for _ in range(4)]
        assert lines == [b": heartbeat\n", b"\n", b": heartbeat\n", b"\n"]
    serving(source, check)
