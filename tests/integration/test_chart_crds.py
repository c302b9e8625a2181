"""A chart's crds/ directory is applied by krypton once per cluster and chart
version, before the tenant releases (helm runs with --skip-crds), is replaced on a chart bump
under --chart-crds=create-replace, and is never deleted by a Tenant's uninstall."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from krypton.testing import ChartRepository
from krypton.testing.operator import OperatorProcess, wait_for
from tests.conftest import CHARTS

from .conftest import Fleet, unique

CRD = "widgets.crds.krypton.test"


@pytest.fixture
def repo(helm_bin: str, tmp_path: Path) -> Any:
    r = ChartRepository(helm_bin)
    r.publish(CHARTS / "withcrds", "1.0.0")
    bumped = tmp_path / "withcrds"
    shutil.copytree(CHARTS / "withcrds", bumped)
    crd = bumped / "crds" / "widgets.yaml"
    crd.write_text(crd.read_text().replace("schema revision 1", "schema revision 2"))
    r.publish(bumped, "1.1.0")
    r.start()
    yield r
    r.close()


def _start(fleet: Fleet, repo: ChartRepository, version: str) -> OperatorProcess:
    args = fleet.args("--chart-crds", "create-replace", chart="withcrds", version=version)
    args[args.index(fleet.chart_repo.url)] = repo.url
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    return op


def _crd(fleet: Fleet) -> Any:
    try:
        return client.ApiextensionsV1Api(fleet.remote.api).read_custom_resource_definition(CRD)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_chart_crds_are_applied_once_replaced_on_a_bump_and_kept(fleet: Fleet,
                                                                  repo: ChartRepository) -> None:
    fleet.register("remote", fleet.remote)
    assert _crd(fleet) is None
    try:
        _scenario(fleet, repo)
    finally:
        for op in fleet.operators:
            op.stop()
        if _crd(fleet) is not None:
            client.ApiextensionsV1Api(fleet.remote.api).delete_custom_resource_definition(CRD)


def _scenario(fleet: Fleet, repo: ChartRepository) -> None:
    op = _start(fleet, repo, "1.0.0")
    a, b = fleet.tenant(fleet.remote, unique("a")), fleet.tenant(fleet.remote, unique("b"))
    for name in (a, b):
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    crd = _crd(fleet)
    assert crd.spec.versions[0].schema.open_apiv3_schema.description == "Widget, schema revision 1"
    # no release owns it: it is nobody's to delete
    assert "meta.helm.sh/release-name" not in (crd.metadata.annotations or {})
    # each release's custom resource of that kind was installable
    widgets = client.CustomObjectsApi(fleet.remote.api)
    for name in (a, b):
        widgets.get_namespaced_custom_object("crds.krypton.test", "v1", name, "widgets",
                                             f"tenant-{name}-remote")
    assert op.metric("krypton_api_writes_total", cluster="remote", kind="crd") == 1

    # Deleting a Tenant uninstalls its release and leaves the CRD (and b's Widget) alone.
    fleet.remote.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1",
                                                        fleet.tenant_ns, "tenants", a)
    wait_for(lambda: fleet.remote.release_records(a, f"tenant-{a}-remote") == [], 60,
             what="a's release uninstalled")
    assert _crd(fleet) is not None
    widgets.get_namespaced_custom_object("crds.krypton.test", "v1", b, "widgets",
                                         f"tenant-{b}-remote")
    op.stop()

    # A chart bump whose CRD changed: replaced before b's release is upgraded.
    op = _start(fleet, repo, "1.1.0")
    wait_for(lambda: fleet.remote.core.read_namespaced_config_map(
        f"tenant-{b}-remote", b).data["chartVersion"] == "1.1.0", 60, what="b upgraded")
    crd = _crd(fleet)
    assert crd.spec.versions[0].schema.open_apiv3_schema.description == "Widget, schema revision 2"
    assert op.metric("krypton_api_writes_total", cluster="remote", kind="crd") == 1
