"""The runtime's guarantees against the real test bed: no Tenant is reconciled from
a cache that has not synced; SIGTERM with helm running is bounded and leaves nothing behind."""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from krypton.decisions import retry
from krypton.testing import ControlPlane
from krypton.testing.operator import cmdline, descendants, wait_for
from tests.integration.conftest import Cluster, Fleet, unique

# Everything the operator needs on a cluster (cluster-wide mode, helm's secret driver) but the
# Secrets, where Helm keeps its release records.
RULES = [
    {"apiGroups": ["mesh.openkcm.io"], "resources": ["tenants", "tenants/status",
                                                      "tenants/finalizers"], "verbs": ["*"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["namespaces", "events", "configmaps"], "verbs": ["*"]},
]
SECRETS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}


def _kubectl(fleet: Fleet, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(fleet.testbin / "kubectl"), "--kubeconfig",
                           str(fleet.remote.cp.kubeconfig), *args], input=stdin, check=True,
                          capture_output=True, text=True).stdout


def _limited(fleet: Fleet, rules: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A ServiceAccount on remote bound to a ClusterRole of `rules`, registered as cluster
    "remote" with a kubeconfig of its token: the role's name and the ClusterRole."""
    sa, role = f"limited-{uuid.uuid4().hex[:5]}", f"krypton-limited-{uuid.uuid4().hex[:5]}"
    _kubectl(fleet, "create", "serviceaccount", sa, "-n", fleet.tenant_ns)
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": sa,
                             "namespace": fleet.tenant_ns}]}
    cluster_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": role}, "rules": rules}
    _kubectl(fleet, "apply", "-f", "-", stdin=yaml.safe_dump_all([cluster_role, binding]))
    token = _kubectl(fleet, "create", "token", sa, "-n", fleet.tenant_ns,
                     "--duration=1h").strip()
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "limited",
                  "clusters": [{"name": "remote", "cluster": {
                      "server": fleet.remote.cp.server,
                      "certificate-authority-data": base64.b64encode(
                          fleet.remote.cp.ca_pem).decode()}}],
                  "users": [{"name": sa, "user": {"token": token}}],
                  "contexts": [{"name": "limited", "context": {"cluster": "remote",
                                                               "user": sa}}]}
    fleet.register("remote", kubeconfig=yaml.safe_dump(kubeconfig))
    return role, cluster_role


def test_no_reconcile_before_the_release_records_are_listed(fleet: Fleet) -> None:
    """Credentials that cannot list Helm's release records: the release cache never syncs.
    Reconciling anyway would take every release for missing and install or upgrade it; the
    operator waits instead (and says so in /readyz), and starts once the list succeeds."""
    role, cluster_role = _limited(fleet, RULES)
    op = fleet.start("--api-timeout", "2s")
    name = fleet.tenant(fleet.remote, unique("early"))

    # The list keeps failing (retried with backoff 0.5, 1, 2, 4 s): five failures take about
    # 7.5 s, well past the 2 s after which the operator once started reconciling regardless.
    wait_for(lambda: len(op.log_events("watch failed, retrying", cluster="remote")) >= 5, 60,
             what="five failed lists of the release records")
    assert "CacheNotSynced" in op.readyz()
    assert op.metric("krypton_helm_processes_total") == 0
    assert not (fleet.remote.tenant(fleet.tenant_ns, name).get("status") or {}).get("conditions")

    cluster_role["rules"] = RULES + [SECRETS]
    _kubectl(fleet, "apply", "-f", "-", stdin=yaml.safe_dump(cluster_role))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    _kubectl(fleet, "delete", "clusterrole,clusterrolebinding", role)


def test_credentials_that_may_not_create_namespaces_install_into_one_made_for_them(
        fleet: Fleet) -> None:
    """A first install creates its namespace without reading it first. Where
    krypton's credentials may not create namespaces and they are made for it (annotated with
    their Tenant), the refused create is followed by a read, and the install goes ahead as
    when the namespace was read first; a Tenant whose namespace was not made says why."""
    no_create = [{"apiGroups": [""], "resources": ["namespaces"],
                  "verbs": ["get", "list", "watch", "patch", "update", "delete"]}]
    rules = [r for r in RULES if "namespaces" not in r["resources"]] + [
        {"apiGroups": [""], "resources": ["events", "configmaps"], "verbs": ["*"]},
        *no_create, SECRETS]
    role, _ = _limited(fleet, rules)
    op = fleet.start()
    made, missing = unique("made"), unique("missing")
    fleet.remote.core.create_namespace({"metadata": {"name": made, "annotations": {
        "mesh.openkcm.io/owner": f"{fleet.tenant_ns}/{made}"}}})
    for name in (made, missing):
        fleet.tenant(fleet.remote, name)
    fleet.remote.wait_phase(fleet.tenant_ns, made, "Ready")
    assert fleet.remote.release_records(made, f"tenant-{made}-remote") == [(1, "deployed")]
    c = fleet.remote.wait_condition(fleet.tenant_ns, missing, "ClusterError/remote", "True")
    assert "forbidden" in c["message"], c
    # retried on the work queue's growing schedule (R3), not in a loop: the refused Tenant
    # (the other one, Ready, has no passes) has failed at least once, so of its next three
    # passes the last two each wait at least the policy's second and third delays; no helm
    passes, start = op.metric("krypton_reconciles_total", cluster="remote"), time.monotonic()
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote") >= passes + 3,
             60, what="three more passes of the refused Tenant")
    assert time.monotonic() - start >= retry.RECONCILE.delay(2) + retry.RECONCILE.delay(3)
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    _kubectl(fleet, "delete", "clusterrole,clusterrolebinding", role)


@pytest.mark.parametrize("engine", ["worker", "cli"])
def test_sigterm_with_helm_running_stops_within_the_shutdown_timeout(fleet: Fleet,
                                                                      engine: str) -> None:
    """SIGTERM while helm waits for a Deployment that cannot become ready (no nodes): the
    operator stops taking work, gives helm --shutdown-timeout, then stops it (cancelled in
    the helm worker, or SIGTERM to the helm binary; at most 5 s, then SIGKILL) and exits 0,
    leaving no helm process and no work directory."""
    fleet.register("remote", fleet.remote)
    op = fleet.start("--helm-wait=true", "--shutdown-timeout", "3s", "--helm-timeout", "300s",
                     "--helm-engine", engine, chart="workload", version="1.0.0")
    name = fleet.tenant(fleet.remote, unique("waiting"))
    program, argument = ("krypton-helmworker", "--kubeconfig") if engine == "worker" \
        else ("helm", "upgrade")
    helm = wait_for(lambda: [p for p in descendants(op.pid)
                             if Path(cmdline(p)[0]).name == program and argument in cmdline(p)],
                    60, what=f"{program} running")
    line = cmdline(helm[0])
    workdir = Path(line[line.index("--kubeconfig") + 1]).parents[2]
    assert workdir.name.startswith("krypton-run-") and workdir.exists()
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterProgress/remote", "True",
                                "Installing")

    code = op.stop(grace=25)  # SIGKILL (-9) after 25 s: far beyond 3 s + helm's 5 s
    assert code == 0, op.log_tail()
    assert all(not cmdline(p) for p in helm), "helm outlived the operator"
    assert not workdir.exists()
    assert op.log_events("stopped")


def test_a_paused_leader_starts_nothing_once_its_lease_is_gone(fleet: Fleet) -> None:
    """SIGSTOP the leader (a partition, a frozen VM), let the standby take over and install
    a new Tenant, SIGCONT the old leader: its watches deliver the Tenant it missed, it notices
    the lost Lease, starts no helm for that Tenant and exits with status 1; the release has
    the standby's one revision only. (That the reconciler asks the fence before every helm
    start is shown by tests/unit/test_leader.py; here the race rarely reaches it.)"""
    fleet.register("remote", fleet.remote)
    lease = unique("lease")
    args = ("--leader-elect", "--leader-election-id", lease, "--lease-duration", "6s",
            "--renew-deadline", "4s", "--retry-period", "1s")
    old = fleet.start(*args)
    wait_for(lambda: old.log_events("became leader"), 30, what="a leader")
    standby = fleet.start(*args)
    first = fleet.tenant(fleet.remote, unique("before"))
    fleet.remote.wait_phase(fleet.tenant_ns, first, "Ready")

    os.kill(old.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: standby.log_events("became leader"), 30, what="the standby leads")
        missed = fleet.tenant(fleet.remote, unique("missed"))
        fleet.remote.wait_phase(fleet.tenant_ns, missed, "Ready")
    finally:
        os.kill(old.pid, signal.SIGCONT)
    assert old.popen is not None
    assert old.popen.wait(30) == 1, old.log_tail()
    # it noticed the loss itself (not only a shutdown, which every exit logs)
    assert old.log_events("leadership lost"), old.log_tail()
    assert [e.get("lease_lost") for e in old.log_events("shutting down")] == [True]
    key = f"{fleet.tenant_ns}/{missed}"
    started = [e for kind in ("install", "upgrade")
               for e in old.log_events(f"helm {kind} start", tenant=key)]
    assert not started, old.log_tail()
    assert fleet.remote.release_records(missed, f"tenant-{missed}-remote") == [(1, "deployed")]


def test_access_lost_after_engagement_is_reported_and_recovered(fleet: Fleet,
                                                                testbin: Path) -> None:
    """The operator's rights on an engaged cluster are withdrawn (its RBAC binding deleted)
    and its connections drop: a Warning Event ClusterAccessDenied on the cluster's Secret,
    krypton_cluster_healthy 0 and a /readyz line; rights back: ClusterRecovered, healthy 1,
    and the cluster serves again."""
    with ControlPlane("revoked", testbin, auth="token").start() as cp:
        cluster = Cluster("revoked", cp)
        cluster.ensure_namespace(fleet.tenant_ns)

        def kubectl(*args: str) -> str:
            return subprocess.run([str(testbin / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                                   *args], check=True, capture_output=True, text=True).stdout

        kubectl("create", "serviceaccount", "operator", "-n", "default")
        grant = ("create", "clusterrolebinding", "operator", "--clusterrole=cluster-admin",
                 "--serviceaccount=default:operator")
        kubectl(*grant)
        token = kubectl("create", "token", "operator", "-n", "default", "--duration=1h").strip()
        fleet.register("revoked", kubeconfig=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {
                "server": cp.server,
                "certificate-authority-data": base64.b64encode(cp.ca_pem).decode()}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
        op = fleet.start()
        first = fleet.tenant(cluster, unique("first"))
        cluster.wait_phase(fleet.tenant_ns, first, "Ready")

        def events(reason: str) -> list[Any]:
            return [e for e in fleet.home.events(fleet.discovery_ns, "revoked")
                    if e.reason == reason]

        kubectl("delete", "clusterrolebinding", "operator")
        cp.stop_apiserver()
        cp.restart_apiserver()  # the open watches drop and must list again
        denied = wait_for(lambda: events("ClusterAccessDenied"), 60, what="ClusterAccessDenied")
        assert denied[0].type == "Warning" and "forbidden" in denied[0].message
        assert "cluster revoked: failing: ClusterAccessDenied" in op.readyz()
        assert op.metric("krypton_cluster_healthy", cluster="revoked") == 0

        kubectl(*grant)
        wait_for(lambda: events("ClusterRecovered"), 60, what="ClusterRecovered")
        assert op.metric("krypton_cluster_healthy", cluster="revoked") == 1
        assert "cluster revoked" not in op.readyz()
        second = fleet.tenant(cluster, unique("second"))
        cluster.wait_phase(fleet.tenant_ns, second, "Ready")
        # one episode, one report: the Event was not repeated on every failed list
        assert [e.count for e in events("ClusterAccessDenied")] == [1]


def test_new_credentials_drain_running_helm_and_block_no_other_cluster(fleet: Fleet,
                                                                        testbin: Path) -> None:
    """A cluster's kubeconfig Secret changes while helm waits for pods that take 8 s to become
    Ready: the old worker is drained (helm finishes, one revision, no failure) and the cluster
    engages again; a cluster registered meanwhile engages without waiting for the drain."""
    with ControlPlane("rotating", testbin, auth="token", nodes=1,
                      pod_ready_delay=8.0).start() as cp:
        cluster = Cluster("rotating", cp)
        cluster.ensure_namespace(fleet.tenant_ns)
        fleet.register("rotating", cluster)
        op = fleet.start("--helm-wait=true", chart="workload", version="1.0.0")
        name = fleet.tenant(cluster, unique("busy"))
        key = f"{fleet.tenant_ns}/{name}"
        wait_for(lambda: op.log_events("helm install start", tenant=key), 60,
                 what="helm install running")

        rotated = yaml.safe_load(cp.kubeconfig.read_text())
        rotated["contexts"][0]["name"] = rotated["current-context"] = "rotated"
        secret = fleet.home.core.read_namespaced_secret("rotating", fleet.discovery_ns)
        secret.data["kubeconfig"] = base64.b64encode(yaml.safe_dump(rotated).encode()).decode()
        fleet.home.core.replace_namespaced_secret("rotating", fleet.discovery_ns, secret)
        fleet.register("remote", fleet.remote)
        wait_for(lambda: op.log_events("cluster engaged", cluster="remote"), 30,
                 what="another cluster engaged during the drain")
        assert not op.log_events("helm install success", tenant=key), \
            "the drain had ended: this run shows nothing about waiting"

        cluster.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
        # the one helm run finished: nothing was stopped, recovered or installed again
        assert len(op.log_events("helm install start", tenant=key)) == 1
        assert len(op.log_events("helm install success", tenant=key)) == 1
        assert not op.log_events("helm install failed", tenant=key)
        assert cluster.release_records(name, f"tenant-{name}-rotating") == [(1, "deployed")]
        wait_for(lambda: len(op.log_events("cluster engaged", cluster="rotating")) == 2, 60,
                 what="engaged again with the new kubeconfig")
        assert op.log_events("cluster draining", cluster="rotating")


@pytest.fixture
def compacted(testbin: Path) -> Any:
    cp = ControlPlane("compacted", testbin).start()
    try:
        yield Cluster("compacted", cp)
    finally:
        cp.stop()


def test_watch_resumes_and_relists_once_after_410(fleet: Fleet, compacted: Cluster) -> None:
    """The API server restarts over an etcd whose history was compacted past every
    resourceVersion the operator saw: resuming its watches ends in 410 Gone. Each informer
    lists again exactly once, and the relist upgrades nothing (item 1)."""
    fleet.register("compacted", compacted)
    compacted.ensure_namespace(fleet.tenant_ns)
    op = fleet.start()
    names = [unique("kept") for _ in range(3)]
    for name in names:
        fleet.tenant(compacted, name)
    for name in names:
        compacted.wait_phase(fleet.tenant_ns, name, "Ready")
    assert op.metric("krypton_watch_relists_total", cluster="compacted") == 0
    helm_runs = op.metric("krypton_helm_processes_total")

    compacted.cp.stop_apiserver()
    compacted.cp.compact_etcd()
    compacted.cp.restart_apiserver()
    compacted.api = Cluster("compacted", compacted.cp).api

    for watch in ("tenants", "helm-releases"):
        wait_for(lambda w=watch: op.metric("krypton_watch_relists_total", cluster="compacted",
                                           watch=w) >= 1, 120, what=f"{watch} relisted")
    # The watches work again: a Tenant created now is installed.
    after = fleet.tenant(compacted, unique("after"))
    compacted.wait_phase(fleet.tenant_ns, after, "Ready", timeout=120)
    for watch in ("tenants", "helm-releases"):
        assert op.metric("krypton_watch_relists_total", cluster="compacted", watch=watch) == 1
    assert op.metric("krypton_helm_processes_total") == helm_runs + 1  # the new install only
    for name in names:
        release = f"tenant-{name}-compacted"
        assert compacted.release_records(name, release) == [(1, "deployed")], name


def test_a_worker_killed_mid_upgrade_leaves_no_pending_record(fleet: Fleet,
                                                              testbin: Path) -> None:
    """SPEC S7: the helm worker killed (by its bound, the kernel or a person) while helm
    waits for an upgrade's pods: krypton knows its own run ended with it, so the next pass
    marks the pending record failed ("unlocked from a stale state", as Flux does, an Event
    ReleaseUnlocked) and recovers the release at once, without waiting out --helm-timeout;
    the history keeps no pending record."""
    with ControlPlane("killed", testbin, auth="token", nodes=1,
                      pod_ready_delay=6.0).start() as cp:
        cluster = Cluster("killed", cp)
        cluster.ensure_namespace(fleet.tenant_ns)
        fleet.register("killed", cluster)
        op = fleet.start("--helm-wait=true", "--helm-engine=worker", "--helm-timeout", "300s",
                         chart="workload", version="1.0.0")
        name = fleet.tenant(cluster, unique("killed"))
        release = f"tenant-{name}-killed"
        cluster.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
        # a new pod template for this cluster (its values): helm waits 6 s for the new pods
        fleet.home.core.patch_namespaced_secret("killed", fleet.discovery_ns, {"data": {
            "values.yaml": base64.b64encode(b"image: krypton.test/testpod:2\n").decode()}})
        wait_for(lambda: cluster.release_records(name, release)[-1] == (2, "pending-upgrade"),
                 60, interval=0.05, what="the upgrade under way")
        (worker,) = [p for p in descendants(op.pid)
                     if Path(cmdline(p)[0]).name == "krypton-helmworker"]
        os.kill(worker, signal.SIGKILL)
        records = wait_for(lambda: (r := cluster.release_records(name, release))[-1][1] ==
                           "deployed" and r, 120, what="the release recovered")
        assert not [r for r in records if r[1].startswith("pending")], records
        assert (2, "failed") in records, records
        secret = cluster.core.read_namespaced_secret(f"sh.helm.release.v1.{release}.v2", name)
        body = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(
            secret.data["release"]))))
        assert body["info"]["description"].startswith(
            "Release unlocked from stale 'pending-upgrade' state: the helm worker of cluster "
            "killed ended"), body["info"]
        said = cluster.wait_event(fleet.tenant_ns, name, "ReleaseUnlocked")
        assert f"revision 2 of {release} was left pending-upgrade" in said.message
        cluster.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
