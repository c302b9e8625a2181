"""krypton as a real pod on a real node (SPEC T8, O5, O6, F6): the image ``make image`` built,
imported into containerd, installed with ``helm install`` of ``chart/`` and run by a kubelet, so
that the chart's probes, securityContext, memory limit and termination are the kubelet's; the
Tenants' chart pods run too (the test bed's own web server image), so readiness, crash loops and
hook Jobs are real.

Each test gets its own control plane with its own node: the operator of one test never sees
another test's Tenants.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from krypton.testing import ChartRepository, ControlPlane
from krypton.testing.image import archive
from krypton.testing.node import API_SERVICE_IP, Node
from krypton.testing.operator import kubeconfig_secret, wait_for

from ..conftest import CHARTS, SAMPLE_VERSIONS
from .conftest import Cluster, unique

ROOT = Path(__file__).resolve().parents[2]
IMAGE_REPOSITORY = "ghcr.io/openkcm/krypton"  # the chart's default image
SELF = "self-cluster"


@dataclass
class Bed:
    cluster: Cluster
    node: Node
    repo: ChartRepository
    testbin: Path

    def kubectl(self, *args: str, check: bool = True,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.testbin / "kubectl"), "--kubeconfig",
                               str(self.cluster.cp.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, check=check)

    def install_operator(self, namespace: str = "krypton-system", **values: Any) -> None:
        """``helm install`` of the operator chart, as its install page says, with the test
        chart repository (served on the node's bridge, where the pod reaches it)."""
        chart = {"repo": self.repo.url, "name": "workload", "version": "1.0.0"}
        merged = {"image": {"pullPolicy": "Never"}, "helm": {"timeout": "60s"},
                  **values, "chart": {**chart, **values.get("chart", {})}}
        subprocess.run([str(self.testbin / "helm"), "install", "krypton", str(ROOT / "chart"),
                        "--namespace", namespace, "--create-namespace", "--values", "-",
                        "--kubeconfig", str(self.cluster.cp.kubeconfig)],
                       input=yaml.safe_dump(merged), check=True, capture_output=True, text=True)

    def register(self, name: str, values: str | None = None) -> None:
        """A kubeconfig Secret for this cluster under another name, as a pod reaches it (the
        ``kubernetes`` Service address), with per-cluster chart values."""
        config = self.cluster.cp.kubeconfig_dict()
        for entry in config["clusters"]:  # type: ignore[attr-defined]
            entry["cluster"]["server"] = f"https://{API_SERVICE_IP}:443"
        self.cluster.ensure_namespace("krypton-system")
        self.cluster.core.create_namespaced_secret("krypton-system", kubeconfig_secret(
            name, yaml.safe_dump(config), namespace="krypton-system", values=values))

    def wait_rollout(self, namespace: str = "krypton-system", timeout: int = 120) -> None:
        done = self.kubectl("-n", namespace, "rollout", "status", "deploy/krypton",
                            f"--timeout={timeout}s", check=False)
        if done.returncode != 0:
            pods = self.kubectl("-n", namespace, "describe", "pods", check=False).stdout
            logs = self.kubectl("-n", namespace, "logs", "deploy/krypton", "--tail=30",
                                check=False)
            pytest.fail(f"the operator pod did not become ready: {done.stderr}\n{pods[-3000:]}"
                        f"\n{logs.stdout}{logs.stderr}")

    def pods(self, namespace: str, selector: str) -> list[client.V1Pod]:
        return list(self.cluster.core.list_namespaced_pod(
            namespace, label_selector=selector).items)

    def operator_pods(self, namespace: str = "krypton-system") -> list[client.V1Pod]:
        return [p for p in self.pods(namespace, "app.kubernetes.io/name=krypton")
                if p.metadata.deletion_timestamp is None]


@pytest.fixture
def bed(testbin: Path, helm_bin: str) -> Iterator[Bed]:
    path = archive()
    if not path.exists():
        pytest.fail(f"{path} is missing: run make image (make test does)")
    missing = [t for t in ("containerd", "runc", "ctr", "iptables") if not shutil.which(t)]
    if missing:
        pytest.fail(f"the real node needs {', '.join(missing)}: run make runtime (make test does)")
    with ControlPlane("real", testbin, auth="cert", real_node=True).start() as cp:
        node = cp.node
        assert node is not None
        node.import_image(path, base_name=IMAGE_REPOSITORY)
        repo = ChartRepository(helm_bin, host=node.ip)
        for version in SAMPLE_VERSIONS:
            repo.publish(CHARTS / "sample", version)
        repo.publish(CHARTS / "workload")
        repo.start()
        try:
            yield Bed(Cluster("real", cp), node, repo, testbin)
        finally:
            repo.close()
    # no process, mount, network namespace, iptables rule, bridge, cgroup or kernel setting
    # of the node survives it
    assert node.leftovers() == []


def test_the_operator_runs_as_a_real_pod_and_its_tenants_pods_run(bed: Bed) -> None:
    """The image and chart as a user installs them: the pod becomes Ready by the chart's own
    probes, runs as the chart's non-root user on a read-only root filesystem, and installs a
    Tenant whose chart pods and hook Job really run."""
    bed.install_operator()
    bed.wait_rollout()
    (pod,) = bed.operator_pods()
    # what the kubelet gave the container, seen from inside it
    assert bed.kubectl("-n", "krypton-system", "exec", pod.metadata.name, "--", "id", "-u"
                       ).stdout.strip() == "65532"
    mounts = bed.kubectl("-n", "krypton-system", "exec", pod.metadata.name, "--", "cat",
                         "/proc/self/mounts").stdout.splitlines()
    (root,) = [m.split() for m in mounts if m.split()[1] == "/"]
    assert "ro" in root[3].split(","), root

    home = bed.cluster
    home.ensure_namespace("team-a")
    name = unique("web")
    home.create_tenant("team-a", name)
    home.wait_phase("team-a", name, "Ready", timeout=120)
    release = f"tenant-{name}-{SELF}"
    deployment = client.AppsV1Api(home.api).read_namespaced_deployment(release, name)
    assert deployment.status.ready_replicas == 2
    job = client.BatchV1Api(home.api).read_namespaced_job(f"{release}-smoke", name)
    assert job.status.succeeded == 1  # the hook's container ran and exited 0
    for p in bed.pods(name, f"app.kubernetes.io/instance={release}"):
        if p.metadata.owner_references[0].kind == "ReplicaSet":
            assert ipaddress.ip_address(p.status.pod_ip) in ipaddress.ip_network(bed.node.subnet)
    assert pod.status.container_statuses[0].restart_count == 0

    # an image that was not imported is never fetched: every registry is a closed port
    home.core.create_namespaced_pod("team-a", {"metadata": {"name": "elsewhere"}, "spec": {
        "containers": [{"name": "c", "image": "registry.example/never:1"}]}})
    pulled = wait_for(lambda: [e.message for e in home.events("team-a", "elsewhere")
                               if e.reason == "Failed" and "pull" in e.message.lower()], 60,
                      what="the pull refused")
    assert any("127.0.0.1:9" in m for m in pulled), pulled


def test_namespaced_mode_runs_as_a_real_pod_with_roles_only(bed: Bed) -> None:
    """Namespaced mode (O5) as a pod: Roles only, the CRD applied beforehand by an
    administrator, the release and its running pods in the watch namespace."""
    home = bed.cluster
    home.ensure_namespace("team-n")
    bed.kubectl("apply", "-f", str(ROOT / "crds"))
    bed.install_operator(namespace="krypton-n", watchNamespace="team-n")
    bed.wait_rollout("krypton-n")
    kinds = set(bed.kubectl("get", "clusterroles,clusterrolebindings", "-o",
                            "jsonpath={.items[*].metadata.name}").stdout.split())
    assert not {k for k in kinds if k.startswith("krypton")}, kinds
    name = unique("web")
    home.create_tenant("team-n", name)
    home.wait_phase("team-n", name, "Ready", timeout=120)
    release = f"tenant-{name}-{SELF}"
    deployment = client.AppsV1Api(home.api).read_namespaced_deployment(release, "team-n")
    assert deployment.status.ready_replicas == 2


def test_readiness_crash_loops_and_failing_hooks_are_the_kubelets(bed: Bed) -> None:
    """F6 with real pods, one Tenant on three names of the cluster, each with its own values:
    on "late" the pods answer their probe after 8 s and the release is Ready once they do; on
    "crash" the container exits at once (a crash loop) and the release ends in
    ReadinessTimeout; on "hook" the hook Job's container exits 1 and the install fails."""
    for name, values in (("late", "readyAfter: 8\nhook: false\n"),
                         ("crash", "crash: true\nhook: false\n"),
                         ("hook", "hookFails: true\n")):
        bed.register(name, values)
    bed.install_operator(selfCluster={"enabled": False},
                         extraArgs=["--helm-timeout=25s", "--allow-duplicate-clusters"])
    bed.wait_rollout()
    home = bed.cluster
    home.ensure_namespace("team-a")
    name = unique("web")
    home.create_tenant("team-a", name)

    home.wait_condition("team-a", name, "ClusterProgress/late", "True", "WaitingForReadiness",
                        timeout=60)
    home.wait_condition("team-a", name, "ClusterReady/late", "True", timeout=60)

    c = home.wait_condition("team-a", name, "ClusterError/crash", "True", "ReadinessTimeout",
                            timeout=120)
    assert "0 of 2 replicas available" in c["message"], c
    statuses = [s for p in bed.pods(name, f"app.kubernetes.io/instance=tenant-{name}-crash")
                for s in p.status.container_statuses or []]
    assert statuses and all(s.restart_count > 0 or (s.state.waiting and s.state.waiting.reason
                                                    == "CrashLoopBackOff") for s in statuses)

    c = home.wait_condition("team-a", name, "ClusterError/hook", "True", "InstallFailed",
                            timeout=120)
    assert "smoke" in c["message"], c
    assert home.phase("team-a", name) == "Error"


def _lease(home: Cluster, namespace: str) -> client.V1Lease:
    return client.CoordinationV1Api(home.api).read_namespaced_lease("krypton-leader", namespace)


def _lease_holder(home: Cluster, namespace: str) -> str:
    return str(_lease(home, namespace).spec.holder_identity or "").split("_", 1)[0]


def test_leadership_moves_when_the_kubelet_deletes_the_leader_pod(bed: Bed) -> None:
    """Two replicas; the leader's pod is deleted as a user or a drain deletes it: the kubelet
    sends SIGTERM, the operator releases its Lease on the way out and the other replica
    leads at once, without waiting for the Lease to expire."""
    bed.install_operator(replicaCount=2)
    bed.wait_rollout()
    home = bed.cluster
    leader = wait_for(lambda: _lease_holder(home, "krypton-system") or None, 60,
                      what="a leader")
    assert leader in {p.metadata.name for p in bed.operator_pods()}
    home.ensure_namespace("team-a")
    first = unique("first")
    home.create_tenant("team-a", first)
    home.wait_phase("team-a", first, "Ready", timeout=120)

    bed.kubectl("-n", "krypton-system", "delete", "pod", leader, "--wait=false")
    started = time.monotonic()
    successor = wait_for(lambda: (h := _lease_holder(home, "krypton-system")) not in ("", leader)
                         and h, 60, what="a new leader")
    # the Lease lasts 15 s: a successor within it means the old leader released it
    assert time.monotonic() - started < 15, "the Lease was not released on SIGTERM"
    assert successor in {p.metadata.name for p in bed.operator_pods()}
    second = unique("second")
    home.create_tenant("team-a", second)
    home.wait_phase("team-a", second, "Ready", timeout=120)


def test_a_pod_deleted_while_helm_runs_leaves_nothing_pending(bed: Bed) -> None:
    """SIGTERM while helm --wait holds a release whose pods answer only after 20 s, longer
    than the Lease (15 s): the old pod finishes its helm run within its grace and keeps the
    Lease until then; its successor leads only afterwards and has nothing to redo."""
    bed.install_operator(helm={"wait": True, "timeout": "60s"},
                         chart={"values": {"readyAfter": 20, "hook": False}})
    bed.wait_rollout()
    home = bed.cluster
    home.ensure_namespace("team-a")
    name = unique("slow")
    release = f"tenant-{name}-{SELF}"
    home.create_tenant("team-a", name)
    wait_for(lambda: _records(home, name, release) == [(1, "pending-install")], 60,
             what="helm install under way")
    (pod,) = bed.operator_pods()
    bed.kubectl("-n", "krypton-system", "delete", "pod", pod.metadata.name, "--wait=false")
    home.wait_phase("team-a", name, "Ready", timeout=180)
    # the helm run outlasted the Lease (15 s): the old pod kept renewing it until its run was
    # over, so its successor led only after the old one wrote the Tenant Ready
    ready = home.condition("team-a", name, "Ready")
    assert ready is not None
    lease = wait_for(lambda: _lease_holder(home, "krypton-system") not in ("", pod.metadata.name)
                     and _lease(home, "krypton-system"), 60, what="a new leader")
    acquired = lease.spec.acquire_time.replace(microsecond=0)
    assert acquired >= dt.datetime.fromisoformat(ready["lastTransitionTime"]), \
        (lease.spec.acquire_time, ready)
    # the old pod finished its helm within its grace: revision 1 is deployed, and its
    # successor had nothing to redo
    assert _records(home, name, release) == [(1, "deployed")]
    (successor,) = bed.operator_pods()
    assert successor.metadata.name != pod.metadata.name
    logs = bed.kubectl("-n", "krypton-system", "logs", successor.metadata.name).stdout
    assert not any(said in logs for said in ("helm install start", "helm upgrade start",
                                             "release left failed")), logs


def _records(cluster: Cluster, namespace: str, release: str) -> list[tuple[int, str]]:
    """Helm release records as the chart's default driver (configmap) stores them."""
    items = cluster.core.list_namespaced_config_map(
        namespace, label_selector=f"owner=helm,name={release}").items
    return sorted((int(c.metadata.labels["version"]), c.metadata.labels["status"]) for c in items)


def _memory_peak(node: Node, pod: client.V1Pod) -> int:
    """The largest memory use of the pod's cgroup, in bytes (cgroup v1)."""
    pods = Path("/sys/fs/cgroup/memory") / node.cgroup_root[1:] / "kubepods"
    # Guaranteed pods sit right under kubepods, the others under their QoS class
    (found,) = [*pods.glob(f"pod{pod.metadata.uid}/memory.max_usage_in_bytes"),
                *pods.glob(f"*/pod{pod.metadata.uid}/memory.max_usage_in_bytes")]
    return int(found.read_text())


def test_fifty_releases_stay_under_the_charts_memory_limit(bed: Bed,
                                                           record_property: Any) -> None:
    """The chart's default memory limit holds the operator and its helm processes while it
    installs 50 releases at its default concurrency: no container is OOM-killed or
    restarted, and the pod's peak is recorded."""
    bed.install_operator(chart={"name": "sample", "version": "0.2.0"})
    bed.wait_rollout()
    (pod,) = bed.operator_pods()
    limit = pod.spec.containers[0].resources.limits["memory"]
    home = bed.cluster
    home.ensure_namespace("team-a")
    names = [f"m{i:02d}-{unique('t')}"[:40] for i in range(50)]
    for name in names:
        home.create_tenant("team-a", name)
    for name in names:
        home.wait_phase("team-a", name, "Ready", timeout=300)
    (after,) = bed.operator_pods()
    assert after.metadata.uid == pod.metadata.uid
    status = after.status.container_statuses[0]
    assert status.restart_count == 0 and status.last_state.terminated is None, status
    peak = _memory_peak(bed.node, after)
    record_property("operator_memory_peak_mib", round(peak / 2**20, 1))
    print(f"operator pod memory peak {peak / 2**20:.1f} MiB under a limit of {limit}")
    assert limit == "1280Mi"  # the chart's default, as users get it
