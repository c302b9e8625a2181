"""Tenant-level rules: targeting (R4), namespace validity and ownership (R5), pause (R15),
and a release left pending by a crash (R9)."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest

from krypton.testing.operator import wait_for

from ..conftest import CHARTS
from .conftest import Fleet, unique

pytestmark = pytest.mark.helm3lane  # also run on Helm 3 (make test-helm3)


def test_invalid_tenant_name(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, "bad.name-" + unique("x"))
    c = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                    "InvalidTenantName")
    assert "not a valid namespace name" in c["message"]
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Error"


def test_namespace_owned_by_another_tenant(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    first = fleet.tenant(fleet.remote, unique("own"))
    fleet.remote.wait_phase(fleet.tenant_ns, first, "Ready")
    # A second Tenant of the same name in another namespace maps to the same namespace.
    other_ns = unique("other")
    fleet.remote.ensure_namespace(other_ns)
    op.stop()
    op = fleet.start("--watch-namespace", other_ns)
    fleet.remote.create_tenant(other_ns, first)
    c = fleet.remote.wait_condition(other_ns, first, "ClusterError/remote", "True",
                                    "NamespaceConflict")
    assert f"{fleet.tenant_ns}/{first}" in c["message"]
    owner = fleet.remote.core.read_namespace(first).metadata.annotations["mesh.openkcm.io/owner"]
    assert owner == f"{fleet.tenant_ns}/{first}"
    assert fleet.remote.phase(fleet.tenant_ns, first) == "Ready"
    release = f"tenant-{first}-remote"
    assert fleet.remote.release_records(first, release) == [(1, "deployed")]


def test_a_namespace_found_by_the_create_is_refused_and_the_resyncs_stay_quiet(
        fleet: Fleet) -> None:
    """A first install creates its namespace without reading it first; one that
    exists and is not the Tenant's is found by the create and refused (R16), permanently.
    The resyncs that follow read the namespace once each, as before the change: no create,
    no write, no helm run."""
    fleet.register("remote", fleet.remote)
    op = fleet.start("--resync-period", "2s")
    name = fleet.refused_tenant(fleet.remote, "taken")

    def count(metric: str, **labels: str) -> float:
        return op.metric(metric, cluster="remote", **labels)

    # the refusal's pass ends after its last Event (seen above): the baseline is taken
    # once the pass is counted, so its own writes are not counted against the resyncs
    wait_for(lambda: count("krypton_reconciles_total") >= 1, 30, what="the refusal's pass")
    creates, writes = count("krypton_api_requests_total", verb="create"), \
        count("krypton_api_writes_total")
    gets, passes = count("krypton_api_requests_total", verb="get"), \
        count("krypton_reconciles_total")
    wait_for(lambda: count("krypton_reconciles_total") >= passes + 3, 30,
             what="three resyncs of the refused Tenant")
    assert count("krypton_api_requests_total", verb="create") == creates
    assert count("krypton_api_writes_total") == writes
    assert count("krypton_api_requests_total", verb="get") > gets  # it does look, each time
    assert op.metric("krypton_helm_processes_total", operation="install") == 0
    assert fleet.remote.release_records(name, f"tenant-{name}-remote") == []


def test_cluster_ref_to_another_cluster_is_skipped(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.register("elsewhere", fleet.home)  # another cluster of the fleet
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("ref"), spec={"clusterRef": {"secretName": "elsewhere"}})
    c = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterProgress/remote", "False",
                                    "NotTargeted")
    assert "elsewhere" in c["message"]
    assert fleet.remote.release_records(name, f"tenant-{name}-remote") == []
    assert op.metric("krypton_helm_processes_total", operation="install") == 0
    fleet.remote.wait_event(fleet.tenant_ns, name, "NotTargeted")
    assert all(e.type == "Normal" for e in fleet.remote.events(fleet.tenant_ns, name)
               if e.reason == "NotTargeted")
    skipped = [e for e in fleet.remote.events(fleet.tenant_ns, name) if e.reason == "NotTargeted"]
    assert len(skipped) == 1 and skipped[0].count == 1


def test_pause_and_resume(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("p"), annotations={"mesh.openkcm.io/paused": "true"})
    fleet.remote.wait_condition(fleet.tenant_ns, name, "Paused", "True")
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote") >= 1, 30,
             what="the pass that set Paused")
    assert op.metric("krypton_helm_processes_total") == 0
    # Phase Suspended, and the Ready condition says why (Flux's word for it)
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Suspended"
    ready = fleet.remote.condition(fleet.tenant_ns, name, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "Suspended")
    fleet.remote.patch_tenant(fleet.tenant_ns, name,
                              {"metadata": {"annotations": {"mesh.openkcm.io/paused": None}}})
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert fleet.remote.condition(fleet.tenant_ns, name, "Paused")["status"] == "False"  # type: ignore[index]
    # pausing a Ready Tenant: Suspended, Ready stays True, and `kubectl get` says so
    fleet.remote.patch_tenant(fleet.tenant_ns, name,
                              {"metadata": {"annotations": {"mesh.openkcm.io/paused": "true"}}})
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Suspended")
    ready = fleet.remote.condition(fleet.tenant_ns, name, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Suspended")
    table = _kubectl_get_tenants(fleet)
    assert table[0] == ["NAME", "PHASE", "CHART", "MESSAGE", "AGE"]
    row = next(r for r in table if r[0] == name)
    assert row[1:3] == ["Suspended", "0.2.0"]
    assert row[3] == ready["message"] and row[3].endswith("ready on remote")
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0


def _kubectl_get_tenants(fleet: Fleet) -> list[list[str]]:
    """`kubectl get tenants` as rows of cells (columns are two or more spaces apart)."""
    out = subprocess.run([str(fleet.testbin / "kubectl"), "--kubeconfig",
                          str(fleet.remote.cp.kubeconfig), "get", "tenants", "-n",
                          fleet.tenant_ns], check=True, capture_output=True, text=True).stdout
    return [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]


def test_release_left_pending_install_is_recovered(fleet: Fleet, helm_bin: str,
                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    name = unique("pend")
    release = f"tenant-{name}-remote"
    # the namespace krypton created for the Tenant before the crash
    fleet.remote.core.create_namespace({"metadata": {"name": name, "annotations": {
        "mesh.openkcm.io/owner": f"{fleet.tenant_ns}/{name}"}}})
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(fleet.remote.cp.kubeconfig.read_text())
    # helm --wait on a Deployment that can never become ready (no nodes), killed mid-run:
    # the release record stays pending-install, as after a crash.
    proc = subprocess.Popen([helm_bin, "--kubeconfig", str(kubeconfig), "install", release,
                             str(CHARTS / "hang"), "-n", name, "--wait", "--timeout", "5m"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: fleet.remote.release_records(name, release) == [(1, "pending-install")],
                 60, what="pending-install record")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    fleet.register("remote", fleet.remote)
    # a pending record is left alone for --helm-timeout + 10 s (another helm may still run)
    fleet.start("--helm-timeout", "5s")
    fleet.tenant(fleet.remote, name)
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
    records = fleet.remote.release_records(name, release)
    assert records and records[-1][1] == "deployed"
    assert all(status != "pending-install" for _, status in records)
    assert fleet.remote.core.read_namespaced_config_map(release, name).data["chartVersion"] == \
        "0.2.0"


def test_range_resolves_to_newest_match(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.start(version="~0.2 || ^0.1")
    name = fleet.tenant(fleet.remote, unique("rng"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    status = fleet.remote.tenant(fleet.tenant_ns, name)["status"]
    assert status["clusters"]["remote"]["chartVersion"] == "0.2.0"
    assert status["lastAppliedChart"].endswith("|sample|0.2.0")


def test_a_quick_install_costs_one_pass_one_helm_run_one_status_write_and_no_start_event(
        fleet: Fleet) -> None:
    """The pass that decides an install runs helm; a run over within 2 s is not
    announced, so each release costs one pass, one helm process and one status write (its
    outcome), and the Tenant's Events say HelmInstalled without HelmInstallStart; no
    namespace is read first. The watch events of the pass's own writes (finalizer,
    fingerprint, status) and of its helm run's release records start no second pass."""
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 60,
             what="remote engaged")
    gets = op.metric("krypton_api_requests_total", cluster="remote", verb="get")
    names = [fleet.tenant(fleet.remote, unique("quick")) for _ in range(3)]
    for name in names:
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    # Marks: the Tenant watch brings events in the order of their resourceVersions, so a
    # paused Tenant created now has its pass after the installs' echoes have arrived; a
    # second one, created after the first's pass, comes after the first's echo as well.
    marks = []
    for _ in range(2):
        marks.append(fleet.tenant(fleet.remote, unique("mark"),
                                  annotations={"mesh.openkcm.io/paused": "true"}))
        fleet.remote.wait_condition(fleet.tenant_ns, marks[-1], "Paused", "True")
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote")
             >= len(names) + len(marks), 60, what="the marks' passes")
    # one pass per Tenant: no echo of the operator's own writes started another
    assert op.metric("krypton_reconciles_total", cluster="remote") == len(names) + len(marks)
    for name in names:
        fleet.remote.wait_event(fleet.tenant_ns, name, "HelmInstalled")
    # one helm install each (other helm processes pull and render the chart, not per run)
    assert op.metric("krypton_helm_processes_total", operation="install") == len(names)
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0
    assert op.metric("krypton_api_writes_total", cluster="remote", kind="status") == \
        len(names) + len(marks)
    # and no namespace read: an install creates its namespace, the create says if it exists
    assert op.metric("krypton_api_requests_total", cluster="remote", verb="get") == gets
    reasons = {e.reason for name in names for e in fleet.remote.events(fleet.tenant_ns, name)}
    assert "HelmInstallStart" not in reasons
