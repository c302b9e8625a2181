"""SPEC S1 faults against the real test bed: an API server outage, a crash during installs,
a chart repository outage, concurrent writers. (Leader death: test_operations.)"""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

import pytest

from krypton.testing import ChartRepository, ControlPlane
from krypton.testing.operator import OperatorProcess, wait_for
from tests.conftest import CHARTS
from tests.integration.conftest import Cluster, Fleet, unique


@pytest.fixture
def flaky(testbin: Path) -> Any:
    cp = ControlPlane("flaky", testbin, auth="token").start()
    try:
        yield Cluster("flaky", cp)
    finally:
        cp.stop()


def test_remote_api_server_outage_and_recovery(fleet: Fleet, flaky: Cluster) -> None:
    fleet.register("home", fleet.home)
    fleet.register("flaky", flaky)
    flaky.ensure_namespace(fleet.tenant_ns)
    op = fleet.start("--api-timeout", "5s")  # away for longer than 10 s is said
    before = fleet.tenant(flaky, unique("before"))
    flaky.wait_phase(fleet.tenant_ns, before, "Ready")

    noticed = len(op.log_events("watch failed, retrying", cluster="flaky"))
    flaky.cp.stop_apiserver()
    during = fleet.tenant(fleet.home, unique("during"))
    fleet.home.wait_phase(fleet.tenant_ns, during, "Ready")  # home unaffected
    # the operator has seen the outage (its watches of flaky fail) and is still up
    wait_for(lambda: len(op.log_events("watch failed, retrying", cluster="flaky")) > noticed,
             60, what="the outage noticed")
    assert op.alive()
    # away for longer than the threshold: said once, in an Event, the metric and /readyz
    away = wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns, "flaky")
                             if e.reason == "ClusterUnreachable"], 90, what="the outage said")
    assert away[0].type == "Warning" and (away[0].count or 1) == 1
    assert "cluster flaky: failing: ClusterUnreachable" in op.readyz()
    assert op.metric("krypton_cluster_healthy", cluster="flaky") == 0

    flaky.cp.restart_apiserver()
    flaky.api = Cluster("flaky", flaky.cp).api
    after = fleet.tenant(flaky, unique("after"))
    flaky.wait_phase(fleet.tenant_ns, after, "Ready", timeout=120)
    assert op.alive() and "watch failed, retrying" in op.log_text()
    fleet.home.wait_event(fleet.discovery_ns, "flaky", "ClusterRecovered", timeout=60)
    assert op.metric("krypton_cluster_healthy", cluster="flaky") == 1


def test_sigkill_during_fifty_installs_then_restart(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    args = ("--max-concurrent-helm", "8", "--max-concurrent-reconciles", "10",
            "--helm-timeout", "5s")
    op = fleet.start(*args)
    names = [unique("crash") for _ in range(50)]
    for name in names:
        fleet.tenant(fleet.remote, name)
    wait_for(lambda: op.metric("krypton_helm_processes_total", operation="install") >= 10, 60,
             interval=0.05, what="installs in flight")
    op.kill(group=True)  # the operator and its helm processes, as when a pod is killed

    fleet.start(*args)
    for name in names:
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready", timeout=180)
    for name in names:
        records = fleet.remote.release_records(name, f"tenant-{name}-remote")
        assert records and records[-1][1] == "deployed", (name, records)
        assert not [r for r in records if r[1].startswith("pending")], (name, records)


def test_chart_repository_outage(fleet: Fleet, helm_bin: str) -> None:
    repo = ChartRepository(helm_bin)
    repo.publish(CHARTS / "sample", "0.2.0")  # not started: the repository is down
    fleet.register("remote", fleet.remote)
    args = [a if a != fleet.chart_repo.url else repo.url for a in fleet.args()]
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    try:
        op.wait_ready()
        name = fleet.tenant(fleet.remote, unique("outage"))
        fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                    "ChartNotLoaded")
        # no hot loop: the attempts back off exponentially (SPEC R3), each gap well over the
        # one before it
        key = f"{fleet.tenant_ns}/{name}"
        tries = wait_for(lambda: (t := op.log_events("chart not available", tenant=key))
                         and len(t) >= 4 and t, 60, what="four attempts")
        stamps = [dt.datetime.fromisoformat(t["timestamp"]) for t in tries[:4]]
        gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]
        assert all(later > 1.5 * earlier for earlier, later in zip(gaps, gaps[1:],
                                                                    strict=False)), gaps
        repo.start()
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
        assert repo.requests <= 4  # one index read and one chart pull, give or take a retry
    finally:
        repo.close()


def test_concurrent_writers_lose_nothing(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.start()
    names = [unique("busy") for _ in range(3)]
    stop = threading.Event()

    def meddle() -> None:
        i = 0
        while not stop.is_set():
            for name in names:
                try:
                    fleet.remote.patch_tenant(fleet.tenant_ns, name, {
                        "metadata": {"labels": {"touched": str(i)}}})
                except Exception:  # noqa: BLE001 - the Tenant may not exist yet
                    pass
            i += 1
            stop.wait(0.02)  # pacing, not synchronisation

    writer = threading.Thread(target=meddle, daemon=True)
    writer.start()
    try:
        for name in names:
            fleet.tenant(fleet.remote, name)
        # another controller adds its own condition with a proper read-modify-write
        custom = fleet.remote.custom
        for name in names:
            def add_condition(name: str = name) -> bool:
                t = fleet.remote.tenant(fleet.tenant_ns, name)
                conds = (t.get("status") or {}).get("conditions") or []
                conds = [c for c in conds if c["type"] != "ExternalCheck"] + [{
                    "type": "ExternalCheck", "status": "True", "reason": "Checked",
                    "message": "by another writer", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
                custom.patch_namespaced_custom_object_status(
                    "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name,
                    {"metadata": {"resourceVersion": t["metadata"]["resourceVersion"]},
                     "status": {"conditions": conds}})
                return True
            wait_for(add_condition, 30, what="external condition written")
        for name in names:
            fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    finally:
        stop.set()
        writer.join(5)
    for name in names:
        t = fleet.remote.tenant(fleet.tenant_ns, name)
        types = {c["type"] for c in t["status"]["conditions"]}
        assert {"ClusterReady/remote", "ClusterError/remote", "Ready"} <= types
        assert "touched" in t["metadata"]["labels"]
        assert t["metadata"]["annotations"]["mesh.openkcm.io/fingerprint-remote"]
        if "ExternalCheck" not in types:
            pytest.fail(f"{name}: the other writer's condition was lost")
