"""Release records forged by whoever may write Secrets in a Tenant's namespace (SPEC S3, S4).

Helm keeps a release's history as Secrets in the release's namespace. The records here are
written by a ServiceAccount that may do nothing but write Secrets in that one namespace (a
tenant's own admin). On a guarded cluster (krypton's ValidatingAdmissionPolicy, the default)
the API server refuses those writes; on an unguarded one (--record-guard=off) the seals
stand, and each test asserts that krypton's cluster-wide rights are never turned against
another namespace: nothing foreign is created or deleted, and helm is not run on a record
krypton did not write (counted from krypton's own helm metrics).
"""

from __future__ import annotations

import base64
import copy
import datetime
import gzip
import hashlib
import json
import subprocess
import sys
import threading
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from krypton.testing.operator import OperatorProcess, wait_for
from tests.integration.conftest import Cluster, Fleet, unique
from tests.integration.test_cli import krypton, run_flags

pytestmark = pytest.mark.reliability

FORGER = "forger"
GUARD = "krypton-release-records"
ADOPT = "mesh.openkcm.io/adopt-records"


def _secret_writer(cluster: Cluster, namespace: str) -> client.CoreV1Api:
    """A client of a ServiceAccount that may only write Secrets in `namespace`."""
    core, rbac = cluster.core, client.RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": FORGER}})
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": FORGER},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["get", "list", "create", "update", "patch", "delete"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": FORGER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FORGER},
        "subjects": [{"kind": "ServiceAccount", "name": FORGER, "namespace": namespace}]})
    token = core.create_namespaced_service_account_token(
        FORGER, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    admin = cluster.api.configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = admin.host, admin.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    writer = client.CoreV1Api(client.ApiClient(cfg))
    with pytest.raises(ApiException) as denied:  # it is what it claims to be: nothing more
        writer.list_namespaced_secret("default")
    assert denied.value.status == 403
    return writer


def _decoded(secret: Any) -> dict[str, Any]:
    raw = base64.b64decode(base64.b64decode(secret.data["release"]))
    return json.loads(gzip.decompress(raw))  # type: ignore[no-any-return]


def _forge(writer: client.CoreV1Api, namespace: str, like: Any, revision: int, status: str,
           release: dict[str, Any] | None = None, *, payload: bytes | None = None,
           modified_at: str | None = None) -> None:
    """A record of revision `revision` shaped like the record `like` (its labels, its type),
    holding `release` (or the raw gzip `payload`)."""
    labels = {**like.metadata.labels, "version": str(revision), "status": status}
    if modified_at is not None:
        labels["modifiedAt"] = modified_at
    if payload is None:
        assert release is not None
        payload = gzip.compress(json.dumps({**release, "version": revision, "info": {
            **release["info"], "status": status}}).encode())
    name = f"sh.helm.release.v1.{labels['name']}.v{revision}"
    writer.create_namespaced_secret(namespace, {
        "metadata": {"name": name, "labels": labels}, "type": like.type,
        "data": {"release": base64.b64encode(base64.b64encode(payload)).decode()}})


def _record(cluster: Cluster, namespace: str, release: str, revision: int) -> Any:
    return cluster.core.read_namespaced_secret(f"sh.helm.release.v1.{release}.v{revision}",
                                               namespace)


def _with_objects(release: dict[str, Any], *docs: dict[str, Any]) -> dict[str, Any]:
    forged = copy.deepcopy(release)
    forged["manifest"] += "".join(f"\n---\n{yaml.safe_dump(d)}" for d in docs)
    return forged


def _refused(fleet: Fleet, name: str) -> bool:
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    return cond.get("status") == "True" and cond.get("reason") == "ReleaseRecordUntrusted"


def _wait_gone(fleet: Fleet, name: str) -> None:
    """Wait until the remote Tenant `name` is deleted: its finalizer removed."""
    def gone() -> bool:
        try:
            fleet.remote.tenant(fleet.tenant_ns, name)
            return False
        except ApiException as exc:
            return exc.status == 404
    wait_for(gone, 60, what="the finalizer removed and the Tenant gone")


def _helm_runs(op: OperatorProcess) -> float:
    return sum(op.metric("krypton_helm_processes_total", operation=o) or 0
               for o in ("install", "upgrade", "rollback", "uninstall"))


def _unguard(fleet: Fleet) -> None:
    """No guard on remote for this test's krypton, nor one of an instance for the whole
    cluster (an earlier test may have left either)."""
    for name in (GUARD, f"{GUARD}.{fleet.tenant_ns}"):
        fleet.remote.remove_guard(name)


def _forbidden_by_guard(fleet: Fleet, write: Any) -> str:
    """The message of the API server's refusal of `write()`, which must be this test's
    krypton's guard."""
    with pytest.raises(ApiException) as refused:
        write()
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 403, message
    assert f"ValidatingAdmissionPolicy '{GUARD}.{fleet.tenant_ns}'" in message, message
    return message  # type: ignore[no-any-return]


@pytest.fixture
def installed(fleet: Fleet) -> tuple[OperatorProcess, str, str, dict[str, Any], Any]:
    """A Tenant Ready on remote at revision 1, on a cluster whose records are not guarded:
    (operator, tenant, release, its release as recorded, its record)."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start("--record-guard=off")
    name = fleet.tenant(fleet.remote, unique("victim"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    record = _record(fleet.remote, name, release, 1)
    return op, name, release, _decoded(record), record


def _bystander(cluster: Cluster) -> tuple[str, str]:
    """A ConfigMap in a namespace of its own that no Tenant has anything to do with."""
    namespace = unique("bystander")
    cluster.ensure_namespace(namespace)
    cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": "precious"}})
    return namespace, "precious"


def _exists_configmap(cluster: Cluster, namespace: str, name: str) -> bool:
    try:
        cluster.core.read_namespaced_config_map(name, namespace)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _binding(cluster: Cluster, name: str) -> Any:
    try:
        return client.RbacAuthorizationV1Api(cluster.api).read_cluster_role_binding(name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _admin_binding(name: str, namespace: str) -> dict[str, Any]:
    """A binding of the forger to cluster-admin that helm keeps once made (an upgrade that
    no longer renders it does not delete it)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "annotations": {"helm.sh/resource-policy": "keep"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": FORGER, "namespace": namespace}]}


def test_a_forged_deployed_record_is_never_upgraded_from(fleet: Fleet, installed: Any) -> None:
    """Drift repair would upgrade "from" a deployed record that lists another namespace's
    object, and helm would delete it (it is in the old manifest, not in the new one)."""
    op, name, release, ours, record = installed
    ns, victim = _bystander(fleet.remote)
    writer = _secret_writer(fleet.remote, name)
    runs = _helm_runs(op)
    _forge(writer, name, record, 2, "deployed", _with_objects(ours, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": victim, "namespace": ns}}))
    wait_for(lambda: _refused(fleet, name) or not _exists_configmap(fleet.remote, ns, victim),
             90, what="the forged record refused (or acted on)")
    assert _exists_configmap(fleet.remote, ns, victim)
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    assert f"{release}.v2 (deployed) that the upgrade would start from was not written by " \
           "krypton" in cond["message"], cond["message"]
    fleet.remote.wait_event(fleet.tenant_ns, name, "ReleaseRecordUntrusted")
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Error"
    assert op.metric("krypton_reconcile_errors_total", cluster="remote",
                     reason="ReleaseRecordUntrusted") >= 1
    assert _exists_configmap(fleet.remote, ns, victim)
    assert _helm_runs(op) == runs
    assert fleet.remote.release_records(name, release) == [(1, "deployed"), (2, "deployed")]
    # the forged record removed, the release is as krypton left it: Ready, still no helm run
    writer.delete_namespaced_secret(f"sh.helm.release.v1.{release}.v2", name)
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "False")
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert _helm_runs(op) == runs
    assert _exists_configmap(fleet.remote, ns, victim)


def test_a_record_whose_labels_and_body_disagree_is_refused(fleet: Fleet,
                                                            installed: Any) -> None:
    """helm selects a release's records by their labels and sorts them by the revision in
    their body. A forged record labelled with a revision that is not a number (krypton's
    check once skipped it) whose body says revision 2, deployed, is what helm's upgrade
    would start from: at the next chart bump the history is refused, no helm runs, and the
    bystander the record lists stays."""
    op, name, release, ours, record = installed
    ns, victim = _bystander(fleet.remote)
    writer = _secret_writer(fleet.remote, name)
    forged = _with_objects(ours, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": victim, "namespace": ns}})
    payload = gzip.compress(json.dumps({**forged, "version": 2}).encode())
    writer.create_namespaced_secret(name, {
        "metadata": {"name": f"sh.helm.release.v1.{release}.v2",
                     "labels": {**record.metadata.labels, "version": "x2"}},
        "type": record.type,
        "data": {"release": base64.b64encode(base64.b64encode(payload)).decode()}})
    op.stop()
    op = fleet.start("--record-guard=off", version="0.3.0")
    wait_for(lambda: _refused(fleet, name) or not _exists_configmap(fleet.remote, ns, victim),
             90, what="the record refused (or acted on)")
    assert _exists_configmap(fleet.remote, ns, victim)
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    assert "is labelled revision 'x2' (deployed) but holds revision 2" in cond["message"], \
        cond["message"]
    assert _helm_runs(op) == 0


def test_a_cluster_that_leaves_and_returns_adopts_nothing(fleet: Fleet, installed: Any) -> None:
    """The cluster's Secret deleted and made again (a kubeconfig rotated by delete and
    create): krypton clears the cluster from its Tenants, seals included. A record forged
    meanwhile, listing another namespace's object, is not adopted on the cluster's return:
    a missing seal is no reason to believe a record. The upgrade is refused, no helm runs,
    the object stays."""
    op, name, release, ours, record = installed
    ns, victim = _bystander(fleet.remote)
    writer = _secret_writer(fleet.remote, name)
    runs = _helm_runs(op)
    fleet.unregister("remote")
    wait_for(lambda: "remote" not in ((fleet.remote.tenant(fleet.tenant_ns, name).get(
        "status") or {}).get("clusters") or {}), 60, what="the cluster cleared from the Tenant")
    _forge(writer, name, record, 2, "deployed", _with_objects(ours, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": victim, "namespace": ns}}))
    fleet.register("remote", fleet.remote)
    wait_for(lambda: _refused(fleet, name) or not _exists_configmap(fleet.remote, ns, victim),
             90, what="the forged record refused (or acted on)")
    assert _exists_configmap(fleet.remote, ns, victim)
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    assert "nothing is adopted by itself" in cond["message"], cond["message"]
    assert _helm_runs(op) == runs


def _upgraded_by_hand(fleet: Fleet, name: str) -> None:
    """What an administrator's own `helm upgrade` of the release with one object more
    leaves: that object, and a deployed revision 2 whose record lists it (no seal of
    krypton's, not what krypton's chart renders)."""
    release = f"tenant-{name}-remote"
    record = _record(fleet.remote, name, release, 1)
    extra = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "extra", "namespace": name, "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": release,
                        "meta.helm.sh/release-namespace": name}}}
    fleet.remote.core.create_namespaced_config_map(name, extra)
    _forge(fleet.remote.core, name, record, 2, "deployed", _with_objects(_decoded(record), extra))


def test_adopt_records_asks_the_operator_for_every_release_it_refused(fleet: Fleet) -> None:
    """SPEC S6: `krypton adopt-records --all --dry-run` lists each release krypton refused
    for its records on the cluster, with why it was not adopted by its content, and writes
    nothing; a release krypton trusts is not listed. The real run asks (the Tenant's
    annotation), and the operator's next pass carries it out: each release upgraded from the
    adopted record, an Event naming the administrator, the seal kept in the status."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start("--record-guard=off")
    kept, *by_hand = (fleet.tenant(fleet.remote, unique(n)) for n in ("kept", "edited", "hand"))
    for name in (kept, *by_hand):
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    for name in by_hand:
        _upgraded_by_hand(fleet, name)
    for name in by_hand:
        wait_for(lambda n=name: _refused(fleet, n), 90, what=f"{name}'s records refused")
    runs = _helm_runs(op)

    dry = krypton(fleet, "adopt-records", "--all", "--dry-run", "--cluster", "remote",
                  *run_flags(fleet))
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert len(lines) == 2 and kept not in dry.stdout, dry.stdout
    for name in by_hand:
        line = next(x for x in lines if f"{fleet.tenant_ns}/{name}:" in x)
        assert line.startswith("remote: ") and "would adopt revisions 2, 1 of release" in line \
            and f"only in the record: ConfigMap {name}/extra" in line, line
        assert ADOPT not in fleet.remote.tenant(fleet.tenant_ns, name)["metadata"].get(
            "annotations", {})
    assert _helm_runs(op) == runs

    asked = krypton(fleet, "adopt-records", "--all", *run_flags(fleet))
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.count("asked for") == 2 and kept not in asked.stdout, asked.stdout
    for name in by_hand:
        release = f"tenant-{name}-remote"
        wait_for(lambda n=name, r=release: (3, "deployed") in fleet.remote.release_records(n, r),
                 90, what=f"{name} upgraded from the adopted record")
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
        event = fleet.remote.wait_event(fleet.tenant_ns, name, "ReleaseRecordAdopted")
        assert f"{release}.v2 adopted as krypton's by an administrator" in event.message
        status = fleet.remote.tenant(fleet.tenant_ns, name)["status"]["clusters"]["remote"]
        assert len(status["seals"]) == 2, status  # the upgrade's seal and the adopted one
        assert not _exists_configmap(fleet.remote, name, "extra")  # helm acted on revision 2
    assert _helm_runs(op) == runs + 2
    again = krypton(fleet, "adopt-records", "--all", "--dry-run", *run_flags(fleet))
    assert again.stdout.strip() == "no release is refused for its records on any discovered " \
        "cluster", again.stdout


def test_a_rotated_key_still_checks_the_seals_it_made(fleet: Fleet, installed: Any) -> None:
    """`krypton rotate-record-key`: a new key seals, the retired one still checks what it
    made. After the operator restarts, the chart bump upgrades from the record the old key
    sealed, and the new seal names the new key; a prune keeps the retired key while a
    Tenant's seals use it."""
    op, name, release, _ours, _record = installed
    rotate = krypton(fleet, "rotate-record-key", *run_flags(fleet))
    assert rotate.returncode == 0, rotate.stderr
    assert "retired, still checking the seals it made" in rotate.stdout, rotate.stdout
    data = fleet.home.core.read_namespaced_secret("krypton-record-key", fleet.discovery_ns).data
    new_id = hashlib.sha256(base64.b64decode(data["key"])).hexdigest()[:8]
    old = [k for k in data if k.startswith("retired-")]
    assert len(old) == 1
    op.stop()
    op = fleet.start("--record-guard=off", version="0.3.0")
    wait_for(lambda: fleet.remote.release_records(name, release) ==
             [(1, "superseded"), (2, "deployed")] or _refused(fleet, name), 120,
             what="the release upgraded (or refused)")
    assert not _refused(fleet, name)
    def both_seals() -> list[str] | None:
        status = fleet.remote.tenant(fleet.tenant_ns, name).get("status") or {}
        seals = ((status.get("clusters") or {}).get("remote") or {}).get("seals") or []
        return seals if len(seals) >= 2 else None

    # The seals reach the status after the record: wait for revision 2's, not only the first.
    kept = wait_for(both_seals, 30, what="both records' seals kept")
    assert kept[0].startswith(f"{new_id}:") and old[0].removeprefix("retired-") in kept[1], kept
    prune = krypton(fleet, "rotate-record-key", "--prune", *run_flags(fleet))
    assert prune.returncode == 0 and "no retired key to remove" in prune.stdout, \
        prune.stdout + prune.stderr


def test_a_recovery_rolls_back_only_to_a_revision_krypton_made(fleet: Fleet,
                                                               installed: Any) -> None:
    """A pending record left "stale" makes krypton roll back and upgrade. helm's rollback
    goes to the previous revision by default: here a forged one whose manifest binds the
    forger to cluster-admin. krypton goes to its own revision 1, and heals the release."""
    op, name, release, ours, record = installed
    writer = _secret_writer(fleet.remote, name)
    crb = unique("forged-admin")
    _forge(writer, name, record, 2, "superseded", _with_objects(ours, _admin_binding(crb, name)))
    _forge(writer, name, record, 3, "pending-upgrade", ours, modified_at="1")
    wait_for(lambda: fleet.remote.release_records(name, release)[-1] == (5, "deployed"), 120,
             what="rolled back to revision 1 (revision 4), then upgraded (revision 5)")
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert _binding(fleet.remote, crb) is None
    rolled = _decoded(_record(fleet.remote, name, release, 4))
    assert rolled["manifest"] == ours["manifest"]
    assert op.metric("krypton_helm_processes_total", operation="rollback") == 1


def test_a_record_that_inflates_is_refused_before_helm_reads_it(fleet: Fleet,
                                                                installed: Any) -> None:
    """A record of 100 KiB that inflates to 128 MiB: helm decodes every record of a release
    at every run, and would take gigabytes. Refused before helm starts."""
    op, name, release, _ours, record = installed
    writer = _secret_writer(fleet.remote, name)
    runs = _helm_runs(op)
    bomb = gzip.compress(b'{"manifest": "' + b"a" * (128 << 20) + b'"}', 9)
    _forge(writer, name, record, 2, "deployed", payload=bomb)
    wait_for(lambda: _refused(fleet, name) or _helm_runs(op) > runs, 90,
             what="the record refused (or read by helm)")
    assert _helm_runs(op) == runs
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    assert f"release record {release}.v2 is refused: release record inflates past" in \
        cond["message"], cond["message"]
    assert _helm_runs(op) == runs
    assert op.alive()


def test_deleting_a_tenant_never_runs_the_hooks_of_a_forged_record(fleet: Fleet,
                                                                  installed: Any) -> None:
    """The uninstall of a Tenant being deleted runs the newest record's pre-delete hooks:
    a forged one would create a cluster-admin binding with krypton's rights. The release
    is uninstalled without them (its own objects only), and the finalizer goes."""
    op, name, release, ours, record = installed
    fleet.remote.patch_tenant(fleet.tenant_ns, name, {"metadata": {"annotations": {
        "mesh.openkcm.io/paused": "true"}}})  # nothing runs before the deletion
    fleet.remote.wait_condition(fleet.tenant_ns, name, "Paused", "True")
    writer = _secret_writer(fleet.remote, name)
    crb = unique("hooked-admin")
    forged = copy.deepcopy(ours)
    forged["hooks"] = [{"name": crb, "kind": "ClusterRoleBinding", "path": "templates/x.yaml",
                        "manifest": yaml.safe_dump(_admin_binding(crb, name)),
                        "events": ["pre-delete"], "last_run": {}, "weight": 0}]
    _forge(writer, name, record, 2, "deployed", forged)
    fleet.remote.custom.delete_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name)
    wait_for(lambda: fleet.remote.release_records(name, release) == [], 90,
             what="the release uninstalled")
    _wait_gone(fleet, name)
    assert _binding(fleet.remote, crb) is None
    assert op.metric("krypton_helm_processes_total", operation="uninstall") == 1


# -- the guard at admission (SPEC S4) --------------------------------------------------------


def test_a_guarded_cluster_refuses_the_forgers_writes(fleet: Fleet) -> None:
    """krypton installs its guard when it engages the cluster: the forger's create (with
    helm's labels, or by name alone), change, relabel and delete of the release's records
    are refused by the API server itself, naming the policy; another helm user's records in
    the same namespace are not; krypton's own writes (a chart bump) still pass, and nothing
    outside the release is touched."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("guarded"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    wait_for(lambda: op.metric("krypton_cluster_records_guarded", cluster="remote") == 1, 30,
             what="the guard in force")
    assert "RecordsUnguarded" not in op.readyz()
    record = _record(fleet.remote, name, release, 1)
    ours = _decoded(record)
    ns, victim = _bystander(fleet.remote)
    forged = _with_objects(ours, {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": victim, "namespace": ns}})
    writer = _secret_writer(fleet.remote, name)
    key = f"sh.helm.release.v1.{release}.v1"
    flipped = base64.b64encode(base64.b64encode(gzip.compress(json.dumps(forged).encode())))
    _forbidden_by_guard(fleet, lambda: _forge(writer, name, record, 2, "deployed", forged))
    _forbidden_by_guard(fleet, lambda: writer.create_namespaced_secret(name, {
        "metadata": {"name": f"sh.helm.release.v1.{release}.v3"}, "data": record.data}))
    _forbidden_by_guard(fleet, lambda: writer.patch_namespaced_secret(
        key, name, {"data": {"release": flipped.decode()}}))
    _forbidden_by_guard(fleet, lambda: writer.patch_namespaced_secret(
        key, name, {"metadata": {"labels": {"owner": None}}}))
    _forbidden_by_guard(fleet, lambda: writer.delete_namespaced_secret(key, name))
    theirs = "sh.helm.release.v1.theirs.v1"  # another helm user's release: not krypton's
    writer.create_namespaced_secret(name, {"metadata": {"name": theirs, "labels": {
        "owner": "helm", "name": "theirs", "version": "1", "status": "deployed"}},
        "data": record.data})
    writer.delete_namespaced_secret(theirs, name)
    assert fleet.remote.release_records(name, release) == [(1, "deployed")]
    assert _decoded(_record(fleet.remote, name, release, 1)) == ours
    op.stop()
    # krypton's own writes pass: the bump upgrades, while the forger flips the record's
    # content back and forth without end, every write refused
    done, tries, passed = threading.Event(), [0], []

    def flip() -> None:
        while not done.is_set() and tries[0] < 2000:
            tries[0] += 1
            try:
                writer.patch_namespaced_secret(key, name, {"data": {"release": flipped.decode()}})
                passed.append(tries[0])
            except ApiException as exc:
                if exc.status != 403:
                    raise

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        op = fleet.start(version="0.3.0")
        wait_for(lambda: fleet.remote.release_records(name, release) ==
                 [(1, "superseded"), (2, "deployed")], 120, what="the release upgraded")
    finally:
        done.set()
        flipper.join(30)
    assert tries[0] > 10 and passed == [], (tries, passed)
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    said = fleet.remote.wait_condition(fleet.tenant_ns, name, "RecordsGuarded/remote", "True")
    assert said["reason"] == "RecordsGuarded" and GUARD in said["message"], said
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 1
    assert _exists_configmap(fleet.remote, ns, victim)


def test_a_cluster_without_the_guard_is_reported_until_an_admin_applies_it(
        fleet: Fleet) -> None:
    """With --record-guard=check krypton only looks for the guard: a cluster without it is
    engaged and said unguarded (Warning Event on its Secret, metric, /readyz). The admin
    applies `krypton guard --print` for the user the cluster says krypton is, and the next
    engagement finds it in force."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start("--record-guard=check")
    wait_for(lambda: "cluster remote: engaged, RecordsUnguarded: validatingadmissionpolicy "
             f"{GUARD}.{fleet.tenant_ns} is absent" in op.readyz(), 30,
             what="/readyz saying unguarded")
    assert op.metric("krypton_cluster_records_guarded", cluster="remote") == 0
    event = fleet.home.wait_event(fleet.discovery_ns, "remote", "RecordsUnguarded")
    assert event.type == "Warning" and "krypton guard --print" in event.message, event.message
    adm = client.AdmissionregistrationV1Api(fleet.remote.api)
    policy, binding = _printed_guard(fleet)
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    op.stop()
    op = fleet.start("--record-guard=check")
    wait_for(lambda: op.metric("krypton_cluster_records_guarded", cluster="remote") == 1, 30,
             what="the guard found in force")
    assert "RecordsUnguarded" not in op.readyz()
    name = fleet.tenant(fleet.remote, unique("found"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    writer = _secret_writer(fleet.remote, name)
    _forbidden_by_guard(fleet, lambda: writer.delete_namespaced_secret(
        f"sh.helm.release.v1.tenant-{name}-remote.v1", name))


def _printed_guard(fleet: Fleet) -> tuple[dict[str, Any], dict[str, Any]]:
    """The guard of this test's krypton as `krypton guard --print` gives it to an admin, for
    the user the cluster says krypton is there."""
    user = client.AuthenticationV1Api(fleet.remote.api).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    ).status.user_info.username
    printed = subprocess.run([sys.executable, "-m", "krypton", "guard", "--print", "--user",
                              user, "--watch-namespace", fleet.tenant_ns],
                             check=True, capture_output=True, text=True).stdout
    policy, binding = yaml.safe_load_all(printed)
    return policy, binding


def _said(fleet: Fleet, reason: str, text: str) -> bool:
    """Whether an Event `reason` on the cluster's Secret says `text`."""
    return any(e.reason == reason and text in e.message
               for e in fleet.home.events(fleet.discovery_ns, "remote"))


def _guarded(op: OperatorProcess) -> bool:
    return op.metric("krypton_cluster_records_guarded", cluster="remote") == 1


def test_a_guard_gone_for_a_moment_is_not_believed_after_it(fleet: Fleet) -> None:
    """SPEC S6. An admin's guard (--record-guard=check) is in force; the Tenant's record is
    made under it. The binding is deleted by mistake and the tenant's admin, who may write
    Secrets in the Tenant's namespace, rewrites that record meanwhile to list a ConfigMap
    in kube-system and one in another namespace; then the admin applies the binding again.
    krypton says the cluster unguarded at once and guarded again; the guard's time starts
    anew, so the rewritten record (made before it, matching no seal) is refused when drift
    repair would upgrade from it: no helm run, both ConfigMaps stay."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    adm = client.AdmissionregistrationV1Api(fleet.remote.api)
    policy, binding = _printed_guard(fleet)
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    op = fleet.start("--record-guard=check", "--resync-period", "2s")
    wait_for(lambda: _guarded(op), 30, what="the admin's guard found in force")
    found = _server_time(fleet.remote, fleet.tenant_ns)  # the guard holds since before this
    wait_for(lambda: _server_time(fleet.remote, fleet.tenant_ns) >= found + 1, 5,
             interval=0.1, what="the API server's clock past the guard's second")
    name = fleet.tenant(fleet.remote, unique("gap"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    ours = _decoded(_record(fleet.remote, name, release, 1))
    ns, victim = _bystander(fleet.remote)
    system = unique("precious")
    fleet.remote.core.create_namespaced_config_map("kube-system", {"metadata": {"name": system}})
    writer = _secret_writer(fleet.remote, name)
    runs = _helm_runs(op)
    forged = _with_objects(ours, *({"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": n, "namespace": where}}
                                   for where, n in ((ns, victim), ("kube-system", system))))
    rewritten = base64.b64encode(base64.b64encode(gzip.compress(json.dumps(forged).encode())))

    def rewrite() -> bool:
        try:
            writer.patch_namespaced_secret(f"sh.helm.release.v1.{release}.v1", name,
                                           {"data": {"release": rewritten.decode()}})
            return True
        except ApiException as exc:
            if exc.status != 403:
                raise
            return False

    adm.delete_validating_admission_policy_binding(binding["metadata"]["name"])
    wait_for(lambda: not _guarded(op), 10, interval=0.1, what="the cluster said unguarded")
    wait_for(rewrite, 30, interval=0.2, what="the rewrite passing once the guard is gone")
    adm.create_validating_admission_policy_binding(binding)
    wait_for(lambda: _guarded(op), 30, what="the guard found in force again")
    fleet.remote.core.delete_namespaced_config_map(release, name)  # drift: a repair is due
    wait_for(lambda: _refused(fleet, name) or not _exists_configmap(fleet.remote, ns, victim),
             90, what="the rewritten record refused (or acted on)")
    assert _exists_configmap(fleet.remote, ns, victim)
    assert _exists_configmap(fleet.remote, "kube-system", system)
    assert _helm_runs(op) == runs
    cond = fleet.remote.condition(fleet.tenant_ns, name, "ClusterError/remote") or {}
    assert f"{release}.v1 (deployed) that the upgrade would start from was not written by " \
           "krypton" in cond["message"], cond["message"]
    assert _said(fleet, "RecordsUnguarded", f"validatingadmissionpolicybinding {GUARD}."
                 f"{fleet.tenant_ns} was deleted"), fleet.home.events(fleet.discovery_ns, "remote")
    assert _said(fleet, "RecordsGuarded", GUARD)
    fleet.remote.core.delete_namespaced_config_map(system, "kube-system")


def test_a_guard_deleted_or_changed_is_put_back_within_seconds(fleet: Fleet) -> None:
    """SPEC S6, --record-guard=install: the policy deleted, then the binding weakened to
    Audit. Each time the cluster is said unguarded at once (Event, metric) and the guard
    is put back by its watches within seconds, not at the next check ten minutes on."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start()
    wait_for(lambda: _guarded(op), 30, what="the guard in force")
    adm = client.AdmissionregistrationV1Api(fleet.remote.api)
    name = f"{GUARD}.{fleet.tenant_ns}"
    first = adm.read_validating_admission_policy(name).metadata.uid
    adm.delete_validating_admission_policy(name)

    def put_back() -> bool:
        try:
            made = adm.read_validating_admission_policy(name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return bool(made.metadata.uid != first and _guarded(op))
    wait_for(put_back, 20, interval=0.2, what="the policy put back and in force")
    assert _said(fleet, "RecordsUnguarded", f"validatingadmissionpolicy {name} was deleted")
    adm.patch_validating_admission_policy_binding(
        name, {"spec": {"validationActions": ["Audit"]}})
    wait_for(lambda: adm.read_validating_admission_policy_binding(
        name).spec.validation_actions == ["Deny"] and _guarded(op), 20, interval=0.2,
             what="the binding put back as krypton makes it")
    assert _said(fleet, "RecordsUnguarded", f"validatingadmissionpolicybinding {name} was "
                 "changed")
    assert _said(fleet, "RecordsGuarded", name)
    assert "RecordsUnguarded" not in op.readyz()


def _status_writes_refused(fleet: Fleet) -> tuple[dict[str, Any], dict[str, Any]]:
    """A policy refusing every change of a Tenant's status in this test's namespace, as an
    admission policy of the cluster's own (or an API outage) would."""
    name = f"refuse-status-{fleet.tenant_ns}"
    policy = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail", "matchConstraints": {
                  "namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": fleet.tenant_ns}},
                  "resourceRules": [{"apiGroups": ["mesh.openkcm.io"], "apiVersions": ["*"],
                                     "resources": ["tenants/status"],
                                     "operations": ["UPDATE"]}]},
                  "validations": [{"expression": "false", "message": "status writes refused"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"]}}
    return policy, binding


def test_a_status_write_lost_after_a_helm_run_leaves_nothing_untrusted(fleet: Fleet) -> None:
    """The Tenant's status writes refused during a chart bump: the upgrade runs, its seal
    never reaches the status. Once writes pass again, the next chart change upgrades from
    that revision: on a guarded cluster it was made by krypton, seal or not."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start()
    adm = client.AdmissionregistrationV1Api(fleet.remote.api)
    _past_the_guards_second(fleet)
    name = fleet.tenant(fleet.remote, unique("unwritten"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    policy, binding = _status_writes_refused(fleet)
    adm.create_validating_admission_policy(policy)
    adm.create_validating_admission_policy_binding(binding)
    try:
        wait_for(lambda: _refuses_status(fleet, name), 30, what="status writes refused")
        op.stop()
        op = fleet.start(version="0.3.0")
        wait_for(lambda: fleet.remote.release_records(name, release) ==
                 [(1, "superseded"), (2, "deployed")], 120, what="upgraded to revision 2")
        wait_for(lambda: [e for e in op.log_events("reconcile failed", tenant=f"{fleet.tenant_ns}/{name}")
                          if "status writes refused" in str(e.get("error"))], 60,
                 what="the status write after the upgrade refused")
        kept = fleet.remote.tenant(fleet.tenant_ns, name)["status"]["clusters"]["remote"]
        assert kept["revision"] == 1 and len(kept["seals"]) == 1, kept  # v2 never sealed
    finally:
        adm.delete_validating_admission_policy_binding(binding["metadata"]["name"])
        adm.delete_validating_admission_policy(policy["metadata"]["name"])
    op.stop()
    op = fleet.start(version="0.1.0")  # another chart change: an upgrade from revision 2
    wait_for(lambda: fleet.remote.release_records(name, release)[-1] == (3, "deployed") or
             _refused(fleet, name), 120, what="upgraded from revision 2 (or refused)")
    assert not _refused(fleet, name)
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")


def _refuses_status(fleet: Fleet, name: str) -> bool:
    """Whether a status write to the Tenant is refused now (the policy came into force)."""
    try:
        fleet.remote.custom.patch_namespaced_custom_object_status(
            "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name,
            {"status": {}})
        return False
    except ApiException as exc:
        return exc.status in (403, 422) and "status writes refused" in str(exc.body)


def _past_the_guards_second(fleet: Fleet) -> None:
    """Wait until the guard of this test's krypton has its time on its binding and the API
    server's clock is past that second: records are stamped to the second, and the ones
    the test makes next must be stamped after it."""
    adm = client.AdmissionregistrationV1Api(fleet.remote.api)
    since = wait_for(lambda: (adm.read_validating_admission_policy_binding(
        f"{GUARD}.{fleet.tenant_ns}").metadata.annotations or {}).get(
        "mesh.openkcm.io/guarded-since"), 30, what="the time the guard holds since")
    held = datetime.datetime.fromisoformat(since.split()[0].replace("Z", "+00:00"))
    wait_for(lambda: _server_time(fleet.remote, fleet.tenant_ns) >= held.timestamp() + 1, 5,
             interval=0.1, what="the API server's clock past the guard's second")


def _server_time(cluster: Cluster, namespace: str) -> float:
    """The API server's clock, as the creation time it gives a dry-run object."""
    made = cluster.core.create_namespaced_config_map(
        namespace, {"metadata": {"generateName": "clock-"}}, dry_run="All")
    return made.metadata.creation_timestamp.timestamp()  # type: ignore[no-any-return]


def test_a_lost_key_freezes_nothing_the_guard_covers(fleet: Fleet) -> None:
    """The Secret krypton-record-key deleted (an admin's mistake, a restore from a backup
    without it): krypton makes a new key at its next start, and no seal the Tenant's status
    keeps holds any more. On a guarded cluster the release's record was made after the guard
    came into force, so by krypton: the chart bump upgrades at once, as before the loss."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    op = fleet.start()
    _past_the_guards_second(fleet)
    name = fleet.tenant(fleet.remote, unique("keyless"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()
    fleet.home.core.delete_namespaced_secret("krypton-record-key", fleet.discovery_ns)
    op = fleet.start(version="0.3.0")
    wait_for(lambda: fleet.remote.release_records(name, release) ==
             [(1, "superseded"), (2, "deployed")] or _refused(fleet, name), 120,
             what="the release upgraded (or refused)")
    assert not _refused(fleet, name)
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 1


# -- deleted by hand: healed at once, with one helm run -------------------------------------


def _installs(op: OperatorProcess) -> float:
    return op.metric("krypton_helm_processes_total", operation="install") or 0


@pytest.mark.parametrize("what", ["records", "namespace"])
def test_a_release_deleted_by_hand_is_installed_again_at_once(fleet: Fleet, what: str) -> None:
    """The release's records, or the Tenant's whole namespace, deleted by hand right after
    the install: the watch of the records brings a pass at once (the resync is 10 minutes
    away), no helm runs into a namespace being deleted, and one install restores it. On
    home, whose controller manager really deletes a namespace's content."""
    fleet.register("home", fleet.home)
    op = fleet.start()
    name = fleet.tenant(fleet.home, unique("oob"))
    release = f"tenant-{name}-home"
    fleet.home.wait_phase(fleet.tenant_ns, name, "Ready")
    before = _installs(op)
    if what == "records":
        fleet.home.core.delete_collection_namespaced_secret(
            name, label_selector=f"owner=helm,name={release}")
    else:
        fleet.home.core.delete_namespace(name)

    def restored() -> Any:
        try:
            ns = fleet.home.core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return ns.metadata.deletion_timestamp is None and \
            fleet.home.release_records(name, release) == [(1, "deployed")] and ns
    ns = wait_for(restored, 30, interval=0.2, what="the namespace and the release made again")
    assert ns.metadata.annotations["mesh.openkcm.io/owner"] == f"{fleet.tenant_ns}/{name}"
    fleet.home.wait_condition(fleet.tenant_ns, name, "ClusterReady/home", "True")
    fleet.home.wait_phase(fleet.tenant_ns, name, "Ready")
    assert _installs(op) == before + 1
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0


def test_deleting_a_tenant_whose_release_is_gone_drops_the_finalizer(fleet: Fleet) -> None:
    """The release's records deleted by hand, then the Tenant: nothing is left to
    uninstall; the finalizer goes without a helm run."""
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("gone"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    fleet.remote.patch_tenant(fleet.tenant_ns, name, {"metadata": {"annotations": {
        "mesh.openkcm.io/paused": "true"}}})  # no reinstall between the two deletions
    fleet.remote.wait_condition(fleet.tenant_ns, name, "Paused", "True")
    fleet.remote.core.delete_collection_namespaced_secret(
        name, label_selector=f"owner=helm,name={release}")
    fleet.remote.custom.delete_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name)
    _wait_gone(fleet, name)
    assert (op.metric("krypton_helm_processes_total", operation="uninstall") or 0) == 0


def test_a_record_flipped_without_end_during_a_bump_never_reaches_helm(fleet: Fleet) -> None:
    """SPEC S7. On a cluster whose records are not guarded, a tenant's admin flips the
    deployed record's content back and forth between krypton's and a forged manifest listing
    a ConfigMap in kube-system and one in another namespace, without end, during a chart
    bump. krypton judges the record, then helm reads it again: where helm runs in krypton's
    worker, the check is that read, so a flip between the two fails the run as
    ReleaseRecordChanged, said on the Tenant and retried; once the writer stops, the bump
    goes through on the true record. Neither ConfigMap is ever deleted."""
    fleet.register("remote", fleet.remote)
    _unguard(fleet)
    engine = "--helm-engine=worker"  # the binary cannot be held to the records (docs)
    op = fleet.start("--record-guard=off", engine)
    name = fleet.tenant(fleet.remote, unique("flipped"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    key = f"sh.helm.release.v1.{release}.v1"
    record = _record(fleet.remote, name, release, 1)
    ns, victim = _bystander(fleet.remote)
    system = unique("precious")
    fleet.remote.core.create_namespaced_config_map("kube-system", {"metadata": {"name": system}})
    forged = _with_objects(_decoded(record), *({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": where}}
        for n, where in ((victim, ns), (system, "kube-system"))))
    contents = [record.data["release"], base64.b64encode(base64.b64encode(
        gzip.compress(json.dumps(forged).encode()))).decode()]
    writer = _secret_writer(fleet.remote, name)
    op.stop()
    done, flips = threading.Event(), [0]

    def flip() -> None:
        while not done.is_set():
            flips[0] += 1
            try:
                writer.patch_namespaced_secret(key, name, {"data": {
                    "release": contents[flips[0] % 2]}})
            except ApiException as exc:
                if exc.status != 404:  # pruned by helm's history
                    raise

    def untouched() -> bool:
        return _exists_configmap(fleet.remote, ns, victim) and \
            _exists_configmap(fleet.remote, "kube-system", system)

    def changed() -> bool:  # a counter: the condition itself may be said over by then
        return op.metric("krypton_reconcile_errors_total", cluster="remote",
                         reason="ReleaseRecordChanged") >= 1

    def bumped() -> bool:
        return fleet.remote.release_records(name, release) == [(1, "superseded"), (2, "deployed")]

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        op = fleet.start("--record-guard=off", engine, version="0.3.0")
        # krypton reads the forged content (untrusted: no seal) or the true one, which helm
        # then finds flipped (said, and retried on the failure schedule), or, when no flip
        # fell between the two reads, finds as krypton read it: the bump then goes through
        # on the true record, which is no less safe (both happen; which comes first is the
        # flipper's timing)
        wait_for(lambda: not untouched() or changed() or bumped(), 180,
                 what="a bump whose record changed under helm said so, or one on the true record")
        assert untouched()
        if changed():
            failed = fleet.remote.wait_event(fleet.tenant_ns, name, "HelmUpgradeFailed")
            assert f"release record {key} changed since krypton read it" in failed.message
    finally:
        done.set()
        flipper.join(30)
    assert flips[0] > 20, flips
    writer.patch_namespaced_secret(key, name, {"data": {"release": contents[0]}})
    wait_for(lambda: fleet.remote.release_records(name, release) ==
             [(1, "superseded"), (2, "deployed")], 180, what="the bump on the true record")
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert untouched()
