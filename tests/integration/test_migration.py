"""Taking over a fleet from the original operator.

The prototype's state is built with helm and kubectl only: its CRD (spec.workspace, a status
of phase and conditions only, no revision), releases ``tenant-<t>-<c>`` installed by helm, the
``fingerprint-<cluster>`` annotation ``sha256(repo|name|version)`` with the repository URL as
its flag was typed (here with a trailing slash), and its conditions. krypton is then started
with the same chart settings and cluster name.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import gzip
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from krypton.decisions.charts.fingerprint import sha256_hex
from krypton.decisions.crd import REVISION_ANNOTATION, crd_manifest
from krypton.decisions.model import FINALIZER
from krypton.testing import ControlPlane
from krypton.testing.operator import wait_for
from tests.integration.conftest import Cluster, Fleet, unique
from tests.integration.test_cli import krypton, run_flags

PROTOTYPE_CRD = Path(__file__).parents[1] / "prototype" / "tenants-crd.yaml"


@pytest.fixture
def proto(testbin: Path) -> Iterator[Cluster]:
    cp = ControlPlane("proto", testbin).start()
    try:
        yield Cluster("proto", cp)
    finally:
        cp.stop()


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _prototype_tenant(fleet: Fleet, proto: Cluster, name: str, version: str, repo: str, *,
                      workspace: str | None = None, helm_args: tuple[str, ...] = ()) -> None:
    """What the original operator left for one Tenant: its namespace, its release, the
    fingerprint annotation and its conditions."""
    kubeconfig = str(proto.cp.kubeconfig)
    if workspace is None:
        _run(str(fleet.testbin / "kubectl"), "--kubeconfig", kubeconfig, "create",
             "namespace", name)
        _run(str(fleet.testbin / "helm"), "--kubeconfig", kubeconfig, "install",
             f"tenant-{name}-proto", "sample", "--repo", repo, "--version", version,
             "--namespace", name, *helm_args)
    proto.create_tenant(fleet.tenant_ns, name, spec={"workspace": workspace or name},
                        annotations={"mesh.openkcm.io/fingerprint-proto":
                                     sha256_hex(f"{repo}|sample|{version}")})
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    proto.custom.patch_namespaced_custom_object_status(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name,
        {"status": {"phase": "Ready", "lastAppliedChart": f"{repo}|sample|{version}",
                    "conditions": [{"type": "ClusterReady/proto", "status": "True",
                                    "reason": "Installed", "message": "release installed",
                                    "lastTransitionTime": now}]}})


def _writes(op: Any) -> float:
    return op.metric("krypton_api_writes_total", cluster="proto")


def test_takeover_from_the_prototype(fleet: Fleet, proto: Cluster) -> None:
    repo = fleet.chart_repo.url + "/"  # typed with a trailing slash, hashed as typed
    _run(str(fleet.testbin / "kubectl"), "--kubeconfig", str(proto.cp.kubeconfig), "apply",
         "-f", str(PROTOTYPE_CRD))
    _run(str(fleet.testbin / "kubectl"), "--kubeconfig", str(proto.cp.kubeconfig), "wait",
         "--for=condition=Established", "crd/tenants.mesh.openkcm.io", "--timeout=60s")
    proto.ensure_namespace(fleet.tenant_ns)
    current = [unique("kept") for _ in range(3)]
    for name in current:
        _prototype_tenant(fleet, proto, name, "0.2.0", repo)
    # an older release with a value the prototype set on every release
    older = unique("older")
    _prototype_tenant(fleet, proto, older, "0.1.0", repo,
                      helm_args=("--set", "data.installCRDs=true"))
    # a Tenant whose workspace is not its name: the prototype installed it elsewhere
    moved = unique("moved")
    _prototype_tenant(fleet, proto, moved, "0.2.0", repo, workspace="elsewhere")

    fleet.register("proto", proto)
    # the prototype created the namespaces: taking them over needs --adopt-namespaces (they
    # are marked adopted and never deleted by krypton)
    op = fleet.start("--chart-repo", repo, "--resync-period", "2s", "--adopt-namespaces")

    fp = sha256_hex(f"{repo}|sample|0.2.0")

    def taken_over(name: str) -> bool:
        meta = proto.tenant(fleet.tenant_ns, name)["metadata"]
        return FINALIZER in (meta.get("finalizers") or []) and \
            meta["annotations"].get("mesh.openkcm.io/fingerprint-proto") == fp

    for name in current:
        wait_for(lambda n=name: taken_over(n), 90, what=f"{name} taken over")
        proto.wait_phase(fleet.tenant_ns, name, "Ready")
    # The prototype's current releases are taken over as they are, without a helm run. The
    # older one needs an upgrade, which would start from the prototype's record: krypton
    # keeps no seal of it, and adopts nothing by itself (S4).
    refused = proto.wait_condition(fleet.tenant_ns, older, "ClusterError/proto", "True",
                                   "ReleaseRecordUntrusted")
    assert "nothing is adopted by itself" in refused["message"] and \
        "krypton adopt-records" in refused["message"], refused["message"]
    assert op.metric("krypton_helm_processes_total", operation="install") == 0
    assert (op.metric("krypton_helm_processes_total", operation="upgrade") or 0) == 0
    for name in current:
        assert proto.release_records(name, f"tenant-{name}-proto") == [(1, "deployed")]

    # spec.workspace that is not the name: refused, never installed a second time
    error = proto.wait_condition(fleet.tenant_ns, moved, "ClusterError/proto", "True")
    assert error["reason"] == "WorkspaceMismatch", error
    assert proto.release_records(moved, f"tenant-{moved}-proto") == []

    # The prototype's CRD lacks status.clusters: reported, with the fix ...
    event = fleet.home.wait_event(fleet.discovery_ns, "proto", "CRDOutdated")
    assert "status.clusters" in event.message and "crds/mesh.openkcm.io_tenants.yaml" in \
        event.message
    assert op.metric("krypton_cluster_crd_outdated", cluster="proto") == 1
    assert "cluster proto: engaged, CRDOutdated" in op.readyz()
    status = krypton(fleet, "status", *run_flags(fleet))
    assert status.returncode == 0, status.stderr
    line = next(row for row in status.stdout.splitlines() if "CRDOutdated" in row)
    assert line.startswith("proto") and "status.clusters" in line, status.stdout
    # ... and costs no write per pass: three resyncs of every Tenant, no API write.
    tenants = len(current) + 2

    def resynced(rounds: int) -> None:
        passes = op.metric("krypton_reconciles_total", cluster="proto")
        wait_for(lambda: op.metric("krypton_reconciles_total", cluster="proto") >=
                 passes + rounds * tenants, 60, what=f"{rounds} resyncs")

    resynced(1)  # the takeover's own writes are behind us
    settle = _writes(op)
    resynced(3)
    assert _writes(op) == settle, f"{_writes(op) - settle} API writes in three no-op resyncs"
    assert (op.metric("krypton_helm_processes_total", operation="upgrade") or 0) == 0

    # The administrator applies krypton's CRD (the older one drops the seals) and adopts
    # the older release's records, an explicit act: it is upgraded, with exactly the
    # fingerprinted (empty) values, and the adoption is said on the Tenant.
    _run(str(fleet.testbin / "kubectl"), "--kubeconfig", str(proto.cp.kubeconfig), "apply",
         "-f", str(Path(__file__).parents[2] / "crds"))

    # The Tenants kept may be as the old schema decoded them (without the seals): once the
    # CRD is seen current, they are listed again.
    current_crd = fleet.home.wait_event(fleet.discovery_ns, "proto", "CRDCurrent")
    assert "listed again" in current_crd.message
    adopt = krypton(fleet, "adopt-records", f"{fleet.tenant_ns}/{older}", "--cluster",
                    "proto", *run_flags(fleet))
    assert adopt.returncode == 0, adopt.stderr
    assert "adoption of revisions 1 of release" in adopt.stdout, adopt.stdout
    wait_for(lambda: taken_over(older), 90, what=f"{older} upgraded")
    proto.wait_phase(fleet.tenant_ns, older, "Ready")
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 1
    data = proto.core.read_namespaced_config_map(f"tenant-{older}-proto", older).data
    assert data == {"chartVersion": "0.2.0"}, data  # installCRDs was not carried over
    adopted = proto.wait_event(fleet.tenant_ns, older, "ReleaseRecordAdopted")
    assert "by an administrator" in adopted.message
    # the operator's commit keeps the adopted seal and the upgrade's in the status
    status = proto.tenant(fleet.tenant_ns, older).get("status") or {}
    assert len(status["clusters"]["proto"]["seals"]) == 2, status
    assert op.metric("krypton_cluster_crd_outdated", cluster="proto") == 0
    assert "CRDOutdated" not in op.readyz()


def _apply_crd(fleet: Fleet, proto: Cluster, crd: dict[str, Any]) -> None:
    kubectl = (str(fleet.testbin / "kubectl"), "--kubeconfig", str(proto.cp.kubeconfig))
    subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump(crd), check=True,
                   capture_output=True, text=True)
    _run(*kubectl, "wait", "--for=condition=Established", "crd/tenants.mesh.openkcm.io",
         "--timeout=60s")


def _bumped(fleet: Fleet, proto: Cluster, name: str) -> Any:
    """krypton started again with chart 0.3.0, unguarded: Tenant `name`'s release upgraded
    from its one record (the seals alone judge it). Returns the operator."""
    op = fleet.start("--record-guard=off", version="0.3.0")
    release = f"tenant-{name}-proto"
    wait_for(lambda: proto.release_records(name, release) == [(1, "superseded"),
                                                               (2, "deployed")] or
             proto.phase(fleet.tenant_ns, name) == "Error", 120, what="the bump upgraded")
    assert proto.release_records(name, release) == [(1, "superseded"), (2, "deployed")]
    return op


def test_krypton_upgrades_its_own_older_crd_so_its_seals_stick(fleet: Fleet,
                                                               proto: Cluster) -> None:
    """SPEC S6: the CRD of krypton 7803cdc (revision 7, without status.clusters.<c>.records)
    on the cluster, as the default --crd-policy used to keep it. krypton replaces its own
    older revision when it engages, so the seal of a new Tenant's install sticks and the
    chart bump upgrades from it, with nothing done by hand, on a cluster without the guard
    (where only the seals judge). Before, the seal was dropped and the bump refused."""
    older = copy.deepcopy(crd_manifest())
    older["metadata"]["annotations"][REVISION_ANNOTATION] = "7"
    clusters = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"]["properties"]["clusters"]["additionalProperties"]["properties"]
    del clusters["seals"], clusters["records"], clusters["newerVersion"]
    _apply_crd(fleet, proto, older)
    proto.ensure_namespace(fleet.tenant_ns)
    fleet.register("proto", proto)
    op = fleet.start("--record-guard=off")
    name = fleet.tenant(proto, unique("sealed"))
    proto.wait_phase(fleet.tenant_ns, name, "Ready")
    assert _served_revision(proto) == crd_manifest()["metadata"]["annotations"][
        REVISION_ANNOTATION]
    wait_for(lambda: proto.tenant(fleet.tenant_ns, name)["status"]["clusters"]["proto"].get(
        "seals"), 30, what="the install's seal kept in the status")
    op.stop()
    op = _bumped(fleet, proto, name)
    proto.wait_phase(fleet.tenant_ns, name, "Ready")
    assert not [e for e in fleet.home.events(fleet.discovery_ns, "proto")
                if e.reason == "CRDOutdated"]


def test_seals_under_their_old_name_are_read_and_moved_to_their_own(fleet: Fleet,
                                                                    proto: Cluster) -> None:
    """SPEC S6: revision 8 of the CRD keeps the seals under `records`. Run with
    --crd-policy=skip (the served CRD not known), krypton writes them under both names and
    revision 8 keeps the old one; upgraded to revision 9 with nothing done by hand, krypton
    reads them there, the chart bump upgrades from that seal on a cluster without the guard
    (where only the seals judge), and its write moves them to `seals`."""
    eight = copy.deepcopy(crd_manifest())
    eight["metadata"]["annotations"][REVISION_ANNOTATION] = "8"
    clusters = eight["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "status"]["properties"]["clusters"]["additionalProperties"]["properties"]
    del clusters["seals"]
    _apply_crd(fleet, proto, eight)
    proto.ensure_namespace(fleet.tenant_ns)
    fleet.register("proto", proto)
    op = fleet.start("--record-guard=off", "--crd-policy=skip")
    name = fleet.tenant(proto, unique("renamed"))
    proto.wait_phase(fleet.tenant_ns, name, "Ready")

    def entry() -> dict[str, Any]:
        return proto.tenant(fleet.tenant_ns, name)["status"]["clusters"]["proto"]
    wait_for(lambda: entry().get("records"), 30, what="the install's seal under `records`")
    assert "seals" not in entry()  # pruned by revision 8
    op.stop()
    op = _bumped(fleet, proto, name)
    assert _served_revision(proto) == "9"
    wait_for(lambda: len(entry().get("seals") or []) == 2 and "records" not in entry(), 30,
             what="both seals under `seals`, `records` gone")
    # trusted by its seal, not adopted by its content (what a release without one needs)
    assert op.metric("krypton_records_adopted_total", cluster="proto") == 0
    proto.wait_phase(fleet.tenant_ns, name, "Ready")


# krypton 7803cdc: it sealed no record, and its Tenant CRD (revision 7) keeps no seal
OLDER_KRYPTON = "7803cdcaa233493e46c646ac65d652364b80834e"


@pytest.fixture(scope="module")
def older_krypton(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package of krypton at OLDER_KRYPTON, from the repository's history."""
    dest = tmp_path_factory.mktemp(f"krypton-{OLDER_KRYPTON[:7]}")
    git = ["git", "-C", str(Path(__file__).parents[2])]
    if subprocess.run([*git, "cat-file", "-e", f"{OLDER_KRYPTON}^{{commit}}"],
                      capture_output=True).returncode != 0:  # a shallow clone: its history
        subprocess.run([*git, "fetch", "--quiet", "--unshallow"], check=True)
    archive = subprocess.run([*git, "archive", OLDER_KRYPTON, "krypton"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _forged(proto: Cluster, name: str, release: str, namespace: str, victim: str) -> None:
    """Revision 1 of `release` rewritten, as an admin of its namespace could, to list
    another namespace's ConfigMap as well."""
    key = f"sh.helm.release.v1.{release}.v1"
    record = proto.core.read_namespaced_secret(key, name)
    body = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(record.data["release"]))))
    body["manifest"] += "\n---\n" + yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": victim, "namespace": namespace}})
    packed = base64.b64encode(base64.b64encode(gzip.compress(json.dumps(body).encode())))
    proto.core.patch_namespaced_secret(key, name, {"data": {"release": packed.decode()}})


@pytest.mark.parametrize("guard", ["install", "off"])
def test_an_older_kryptons_fleet_moves_on_with_nothing_done_by_hand(
        fleet: Fleet, proto: Cluster, older_krypton: Path, guard: str) -> None:
    """SPEC S6. krypton 7803cdc installs three Tenants (it sealed nothing, and its CRD
    keeps no seal); then a record of one of them is rewritten to list another namespace's
    ConfigMap. The current krypton takes over, guarded or not, with a chart bump: the two
    honest releases are adopted by their content (exactly what chart 0.2.0 renders with
    krypton's values) and upgraded, with nothing done by hand; the forged one is refused
    and the ConfigMap stays."""
    proto.ensure_namespace(fleet.tenant_ns)
    fleet.register("proto", proto)
    # (-m would put the working directory, and this krypton, first on the path)
    older = fleet.start(env={"PYTHONPATH": str(older_krypton), "PYTHONSAFEPATH": "1"})
    names = [fleet.tenant(proto, unique("older")) for _ in range(3)]
    for name in names:
        proto.wait_phase(fleet.tenant_ns, name, "Ready")
    older.stop()
    assert _served_revision(proto) == "7"  # the older krypton's own CRD: it was that one
    bystanders = unique("bystander")
    proto.ensure_namespace(bystanders)
    proto.core.create_namespaced_config_map(bystanders, {"metadata": {"name": "precious"}})
    forged, *honest = names
    _forged(proto, forged, f"tenant-{forged}-proto", bystanders, "precious")
    op = fleet.start(f"--record-guard={guard}", version="0.3.0")
    for name in honest:
        wait_for(lambda n=name: proto.release_records(n, f"tenant-{n}-proto") == [
            (1, "superseded"), (2, "deployed")], 90, what=f"{name} upgraded")
        proto.wait_phase(fleet.tenant_ns, name, "Ready")
        adopted = proto.wait_event(fleet.tenant_ns, name, "ReleaseRecordAdopted")
        assert "adopted by its content" in adopted.message, adopted.message
    refused = proto.wait_condition(fleet.tenant_ns, forged, "ClusterError/proto", "True",
                                   "ReleaseRecordUntrusted")
    assert "nothing is adopted by itself unless its content" in refused["message"], refused
    assert proto.core.read_namespaced_config_map("precious", bystanders)
    assert proto.release_records(forged, f"tenant-{forged}-proto") == [(1, "deployed")]
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == len(honest)
    assert op.metric("krypton_records_adopted_total", cluster="proto") == len(honest)
    assert _served_revision(proto) == crd_manifest()["metadata"]["annotations"][
        REVISION_ANNOTATION]


def _served_revision(cluster: Cluster) -> str:
    served = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(
        "tenants.mesh.openkcm.io")
    return str(served.metadata.annotations[REVISION_ANNOTATION])


def test_a_paused_tenant_on_an_older_crd_is_written_as_pending(
        fleet: Fleet, proto: Cluster) -> None:
    """A Tenant CRD without phase Suspended that is not krypton's to replace (no revision
    annotation: an admin's own copy, kept by the default --crd-policy): the API server
    would refuse every status write of a paused Tenant. It is written as Pending, its Ready
    reason Suspended."""
    older = copy.deepcopy(crd_manifest())
    del older["metadata"]["annotations"]
    schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["status"]["properties"]["phase"]["enum"] = ["Pending", "Ready", "Error"]
    _apply_crd(fleet, proto, older)
    proto.ensure_namespace(fleet.tenant_ns)
    fleet.register("proto", proto)
    op = fleet.start("--resync-period", "2s")  # --crd-policy=create keeps a CRD not krypton's
    name = fleet.tenant(proto, unique("p"), annotations={"mesh.openkcm.io/paused": "true"})
    ready = proto.wait_condition(fleet.tenant_ns, name, "Ready", "False", "Suspended")
    assert proto.phase(fleet.tenant_ns, name) == "Pending"
    assert ready["message"].startswith("suspended")
    fleet.home.wait_event(fleet.discovery_ns, "proto", "CRDOutdated")
    # no write per pass: the phase written is the one the server keeps
    passes = op.metric("krypton_reconciles_total", cluster="proto")
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="proto") >= passes + 3, 60,
             what="three resyncs")
    settle = _writes(op)
    passes = op.metric("krypton_reconciles_total", cluster="proto")
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="proto") >= passes + 3, 60,
             what="three more resyncs")
    assert _writes(op) == settle
    assert op.metric("krypton_helm_processes_total", operation="install") == 0
