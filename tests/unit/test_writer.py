"""This instance as a writer (SPEC S6): which Lease a record's writer label makes krypton
read. The home cluster is a fake of krypton's own port: only its Lease reads count."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from krypton.app.writer import Writer
from krypton.decisions.settings import Settings

pytestmark = pytest.mark.unit


class Home:
    """Leases by (namespace, name), each read noted."""

    def __init__(self, leases: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.leases, self.read = leases, list[tuple[str, str]]()

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.read.append((namespace, name))
        return self.leases.get((namespace, name))


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
