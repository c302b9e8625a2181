"""The API server of an engaged cluster is someone else's (issue 46, SPEC S3): answers that
never end, are too large, nest past any parser, a watch line without end, a watch that
streams new objects forever, a watch refused with an answer without end, pages without end,
a redirect to another origin. Each costs only its own cluster: a reason and an Event on its
Secret (a refused watch is only tried again), a backoff, and neither the operator's memory
(its peak RSS stays within 64 MiB of what it was) nor the healthy cluster's progress.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from krypton.testing.operator import wait_for
from tests.integration.conftest import Fleet, unique
from tests.reliability.hostile_api import HostileAPI, answer, is_list, is_watch, stream
from tests.reliability.test_hostile_input import Responder

pytestmark = pytest.mark.reliability

MiB = 1 << 20
Answer = Callable[[BaseHTTPRequestHandler], None]


def _tenant_event(namespace: str, i: int) -> bytes:
    """An ADDED event of a Tenant nobody made, 64 KiB of annotation each."""
    return json.dumps({"type": "ADDED", "object": {
        "apiVersion": "mesh.openkcm.io/v1alpha1", "kind": "Tenant",
        "metadata": {"name": f"ghost-{i}", "namespace": namespace, "uid": f"u{i}",
                     "resourceVersion": str(10_000_000 + i),
                     "annotations": {"pad": "x" * 65536}}, "spec": {}}}).encode() + b"\n"


def _endless_tenants(namespace: str) -> Answer:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        for i in range(20_000):  # 1.3 GiB if nothing stopped reading
            h.wfile.write(_tenant_event(namespace, i))
    return send


def _pages(h: BaseHTTPRequestHandler) -> None:
    """A page of no Tenant, 8 MiB of it blank, and a token for the next one, every time."""
    body = b'{"kind": "TenantList", "metadata": {"continue": "more"}, "items": []' + \
        b" " * (8 * MiB) + b"}"
    answer(h, 200, body)


DEEP = b'{"a":' * 200_000 + b"1" + b"}" * 200_000


def _classes(namespace: str, elsewhere: str) -> dict[str, tuple[str, Answer, str]]:
    """name -> (what it answers: list or watch of Tenants, how, the reason expected: none
    where a failed watch is only tried again, the cluster serving from its list)."""
    return {
        "huge body": ("list", lambda h: stream(h, b'{"items": [', b" " * 65536, 512 * MiB,
                                               tail=b"]}"), "AnswerTooLarge"),
        "no length, no end": ("list", lambda h: stream(h, b'{"items": [', b" " * 65536,
                                                       512 * MiB, length=False),
                              "AnswerTooLarge"),
        "nested past the parser": ("list", lambda h: answer(h, 200, DEEP), "BadResponse"),
        "pages without end": ("list", _pages, "TooManyObjects"),
        "a watch line without end": ("watch", lambda h: stream(
            h, b'{"type": "ADDED", "object": {"metadata": {"name": "', b"a" * 65536,
            512 * MiB, length=False), "AnswerTooLarge"),
        "new objects without end": ("watch", _endless_tenants(namespace), "TooManyObjects"),
        "a watch refused at length": ("watch", lambda h: stream(
            h, b'{"kind": "Status", "message": "', b"x" * 65536, 512 * MiB, length=False,
            status=500), ""),
        "a redirect to http": ("list", lambda h: answer(h, 302, b"{}", {
            "Location": f"{elsewhere}/apis/mesh.openkcm.io/v1alpha1/tenants"}), "APIError"),
    }


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def elsewhere() -> Iterator[Responder]:
    other = Responder(lambda _path: b"{}", content_type="application/json")
    yield other
    other.close()


@pytest.mark.parametrize("name", list(_classes("", "")))
def test_a_hostile_api_server_costs_only_its_own_cluster(fleet: Fleet, elsewhere: Responder,
                                                         name: str) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    started = time.monotonic()
    first = fleet.tenant(fleet.remote, unique("before"))
    fleet.remote.wait_phase(fleet.tenant_ns, first, "Ready")
    alone = time.monotonic() - started
    baseline = _peak_rss(op.pid)

    which, send, reason = _classes(fleet.tenant_ns, elsewhere.url)[name]
    hits = is_list if which == "list" else is_watch
    hostile = HostileAPI(fleet.home.cp.kubeconfig,
                         lambda method, path: send if hits(method, path, "tenants") else None)
    try:
        fleet.register("hostile", kubeconfig=hostile.kubeconfig())
        # refused, and tried again after a backoff: the cluster is not given up on
        wait_for(lambda: hostile.answered >= 2, 90, what=f"{name}: answered twice")
        if reason not in ("APIError", ""):
            warned = wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns, "hostile")
                                       if e.reason == reason], 60,
                              what=f"{name}: Warning {reason} on the cluster's Secret")
            assert warned[0].type == "Warning"
        if reason:
            wait_for(lambda: "cluster hostile:" in op.readyz(), 60,
                     what="/readyz names the cluster")
        # the healthy cluster keeps its pace meanwhile
        started = time.monotonic()
        after = fleet.tenant(fleet.remote, unique("during"))
        fleet.remote.wait_phase(fleet.tenant_ns, after, "Ready")
        beside = time.monotonic() - started
        assert op.alive()
        grown = _peak_rss(op.pid) - baseline
        print(f"{name}: peak RSS {baseline / MiB:.1f} MiB before, +{grown / MiB:.1f} MiB; "
              f"{hostile.answered} hostile answers; a healthy Tenant Ready in {alone:.2f} s "
              f"alone, {beside:.2f} s beside it")
        assert grown <= 64 * MiB, f"{name}: the operator's peak RSS grew {grown / MiB:.0f} MiB"
        assert elsewhere.requests == 0  # no redirect followed, to any origin
    finally:
        hostile.close()
