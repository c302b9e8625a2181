"""Rollout waves gated by metrics (SPEC F7), against the real Prometheus of the
test bed scraping an exporter whose error ratio each test sets per cluster. The gate query
passes while a cluster's ratio is under 5 %."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from krypton.testing import ChartRepository
from krypton.testing.metrics_server import METRIC, Exporter, PrometheusServer
from krypton.testing.operator import OperatorProcess, wait_for
from tests.conftest import CHARTS
from tests.integration.test_cli import krypton

from .conftest import Fleet, unique
from .test_progressive_rollout import ROLLOUT, rollout_state

QUERY = f'max({METRIC}{{cluster="$cluster"}}) < 0.05'


@pytest.fixture
def repo(helm_bin: str) -> Iterator[ChartRepository]:
    r = ChartRepository(helm_bin)
    for version in ("0.2.0", "0.3.0"):
        r.publish(CHARTS / "sample", version)
    r.start()
    yield r
    r.close()


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    e = Exporter()
    yield e
    e.close()


@pytest.fixture
def prometheus(testbin: Path, exporter: Exporter) -> Iterator[PrometheusServer]:
    server = PrometheusServer(testbin, exporter).start()
    yield server
    server.close()


def gate_args(server: PrometheusServer, *extra: str, interval: str = "1s") -> list[str]:
    return [*ROLLOUT, "--rollout-gate-prometheus", server.url, "--rollout-gate-query", QUERY,
            "--rollout-gate-interval", interval, *extra]


def good_fleet(fleet: Fleet, exporter: Exporter, server: PrometheusServer) -> None:
    """Both clusters registered with a good ratio that the server has already scraped (an
    evaluation before the first scrape finds nothing, and nothing fails it)."""
    for cluster in ("home", "remote"):
        exporter.set(cluster, 0.01)
    wait_for(lambda: all(server.has(f'{METRIC}{{cluster="{c}"}}') for c in ("home", "remote")),
             30, what="both clusters' ratios scraped")
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)


def rolled_out(fleet: Fleet) -> tuple[str, str]:
    """A Tenant on each cluster, once the rollout is complete: (home's, remote's)."""
    h, r = fleet.tenant(fleet.home, unique("h")), fleet.tenant(fleet.remote, unique("r"))
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete", 120,
             what="rollout complete")
    return h, r


def passed_on(op: OperatorProcess, *clusters: str) -> bool:
    return all(op.metric("krypton_rollout_gate_evaluations_total", cluster=c,
                         result="passed") >= 1 for c in clusters)


def start(fleet: Fleet, repo: ChartRepository, version: str, *extra: str) -> OperatorProcess:
    args = fleet.args(*extra, version=version)
    args[args.index(fleet.chart_repo.url)] = repo.url
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    return op


def deployed(fleet: Fleet, cluster: Any, tenant: str) -> str:
    release = f"tenant-{tenant}-{cluster.name}"
    return cluster.core.read_namespaced_config_map(release, tenant).data["chartVersion"]


def test_good_metrics_pass_the_waves_and_a_canary_gone_bad_is_halted_and_reverted(
        fleet: Fleet, repo: ChartRepository, exporter: Exporter,
        prometheus: PrometheusServer) -> None:
    good_fleet(fleet, exporter, prometheus)
    op = start(fleet, repo, "0.2.0", *gate_args(prometheus, "--rollout-wave-soak", "3s"))
    h, r = rolled_out(fleet)
    assert passed_on(op, "home", "remote")  # each wave passed on its own clusters
    assert op.metric("krypton_rollout_gate", cluster="home") == 1
    op.stop()

    # 0.3.0: the canary is Ready on it and passes its gate; then its error ratio rises
    op = start(fleet, repo, "0.3.0", *gate_args(prometheus, "--rollout-wave-soak", "60s",
                                                "--rollout-gate-failures", "2",
                                                "--rollout-auto-revert"))
    wait_for(lambda: ((rollout_state(fleet) or {}).get("gates") or {}).get("home", {})
             .get("result") == "passed" and deployed(fleet, fleet.home, h) == "0.3.0", 90,
             what="the canary on 0.3.0 passing its gate")
    exporter.set("home", 0.4)
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Halted" and s, 60,
                     what="rollout halted by its gate")
    assert state["gate_failed"] and state["failed"] == ["home"]
    assert QUERY in state["message"] and "gave empty" in state["message"]
    assert state["gates"]["home"]["failures"] == 2
    halted = fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutHalted")
    assert QUERY in halted.message
    # the canary goes back to 0.2.0; the other cluster never moved
    wait_for(lambda: deployed(fleet, fleet.home, h) == "0.2.0", 60, what="canary reverted")
    fleet.home.wait_condition(fleet.tenant_ns, h, "ClusterReady/home", "True", "RolledBack")
    assert deployed(fleet, fleet.remote, r) == "0.2.0"
    assert fleet.remote.release_records(r, f"tenant-{r}-remote") == [(1, "deployed")]
    assert op.metric("krypton_rollout_gate", cluster="home") == 0
    args = fleet.args(*gate_args(prometheus), version="0.3.0")
    args[args.index(fleet.chart_repo.url)] = repo.url
    status = krypton(fleet, "status", *args)
    assert "gate      home: failed (empty; 2 failed" in status.stdout, status.stdout


def test_a_server_that_does_not_answer_fails_the_wave_after_its_deadline(
        fleet: Fleet, repo: ChartRepository, exporter: Exporter,
        prometheus: PrometheusServer) -> None:
    exporter.set("home", 0.01)
    prometheus.stop()  # down from the start: the query cannot be checked, the gate waits
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    began = time.monotonic()
    op = start(fleet, repo, "0.2.0", *gate_args(prometheus, "--rollout-wave-soak", "2s",
                                                "--rollout-wave-deadline", "12s",
                                                interval="4s"))
    assert "metric gate query not checked" in op.log_text()
    h = fleet.tenant(fleet.home, unique("h"))
    fleet.tenant(fleet.remote, unique("r"))
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Halted" and s, 90,
                     what="rollout halted")
    assert "no answer for" in state["message"] and "(deadline 12s)" in state["message"]
    assert deployed(fleet, fleet.home, h) == "0.2.0"  # the canary installed, then held
    # the canary's wave failed; the next wave never started (a first install is never held)
    assert (state["wave"], state["failed"]) == (0, ["home"]), state
    assert op.metric("krypton_rollout_gate", cluster="home") == -1
    # asked once per --rollout-gate-interval (4 s) while it lasted, not on every rollout
    # step (2 s)
    asked = op.metric("krypton_rollout_gate_evaluations_total", result="unanswered")
    assert 3 <= asked <= (time.monotonic() - began) / 4 + 1, (asked, time.monotonic() - began)


def test_a_query_the_server_cannot_parse_is_refused_at_start(
        fleet: Fleet, repo: ChartRepository, prometheus: PrometheusServer) -> None:
    args = fleet.args(*ROLLOUT, "--rollout-gate-prometheus", prometheus.url,
                      "--rollout-gate-query", "max(up{cluster=\"$cluster\"} <",
                      "--helm-executable", str(fleet.testbin / "helm"), version="0.2.0")
    result = subprocess.run([sys.executable, "-m", "krypton", "run", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "invalid --rollout-gate-query: the server cannot parse it" in result.stderr


GATE_PASSWORD = "pw-gate-5d0e3a91"


def test_a_server_behind_tls_and_basic_auth_with_credentials_from_a_secret(
        fleet: Fleet, repo: ChartRepository, exporter: Exporter, testbin: Path) -> None:
    server = PrometheusServer(testbin, exporter, password=GATE_PASSWORD).start()
    try:
        good_fleet(fleet, exporter, server)
        fleet.home.core.create_namespaced_secret(fleet.discovery_ns, {
            "metadata": {"name": "gate-creds"}, "type": "Opaque",
            "stringData": {"username": server.username, "password": GATE_PASSWORD}})
        op = start(fleet, repo, "0.2.0", *gate_args(
            server, "--rollout-wave-soak", "2s", "--rollout-gate-ca-file", str(server.ca_file),
            "--rollout-gate-credentials-secret", "gate-creds"))
        assert "metric gate query not checked" not in op.log_text()  # asked, and it parsed
        rolled_out(fleet)
        assert passed_on(op, "home", "remote")
        assert op.metric("krypton_rollout_gate_evaluations_total", result="unanswered") == 0
        assert GATE_PASSWORD not in op.log_text()
    finally:
        server.close()


def test_under_sharding_the_gate_is_evaluated_once_for_the_fleet(
        fleet: Fleet, repo: ChartRepository, exporter: Exporter,
        prometheus: PrometheusServer) -> None:
    """Two replicas split the fleet; the rollout controller, and with it the gate, runs on
    the replica holding the leader Lease only."""
    good_fleet(fleet, exporter, prometheus)
    args = fleet.args("--sharding", "--leader-election-id", unique("gate"),
                      "--lease-duration", "6s", "--renew-deadline", "4s", "--retry-period", "1s",
                      *gate_args(prometheus, "--rollout-wave-soak", "2s"), version="0.2.0")
    args[args.index(fleet.chart_repo.url)] = repo.url
    ops = []
    for replica in ("r0", "r1"):
        op = OperatorProcess([*args, "--shard-identity", replica], helm_dir=fleet.testbin)
        fleet.operators.append(op.start())
        ops.append(op)
    for op in ops:
        op.wait_ready()
    rolled_out(fleet)
    evaluated = sorted(op.metric("krypton_rollout_gate_evaluations_total") for op in ops)
    assert evaluated[0] == 0 and evaluated[1] >= 2, evaluated  # one replica, both waves
