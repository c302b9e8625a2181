"""What runs pods on a test control plane: the controller manager with the workload
controllers, the scheduler, and kwok's simulated nodes (SPEC T6); a real node is
:mod:`krypton.testing.node`'s. Each is started on a free port and waited for until it
listens.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from .host import RETRIED_STARTS, ControlPlaneError, Process, free_port


class Plane(Protocol):
    """What the workload processes need of their control plane
    (:class:`~krypton.testing.controlplane.ControlPlane`)."""

    name: str
    bin_dir: Path
    workdir: Path
    kubeconfig: Path
    nodes: int
    real_node: bool
    pod_ready_delay: float
    startup_timeout: float
    with_controller_manager: bool

    def binary(self, name: str) -> str: ...


class Workloads:
    """The workload processes of one control plane, as its settings ask for them."""

    def __init__(self, cp: Plane) -> None:
        self.cp = cp
        self._kcm: Process | None = None
        self._scheduler: Process | None = None
        self._kwok: Process | None = None

    @property
    def processes(self) -> tuple[Process | None, ...]:
        return self._kcm, self._scheduler, self._kwok

    def start(self) -> None:
        cp = self.cp
        if cp.with_controller_manager:
            self._start_controller_manager()
        if cp.nodes or cp.real_node:
            self._start_scheduler()
        if cp.nodes:
            self._start_simulated_nodes()

    def stop(self) -> None:
        for proc in (self._kwok, self._scheduler, self._kcm):
            if proc is not None:
                proc.stop()
        self._kwok = self._scheduler = self._kcm = None

    def start_listening(self, name: str, argv: Any, log: Path) -> Process:
        """Start `name` with `argv(port)` on a free port and wait until it listens there. A
        start that failed for a reason of the moment (:data:`RETRIED_STARTS`) is tried again
        on a new port, up to five times; any other failure is an error at once."""
        for _ in range(5):
            port = free_port()
            proc = Process(name, argv(port), log)
            offset = proc.log_size()
            proc.start()
            deadline = time.monotonic() + self.cp.startup_timeout
            while proc.alive() and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return proc
                except OSError:
                    time.sleep(0.2)
            proc.stop()
            if not any(cause in proc.said_since(offset) for cause in RETRIED_STARTS):
                raise ControlPlaneError(f"{name} of {self.cp.name} did not start:\n{proc.tail()}")
        raise ControlPlaneError(f"{name} of {self.cp.name} did not start in five tries:\n"
                                f"{proc.tail()}")

    def _start_controller_manager(self) -> None:
        w = self.cp.workdir
        self._kcm = self.start_listening("kube-controller-manager", lambda port: [
            self.cp.binary("kube-controller-manager"),
            "--kubeconfig", str(self.cp.kubeconfig),
            "--bind-address", "127.0.0.1",
            "--secure-port", str(port),
            "--leader-elect=false",
            "--controllers", ",".join(
                CONTROLLERS + (WORKLOAD_CONTROLLERS if self.cp.nodes or self.cp.real_node else ())
                # kube-root-ca.crt in every namespace, for the pods' token volumes
                + (("root-ca-cert-publisher",) if self.cp.real_node else ())),
            "--service-account-private-key-file", str(w / "sa.key"),
            "--root-ca-file", str(w / "ca.crt"),
            "--cert-dir", str(w / "kcm-certs"),
        ], w / "kube-controller-manager.log")

    def _start_scheduler(self) -> None:
        w = self.cp.workdir
        self._scheduler = self.start_listening("kube-scheduler", lambda port: [
            self.cp.binary("kube-scheduler"), "--kubeconfig", str(self.cp.kubeconfig),
            "--authentication-kubeconfig", str(self.cp.kubeconfig),
            "--authorization-kubeconfig", str(self.cp.kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(port),
            "--leader-elect=false", "--cert-dir", str(w / "scheduler-certs")],
            w / "kube-scheduler.log")

    def _start_simulated_nodes(self) -> None:
        """kwok with its stages, and `nodes` fake nodes (SPEC T6).

        kwok plays the kubelet: nodes become Ready, pods scheduled onto them become Ready
        after `pod_ready_delay` seconds, pods of Jobs complete, deleted pods go away.
        """
        w = self.cp.workdir
        stages = w / "kwok-stages.yaml"
        stages.write_text(kwok_stages(self.cp.bin_dir / "kwok-stages", self.cp.pod_ready_delay))
        self._kwok = self.start_listening("kwok", lambda port: [
            self.cp.binary("kwok"), "--kubeconfig", str(self.cp.kubeconfig), "--config", str(stages),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector", f"{KWOK_ANNOTATION}=fake",
            "--cidr", "10.244.0.0/16", "--node-ip", "127.0.0.1",
            # the node Leases in kube-node-lease, renewed as a kubelet renews them: the
            # heartbeat stage updates a node's status only every 10-20 minutes and counts on
            # them, and without them the node lifecycle controller marks every node NotReady
            # (and every pod Ready=False) after its 50 s grace period (SPEC F5b)
            "--node-lease-duration-seconds", str(NODE_LEASE_SECONDS),
            "--server-address", f"127.0.0.1:{port}"],
            w / "kwok.log")
        nodes = [node_manifest(f"{self.cp.name}-node-{i}") for i in range(self.cp.nodes)]
        self._kubectl_apply(nodes)

    def _kubectl_apply(self, objects: list[dict[str, object]]) -> None:
        manifest = self.cp.workdir / "apply.yaml"
        manifest.write_text(yaml.safe_dump_all(objects))
        deadline = time.monotonic() + self.cp.startup_timeout
        while True:
            done = subprocess.run([self.cp.binary("kubectl"), "--kubeconfig", str(self.cp.kubeconfig),
                                   "apply", "-f", str(manifest)], capture_output=True, text=True)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"kubectl apply failed: {done.stderr[-500:]}")
            time.sleep(0.5)


def node_manifest(name: str) -> dict[str, object]:
    """A fake node that kwok manages: 32 CPUs, 256 GiB, 110 pods, with the well-known
    labels a kubelet sets (charts select on ``kubernetes.io/os: linux``)."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                    "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64",
                                    "node.kubernetes.io/instance-type": "kwok"}},
            "status": {"capacity": capacity, "allocatable": capacity}}


KWOK_ANNOTATION = "kwok.x-k8s.io/node"
NODE_LEASE_SECONDS = 40  # a kubelet's default
CONTROLLERS = ("namespace", "garbagecollector", "serviceaccount", "serviceaccount-token")
WORKLOAD_CONTROLLERS = ("nodelifecycle", "deployment", "replicaset", "statefulset", "daemonset", "job",
                        "endpoint", "endpointslice", "podgc", "ttl-after-finished")
KWOK_STAGES = ("node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete",
               "pod-delete")


def kwok_stages(directory: Path, pod_ready_delay: float) -> str:
    """The stage definitions kwok's module ships (copied next to the binaries by
    hack/testbin.sh), with the pod-ready stage delayed by `pod_ready_delay` seconds."""
    docs = []
    for name in KWOK_STAGES:
        stage = yaml.safe_load((directory / f"{name}.yaml").read_text())
        if name == "pod-ready":
            stage["spec"]["delay"] = {"durationMilliseconds": int(pod_ready_delay * 1000)}
        docs.append(stage)
    docs.append(LOAD_BALANCER_STAGE)
    return str(yaml.safe_dump_all(docs, sort_keys=False))


# The test bed's load-balancer controller: a Service of type LoadBalancer gets an ingress
# address (loopback), as a cloud's controller would give it one, so that charts with one
# (ingress-nginx's shape) become ready on simulated nodes.
LOAD_BALANCER_STAGE: dict[str, object] = {
    "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage",
    "metadata": {"name": "service-load-balancer"},
    "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Service"},
        "selector": {"matchExpressions": [
            {"key": ".spec.type", "operator": "In", "values": ["LoadBalancer"]},
            {"key": ".status.loadBalancer.ingress", "operator": "DoesNotExist"}]},
        "next": {"statusTemplate": "loadBalancer:\n  ingress:\n  - ip: 127.0.0.1\n"},
    },
}
