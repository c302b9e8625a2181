"""This instance as a writer (SPEC S6): which Lease a record's writer label makes krypton
read. The home cluster is a fake of krypton's own port: only its Lease reads count."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import time
from typing import Any

import pytest

from krypton.adapters.events import reporting_instance
from krypton.app.writer import Writer
from krypton.decisions.errors import Forbidden
from krypton.decisions.settings import Settings
from krypton.decisions.trust import writers

pytestmark = pytest.mark.unit


class Home:
    """Leases by (namespace, name), each read noted; creates refused when `refuse`."""

    def __init__(self, leases: dict[tuple[str, str], dict[str, Any]],
                 refuse: bool = False) -> None:
        self.leases, self.read, self.refuse = leases, list[tuple[str, str]](), refuse

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.read.append((namespace, name))
        return self.leases.get((namespace, name))

    async def list_leases(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        key, _, value = selector.partition("=")
        return [lease for (ns, _), lease in self.leases.items() if ns == namespace and
                (lease.get("metadata") or {}).get("labels", {}).get(key) == value]

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.refuse:
            raise Forbidden("leases is forbidden")
        made = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        self.leases[(namespace, body["metadata"]["name"])] = made
        return made

    async def delete_lease(self, namespace: str, name: str, version: str | None = None) -> None:
        self.leases.pop((namespace, name), None)


def _live() -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    return {"spec": {"holderIdentity": "pod-a", "renewTime": now, "leaseDurationSeconds": 15}}


def _writer(home: Home) -> Writer:
    settings = dataclasses.replace(Settings(), watch_namespace="krypton", resync_period=60.0)
    return Writer(home, settings)  # type: ignore[arg-type]


def test_a_writer_named_by_a_lease_of_kryptons_namespace_is_as_live_as_that_lease() -> None:
    home = Home({("krypton", "other-install"): _live()})
    writer = _writer(home)
    assert asyncio.run(writer.active("lease.krypton.other-install", 0.0))
    assert not asyncio.run(writer.active("lease.krypton.gone", 0.0))
    assert home.read == [("krypton", "other-install"), ("krypton", "gone")]


def test_a_label_naming_a_lease_elsewhere_reads_no_lease_and_is_judged_by_time() -> None:
    home = Home({("kube-system", "kube-controller-manager"): _live()})
    writer = _writer(home)
    written = time.time()  # after this process started, within the window: at work
    assert asyncio.run(writer.active("lease.kube-system.kube-controller-manager", written))
    assert not asyncio.run(writer.active("lease.kube-system.kube-controller-manager", 0.0))
    assert home.read == []


def _presence(name: str, renewed: float, host: str = "h", pid: int | str = 1) -> dict[str, Any]:
    when = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(renewed))
    return {"metadata": {"name": name, "resourceVersion": "7",
                         "labels": {writers.PRESENCE_LABEL: "true"},
                         "annotations": {writers.PRESENCE_HOST: host,
                                         writers.PRESENCE_PID: str(pid)}},
            "spec": {"holderIdentity": name, "renewTime": when, "leaseDurationSeconds": 15}}


def test_an_instance_without_the_fleets_lease_is_named_after_a_lease_of_its_own() -> None:
    """Its own Lease made, the name on its records says it, and another instance reads that
    Lease; leftovers unrenewed for an hour go first, a recent one stays; withdrawn, the
    Lease is gone and the instance no longer at work to anyone."""
    now = time.time()
    home = Home({("krypton", "krypton-run-old-1"): _presence("krypton-run-old-1", now - 7200),
                 ("krypton", "krypton-run-other-2"): _presence("krypton-run-other-2", now)})
    writer = _writer(home)
    asyncio.run(writer.announce())
    assert writer.presence.startswith(writers.PRESENCE_PREFIX)
    assert writer.name == f"lease.krypton.{writer.presence}"
    assert writers.lease_of(writer.name) == ("krypton", writer.presence)
    assert sorted(n for _, n in home.leases) == sorted(["krypton-run-other-2", writer.presence])
    other = _writer(home)
    assert asyncio.run(other.active(writer.name, 0.0))
    asyncio.run(writer.withdraw())
    assert ("krypton", writer.presence) not in home.leases and writer.presence == ""
    gone = writers.presence_lease("krypton", "h", 1)
    assert not asyncio.run(other.active(f"lease.krypton.{gone}", 0.0))


def test_a_predecessor_killed_on_this_host_leaves_no_lease_to_wait_for() -> None:
    """A Lease of an instance of this host whose process is gone is deleted when the next
    one starts (it would otherwise look at work for its duration); one of a process that
    runs, or of another host, stays."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = reporting_instance()
    home = Home({("krypton", n): _presence(n, time.time(), host=h, pid=p) for n, h, p in (
        ("krypton-run-gone", host, gone.pid), ("krypton-run-alive", host, os.getppid()),
        ("krypton-run-elsewhere", "another-host", gone.pid))})
    # a pid no process has (over the bound, and past what int() takes) is not looked up
    home.leases[("krypton", "krypton-run-odd")] = _presence("krypton-run-odd", time.time(),
                                                            host=host, pid="9" * 5000)
    writer = _writer(home)
    asyncio.run(writer.announce())
    assert sorted(n for _, n in home.leases) == sorted(
        ["krypton-run-alive", "krypton-run-elsewhere", "krypton-run-odd", writer.presence])
    left = asyncio.run(writer.active("lease.krypton.krypton-run-alive", 0.0))
    assert 0 < left <= 15.0  # until its Lease runs out, if it is not renewed


def test_without_the_right_to_make_a_lease_it_is_named_after_its_process() -> None:
    writer = _writer(Home({}, refuse=True))
    asyncio.run(writer.announce())
    assert writer.presence == "" and writer.name.startswith(writers.RUN_PREFIX)


def test_a_presence_lease_name_is_a_dns_name_whose_writer_name_fits_a_label() -> None:
    name = writers.presence_lease("krypton-system", "Pod_With.Upper-Case" + "x" * 80, 4194304)
    # lease.krypton-system. (21) krypton-run- (12) -4194304 (8): 62 - 41 = 21 of the host
    assert name == "krypton-run-pod-with-upper-casexx-4194304"
    writer = writers.name(leased=True, lease_namespace="krypton-system", lease_name=name,
                          host="", pid=0)
    assert len(writer) == writers.LABEL_MAX - 1 and writers.lease_of(writer) == (
        "krypton-system", name)
    assert writers.presence_lease("n" * 63, "host", 7) == "krypton-run-7"  # no room: none
