"""(a), (b), (c) and (s): a fleet installed, resynced, restarted and bumped; the fleet's shape."""

from __future__ import annotations

import functools
import socket
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from ..host import free_port, terminate
from ..operator import (
    OperatorProcess,
    wait_for,
)
from .bed import Bed, PlaneLoad, per_release, ready, requests_by_kind
from .config import FLEET_RESYNC, ROOT, SHAPE_TENANTS, SIZES
from .process import TreeMemory, cpu_per_release, cpu_seconds, log, peak_rss_mib, profiled, tree_cpu_seconds
from .streams import Streams, commit_to_stream


def fleet_run(bed: Bed, n: int, *extra: str, prefix: str = "t", bump: bool = False,
              proxy: str = "", streams: int = 0) -> dict[str, Any]:
    """(a), and with the largest N (b) and (c); with `extra` operator flags, (a) alone; with
    `bump`, (a) and (c) (as (x) takes turns with Flux). With `proxy`, the clusters are
    reached through it (p): their kubeconfigs name them by a name only the proxy resolves,
    and the operator's environment (its helm's too) names the proxy. With `streams`, that
    many event streams are open on the fleet page meanwhile (v)."""
    discovery = bed.namespace("bench-disc", ("home",))
    ns = bed.namespace("bench")
    for c in bed.clusters:
        for i in range(n):
            bed.create_tenant(c, ns, f"{prefix}{n}-{i:03d}")
    for c, cp in bed.clusters.items():
        port = urlsplit(cp.server).port
        bed.register(discovery, c, c, server=f"https://{PROXIED_NAME}:{port}" if proxy else "")
    env = {"HTTPS_PROXY": proxy, "NO_PROXY": ""} if proxy else {}
    log(f"(a) {n} Tenants x 2 clusters: starting the operator {' '.join(extra)}")
    load = PlaneLoad(bed)
    start = time.monotonic()
    # (x) measures no resync: the default period (10 min), as Flux's interval is
    resync = () if bump else ("--resync-period", f"{FLEET_RESYNC:.0f}s")
    op = bed.operator(discovery, ns, "0.2.0", *resync, *extra, env=env)
    memory = TreeMemory(op.pid)
    total = 2 * n
    with profiled(op.pid, f"install-{n}"), Streams(op.web_port, streams) as watching:
        wait_for(lambda: bed.count(ns, ready("0.2.0")) == total, 1800, interval=0.5,
                 what=f"{total} Ready")
    seconds = time.monotonic() - start
    own, helm = tree_cpu_seconds(op.pid)
    counts = per_release(op, total)
    result: dict[str, Any] = {"tenants_per_cluster": n, "releases": total, **counts,
                              "seconds_to_ready": round(seconds, 1),
                              "releases_per_second": round(total / seconds, 2),
                              "operator_cpu_seconds": round(own, 2),
                              "helm_cpu_seconds": round(helm, 2),
                              **cpu_per_release(own, helm, total),
                              "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
                              **load.per_release(total), **memory.peak()}
    if streams:
        result["commit_to_stream"] = commit_to_stream(watching)
    log(f"(a) {total} releases Ready in {seconds:.1f}s")
    if seconds >= FLEET_RESYNC and not bump:
        log(f"(a) took longer than --resync-period {FLEET_RESYNC:.0f}s: its figures include "
            "a resync's passes")
    if (bump or n == max(SIZES)) and not extra:
        if not bump:
            result["noop_resync"] = noop_resync(op, total)
        op.stop()
        if not bump:
            result["restart_settled"] = restart_settled(bed, discovery, ns, total)
        op, result["version_bump"] = _bump(bed, discovery, ns, total, env, streams)
    op.stop()
    return result


def _bump(bed: Bed, discovery: str, ns: str, total: int, env: dict[str, str], streams: int = 0
          ) -> tuple[OperatorProcess, dict[str, Any]]:
    """(c): an operator started with the next chart version, until every release is Ready
    at it; the operator (still running) and its figures."""
    log(f"(c) chart bump 0.2.0 -> 0.3.0 through {total} releases")
    load = PlaneLoad(bed)
    start = time.monotonic()
    op = bed.operator(discovery, ns, "0.3.0", env=env)
    memory = TreeMemory(op.pid)
    with profiled(op.pid, f"bump-{total // 2}"), Streams(op.web_port, streams):
        wait_for(lambda: bed.count(ns, ready("0.3.0")) == total, 1800, interval=0.5,
                 what="bump rolled out")
    bumped = time.monotonic() - start
    own, helm = tree_cpu_seconds(op.pid)
    log(f"(c) bump done in {bumped:.1f}s")
    return op, {"seconds": round(bumped, 1), **per_release(op, total),
                "releases_per_second": round(total / bumped, 2), **load.per_release(total),
                **cpu_per_release(own, helm, total), **memory.peak()}


def fleet_shape(bed: Bed, m: int) -> dict[str, Any]:
    """(s) A fleet's shape: `m` cluster names (half of them for each control plane), each with
    `SHAPE_TENANTS` Tenants of its own (spec.clusterRef), so that each cluster's helm serves
    a few releases and goes idle; seconds until all are Ready, then a chart bump, each with
    CPU per release and the peak memory of the operator's tree."""
    discovery = bed.namespace("shape-disc", ("home",))
    ns = bed.namespace("shape")
    names = [(c, f"s{i:03d}-{c}") for i in range(m // 2) for c in bed.clusters]
    for c, name in names:
        for k in range(SHAPE_TENANTS):
            bed.create_tenant(c, ns, f"{name}-{k}", target=name)
    for c, name in names:
        bed.register(discovery, name, c)
    total = len(names) * SHAPE_TENANTS

    def done(version: str) -> Any:
        def check(_cluster: str, t: dict[str, Any]) -> bool:
            status = t.get("status") or {}
            target = ((t.get("spec") or {}).get("clusterRef") or {}).get("secretName", "")
            mine = (status.get("clusters") or {}).get(target) or {}
            return status.get("phase") == "Ready" and mine.get("chartVersion") == version
        return check

    result: dict[str, Any] = {"clusters": len(names), "releases": total}
    for version, key in (("0.2.0", "install"), ("0.3.0", "version_bump")):
        log(f"(s) {len(names)} clusters x {SHAPE_TENANTS} Tenants: chart {version}")
        load, start = PlaneLoad(bed), time.monotonic()
        op = bed.operator(discovery, ns, version)
        memory = TreeMemory(op.pid)
        wait_for(functools.partial(lambda check: bed.count(ns, check) == total, done(version)),
                 1800, interval=1.0, what=f"{total} at {version}")
        seconds = time.monotonic() - start
        own, helm = tree_cpu_seconds(op.pid)
        result[key] = {"seconds": round(seconds, 1), **per_release(op, total),
                       **cpu_per_release(own, helm, total), **load.per_release(total),
                       **memory.peak()}
        log(f"(s) {total} releases at {version} in {seconds:.1f}s")
        op.stop()
    return result


def release_index_bytes(releases: int = 2000, revisions: int = 2) -> float:
    """Bytes the release index keeps per release record, measured in this process with
    tracemalloc on records shaped like the bench's (names, UIDs, labels of a helm run)."""
    import tracemalloc

    from krypton.decisions.releases import ReleaseIndex

    def records() -> list[dict[str, Any]]:
        return [{"metadata": {"namespace": f"t200-{i:04d}", "name":
                              f"sh.helm.release.v1.tenant-t200-{i:04d}-home.v{r}",
                              "resourceVersion": str(100000 + i * revisions + r), "labels": {
                                  "owner": "helm", "name": f"tenant-t200-{i:04d}-home",
                                  "version": str(r), "status": "deployed" if r == revisions
                                  else "superseded", "modifiedAt": str(1790000000 + r),
                                  "mesh.openkcm.io/tenant-uid": str(uuid.uuid4()),
                                  "mesh.openkcm.io/cluster": "home"}}}
                for i in range(releases) for r in range(1, revisions + 1)]

    def once() -> float:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        index = ReleaseIndex()
        index.replace(records())  # the records (as a list hands them over) are dropped after
        kept = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return kept / (releases * revisions) if index.names() else 0.0

    # the least of three: whatever another thread of this process allocates meanwhile (the
    # memory sampler, a wait) is counted too, and only ever adds
    return round(min(once() for _ in range(3)), 1)


def noop_resync(op: OperatorProcess, total: int) -> dict[str, Any]:
    log("(b) waiting for the fleet to settle, then measuring one full resync")
    time.sleep(5)
    passes = op.metric("krypton_reconciles_total")
    helm = op.metric("krypton_helm_processes_total")
    requests = op.metric("krypton_api_requests_total")
    by_kind = requests_by_kind(op)
    writes = op.metric("krypton_api_writes_total")
    cpu, _ = cpu_seconds(op.pid)
    wait_for(lambda: op.metric("krypton_reconciles_total") >= passes + total, FLEET_RESYNC + 60,
             interval=0.5, what="a full resync")
    time.sleep(1)
    after_cpu, _ = cpu_seconds(op.pid)
    result = {
        "reconciles": int(op.metric("krypton_reconciles_total") - passes),
        "helm_processes": int(op.metric("krypton_helm_processes_total") - helm),
        "api_requests": int(op.metric("krypton_api_requests_total") - requests),
        "api_writes": int(op.metric("krypton_api_writes_total") - writes),
        "api_requests_by_kind": {k: int(v - by_kind.get(k, 0))
                                 for k, v in requests_by_kind(op).items()
                                 if v > by_kind.get(k, 0)},
        "operator_cpu_seconds": round(after_cpu - cpu, 2),
    }
    log(f"(b) no-op resync: {result}")
    return result


def restart_settled(bed: Bed, discovery: str, ns: str, total: int) -> dict[str, Any]:
    """The operator's fixed cost: started on the settled fleet, its CPU once every Tenant
    has had its first pass (nothing to do: imports, connections, lists, 400 skips)."""
    log("(b) restarting the operator on the settled fleet")
    start = time.monotonic()
    op = bed.operator(discovery, ns, "0.2.0")
    wait_for(lambda: op.metric("krypton_reconciles_total") >= total, 300, interval=0.1,
             what="a first pass of every Tenant")
    seconds = time.monotonic() - start
    cpu, _ = cpu_seconds(op.pid)
    result = {"operator_cpu_seconds": round(cpu, 2), "seconds": round(seconds, 1),
              "helm_processes": int(op.metric("krypton_helm_processes_total")),
              "api_writes": int(op.metric("krypton_api_writes_total"))}
    op.stop()
    log(f"(b) restart on the settled fleet: {result}")
    return result


PROXIED_NAME = "kubernetes.default.svc"  # (p): in the API servers' certificates, resolved by none


def proxied(bed: Bed, n: int) -> dict[str, Any]:
    """(p): (a) and (c) at n x 2 with both clusters reached through a CONNECT proxy on
    loopback (krypton.testing.tunnel, a process of its own: its CPU is not the operator's)."""
    port = free_port()
    tunnel = subprocess.Popen([sys.executable, "-m", "krypton.testing.tunnel", str(port)],
                              cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: _listening(port), 30, interval=0.1, what="the proxy listening")
        log(f"(p) {n} x 2 through the proxy on port {port}")
        result = fleet_run(bed, n, prefix="p", bump=True, proxy=f"http://127.0.0.1:{port}")
        result["proxy_cpu_seconds"] = round(cpu_seconds(tunnel.pid)[0], 2)
        return result
    finally:
        terminate(tunnel, 5.0)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
