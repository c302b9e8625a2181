"""F8 update notices: a newer chart in the repository that the settings do not take is said in
the Tenant's status, by `krypton status` and `krypton plan` and by the release's info metric,
once, and nothing more is written while the fleet is idle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from krypton.testing import ChartRepository
from krypton.testing.operator import OperatorProcess, wait_for
from tests.conftest import CHARTS

from .conftest import Fleet, unique
from .test_cli import krypton, run_flags


@pytest.fixture
def repo(helm_bin: str) -> Any:
    r = ChartRepository(helm_bin)
    r.publish(CHARTS / "sample", "1.0.0")
    r.start()
    yield r
    r.close()


def _with_repo(flags: list[str], fleet: Fleet, repo: ChartRepository) -> list[str]:
    flags = list(flags)
    flags[flags.index(fleet.chart_repo.url)] = repo.url
    return flags


def test_a_newer_chart_is_noticed_once_and_nothing_more_is_written(
        fleet: Fleet, repo: ChartRepository, tmp_path: Path) -> None:
    fleet.register("remote", fleet.remote)
    args = _with_repo(fleet.args("--chart-index-ttl", "2s", version="1.0.0"), fleet, repo)
    args[args.index("600s")] = "3s"  # --resync-period: idle passes come often
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    ns, name = fleet.tenant_ns, fleet.tenant(fleet.remote, unique("notice"))
    fleet.remote.wait_phase(ns, name, "Ready")

    def record() -> dict[str, Any]:
        return fleet.remote.tenant(ns, name)["status"]["clusters"]["remote"]

    assert "newerVersion" not in record()  # nothing newer: no field at all
    # a pre-release is no notice for a release; 1.1.0 is, and the pin does not take it
    repo.publish(CHARTS / "sample", "2.0.0-rc.1")
    repo.publish(CHARTS / "sample", "1.1.0")
    wait_for(lambda: record().get("newerVersion") == "1.1.0", 60, what="the notice in status")
    assert record()["chartVersion"] == "1.0.0"
    wait_for(lambda: op.metric("krypton_tenant_release_info", cluster="remote", tenant=name,
                               newer_version="1.1.0") == 1, 30, what="the notice as a metric")
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0

    flags = _with_repo(run_flags(fleet, version="1.0.0"), fleet, repo)
    status = krypton(fleet, "status", *flags, "-o", "json")
    row, = (r for r in json.loads(status.stdout) if r["tenant"] == name)
    assert "chart 1.1.0 is available (the settings take 1.0.0)" in row["detail"]
    plan = krypton(fleet, "plan", *flags, "-o", "json")
    row, = (r for r in json.loads(plan.stdout) if r["tenant"] == name)
    assert (row["action"], row["reason"]) == ("skip", "NoChange")
    assert "chart 1.1.0 is available" in row["detail"]

    # idle: passes (every resync) and index reads (every TTL) go on, the status stays
    version = fleet.remote.tenant(ns, name)["metadata"]["resourceVersion"]
    writes = op.metric("krypton_api_writes_total", cluster="remote")
    passes, reads = op.metric("krypton_reconciles_total", cluster="remote"), repo.requests
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote") >= passes + 3
             and repo.requests >= reads + 2, 60, what="three idle passes and two index reads")
    assert op.metric("krypton_api_writes_total", cluster="remote") == writes
    assert fleet.remote.tenant(ns, name)["metadata"]["resourceVersion"] == version

    # settings that take the newer version plan its upgrade, and no notice
    bump = krypton(fleet, "plan", *_with_repo(run_flags(fleet, version="~1.1"), fleet, repo))
    assert " upgrade " in bump.stdout and "is available" not in bump.stdout
