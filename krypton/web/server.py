"""The fleet page's server (SPEC O16): server-rendered HTML from Jinja2 templates with
autoescape on, one script and one style file of the project's own, server-sent events for
live changes, CSV and JSON downloads. It reads only what the operator holds (a
:class:`FleetSource`); every string a cluster or a registry wrote is escaped by the
templates, a Content-Security-Policy forbids any script or style but the page's own files,
frames are refused, queries are bounded and the event streams capped.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import jinja2
import structlog
from aiohttp import web

from krypton.decisions import fleetview
from krypton.decisions.errors import KryptonError
from krypton.decisions.fleetview import Filters, Row
from krypton.decisions.model import GROUP, epoch_seconds
from krypton.decisions.rollouts.rollout import RolloutState
from krypton.decisions.rollouts.rolloutcontrol import history_lines
from krypton.runtime.changes import LOST, ROLLOUT, ROW, Change, Changes
from krypton.web.auth import CONTROLS, ROLLOUTS, Access, Identity, Unanswered

_log = structlog.get_logger("krypton.web")

HERE = Path(__file__).parent
STREAMS = 50  # event streams open at once; one more is refused (503)
HEARTBEAT = 15.0  # seconds between two comments on an idle stream
GATHER = 0.25  # seconds a stream gathers changes after one came, to say them in one write
QUERY_MAX = 2048  # bytes of a request's query
HEAD_MAX = 8190  # bytes of a request line or header
BODY_MAX = 4096  # bytes of a request's body (a rollout control's form)
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
CSV_FIELDS = [f.name for f in dataclasses.fields(Row)]
SAID = {LOST: b"event: reload\ndata: {}\n\n", ROLLOUT: b"event: rollout\ndata: {}\n\n"}
WHO = web.RequestKey("who", Identity)  # who asks, as the home cluster named them


class FleetSource(Protocol):
    """What the page reads of the operator, all of it in the operator's memory."""

    changes: Changes

    def rows(self) -> list[Row]:
        """Every Tenant x engaged cluster, as :func:`fleetview.tenant_rows` makes them."""

    def clusters(self) -> dict[str, dict[str, str]]:
        """Each discovered cluster: its state ("engaged" or its one reason) and what else is
        known of it (its source, guard, budget, helm worker), as words."""

    def tenant(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        """The Tenant as each engaged cluster holds it (cluster -> object)."""

    async def plan(self, namespace: str, name: str, *, diff: bool = False
                   ) -> Mapping[str, tuple[str, str, str]]:
        """What each engaged cluster's next pass would do with the Tenant, as ``krypton
        plan`` says it: (action, reason, message) per cluster; with `diff`, the message is
        ``krypton diff``'s. It may look the clusters up, so the page asks for it only when a
        person does."""

    def journal(self, namespace: str, name: str) -> Mapping[str, Any]:
        """What each engaged cluster remembers of the Tenant beyond its object: the Events
        krypton last wrote of it (`said`) and its release's history as last judged
        (`judged`), as :class:`krypton.runtime.reconcile.memory.TenantMemory` keeps them."""

    def rollout(self) -> RolloutState | None: ...

    def controlled_in(self) -> str:
        """The namespace of the rollout's state on the home cluster: where a person's right
        to control it (F9) is asked."""

    async def control(self, action: str, by: str, seen: str) -> tuple[bool, str]:
        """A person's rollout control, asked as ``krypton rollout`` asks it, unless the
        rollout moved on from the target `seen`; whether it wrote, and what it says."""

    def scope(self) -> str:
        """What part of the fleet this replica shows ("" for all of it)."""


def ago(stamp: str, now: float) -> str:
    """How long ago an RFC 3339 time was, in a person's words ("" when unknown)."""
    then = epoch_seconds(stamp)
    if not then:
        return ""
    seconds = max(0, int(now - then))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _csv_cell(value: object) -> str:
    """A cell a spreadsheet shows as text, never runs as a formula."""
    text = str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # a browser asks; the page has no icon


def rollout_view(rollout: RolloutState | None, rows: list[Row]) -> dict[str, Any]:
    """What the page says of the rollout (F1, F9): its waves with their progress, what a
    person may do and the command, its history."""
    if rollout is None:
        return {"rollout": None}
    return {"rollout": rollout, "waves": fleetview.waves(rollout, rows),
            "actions": fleetview.actions(rollout),
            "history": history_lines(rollout, lambda t: time.strftime(
                "%Y-%m-%d %H:%M:%SZ", time.gmtime(t)))}


def row_json(row: Row, now: float) -> dict[str, Any]:
    return {**dataclasses.asdict(row), "ago": ago(row.since, now)}


class WebServer:
    """The page on `address` ("0": none), reading `source`; to whoever reaches it, or with
    `access`, to whom the home cluster names, each Tenant where they may get it."""

    def __init__(self, address: str, source: FleetSource, *, access: Access | None = None,
                 streams: int = STREAMS) -> None:
        self.address, self.source, self.streams = address, source, streams
        self.access = access
        self._planning = asyncio.Lock()  # one plan at a time: it may ask the clusters
        self.open_streams = 0
        self._streaming: set[asyncio.Task[Any]] = set()  # ended first when the page stops
        self._runner: web.AppRunner | None = None
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            undefined=jinja2.ChainableUndefined)  # a field a cluster left out is empty

    async def start(self) -> None:
        """Bind the listener; OSError if its port is taken."""
        if self.address == "0":
            return
        app = web.Application(middlewares=[self._guarded], client_max_size=BODY_MAX)
        app.add_routes([web.get("/", self._index), web.get("/rows.json", self._json),
                        web.get("/rows.csv", self._csv), web.get("/events", self._events),
                        web.get("/tenants/{namespace}/{name}", self._tenant),
                        web.get("/tenants/{namespace}/{name}/plan", self._tenant),
                        web.get("/tenants/{namespace}/{name}/diff", self._tenant),
                        web.post("/rollout/{action}", self._control),
                        web.get("/clusters/{name}", self._cluster),
                        web.get("/favicon.ico", _no_icon),
                        web.static("/static", HERE / "static")])
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               max_line_size=HEAD_MAX, max_field_size=HEAD_MAX)
        await runner.setup()
        self._runner = runner
        host, _, port = self.address.rpartition(":")
        try:
            await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop serving: the open event streams end at once, then the listener."""
        for task in list(self._streaming):
            task.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @web.middleware
    async def _guarded(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every answer with the page's headers; a query past its bound refused; with
        `access`, a request the home cluster names no one for refused (401)."""
        if len(request.query_string) > QUERY_MAX:
            response: web.StreamResponse = web.Response(status=414, text="query too long")
        elif (refused := await self._identify(request)) is not None:
            response = refused
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # a 404 or 503 gets the headers too
                exc.headers.update({k: v for k, v in HEADERS.items() if k not in exc.headers})
                raise
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _identify(self, request: web.Request) -> web.Response | None:
        """Who asks (kept on the request), or the answer refusing them."""
        if self.access is None:
            return None
        try:
            who = await self.access.identity(request.headers.get("Authorization", ""))
        except (Unanswered, KryptonError) as exc:
            _log.warning("fleet page cannot ask who a token is", error=str(exc))
            return web.Response(status=503, text="the home cluster cannot be asked who you "
                                                 "are; try again later")
        if who is None:
            return web.Response(status=401, text="a bearer token the home cluster takes is "
                                                 "needed (--web-auth=kubernetes)",
                                headers={"WWW-Authenticate": 'Bearer realm="krypton"'})
        request[WHO] = who
        return None

    async def _visible(self, request: web.Request, rows: list[Row]) -> list[Row]:
        """Those of `rows` whose Tenant the asker may see."""
        who: Identity | None = request.get(WHO)
        if self.access is None or who is None:
            return rows
        try:
            seen = await self.access.namespaces(who, {r.namespace for r in rows})
        except (Unanswered, KryptonError) as exc:
            raise web.HTTPServiceUnavailable(
                text="the home cluster cannot be asked what you may see; try again later"
            ) from exc
        return [r for r in rows if r.namespace in seen]

    def _page(self, template: str, request: web.Request, **values: Any) -> web.Response:
        who: Identity | None = request.get(WHO)
        html = self._env.get_template(template).render(
            scope=self.source.scope(), open=self.access is None,
            viewer=who.name if who is not None else "", **values)
        return web.Response(text=html, content_type="text/html")

    async def _rows(self, request: web.Request) -> tuple[Filters, list[Row]]:
        filters = Filters.of(request.query)
        return filters, await self._visible(
            request, [r for r in self.source.rows() if filters.keep(r)])

    async def _index(self, request: web.Request) -> web.Response:
        filters, rows = await self._rows(request)
        clusters, tenants, cells = fleetview.matrix(rows)
        by_cluster = len(clusters) >= len(tenants)  # the longer axis down the page
        now = time.time()
        return self._page(
            "index.html", request, filters=filters, summary=fleetview.summary(rows),
            down=clusters if by_cluster else tenants, across=tenants if by_cluster else clusters,
            by_cluster=by_cluster, cells=cells, now=now, ago=ago, states=fleetview.STATES,
            query=request.query_string, clusters=self.source.clusters(),
            allowed=await self._controls(request), **rollout_view(self.source.rollout(), rows))

    async def _controls(self, request: web.Request) -> set[str]:
        """The rollout controls the asker may use (none without --web-auth=kubernetes: a page
        that knows nobody acts for nobody)."""
        who, rollout = request.get(WHO), self.source.rollout()
        if self.access is None or who is None or rollout is None:
            return set()
        possible = [a for a, _, _ in fleetview.actions(rollout)]
        try:
            return {a for a in possible if await self.access.may(
                who, a, ROLLOUTS, self.source.controlled_in())}
        except (Unanswered, KryptonError):
            return set()  # not asked now: the buttons wait for the next look

    async def _control(self, request: web.Request) -> web.StreamResponse:
        """A rollout control from the page's form (F9): only from the page itself, only for
        someone the home cluster names and lets use the control, said in an Event."""
        action, who = request.match_info["action"], request.get(WHO)
        origin = request.headers.get("Origin", "")
        if urlsplit(origin).netloc != request.host or \
                request.headers.get("Sec-Fetch-Site", "same-origin") != "same-origin":
            return web.Response(status=403, text="refused: a rollout control comes only from "
                                                 "this page (its Origin)")
        if self.access is None or who is None:
            return web.Response(status=403, text="the page acts only for someone it knows "
                                                 "(--web-auth=kubernetes)")
        if action not in CONTROLS or not await self.access.may(
                who, action, ROLLOUTS, self.source.controlled_in()):
            return web.Response(status=403, text=f"{who.name} may not {action} the rollout "
                                                 f"(RBAC: verb {action} on {ROLLOUTS}."
                                                 f"{GROUP})")
        form = await request.post()
        try:
            wrote, said = await self.source.control(action, who.name, str(form.get("target")))
        except KryptonError as exc:
            return web.Response(status=503, text=f"the rollout could not be asked: {exc}")
        _log.info("rollout control from the fleet page", by=who.name, action=action,
                  wrote=wrote, detail=said)
        if not wrote:
            return web.Response(status=409, text=said)
        raise web.HTTPSeeOther("/")

    @staticmethod
    def _encoded(change: Change) -> list[tuple[Row, bytes]]:
        """`change` as events: its rows, each with its text (made once for every stream,
        kept on the change)."""
        encoded: list[tuple[Row, bytes]] | None = change.memo.get("rows")
        if encoded is None:
            now = time.time()
            encoded = change.memo["rows"] = [
                (row, f"event: row\ndata: {json.dumps({**row_json(row, now), 'at': change.at})}"
                      "\n\n".encode())
                for row in fleetview.tenant_rows(change.cluster, [change.tenant])]
        return encoded

    def _plain(self, change: Change) -> bytes:
        """What an unfiltered stream of an open page says of `change` (the same bytes for
        every such stream)."""
        said: bytes | None = change.memo.get("plain")
        if said is None:
            said = change.memo["plain"] = SAID.get(change.kind) or b"".join(
                text for _, text in self._encoded(change))
        return said

    async def _said(self, request: web.Request, filters: Filters, change: Change) -> bytes:
        """What a stream of `filters` says of `change`, the asker's to see only."""
        if change.kind != ROW:
            return SAID[change.kind]
        kept = [(row, text) for row, text in self._encoded(change) if filters.keep(row)]
        shown = {id(row) for row in await self._visible(request, [row for row, _ in kept])}
        return b"".join(text for row, text in kept if id(row) in shown)

    async def _json(self, request: web.Request) -> web.Response:
        _, rows = await self._rows(request)
        now = time.time()
        return web.json_response([row_json(r, now) for r in rows])

    async def _csv(self, request: web.Request) -> web.Response:
        _, rows = await self._rows(request)
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(CSV_FIELDS)
        for r in rows:
            writer.writerow([_csv_cell(getattr(r, f)) for f in CSV_FIELDS])
        return web.Response(text=out.getvalue(), content_type="text/csv", headers={
            "Content-Disposition": 'attachment; filename="krypton-fleet.csv"'})

    async def _tenant(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        held = self.source.tenant(namespace, name)
        if not held or not await self._visible(request, [Row("", namespace, name)]):
            raise web.HTTPNotFound(text="no such Tenant on an engaged cluster")
        now = time.time()
        journal = self.source.journal(namespace, name)
        plans: Mapping[str, tuple[str, str, str]] | None = None
        if request.path.endswith(("/plan", "/diff")):
            if self._planning.locked():
                raise web.HTTPServiceUnavailable(text="another plan is being made; try again")
            async with self._planning:
                plans = await self.source.plan(namespace, name,
                                               diff=request.path.endswith("/diff"))
        per_cluster = []
        for cluster, obj in sorted(held.items()):
            status = obj.get("status") or {}
            conditions = [c for c in status.get("conditions") or []
                          if str(c.get("type", "")).endswith(f"/{cluster}")]
            row = fleetview.tenant_rows(cluster, [obj])[0]
            per_cluster.append((cluster, row, conditions,
                                (status.get("clusters") or {}).get(cluster) or {},
                                journal.get(cluster),
                                None if plans is None else plans.get(cluster)))
        return self._page("tenant.html", request, namespace=namespace, name=name, now=now, ago=ago,
                          per_cluster=per_cluster)

    async def _cluster(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        known = self.source.clusters().get(name)
        if known is None:
            raise web.HTTPNotFound(text="no such cluster")
        rows = await self._visible(request, [r for r in self.source.rows() if r.cluster == name])
        return self._page("cluster.html", request, name=name, known=known, rows=rows, now=time.time(),
                          ago=ago)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: each write of a Tenant that the view's filters keep, as its
        row; "reload" when this stream fell behind. Capped at `streams` open at once."""
        if self.open_streams >= self.streams:
            return web.Response(status=503, text=f"more than {self.streams} event streams are "
                                                 "open; reload the page later")
        filters = Filters.of(request.query)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               **HEADERS})
        self.open_streams += 1
        task = asyncio.current_task()
        if task is not None:
            self._streaming.add(task)
        try:
            await response.prepare(request)
            plain = not filters.given() and self.access is None  # the page everyone sees
            with self.source.changes.listen() as feed:
                while True:
                    try:
                        await feed.wait(HEARTBEAT)
                    except TimeoutError:
                        await response.write(b": heartbeat\n\n")
                        continue
                    await asyncio.sleep(GATHER)  # what comes meanwhile goes in the same write
                    said = [self._plain(change) if plain else
                            await self._said(request, filters, change) for change in feed.take()]
                    if payload := b"".join(said):
                        await response.write(payload)
        except ConnectionResetError:
            pass  # the page went
        except web.HTTPServiceUnavailable:
            pass  # who may see what cannot be asked: the page reconnects, and is told so
        finally:
            self.open_streams -= 1
            self._streaming.discard(task)  # type: ignore[arg-type]
        return response
