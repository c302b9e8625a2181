"""The fleet page (SPEC O16) in a real browser: Debian's chromium, driven by Playwright for
Python through its executable path (Playwright's own browser download is never used). A few
sharp tests: a Tenant's change reaches the open page without a reload, markup a cluster wrote
runs nothing, a filter in the URL survives a reload, the downloads hold the view's rows, and
the page at 2 and at 200 clusters, photographed (KRYPTON_SCREENSHOTS names where; the docs
site shows the ones taken there)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from krypton.testing import free_port
from krypton.web.server import WebServer
from tests.unit.test_fleet_page import Source, tenant

from .conftest import Fleet, unique
from .test_cli import krypton, run_flags
from .test_fleet_page import HOSTILE, awaiting_approval, calm_and_evil

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# as this machine's closed network asks: nothing of Chromium's own reaches out
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is not installed (hack/runtime.sh)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def watched(page: Page) -> list[str]:
    """What the page would run or complain of: dialogs, uncaught errors, console errors."""
    said: list[str] = []
    page.on("dialog", lambda d: (said.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("pageerror", lambda e: said.append(f"error: {e}"))
    page.on("console", lambda m: said.append(f"console: {m.text}") if m.type == "error" else None)
    return said


def shots() -> Path | None:
    where = os.environ.get("KRYPTON_SCREENSHOTS")
    return Path(where) if where else None


def test_the_open_page_follows_the_fleet_and_runs_nothing_a_cluster_wrote(
        fleet: Fleet, browser: Browser) -> None:
    op, calm, evil = calm_and_evil(fleet)
    url = f"http://127.0.0.1:{op.web_port}"
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    said = watched(page)
    page.goto(url + "/")
    page.evaluate("window.notReloaded = true")
    evil_cell = page.locator(f'td[data-cell="home|{fleet.tenant_ns}/{evil}"]')
    assert evil_cell.get_attribute("class") == "cell s-Failed"
    assert HOSTILE in (evil_cell.get_attribute("title") or "")  # as text, in a tooltip
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0

    later = fleet.tenant(fleet.remote, unique("later"))
    cell = f'td[data-cell="remote|{fleet.tenant_ns}/{later}"].s-Ready'
    page.wait_for_selector(cell, timeout=60_000)  # no reload: the stream brought it
    assert page.evaluate("window.notReloaded") is True
    if (where := shots()) is not None:
        where.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(where / "fleet-page-2.png"), full_page=True)

    # a filter in the URL survives a reload; the downloads hold the view's rows
    page.goto(f"{url}/?tenant={calm}")
    page.reload()
    assert page.input_value('input[name="tenant"]') == calm
    shown = page.locator("td.cell:not(.none)").count()
    assert shown == 1, shown
    rows = json.loads(page.request.get(f"{url}/rows.json?tenant={calm}").text())
    table = page.request.get(f"{url}/rows.csv?tenant={calm}").text().splitlines()
    assert [(r["cluster"], r["tenant"]) for r in rows] == [("remote", calm)]
    assert len(table) == 2 and table[1].startswith(f"remote,{fleet.tenant_ns},{calm},")
    page.goto(f"{url}/tenants/{fleet.tenant_ns}/{evil}")
    assert HOSTILE in page.locator(".detail").first.inner_text()
    assert said == [], said


def test_a_wave_awaiting_approval_is_shown_with_its_command_and_moves_on_by_itself(
        fleet: Fleet, browser: Browser) -> None:
    op, r = awaiting_approval(fleet)
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    said = watched(page)
    page.goto(f"http://127.0.0.1:{op.web_port}/")
    page.evaluate("window.notReloaded = true")
    waiting = page.locator("#rollout li.current.awaiting")
    assert "remote" in waiting.inner_text() and "waits for approval" in waiting.inner_text()
    assert "krypton rollout approve --by <your name>" in page.locator(
        "#rollout .actions").inner_text()
    if (where := shots()) is not None:
        where.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(where / "fleet-page-rollout.png"))

    approved = krypton(fleet, "rollout", "approve", "--by", "alice",
                       *run_flags(fleet, version="0.3.0"),
                       "--from-deployment", "none")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    page.wait_for_selector("#rollout .phase:text-is('Complete')", timeout=60_000)
    assert page.locator("#rollout li.awaiting").count() == 0
    assert "approved wave 2 by alice" in (page.locator("#rollout .history").text_content() or "")
    assert page.evaluate("window.notReloaded") is True
    # the history krypton judged before the upgrade: the deployed record, sealed by it
    page.goto(f"http://127.0.0.1:{op.web_port}/tenants/{fleet.tenant_ns}/{r}")
    assert "1 deployed sealed by krypton" in page.locator("table.records").inner_text() \
        .replace("\t", " ")
    assert said == [], said


def test_the_page_reads_at_two_hundred_clusters(browser: Browser) -> None:
    """200 clusters of 4 Tenants each (a fleet source of the test's own: one bed cannot
    engage 200 API servers): the matrix keeps its clusters down the page, each cell says
    its state in words, and the page is photographed at that size."""
    states = [dict(), dict(ready=False), dict(ready=False, error="UpgradeFailed: timed out"),
              dict(version="0.3.0")]
    held: dict[str, list[dict[str, Any]]] = {
        f"cluster-{i:03d}": [tenant(f"tenant-{j}", f"cluster-{i:03d}", **states[(i + j) % 4])
                             for j in range(4)] for i in range(200)}
    source = Source(held)
    port = free_port()
    loop = asyncio.new_event_loop()
    server = WebServer(f"127.0.0.1:{port}", source)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        said = watched(page)
        page.goto(f"http://127.0.0.1:{port}/")
        assert page.locator("#matrix").get_attribute("data-down") == "cluster"
        assert page.locator("#matrix tbody tr").count() == 200
        assert page.locator("td.cell .state").first.inner_text() in (
            "Ready", "Pending", "Failed", "Progressing")
        if (where := shots()) is not None:
            where.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(where / "fleet-page-200.png"))
        assert said == [], said
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
