"""F2 drift repair and F3 per-cluster values, on the real test bed."""

from __future__ import annotations

import subprocess

import pytest

from krypton.testing.operator import wait_for

from .conftest import Fleet, unique

pytestmark = pytest.mark.helm3lane  # also run on Helm 3 (make test-helm3)


def _drift_events(cluster, ns: str, name: str) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [e for e in cluster.events(ns, name) if e.reason == "DriftRepaired"]


def test_drift_is_repaired(fleet: Fleet, helm_bin: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Drift by hand, with helm. The hand's helm here acts as the same user as krypton: on
    a guarded cluster its records are krypton's (S4), so the cluster is left unguarded and
    the seals judge them."""
    fleet.register("remote", fleet.remote)
    fleet.remote.remove_guard("krypton-release-records")
    fleet.start("--record-guard=off")
    name = fleet.tenant(fleet.remote, unique("drift"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(fleet.remote.cp.kubeconfig.read_text())
    helm = [helm_bin, "--kubeconfig", str(kubeconfig), "-n", name]

    # helm uninstall by hand -> reinstalled
    subprocess.run([*helm, "uninstall", release], check=True, capture_output=True)
    wait_for(lambda: fleet.remote.release_records(name, release) == [(1, "deployed")], 60,
             what="reinstalled")
    wait_for(lambda: _drift_events(fleet.remote, fleet.tenant_ns, name), 30, what="event")

    # helm upgrade by hand with values of its own: a record krypton did not write, which it
    # never upgrades from (SPEC S3: whoever may write Secrets in the namespace could have
    # written it; nor is it what krypton's chart renders, SPEC S6)
    op = fleet.operators[-1]
    runs = op.metric("krypton_helm_processes_total", operation="upgrade")
    subprocess.run([*helm, "upgrade", release, str(fleet.chart_repo.directory / "sample-0.3.0.tgz"),
                    "--set", "data.by=hand"], check=True, capture_output=True)
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "ReleaseRecordUntrusted", timeout=60)
    assert fleet.remote.condition(fleet.tenant_ns, name, "ClusterReady/remote")["status"] == \
        "False"
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == runs
    # helm rollback by hand to what krypton made (sealed) -> upgraded again
    subprocess.run([*helm, "rollback", release, "1"], check=True, capture_output=True)
    wait_for(lambda: fleet.remote.release_records(name, release)[-1] == (4, "deployed"), 60,
             what="rollback by hand repaired")
    assert fleet.remote.core.read_namespaced_config_map(release, name).data["chartVersion"] == \
        "0.2.0"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")

    # fingerprint annotation removed -> written again; the release is as recorded, so no helm run
    fleet.remote.patch_tenant(fleet.tenant_ns, name, {"metadata": {"annotations": {
        "mesh.openkcm.io/fingerprint-remote": None}}})
    wait_for(lambda: fleet.remote.tenant(fleet.tenant_ns, name)["metadata"]["annotations"].get(
        "mesh.openkcm.io/fingerprint-remote"), 60, what="annotation restored")
    wait_for(lambda: len(_drift_events(fleet.remote, fleet.tenant_ns, name)) >= 3, 30,
             what="DriftRepaired for the annotation")
    assert fleet.remote.release_records(name, release)[-1] == (4, "deployed")


def test_a_deleted_object_of_a_release_is_restored(fleet: Fleet) -> None:
    """Drift detection reads the deployed revision's manifest from its
    release record (no helm process) once per --resync-period and upgrades a release one of
    whose objects is gone; with --drift-detection=off only release records count."""
    fleet.register("remote", fleet.remote)
    op = fleet.start("--resync-period", "2s")
    name = fleet.tenant(fleet.remote, unique("gone"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    fleet.remote.core.delete_namespaced_config_map(release, name)  # the chart's one object
    wait_for(lambda: fleet.remote.release_records(name, release)[-1] == (2, "deployed"), 60,
             what="upgraded to restore the object")
    assert fleet.remote.core.read_namespaced_config_map(release, name).data["chartVersion"] == \
        "0.2.0"
    repaired = wait_for(lambda: _drift_events(fleet.remote, fleet.tenant_ns, name), 30,
                        what="DriftRepaired")
    assert f"ConfigMap {release}" in repaired[0].message and "gone" in repaired[0].message
    op.stop()

    op = fleet.start("--resync-period", "2s", "--drift-detection", "off")
    wait_for(lambda: op.metric("krypton_reconciles_total") >= 1, 30, what="a pass")
    fleet.remote.core.delete_namespaced_config_map(release, name)
    passes = op.metric("krypton_reconciles_total")
    wait_for(lambda: op.metric("krypton_reconciles_total") >= passes + 6, 30,
             what="resync passes after the deletion (three times the check's period)")
    assert fleet.remote.release_records(name, release)[-1] == (2, "deployed")


def test_per_cluster_values(fleet: Fleet) -> None:
    fleet.register("home", fleet.home, values="data:\n  region: eu\n")
    fleet.register("remote", fleet.remote, values="data:\n  region: us\n")
    fleet.start()
    h = fleet.tenant(fleet.home, unique("pv"))
    r = fleet.tenant(fleet.remote, unique("pv"))
    fleet.home.wait_phase(fleet.tenant_ns, h, "Ready")
    fleet.remote.wait_phase(fleet.tenant_ns, r, "Ready")
    cm = lambda c, n: c.core.read_namespaced_config_map(f"tenant-{n}-{c.name}", n).data  # noqa: E731
    assert cm(fleet.home, h)["region"] == "eu" and cm(fleet.remote, r)["region"] == "us"
    fp_home = fleet.home.tenant(fleet.tenant_ns, h)["status"]["clusters"]["home"]["fingerprint"]

    secret = fleet.home.core.read_namespaced_secret("remote", fleet.discovery_ns)
    import base64

    secret.data["values.yaml"] = base64.b64encode(b"data:\n  region: ap\n").decode()
    fleet.home.core.replace_namespaced_secret("remote", fleet.discovery_ns, secret)
    wait_for(lambda: cm(fleet.remote, r)["region"] == "ap", 60, what="remote upgraded")
    wait_for(lambda: fleet.remote.release_records(r, f"tenant-{r}-remote")[-1] == (2, "deployed"),
             30, what="remote revision 2 deployed")
    assert fleet.home.release_records(h, f"tenant-{h}-home") == [(1, "deployed")]
    assert fleet.home.tenant(fleet.tenant_ns, h)["status"]["clusters"]["home"]["fingerprint"] \
        == fp_home
