"""(x): krypton and Flux taking turns on the same bed and chart."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import free_port
from ..operator import (
    descendants,
    wait_for,
)
from .bed import Bed, PlaneLoad
from .config import FLUX_CHART, FLUX_PROFILE, ROOT
from .process import TreeMemory, cpu_seconds, log, spawned, still_runs


class Flux:
    """Flux's source-controller and helm-controller on the home control plane, children of one
    shell so that the tree's memory and CPU are theirs together."""

    def __init__(self, bed: Bed) -> None:
        built = subprocess.run(["bash", str(ROOT / "hack" / "flux.sh")], check=True, text=True,
                               capture_output=True)
        self.dir = Path(built.stdout.strip().splitlines()[-1])
        self.bed = bed
        for verb in (["apply", "--server-side"], ["wait", "--for", "condition=Established"]):
            subprocess.run([str(bed.tools / "kubectl"), "--kubeconfig",
                            str(bed.home.kubeconfig), *verb, "-f", str(self.dir / "crds")],
                           check=True, capture_output=True)
        bed.core("home").create_namespace({"metadata": {"name": "flux-system"}})  # type: ignore[arg-type]
        self.proc: subprocess.Popen[bytes] | None = None
        self.storage = ""

    def start(self) -> int:
        self.storage = storage = tempfile.mkdtemp(prefix="krypton-bench-flux-")
        port = free_port()
        source = (f'"{self.dir}/source-controller" --storage-path "{storage}" '
                  f"--storage-addr 127.0.0.1:{port} --storage-adv-addr 127.0.0.1:{port} "
                  f"--metrics-addr 127.0.0.1:{free_port()} --health-addr 127.0.0.1:{free_port()}")
        helm = (f'"{self.dir}/helm-controller" --metrics-addr 127.0.0.1:{free_port()} '
                f"--health-addr 127.0.0.1:{free_port()}")
        env = {**os.environ, "KUBECONFIG": str(self.bed.home.kubeconfig),
               "RUNTIME_NAMESPACE": "flux-system"}
        with open(Path(storage) / "controllers.log", "wb") as out:
            self.proc = subprocess.Popen(["bash", "-c", f"{source} & {helm} & wait"], env=env,
                                         stdout=out, stderr=out, start_new_session=True)
        return self.proc.pid

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return sum(cpu_seconds(p)[0] for p in spawned(self.proc.pid))

    def stop(self) -> None:
        """SIGTERM to the controllers and their shell, then SIGKILL to a controller that
        still runs 30 s later (seen: helm-controller running on, orphaned, after its shell
        and the run had ended)."""
        if self.proc is not None and self.proc.poll() is None:
            controllers = descendants(self.proc.pid)
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(map(still_runs, controllers)):
                time.sleep(0.2)
            for pid in filter(still_runs, controllers):
                os.kill(pid, signal.SIGKILL)
            self.proc.wait(30)
        if self.storage:
            shutil.rmtree(self.storage, ignore_errors=True)  # its artifacts and its log
            self.storage = ""


SOURCE = "source.toolkit.fluxcd.io"


def _helm_releases(bed: Bed, ns: str, n: int, prefix: str) -> list[str]:
    """The chart's source and n HelmReleases a cluster in `ns`, as FLUX_CHART and
    FLUX_PROFILE say; their names."""
    custom, source = bed.custom("home"), SOURCE
    custom.create_namespaced_custom_object(
        source, "v1", ns, "helmrepositories",
        {"apiVersion": f"{source}/v1", "kind": "HelmRepository",
         "metadata": {"name": "bench"}, "spec": {"url": bed.repo.url, "interval": "10m"}})
    chart_spec = {"chart": "sample", "version": "0.2.0",
                  "sourceRef": {"kind": "HelmRepository", "name": "bench"}}
    if FLUX_CHART == "shared":
        custom.create_namespaced_custom_object(
            source, "v1", ns, "helmcharts",
            {"apiVersion": f"{source}/v1", "kind": "HelmChart", "metadata": {"name": "sample"},
             "spec": {**chart_spec, "interval": "10m"}})
    bed.core("home").create_namespaced_secret(ns, {  # type: ignore[arg-type]
        "metadata": {"name": "remote"}, "stringData": {"value": bed.remote.kubeconfig.read_text()}})
    matched = {"disableWait": True, "disableOpenAPIValidation": True} \
        if FLUX_PROFILE == "matched" else {}
    names = []
    for c in bed.clusters:
        for i in range(n):
            name = f"{prefix}{n}-{i:03d}"
            spec: dict[str, Any] = {
                "interval": "10m", "releaseName": name, "targetNamespace": name,
                "storageNamespace": name, "install": {"createNamespace": True, **matched},
                **({"upgrade": matched} if matched else {})}
            if FLUX_CHART == "shared":
                spec["chartRef"] = {"kind": "HelmChart", "name": "sample", "namespace": ns}
            else:
                spec["chart"] = {"spec": chart_spec}
            if c == "remote":
                spec["kubeConfig"] = {"secretRef": {"name": "remote", "key": "value"}}
            custom.create_namespaced_custom_object(
                "helm.toolkit.fluxcd.io", "v2", ns, "helmreleases",
                {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
                 "metadata": {"name": f"{c}-{name}"}, "spec": spec})
            names.append(f"{c}-{name}")
    return names


def flux_run(bed: Bed, flux: Flux, n: int, prefix: str = "x") -> dict[str, Any]:
    """(x): Flux installs n releases on each cluster, then bumps them, as (a) and (c) do.
    With FLUX_CHART "shared" (Flux at its cheapest) every HelmRelease names one HelmChart by
    its chartRef and the bump edits that HelmChart; with "each" every HelmRelease has a
    chart template of its own (a HelmChart per release) and the bump edits each one."""
    ns = bed.namespace("flux")
    custom = bed.custom("home")
    names = _helm_releases(bed, ns, n, prefix)
    total = len(names)

    def ready(version: str) -> int:
        items = custom.list_namespaced_custom_object(
            "helm.toolkit.fluxcd.io", "v2", ns, "helmreleases")["items"]  # type: ignore[index]
        return sum(1 for hr in items
                   if any(c["type"] == "Ready" and c["status"] == "True"
                          for c in (hr.get("status") or {}).get("conditions") or [])
                   and ((hr.get("status") or {}).get("history") or [{}])[0].get(
                       "chartVersion") == version)

    load = PlaneLoad(bed)
    log(f"(x) Flux: {n} HelmReleases x 2 clusters, chart {FLUX_CHART}, profile {FLUX_PROFILE}")
    start = time.monotonic()
    pid = flux.start()
    memory = TreeMemory(pid)
    wait_for(lambda: ready("0.2.0") == total, 3600, interval=0.5, what=f"{total} Ready")
    seconds = time.monotonic() - start
    cpu = flux.cpu_seconds()
    result: dict[str, Any] = {
        "releases": total, "chart": FLUX_CHART, "profile": FLUX_PROFILE,
        "seconds_to_ready": round(seconds, 1),
        "cpu_ms_per_release": round(1000 * cpu / total, 1), **load.per_release(total),
        **memory.peak()}
    log(f"(x) Flux: {total} releases Ready in {seconds:.1f}s")
    load, cpu0 = PlaneLoad(bed), flux.cpu_seconds()
    memory = TreeMemory(pid)
    start = time.monotonic()
    if FLUX_CHART == "shared":
        custom.patch_namespaced_custom_object(SOURCE, "v1", ns, "helmcharts", "sample",
                                              {"spec": {"version": "0.3.0"}})
        edits = 1
    else:
        for name in names:
            custom.patch_namespaced_custom_object(
                "helm.toolkit.fluxcd.io", "v2", ns, "helmreleases", name,
                {"spec": {"chart": {"spec": {"version": "0.3.0"}}}})
        edits = total
    wait_for(lambda: ready("0.3.0") == total, 3600, interval=0.5, what="bump rolled out")
    bump = time.monotonic() - start
    result["version_bump"] = {  # the bench's own edits not counted
        "seconds": round(bump, 1),
        "cpu_ms_per_release": round(1000 * (flux.cpu_seconds() - cpu0) / total, 1),
        **load.per_release(total, own_edits=edits), **memory.peak()}
    log(f"(x) Flux: bump done in {bump:.1f}s")
    flux.stop()
    return result


FLUX_PAIRS = {  # ratio: (of the bump, else of the install; the figure)
    "seconds_to_ready": (False, "seconds_to_ready"),
    "install_cpu_per_release": (False, "cpu_ms_per_release"),
    "install_peak_pss": (False, "peak_tree_pss_mib"),
    "install_writes": (False, "apiserver_writes_per_release"),
    "install_control_plane_cpu": (False, "control_plane_cpu_ms_per_release"),
    "bump_seconds": (True, "seconds"),
    "bump_cpu_per_release": (True, "cpu_ms_per_release"),
    "bump_peak_pss": (True, "peak_tree_pss_mib"),
    "bump_writes": (True, "apiserver_writes_per_release"),
    "bump_control_plane_cpu": (True, "control_plane_cpu_ms_per_release")}


def flux_ratios(krypton: dict[str, Any], flux: dict[str, Any]) -> dict[str, float]:
    """krypton's figures over Flux's, from runs of the same size taking turns (P4)."""
    out = {}
    for name, (of_bump, figure) in FLUX_PAIRS.items():
        k, f = (krypton["version_bump"], flux["version_bump"]) if of_bump else (krypton, flux)
        a, b = k.get(figure), f.get(figure)
        if a is not None and b:
            out[name] = round(a / b, 2)
    return out


def flux_summary(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, each ratio's median over the turns, with its lowest and highest."""
    out = []
    for size in sorted({t["releases"] for t in turns}):
        ratios = [t["ratios"] for t in turns if t["releases"] == size]
        out.append({"releases": size, "turns": len(ratios), **{
            name: {"median": round(statistics.median(r[name] for r in ratios), 2),
                   "min": min(r[name] for r in ratios), "max": max(r[name] for r in ratios)}
            for name in FLUX_PAIRS if all(name in r for r in ratios)}})
    return out
