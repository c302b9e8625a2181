"""The bench's bed: two control planes, the chart repository, Tenants, and what the control planes did."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config

from krypton.decisions.memory import FLOOR, OPERATOR_SHARE

from .. import ChartRepository, ControlPlane, testbin
from ..operator import (
    OperatorProcess,
    kubeconfig_secret,
    logged_at,
)
from .config import OPERATOR_ARGS, OPERATOR_ENV, ROOT
from .process import cpu_seconds, log


class Bed:
    def __init__(self) -> None:
        self.tools = testbin()
        log("starting control planes and the chart repository")
        self.home = ControlPlane("home", self.tools, auth="cert").start()
        self.remote = ControlPlane("remote", self.tools, auth="token").start()
        self.repo = ChartRepository(self.tools / "helm")
        for version in ("0.2.0", "0.3.0"):
            self.repo.publish(ROOT / "tests" / "charts" / "sample", version)
        self.repo.publish(ROOT / "tests" / "charts" / "hang", "0.1.0")
        for version in ("1.0.0", "1.1.0"):
            self.repo.publish(ROOT / "tests" / "charts" / "workload", version)
        self.repo.start()
        self.clusters = {"home": self.home, "remote": self.remote}
        self.api = {n: config.new_client_from_config(str(cp.kubeconfig))
                    for n, cp in self.clusters.items()}
        for cp in self.clusters.values():
            subprocess.run([str(self.tools / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                            "apply", "-f", str(ROOT / "crds")], check=True, capture_output=True)

    def core(self, name: str) -> client.CoreV1Api:
        return client.CoreV1Api(self.api[name])

    def custom(self, name: str) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api[name])

    def namespace(self, prefix: str, clusters: tuple[str, ...] = ("home", "remote")) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:5]}"
        for c in clusters:
            self.core(c).create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        return ns

    def register(self, discovery: str, name: str, target: str, server: str = "") -> float:
        """A labelled Secret named `name` with the kubeconfig of control plane `target`
        (its server replaced by `server` when given)."""
        started = time.time()
        text = self.clusters[target].kubeconfig.read_text()
        if server:
            text = text.replace(self.clusters[target].server, server)
        self.core("home").create_namespaced_secret(discovery, kubeconfig_secret(  # type: ignore[arg-type]
            name, text, namespace=discovery))
        return started

    def create_tenant(self, cluster: str, ns: str, name: str, target: str = "") -> float:
        started = time.time()
        spec = {"clusterRef": {"secretName": target}} if target else {}
        self.custom(cluster).create_namespaced_custom_object(
            "mesh.openkcm.io", "v1alpha1", ns, "tenants",
            {"apiVersion": "mesh.openkcm.io/v1alpha1", "kind": "Tenant",
             "metadata": {"name": name, "namespace": ns}, "spec": spec})
        return started

    def tenants(self, cluster: str, ns: str) -> list[dict[str, Any]]:
        body = self.custom(cluster).list_namespaced_custom_object(
            "mesh.openkcm.io", "v1alpha1", ns, "tenants")
        return list(body["items"])  # type: ignore[index]

    def tenant_phase(self, cluster: str, ns: str, name: str) -> str:
        tenant: dict[str, Any] = self.custom(cluster).get_namespaced_custom_object(  # type: ignore[assignment]
            "mesh.openkcm.io", "v1alpha1", ns, "tenants", name)
        return str((tenant.get("status") or {}).get("phase") or "")

    def release_records(self, cluster: str) -> list[Any]:
        """Every Helm release record on control plane `cluster`."""
        return list(self.core(cluster).list_secret_for_all_namespaces(
            label_selector="owner=helm").items)

    def release_states(self, cluster: str, release_namespace: str) -> list[str]:
        """The status label of every Helm release record in `release_namespace`."""
        items = self.core(cluster).list_namespaced_secret(
            release_namespace, label_selector="owner=helm").items
        return [(s.metadata.labels or {}).get("status", "") for s in items]  # type: ignore[union-attr]

    def count(self, ns: str, predicate: Any) -> int:
        return sum(1 for c in self.clusters for t in self.tenants(c, ns) if predicate(c, t))

    def operator(self, discovery: str, ns: str, version: str, *extra: str,
                 chart: str = "sample", env: dict[str, str] | None = None) -> OperatorProcess:
        op = OperatorProcess([
            "--watch-kubeconfig", str(self.home.kubeconfig), "--namespace", discovery,
            "--watch-namespace", ns, "--no-self-cluster", "--allow-duplicate-clusters",
            "--chart-repo", self.repo.url,
            "--chart-name", chart, "--chart-version", version, "--log-level", "info",
            *extra, *OPERATOR_ARGS], helm_dir=self.tools, env={**OPERATOR_ENV, **(env or {})},
            image_imports=True)
        return op.start()

    def stop(self) -> None:
        self.repo.close()
        self.remote.stop()
        self.home.stop()


def ready(version: str) -> Any:
    def check(cluster: str, t: dict[str, Any]) -> bool:
        status = t.get("status") or {}
        mine = (status.get("clusters") or {}).get(cluster) or {}
        return status.get("phase") == "Ready" and mine.get("chartVersion") == version
    return check


def apiserver_writes(bed: Bed) -> float:
    """Create, update, patch and delete requests both control planes served so far."""
    total = 0.0
    for cp in bed.clusters.values():
        text = subprocess.run([str(bed.tools / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                               "get", "--raw", "/metrics"], check=True, capture_output=True,
                              text=True).stdout
        total += metric_total(text, "apiserver_request_total", 'verb="POST"') + \
            metric_total(text, "apiserver_request_total", 'verb="PUT"') + \
            metric_total(text, "apiserver_request_total", 'verb="PATCH"') + \
            metric_total(text, "apiserver_request_total", 'verb="DELETE"')
    return total


def control_plane_cpu(bed: Bed) -> float:
    """CPU seconds both control planes' processes (etcd, the API server and the rest) used so
    far."""
    return sum(cpu_seconds(pid)[0] for cp in bed.clusters.values() for pid in cp.pids)


class PlaneLoad:
    """What both control planes did from its making on: the writes they served and the CPU
    they used."""

    def __init__(self, bed: Bed) -> None:
        self.bed = bed
        self.writes, self.cpu = apiserver_writes(bed), control_plane_cpu(bed)

    def per_release(self, releases: int, own_edits: int = 0) -> dict[str, float]:
        """Both, per release, the bench's own `own_edits` not counted as writes."""
        return {"apiserver_writes_per_release": round(
                    (apiserver_writes(self.bed) - self.writes - own_edits) / releases, 2),
                "control_plane_cpu_ms_per_release": round(
                    1000 * (control_plane_cpu(self.bed) - self.cpu) / releases, 1)}


def helm_room(runs: int) -> tuple[str, str]:
    """--memory-limit with room for `runs` helm runs at once, each with its share (SPEC S7),
    so that --max-concurrent-helm is not lowered to what the default limit holds."""
    return "--memory-limit", str(OPERATOR_SHARE + (runs + 1) * FLOOR)


def per_release(op: OperatorProcess, releases: int) -> dict[str, Any]:
    """The operator's passes, API requests (by verb) and writes so far, per release."""
    return {"passes_per_release": round(op.metric("krypton_reconciles_total") / releases, 2),
            "requests_per_release": {k: round(v / releases, 2)
                                     for k, v in sorted(requests_by_kind(op).items())},
            "writes_per_release": round(op.metric("krypton_api_writes_total") / releases, 2)}


def requests_by_kind(op: OperatorProcess) -> dict[str, float]:
    """The operator's API requests so far, summed per verb (its `verb` label)."""
    found: dict[str, float] = {}
    for line in op.metrics_text().splitlines():
        if line.startswith("krypton_api_requests_total{"):
            head, _, value = line.rpartition(" ")
            kind = head.split('verb="', 1)[-1].split('"', 1)[0]
            found[kind] = found.get(kind, 0.0) + float(value)
    return found


@contextlib.contextmanager
def stopped_after(op: OperatorProcess) -> Iterator[OperatorProcess]:
    """A started operator, stopped however the block ends."""
    try:
        yield op
    finally:
        op.stop()


def metric_total(text: str, name: str, having: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and having in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engaged(op: OperatorProcess, cluster: str) -> bool:
    return op.metric("krypton_cluster_engaged", cluster=cluster) == 1


def log_time(op: OperatorProcess, event: str, **fields: str) -> float:
    return next((logged_at(e) for e in op.log_events(event, **fields)), 0.0)
