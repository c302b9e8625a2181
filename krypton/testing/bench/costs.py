"""(d), (e), (f) and (u): idle clusters, latencies, starvation and unit costs."""

from __future__ import annotations

import asyncio
import functools
import resource
import subprocess
import time
from typing import Any

from .. import BlackHole
from ..operator import (
    OperatorProcess,
    image_python,
    wait_for,
)
from .bed import Bed, engaged, log_time
from .process import cpu_seconds, log, peak_rss_mib, summary, threads


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _request_costs(bed: Bed, ns: str, n: int, result: dict[str, list[float]]) -> None:
    """(u): CPU per API request of each kind, krypton's own Kube against the home control
    plane, three rounds of `n`."""
    from krypton.adapters.clientconfig import configuration_from_file
    from krypton.adapters.kube import Kube
    from krypton.adapters.kubeapi import core_path

    event = {"metadata": {"generateName": "t.", "namespace": ns},
             "involvedObject": {"kind": "Tenant", "name": "t", "namespace": ns, "uid": "u"},
             "type": "Normal", "reason": "HelmInstalled", "count": 1,
             "message": "chart sample 0.2.0 installed as tenant-t-home revision 1"}
    path = f"{core_path('namespaces')}/{ns}"
    kube = Kube(await configuration_from_file(str(bed.home.kubeconfig),
                                              workdir=bed.home.workdir / "bench-tls"), name="home")
    kinds = {
        "get": lambda: kube.request("get namespace", "GET", path),
        "merge_patch": lambda: kube.request(
            "patch namespace", "PATCH", path, body={"metadata": {"labels": {"a": "b"}}},
            content_type="application/merge-patch+json"),
        "event_post": lambda: kube.create_event(ns, event),
    }
    for _ in range(200):  # connections made, caches warm
        await kinds["get"]()
    for _ in range(3):
        for kind, call in kinds.items():
            before = _cpu()
            for _ in range(n):
                await call()
            result.setdefault(f"request_{kind}_ms", []).append(
                round(1000 * (_cpu() - before) / n, 3))
    await kube.close()


async def _helm_process_costs(bed: Bed, spawns: int, result: dict[str, list[float]]) -> None:
    """(u): CPU per helm process started and heard to its end, as the operator starts them
    (pipes, exit through a pidfd)."""
    from krypton.adapters.helm import watch_children_with_pidfds

    watch_children_with_pidfds()
    for _ in range(2):
        before = _cpu()
        for _ in range(spawns):
            proc = await asyncio.create_subprocess_exec(
                str(bed.tools / "helm"), "version", "--short",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            await proc.communicate(b"{}")
        result.setdefault("helm_process_ms", []).append(
            round(1000 * (_cpu() - before) / spawns, 3))


def unit_costs(bed: Bed, n: int = 2000, spawns: int = 300) -> dict[str, Any]:
    """(u) The pieces a release is made of, each on its own, in this process with nothing
    else running: CPU per API request of each kind, per helm process and of the operator's
    imports."""
    ns = bed.namespace("bench-u", ("home",))
    result: dict[str, list[float]] = {}
    log("(u) one request, one helm process, the imports, each on its own")
    asyncio.run(_request_costs(bed, ns, n, result))
    asyncio.run(_helm_process_costs(bed, spawns, result))
    for _ in range(3):  # what `krypton run` imports, of the packages the image has
        run = subprocess.run(image_python(IMPORTS),
                             check=True, capture_output=True, text=True)
        cpu_s, pss, modules = run.stdout.split()
        result.setdefault("operator_imports_cpu_s", []).append(round(float(cpu_s), 3))
        result.setdefault("operator_imports_pss_mib", []).append(round(int(pss) / 1024, 1))
        result.setdefault("operator_imports_modules", []).append(int(modules))
    bed.core("home").delete_namespace(ns)
    log(f"(u) {result}")
    return result


IMPORTS = ("import resource, krypton.cli.main, krypton.app.operator;"
           "r = resource.getrusage(resource.RUSAGE_SELF);"
           "pss = next(ln.split()[1] for ln in open('/proc/self/smaps_rollup') if ln[:4] == 'Pss:');"
           "print(r.ru_utime + r.ru_stime, pss, len(sys.modules))")


def cluster_scale(bed: Bed, m: int) -> dict[str, Any]:
    discovery = bed.namespace("bench-m", ("home",))
    ns = bed.namespace("bench-idle")
    for i in range(m):
        bed.register(discovery, f"c{m}-{i:03d}", "home" if i % 2 == 0 else "remote")
    op = bed.operator(discovery, ns, "0.2.0")
    start = time.monotonic()
    wait_for(lambda: op.metric("krypton_engaged_clusters") == m, 1200, interval=1.0,
             what=f"{m} engaged")
    engaged = time.monotonic() - start
    time.sleep(5)
    cpu0, _ = cpu_seconds(op.pid)
    window = 60.0
    time.sleep(window)
    cpu1, _ = cpu_seconds(op.pid)
    result = {"clusters": m, "seconds_to_engage": round(engaged, 1),
              "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
              "idle_cpu_percent": round(100 * (cpu1 - cpu0) / window, 2),
              "threads": threads(op.pid)}
    log(f"(d) {result}")
    op.stop()
    for i in range(m):
        bed.core("home").delete_namespaced_secret(f"c{m}-{i:03d}", discovery)
    return result


def latencies(bed: Bed, samples: int = 20) -> dict[str, Any]:
    discovery = bed.namespace("bench-lat", ("home",))
    ns = bed.namespace("bench-lat")
    bed.register(discovery, "remote", "remote")
    op = bed.operator(discovery, ns, "0.2.0")
    op.wait_ready()
    wait_for(lambda: op.metric("krypton_engaged_clusters") == 1, 60)
    engage = []
    for i in range(samples):
        name = f"lat-{i:02d}"
        created = bed.register(discovery, name, "home")
        wait_for(functools.partial(engaged, op, name), 60, interval=0.02)
        engage.append(log_time(op, "cluster engaged", cluster=name) - created)
        bed.core("home").delete_namespaced_secret(name, discovery)
    install = install_waits(bed, op, ns, "lat", samples)
    op.stop()
    result = {"secret_to_engaged": summary(engage), "tenant_to_install_start": summary(install)}
    log(f"(e) {result}")
    return result


def install_waits(bed: Bed, op: OperatorProcess, ns: str, prefix: str,
                  samples: int) -> list[float]:
    """Seconds from creating a Tenant on `remote` to its helm install starting, one Tenant at
    a time."""
    waits = []
    for i in range(samples):
        name = f"{prefix}-{i:02d}"
        created = bed.create_tenant("remote", ns, name)
        wait_for(functools.partial(log_time, op, "helm install start", tenant=f"{ns}/{name}"),
                 120, interval=0.02)
        waits.append(log_time(op, "helm install start", tenant=f"{ns}/{name}") - created)
        time.sleep(0.3)
    return waits


def starvation(bed: Bed, dead: int, total: int = 100, samples: int = 30) -> dict[str, Any]:
    """(f) Tenant -> helm install start on a healthy cluster while `dead` of `total` engaged
    clusters never answer; the operator holds a Lease, whose renewals must not suffer. The
    measured cluster is `remote`, the only name for that API server; the other healthy ones
    are names of `home` with no Tenants, so each Tenant is seen by one worker only."""
    discovery = bed.namespace("bench-starve", ("home",))
    ns = bed.namespace("bench-starve")
    hole = BlackHole()
    bed.register(discovery, "remote", "remote")
    for i in range(total - dead - 1):
        bed.register(discovery, f"idle-{i:03d}", "home")
    for i in range(dead):
        bed.register(discovery, f"dead-{i:03d}", "remote", server=hole.url)
    op = bed.operator(discovery, ns, "0.2.0", "--leader-elect")
    wait_for(lambda: op.metric("krypton_engaged_clusters") == total - dead, 600, interval=0.5,
             what=f"{total - dead} healthy clusters engaged")
    time.sleep(10)  # the dead clusters' engagement attempts are under way
    waits = install_waits(bed, op, ns, f"st{dead}", samples)
    missed = len(op.log_events("lease renewal failed")) + len(op.log_events("leadership lost"))
    op.stop(grace=30)
    hole.close()
    result = {"clusters": total, "dead": dead, **summary(waits),
              "lease_renewals_failed": missed}
    log(f"(f) {result}")
    return result
