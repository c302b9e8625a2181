"""F8 CEL health: the admin's rule for a chart's custom resource decides its release's
readiness, on the real test bed (the Widget of tests/charts/withcrds, its status written
here as its controller would)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from krypton.testing import ChartRepository
from krypton.testing.operator import OperatorProcess
from tests.conftest import CHARTS

from .conftest import Fleet, unique

GROUP, CRD = "crds.krypton.test", "widgets.crds.krypton.test"
RULES = """\
- apiVersion: crds.krypton.test/v1
  kind: Widget
  failed: status.?phase.orValue('') == 'Failed'
  current: status.?phase.orValue('') == 'Ready'
"""


@pytest.fixture
def repo(helm_bin: str) -> Any:
    r = ChartRepository(helm_bin)
    r.publish(CHARTS / "withcrds", "1.0.0")
    r.start()
    yield r
    r.close()


def _args(fleet: Fleet, repo: ChartRepository, rules: Path) -> list[str]:
    args = fleet.args("--chart-crds", "create-replace", "--health-check-expr", str(rules),
                      "--helm-executable", str(fleet.testbin / "helm"),
                      chart="withcrds", version="1.0.0")
    args[args.index(fleet.chart_repo.url)] = repo.url
    args[args.index("600s")] = "3s"  # --resync-period: a Ready release is looked at that often
    return args


def test_a_custom_resource_is_ready_or_degraded_as_its_cel_rule_says(
        fleet: Fleet, repo: ChartRepository, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    fleet.register("remote", fleet.remote)
    op = OperatorProcess(_args(fleet, repo, rules), helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    widgets = client.CustomObjectsApi(fleet.remote.api)
    try:
        op.wait_ready()
        ns, name = fleet.tenant_ns, fleet.tenant(fleet.remote, unique("cel"))
        release = f"tenant-{name}-remote"

        def set_phase(phase: str) -> None:
            widgets.patch_namespaced_custom_object(GROUP, "v1", name, "widgets", release,
                                                   {"status": {"phase": phase}})

        # installed; the Widget says nothing yet: not current, the release waits for it
        waiting = fleet.remote.wait_condition(ns, name, "ClusterReady/remote", "False",
                                              "WaitingForReadiness")
        assert f"Widget {release} in namespace {name}: not current yet" in waiting["message"]
        set_phase("Ready")
        fleet.remote.wait_phase(ns, name, "Ready")
        # its rule says failed: the release is Degraded at its next look, and says by which
        # expression
        set_phase("Failed")
        degraded = fleet.remote.wait_condition(ns, name, "ClusterReady/remote", "False",
                                               "Degraded")
        assert "failed (status.?phase.orValue('') == 'Failed')" in degraded["message"]
        set_phase("Ready")
        fleet.remote.wait_phase(ns, name, "Ready")
        assert op.metric("krypton_helm_processes_total", operation="install") == 1
        assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0
    finally:
        op.stop()
        try:
            client.ApiextensionsV1Api(fleet.remote.api).delete_custom_resource_definition(CRD)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def test_a_rule_that_does_not_compile_stops_the_start_with_exit_2(
        fleet: Fleet, repo: ChartRepository, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("== 'Ready'", "== 'Ready' &&"))
    run = subprocess.run([sys.executable, "-m", "krypton", "run", *_args(fleet, repo, rules)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert f"invalid --health-check-expr {rules}: rule 1 (crds.krypton.test/v1 Widget): " \
           "current does not compile" in run.stderr
