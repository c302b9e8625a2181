"""Chart problems (R6, R10, R11): missing and invalid versions, unreachable repository,
ALLOW_CHART_SKIP, charts that fail to install and the recovery after a fix."""

from __future__ import annotations

from pathlib import Path

from krypton.testing import free_port

from .conftest import Fleet, unique


def test_missing_and_invalid_versions_and_unreachable_repo(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start(version="9.9.9")
    name = fleet.tenant(fleet.remote, unique("nf"))
    c = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                    "VersionNotFound")
    assert "9.9.9" in c["message"]
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Pending"
    fleet.remote.wait_event(fleet.tenant_ns, name, "ChartVersionNotFound")
    op.stop()

    op = fleet.start(version="not-a-version")
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "VersionInvalid")
    fleet.remote.wait_event(fleet.tenant_ns, name, "ChartVersionInvalid")
    op.stop()

    dead = f"http://127.0.0.1:{free_port()}"
    args = [a if a != fleet.chart_repo.url else dead for a in fleet.args()]
    from krypton.testing.operator import OperatorProcess

    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "ChartNotLoaded")
    fleet.remote.wait_event(fleet.tenant_ns, name, "ChartNotLoaded")
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Pending"


def test_allow_chart_skip_keeps_an_installed_tenant_ready(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("skip"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()
    fleet.start(version="9.9.9", env={"ALLOW_CHART_SKIP": "true"})
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "VersionNotFound")
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Ready"
    ready = fleet.remote.condition(fleet.tenant_ns, name, "ClusterReady/remote")
    assert ready and ready["status"] == "True"


def test_failed_install_then_fix_clears_the_error(fleet: Fleet, tmp_path: Path) -> None:
    fleet.register("remote", fleet.remote)
    bad = tmp_path / "bad.yaml"
    bad.write_text("failRender: this chart refuses to render\n")
    op = fleet.start("--chart-values-file", str(bad))
    name = fleet.tenant(fleet.remote, unique("fail"))
    c = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                    "InstallFailed")
    assert "refuses to render" in c["message"]
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Error")
    fleet.remote.wait_event(fleet.tenant_ns, name, "HelmInstallFailed")
    op.stop()

    fleet.start()
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    err = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote")
    assert err and err["status"] == "False"


def test_object_rejected_by_the_api_server_is_install_failed(fleet: Fleet, tmp_path: Path) -> None:
    fleet.register("remote", fleet.remote)
    bad = tmp_path / "bad.yaml"
    bad.write_text("invalidObject: true\n")
    fleet.start("--chart-values-file", str(bad))
    name = fleet.tenant(fleet.remote, unique("rej"))
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "InstallFailed")
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Error")
