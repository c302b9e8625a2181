"""(g), (h), (i), (j): SIGTERM under load, sharding's failovers, real waiting, a failure storm."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from .. import ControlPlane
from ..operator import (
    OperatorProcess,
    cluster_holders,
    cmdline,
    descendants,
    kubeconfig_secret,
    logged_at,
    wait_for,
)
from .bed import Bed, helm_room, metric_total, per_release, ready, stopped_after
from .config import (
    FAILOVERS,
    POD_READY_DELAY,
    ROOT,
    STALL_MINUTES,
    STORM_MINUTES,
    STORM_TENANTS,
    WAITING_TENANTS,
)
from .process import TreeMemory, cpu_per_release, log, pct, profiled, tree_cpu_seconds

HELM_NAMES = ("helm", "krypton-helmworker")  # what runs helm: its binary, or krypton's worker


def sigterm_during_installs(bed: Bed, installs: int = 20) -> dict[str, Any]:
    """(g) SIGTERM while `installs` helm installs wait for Deployments that cannot become
    ready (no nodes); then a restarted operator, not waiting for readiness, converges."""
    discovery = bed.namespace("bench-term", ("home",))
    ns = bed.namespace("bench-term")
    bed.register(discovery, "remote", "remote")
    shutdown = 10.0
    args = ("--helm-wait=true", "--max-concurrent-helm", str(installs), "--max-concurrent-reconciles",
            str(installs), "--helm-timeout", "300s", "--shutdown-timeout", f"{shutdown:.0f}s",
            *helm_room(installs))
    op = bed.operator(discovery, ns, "0.1.0", *args, chart="hang")
    names = [f"term-{i:02d}" for i in range(installs)]
    for name in names:
        bed.create_tenant("remote", ns, name)

    # each install waits for its Deployment (the helm timeout is far off), so every install
    # started is one under way, in a helm process or in the cluster's helm worker alike
    wait_for(lambda: op.metric("krypton_helm_processes_total", operation="install") >= installs,
             300, interval=0.2, what=f"{installs} helm installs running")
    time.sleep(2)
    helm = [p for p in descendants(op.pid) if Path(cmdline(p)[0] or "x").name in HELM_NAMES]
    start = time.monotonic()
    code = op.stop(grace=120)
    seconds = time.monotonic() - start
    left = [p for p in helm if cmdline(p)]
    op = bed.operator(discovery, ns, "0.1.0", "--helm-wait=false", chart="hang")

    def deployed() -> bool:  # the chart's pods never run (no nodes): its releases are the end
        return all("deployed" in bed.release_states("remote", n) for n in names)
    wait_for(deployed, 600, interval=1.0, what="the restarted operator's releases deployed")
    op.stop()
    pending = sum(1 for n in names for status in bed.release_states("remote", n)
                  if status.startswith("pending"))
    result = {"installs": installs, "shutdown_timeout": shutdown, "exit_code": code,
              "seconds_to_exit": round(seconds, 1), "helm_processes_left": len(left),
              "releases_pending_after_restart": pending}
    log(f"(g) {result}")
    return result


class ShardedFleet:
    """(h) replicas of one sharding group over `clusters` cluster names (the two control
    planes under different names), with the default Lease settings."""

    def __init__(self, bed: Bed, clusters: int) -> None:
        self.bed, self.clusters = bed, clusters
        self.discovery = bed.namespace("bench-shard", ("home",))
        self.ns = bed.namespace("bench-shard")
        self.group = f"bench-{uuid.uuid4().hex[:5]}"
        for i in range(clusters):
            bed.register(self.discovery, f"s-{i:02d}", "home" if i % 2 == 0 else "remote")
        self.ops: dict[str, OperatorProcess] = {}

    def start(self, identity: str) -> None:
        self.ops[identity] = self.bed.operator(
            self.discovery, self.ns, "0.2.0", "--sharding", "--leader-election-id", self.group,
            "--shard-identity", identity)

    def settled(self) -> dict[str, str]:
        """cluster -> replica once every cluster is engaged where its Lease says."""
        def check() -> dict[str, str] | None:
            owners = cluster_holders(self.bed.api["home"], self.ns, self.group)
            loads = {r: list(owners.values()).count(r) for r in self.ops}
            done = len(owners) == self.clusters and set(owners.values()) == set(self.ops) and \
                all(op.metric("krypton_engaged_clusters") == loads[r]
                    for r, op in self.ops.items())
            return owners if done else None
        return wait_for(check, 600, interval=0.2, what="the clusters settled on the replicas")

    def engaged_after(self, clusters: list[str], since: float) -> float:
        """Seconds from `since` until each of `clusters` was engaged by a running replica
        (from their logs); waits until all were."""
        def latest() -> float | None:
            when: dict[str, float] = {}
            for op in self.ops.values():
                for entry in op.log_entries():
                    if entry.get("event") == "cluster engaged" and \
                            entry.get("cluster") in clusters and logged_at(entry) > since:
                        when[entry["cluster"]] = logged_at(entry)
            return max(when.values()) if len(when) == len(clusters) else None
        return wait_for(latest, 300, interval=0.2, what="the clusters engaged elsewhere") - since

    def stop(self) -> None:
        for op in self.ops.values():
            op.stop(grace=30)


def sharding(bed: Bed, clusters: int = 30) -> dict[str, Any]:
    log(f"(h) sharding: 3 replicas, {clusters} clusters, {FAILOVERS} kills")
    fleet = ShardedFleet(bed, clusters)
    try:
        for i in range(3):
            fleet.start(f"r{i}")
        before = fleet.settled()
        started = time.monotonic()
        fleet.start("r3")
        after = fleet.settled()
        joined = {"moved": sum(1 for c in before if after[c] != before[c]),
                  "to_newcomer": list(after.values()).count("r3"),
                  "seconds_to_settle": round(time.monotonic() - started, 1)}
        handed = [c for c, r in after.items() if r == "r3"]
        left = time.time()
        fleet.ops.pop("r3").stop(grace=30)
        handover = fleet.engaged_after(handed, left)
        kills = []
        for k in range(FAILOVERS):
            owners = fleet.settled()
            victim = f"r{k % 3}"
            lost = [c for c, r in owners.items() if r == victim]
            killed = time.time()
            fleet.ops.pop(victim).kill()
            kills.append(fleet.engaged_after(lost, killed))
            log(f"(h) kill {k + 1}: {len(lost)} clusters engaged elsewhere after "
                f"{kills[-1]:.1f} s")
            fleet.start(victim)
        result = {"replicas": 3, "clusters": clusters, "lease_duration": 15.0,
                  "retry_period": 2.0, "join": joined,
                  "sigterm_to_engaged_elsewhere_s": round(handover, 1),
                  "kill_to_engaged_elsewhere": {
                      "p50_s": round(statistics.median(kills), 1),
                      "p95_s": round(pct(kills, 0.95), 1), "samples": len(kills)}}
        log(f"(h) {result}")
        return result
    finally:
        fleet.stop()


def _simulated_tenants(bed: Bed, sims: list[ControlPlane], discovery: str, ns: str,
                       n: int) -> dict[str, Any]:
    """(i): the Tenant CRD and n Tenants in `ns` on each simulated cluster, each registered
    in `discovery`; a client of each."""
    apis = {cp.name: config.new_client_from_config(str(cp.kubeconfig)) for cp in sims}
    for cp in sims:
        subprocess.run([str(bed.tools / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                        "apply", "-f", str(ROOT / "crds")], check=True, capture_output=True)
        client.CoreV1Api(apis[cp.name]).create_namespace({"metadata": {"name": ns}})  # type: ignore[arg-type]
        custom = client.CustomObjectsApi(apis[cp.name])
        for i in range(n):
            custom.create_namespaced_custom_object(
                "mesh.openkcm.io", "v1alpha1", ns, "tenants",
                {"apiVersion": "mesh.openkcm.io/v1alpha1", "kind": "Tenant",
                 "metadata": {"name": f"w-{i:03d}", "namespace": ns}, "spec": {}})
        bed.core("home").create_namespaced_secret(discovery, kubeconfig_secret(  # type: ignore[arg-type]
            cp.name, cp.kubeconfig.read_text(), namespace=discovery))
    return apis


def _waited(bed: Bed, op: OperatorProcess, phase: str, version: str, n: int,
            all_ready: Callable[[str], bool], start: float) -> dict[str, Any]:
    """(i): one phase, until every Tenant is Ready at `version`: its figures, and when the
    last helm run ended (the rest of the wait is the pods')."""
    memory = TreeMemory(op.pid)
    helm_done: list[float] = []

    def done() -> bool:
        if not helm_done and op.metric(
                "krypton_helm_processes_total",
                operation="install" if version == "1.0.0" else "upgrade") >= 2 * n \
                and not any(Path((cmdline(p) or ["x"])[0]).name == "helm"
                            for p in descendants(op.pid)):
            helm_done.append(time.monotonic() - start)
        return all_ready(version)

    with profiled(op.pid, f"waiting-{phase}"):
        wait_for(done, 3600, interval=1.0, what=f"{2 * n} Ready at {version}")
    seconds = time.monotonic() - start
    own, helm = tree_cpu_seconds(op.pid)
    return {"seconds": round(seconds, 1),
            "helm_done_seconds": round(helm_done[0], 1) if helm_done else None,
            **per_release(op, 2 * n), **cpu_per_release(own, helm, 2 * n), **memory.peak()}


def real_waiting(bed: Bed, helm_wait: bool) -> dict[str, Any]:
    """(i) Two clusters with simulated nodes whose pods become Ready POD_READY_DELAY seconds
    after they are scheduled; WAITING_TENANTS Tenants on each, the workload chart (one pod per
    release, no hook): seconds until every Tenant is Ready, then seconds until a chart bump
    (it rolls the pod) is Ready everywhere. With `helm_wait` only the first is measured."""
    n, mode = WAITING_TENANTS, "helm --wait" if helm_wait else "krypton follows readiness"
    log(f"(i) {n} x 2 with pods Ready after {POD_READY_DELAY:.0f}s ({mode}): starting clusters")
    nodes = max(2, -(-n // 100) + 1)  # 110 pods per node
    sims = [ControlPlane(name, bed.tools, auth="token", nodes=nodes,
                         pod_ready_delay=POD_READY_DELAY).start() for name in ("sim-a", "sim-b")]
    values = Path(tempfile.mkstemp(prefix="bench-values-", suffix=".yaml")[1])
    values.write_text("hook: false\nreplicas: 1\n")
    try:
        discovery = bed.namespace("bench-wait", ("home",))
        ns = f"bench-wait-{uuid.uuid4().hex[:5]}"
        apis = _simulated_tenants(bed, sims, discovery, ns, n)

        def all_ready(version: str) -> bool:
            count = 0
            for name, api in apis.items():
                items = client.CustomObjectsApi(api).list_namespaced_custom_object(
                    "mesh.openkcm.io", "v1alpha1", ns, "tenants")["items"]  # type: ignore[index]
                count += sum(1 for t in items if ready(version)(name, t))
            return count == 2 * n

        args = ("--chart-values-file", str(values), f"--helm-wait={str(helm_wait).lower()}",
                "--helm-timeout", "300s")
        result: dict[str, Any] = {"tenants_per_cluster": n, "pod_ready_delay": POD_READY_DELAY,
                                  "helm_wait": helm_wait}
        phases = [("install", "1.0.0")] + ([] if helm_wait else [("bump", "1.1.0")])
        for phase, version in phases:
            start = time.monotonic()
            op = bed.operator(discovery, ns, version, *args, chart="workload")
            result[phase] = _waited(bed, op, phase, version, n, all_ready, start)
            log(f"(i) {phase}: {result[phase]}")
            op.stop()
        return result
    finally:
        values.unlink(missing_ok=True)
        for cp in sims:
            cp.stop()


def failure_storm(bed: Bed) -> dict[str, Any]:
    """(j) SPEC P3: N Tenants x 2 clusters whose upgrade always fails (a template `fail` in
    the central values): helm processes, API writes and Events per minute with the default
    schedule for STORM_MINUTES, then, with a short cap and budget (--retry-backoff-max 20s,
    --max-retries 3), how the counts fall to zero once every release is stalled."""
    discovery = bed.namespace("bench-disc", ("home",))
    ns = bed.namespace("storm")
    n = STORM_TENANTS
    for c in bed.clusters:
        for i in range(n):
            bed.create_tenant(c, ns, f"s-{i:03d}")
        bed.register(discovery, c, c)
    total = 2 * n
    bad = Path(tempfile.mkdtemp(prefix="krypton-bench-")) / "fail.yaml"
    bad.write_text("failRender: the upgrade of this chart always fails\n")
    result: dict[str, Any] = {"tenants_per_cluster": n, "releases": total}
    with stopped_after(bed.operator(discovery, ns, "0.2.0")):
        wait_for(lambda: bed.count(ns, ready("0.2.0")) == total, 1800, interval=0.5,
                 what=f"{total} Ready")
    log(f"(j) {total} releases whose upgrade fails, default schedule, {STORM_MINUTES} min")
    with stopped_after(bed.operator(discovery, ns, "0.3.0", "--chart-values-file",
                                    str(bad))) as op:
        op.wait_ready()
        result["default"] = {"settings": "--max-retries 8 --retry-backoff-max 600s",
                             **_per_minute(op, STORM_MINUTES, total)}
    log(f"(j) the same with --max-retries 3 --retry-backoff-max 20s, {STALL_MINUTES} min")
    with stopped_after(bed.operator(discovery, ns, "0.3.0", "--chart-values-file", str(bad),
                                    "--max-retries", "3", "--retry-backoff-max", "20s")) as op:
        op.wait_ready()
        result["stalling"] = {"settings": "--max-retries 3 --retry-backoff-max 20s",
                              **_per_minute(op, STALL_MINUTES, total)}
        result["stalling"]["stalled"] = sum(op.metric("krypton_releases_stalled", cluster=c)
                                            for c in bed.clusters)
    return result


def _per_minute(op: OperatorProcess, minutes: int, releases: int) -> dict[str, Any]:
    """helm processes, API writes and Events the operator made in each minute."""
    def counts() -> tuple[float, float, float]:
        text = op.metrics_text()
        return (metric_total(text, "krypton_helm_processes_total"),
                metric_total(text, "krypton_api_writes_total"),
                metric_total(text, 'krypton_api_writes_total{', 'kind="event"'))

    rows, last = [], counts()
    for _ in range(minutes):
        time.sleep(60)
        now = counts()
        rows.append([round(b - a) for a, b in zip(last, now, strict=True)])
        last = now
    helm = [r[0] for r in rows]
    return {"minutes": minutes, "helm_per_minute": helm,
            "writes_per_minute": [r[1] for r in rows],
            "events_per_minute": [r[2] for r in rows],
            "helm_runs_per_release": round(sum(helm) / releases, 2)}
