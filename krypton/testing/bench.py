"""``make bench``: krypton's performance on the local test bed (SPEC P1).

Writes ``bench/results.json`` and prints a table:

(a) seconds until N Tenants on each of 2 clusters are Ready (N = 50, 200), releases/second;
(b) a no-op resync of the 200 x 2 fleet: helm processes, API requests and API writes made by
    the operator (its own counters), and its CPU seconds;
(c) seconds to roll a chart version bump through 200 x 2;
(d) peak RSS, idle CPU and OS threads with M engaged clusters (M = 10, 100, 1000 Secrets
    pointing at the two control planes under different names);
(e) p50/p95 latency from Secret creation to cluster engaged and from Tenant creation to the
    helm install starting;
(f) starvation: p50/p95 Tenant created -> helm install started on healthy clusters of a
    100-cluster fleet, with 10 of them pointing at a loopback listener that accepts TCP and
    never answers, against the same fleet with no dead cluster; Lease renewals missed;
(g) SIGTERM during 20 running helm installs: seconds to exit, helm processes left, and
    releases left pending once a restarted operator has converged;
(h) sharding: 3 replicas serving 30 clusters (with the default Lease settings): seconds from a
    replica's SIGKILL until every one of its clusters is engaged by another (p50/p95 over
    several kills), seconds from a SIGTERM until its clusters are engaged elsewhere, and how
    many clusters move when a fourth replica joins;
(i) real waiting: on two clusters with simulated nodes (kwok), a chart whose pod takes 20 s to
    become Ready, 100 Tenants x 2 clusters: seconds until all are Ready, then seconds until a
    chart version bump (which rolls every pod) is Ready everywhere, with CPU and memory;
    part ``w`` measures the same with ``--helm-wait=true`` (not run by default: minutes).

(x) on request: krypton and Flux's source-controller and helm-controller (built by
    hack/flux.sh) taking turns on the same bed and chart, N releases x 2 clusters for each N of
    KRYPTON_BENCH_FLUX_N (200,500), KRYPTON_BENCH_FLUX_TURNS times (1): (a) and (c) for krypton,
    then for Flux N HelmReleases made before the controllers start, as (a) makes its Tenants,
    seconds until all are Ready, then a chart version bump. Each reports CPU per release, the
    peak PSS of its tree, the API writes and the control planes' CPU; then krypton's ratios
    to Flux, per turn and their medians. Flux's HelmReleases share one HelmChart by their
    chartRef, the bump editing it (KRYPTON_BENCH_FLUX_CHART=shared), or each has a chart
    template of its own, the bump editing each (=each). KRYPTON_BENCH_FLUX_PROFILE=defaults
    runs Flux at its own defaults (kstatus wait, client-side OpenAPI validation); =matched
    sets disableWait and disableOpenAPIValidation on install and upgrade, as krypton's
    defaults pass helm no wait and no client-side validation.

(s) on request: the fleet's shape, KRYPTON_BENCH_SHAPE_M (40) cluster names of the two control
    planes, 2 Tenants each (spec.clusterRef): seconds until Ready and a chart bump, with CPU
    per release and peak memory, where each cluster's helm serves only a few releases and
    more clusters have helm work than helm workers may run. Every name of a control plane
    sees all its Tenants and says NotTargeted on those of the others (M/2 conditions on
    each Tenant, M^2/2 status writes in all): at 200 names that, not helm, is the run.

(a) and (c) also report CPU per release (operator and helm, milliseconds) and the peak memory
of the operator's process tree (the operator, its helm processes or workers) while they run: the sum
of RSS, which counts the helm binary's shared pages once per process, and the sum of PSS,
which shares them out (what the tree costs the node).

Figures only: nothing here passes or fails on timing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

from krypton.decisions.settings import Settings

from . import BlackHole, ChartRepository, ControlPlane, free_port, testbin
from .operator import (
    OperatorProcess,
    cluster_holders,
    cmdline,
    descendants,
    image_python,
    kubeconfig_secret,
    logged_at,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("KRYPTON_BENCH_OUT", ROOT / "bench" / "results.json"))
SIZES = [int(x) for x in os.environ.get("KRYPTON_BENCH_N", "50,200").split(",")]
CLUSTER_COUNTS = [int(x) for x in os.environ.get("KRYPTON_BENCH_M", "10,100,1000").split(",")]
# measures to run: a (with b and c), d, e, f, g, h, i, j; on request: w (i with helm's own
# wait), D ((d) once (a) left release records), k (--max-concurrent-helm against throughput),
# u (what one request, one helm process and the process's start cost on their own)
PARTS = set(os.environ.get("KRYPTON_BENCH_PARTS", "adefghij").replace(",", ""))
OPERATOR_ARGS = os.environ.get("KRYPTON_BENCH_OPERATOR_ARGS", "").split()  # to every operator
# NAME=VALUE pairs for every operator's environment only (helm inherits it; the control
# planes do not), e.g. Go's memory settings for helm: "GOMEMLIMIT=16MiB"
OPERATOR_ENV: dict[str, str] = dict(
    pair.partition("=")[::2] for pair in os.environ.get("KRYPTON_BENCH_OPERATOR_ENV", "").split())
FLUX_N = [int(x) for x in os.environ.get("KRYPTON_BENCH_FLUX_N", "200,500").split(",")]  # (x)
FLUX_TURNS = int(os.environ.get("KRYPTON_BENCH_FLUX_TURNS", "1"))  # (x): krypton, Flux, ...
FLUX_CHART = os.environ.get("KRYPTON_BENCH_FLUX_CHART", "shared")  # (x): or "each"
# (x): Flux at its own defaults (kstatus wait, OpenAPI validation), or "matched" to krypton's
# helm semantics (no wait, no client-side validation: krypton judges readiness by its reads)
FLUX_PROFILE = os.environ.get("KRYPTON_BENCH_FLUX_PROFILE", "defaults")
HELM_CURVE = [int(x) for x in os.environ.get("KRYPTON_BENCH_HELM", "1,2,4,8,16").split(",")]
CURVE_N = int(os.environ.get("KRYPTON_BENCH_CURVE_N", "100"))  # (k): Tenants per cluster
FAILOVERS = int(os.environ.get("KRYPTON_BENCH_FAILOVERS", "6"))  # (h) replicas killed
POD_READY_DELAY = 20.0  # (i): seconds from a pod's scheduling to its readiness
WAITING_TENANTS = int(os.environ.get("KRYPTON_BENCH_WAITING_N", "100"))  # (i) per cluster
TICK = os.sysconf("SC_CLK_TCK")
# a directory: (a) and (c) record the operator with py-spy (sampling, 100 Hz) into it
PROFILE_DIR = os.environ.get("KRYPTON_BENCH_PROFILE", "")  # only samples holding the GIL: CPU spent in Python


def log(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the program's name, from the state on."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of waited-for children such as helm)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK, (int(fields[13]) + int(fields[14])) / TICK


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """(the operator's own CPU seconds, those of its helm: the helm processes it waited for
    and the helm workers still running, with whatever they waited for)."""
    own, helm = cpu_seconds(pid)
    for child in descendants(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            helm += sum(cpu_seconds(child))
    return own, helm


def still_runs(pid: int) -> bool:
    """Whether `pid` still runs: an orphan that ended stays a zombie where nothing reaps it."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def status_field(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status in its unit (kB for memory); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int) -> float:
    return status_field(pid, "VmHWM") / 1024


def threads(pid: int) -> int:
    return status_field(pid, "Threads")


def _rollup_kib(pid: int, field: str) -> int:
    """A field of /proc/<pid>/smaps_rollup (kB); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kib(pid: int) -> int:
    return _rollup_kib(pid, "Pss")


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def spawned(pid: int) -> dict[int, str]:
    """The descendants of `pid` that run programs of their own, with each one's program name
    as it was when listed. A child that still runs the parent's executable is one being
    started: Python starts programs with vfork, so until its exec the child shares the
    parent's memory, and /proc shows the parent's memory in it a second time (seen: a
    "python" child of 58.9 MiB PSS beside an operator of 58.9 MiB at a tree's peak). The
    name is read before the memory: a helm process that ends in between is still counted as
    helm (its memory was read while it ran), not as a process without a name."""
    exe = _exe(pid)
    programs = {p: _exe(p) for p in descendants(pid)}
    return {p: Path(program).name for p, program in programs.items() if program != exe}


class TreeMemory:
    """Samples the memory of a process and its descendants every `interval` seconds in a
    thread; `peak()` gives the highest sums seen (MiB) and how many helm processes ran then."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval = pid, interval
        self.rss = self.pss = 0.0
        self.helm_at_peak = 0
        self.operator = 0.0  # the operator's own PSS at the tree's peak (MiB)
        self.children: list[tuple[str, float]] = []  # its processes then: name, PSS (MiB)
        self.helm_private = 0.0  # the most any one helm process kept private (MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            names = spawned(self.pid)
            tree = [self.pid, *names]
            rss = sum(status_field(p, "VmRSS") for p in tree)
            sizes = {p: _pss_kib(p) for p in tree}
            helms = [p for p in names if names[p] == "helm"]
            for p in helms:
                private = _rollup_kib(p, "Private_Clean") + _rollup_kib(p, "Private_Dirty")
                self.helm_private = max(self.helm_private, private / 1024)
            pss = sum(sizes.values())
            if pss / 1024 > self.pss:
                self.pss, self.rss = pss / 1024, rss / 1024
                self.helm_at_peak = len(helms)
                self.operator = sizes[self.pid] / 1024
                self.children = sorted(((names[p], round(sizes[p] / 1024, 1)) for p in tree[1:]),
                                       key=lambda c: -c[1])

    def peak(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"peak_tree_pss_mib": round(self.pss, 1), "peak_tree_rss_mib": round(self.rss, 1),
                "helm_processes_at_peak": self.helm_at_peak,
                "operator_pss_mib_at_peak": round(self.operator, 1),
                "children_pss_mib_at_peak": self.children,
                "helm_private_mib_max": round(self.helm_private, 1)}


@contextlib.contextmanager
def profiled(pid: int, name: str) -> Iterator[None]:
    """With KRYPTON_BENCH_PROFILE set, a py-spy recording of the operator while the block
    runs (collapsed stacks in ``<dir>/<name>.txt``); otherwise nothing."""
    if not PROFILE_DIR:
        yield
        return
    spy = Path(sys.executable).with_name("py-spy")
    out = Path(PROFILE_DIR) / f"{name}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "100", "--gil",
                             "--format", "raw", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.send_signal(2)
        proc.wait(60)


def cpu_per_release(own: float, helm: float, releases: int) -> dict[str, float]:
    return {"operator_cpu_ms_per_release": round(1000 * own / releases, 1),
            "helm_cpu_ms_per_release": round(1000 * helm / releases, 1),
            "cpu_ms_per_release": round(1000 * (own + helm) / releases, 1)}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


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
                 chart: str = "sample") -> OperatorProcess:
        op = OperatorProcess([
            "--watch-kubeconfig", str(self.home.kubeconfig), "--namespace", discovery,
            "--watch-namespace", ns, "--no-self-cluster", "--allow-duplicate-clusters",
            "--chart-repo", self.repo.url,
            "--chart-name", chart, "--chart-version", version, "--log-level", "info",
            *extra, *OPERATOR_ARGS], helm_dir=self.tools, env=OPERATOR_ENV, image_imports=True)
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


# --resync-period of (a)'s operator: (b) measures its first resync, which must come after (a)
# has ended, or (a) counts a resync's passes as the installs' (at 45 s it fell within (a) on a
# slow day, at 1.8 passes per release instead of 1)
FLEET_RESYNC = 120.0


def fleet_run(bed: Bed, n: int, *extra: str, prefix: str = "t", bump: bool = False
              ) -> dict[str, Any]:
    """(a), and with the largest N (b) and (c); with `extra` operator flags, (a) alone; with
    `bump`, (a) and (c) (as (x) takes turns with Flux)."""
    discovery = bed.namespace("bench-disc", ("home",))
    ns = bed.namespace("bench")
    for c in bed.clusters:
        for i in range(n):
            bed.create_tenant(c, ns, f"{prefix}{n}-{i:03d}")
    for c in bed.clusters:
        bed.register(discovery, c, c)
    log(f"(a) {n} Tenants x 2 clusters: starting the operator {' '.join(extra)}")
    load = PlaneLoad(bed)
    start = time.monotonic()
    # (x) measures no resync: the default period (10 min), as Flux's interval is
    resync = () if bump else ("--resync-period", f"{FLEET_RESYNC:.0f}s")
    op = bed.operator(discovery, ns, "0.2.0", *resync, *extra)
    memory = TreeMemory(op.pid)
    total = 2 * n
    with profiled(op.pid, f"install-{n}"):
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
        log(f"(c) chart bump 0.2.0 -> 0.3.0 through {total} releases")
        load = PlaneLoad(bed)
        start = time.monotonic()
        op = bed.operator(discovery, ns, "0.3.0")
        memory = TreeMemory(op.pid)
        with profiled(op.pid, f"bump-{n}"):
            wait_for(lambda: bed.count(ns, ready("0.3.0")) == total, 1800, interval=0.5,
                     what="bump rolled out")
        bumped = time.monotonic() - start
        own, helm = tree_cpu_seconds(op.pid)
        result["version_bump"] = {"seconds": round(bumped, 1), **per_release(op, total),
                                  "releases_per_second": round(total / bumped, 2),
                                  **load.per_release(total),
                                  **cpu_per_release(own, helm, total), **memory.peak()}
        log(f"(c) bump done in {bumped:.1f}s")
    op.stop()
    return result


SHAPE_M = int(os.environ.get("KRYPTON_BENCH_SHAPE_M", "40"))  # (s): cluster names
SHAPE_TENANTS = 2  # (s): Tenants per cluster name


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


def apiserver_writes(bed: Bed) -> float:
    """Create, update, patch and delete requests both control planes served so far."""
    total = 0.0
    for cp in bed.clusters.values():
        text = subprocess.run([str(bed.tools / "kubectl"), "--kubeconfig", str(cp.kubeconfig),
                               "get", "--raw", "/metrics"], check=True, capture_output=True,
                              text=True).stdout
        total += _sum(text, "apiserver_request_total", 'verb="POST"') + \
            _sum(text, "apiserver_request_total", 'verb="PUT"') + \
            _sum(text, "apiserver_request_total", 'verb="PATCH"') + \
            _sum(text, "apiserver_request_total", 'verb="DELETE"')
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


def flux_run(bed: Bed, flux: Flux, n: int, prefix: str = "x") -> dict[str, Any]:
    """(x): Flux installs n releases on each cluster, then bumps them, as (a) and (c) do.
    With FLUX_CHART "shared" (Flux at its cheapest) every HelmRelease names one HelmChart by
    its chartRef and the bump edits that HelmChart; with "each" every HelmRelease has a
    chart template of its own (a HelmChart per release) and the bump edits each one."""
    ns = bed.namespace("flux")
    custom = bed.custom("home")
    source = "source.toolkit.fluxcd.io"
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
    names = []
    for c in bed.clusters:
        for i in range(n):
            name = f"{prefix}{n}-{i:03d}"
            matched = {"disableWait": True, "disableOpenAPIValidation": True} \
                if FLUX_PROFILE == "matched" else {}
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
        custom.patch_namespaced_custom_object(source, "v1", ns, "helmcharts", "sample",
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


def per_release(op: OperatorProcess, releases: int) -> dict[str, Any]:
    """The operator's passes, API requests (by verb) and writes so far, per release."""
    return {"passes_per_release": round(op.metric("krypton_reconciles_total") / releases, 2),
            "requests_per_release": {k: round(v / releases, 2)
                                     for k, v in sorted(requests_by_kind(op).items())},
            "writes_per_release": round(op.metric("krypton_api_writes_total") / releases, 2)}


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


def requests_by_kind(op: OperatorProcess) -> dict[str, float]:
    """The operator's API requests so far, summed per verb (its `verb` label)."""
    found: dict[str, float] = {}
    for line in op.metrics_text().splitlines():
        if line.startswith("krypton_api_requests_total{"):
            head, _, value = line.rpartition(" ")
            kind = head.split('verb="', 1)[-1].split('"', 1)[0]
            found[kind] = found.get(kind, 0.0) + float(value)
    return found


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


def unit_costs(bed: Bed, n: int = 2000, spawns: int = 300) -> dict[str, Any]:
    """(u) The pieces a release is made of, each on its own, in this process with nothing
    else running: CPU per API request of each kind (krypton's own Kube against the home
    control plane, three rounds of `n`), per helm process started and heard to its end (as
    the operator starts them: pipes, exit through a pidfd) and of the operator's imports."""
    import asyncio
    import resource

    from krypton.adapters.clientconfig import configuration_from_file
    from krypton.adapters.helm import watch_children_with_pidfds
    from krypton.adapters.kube import Kube
    from krypton.adapters.kubeapi import core_path

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    ns = bed.namespace("bench-u", ("home",))
    event = {"metadata": {"generateName": "t.", "namespace": ns},
             "involvedObject": {"kind": "Tenant", "name": "t", "namespace": ns, "uid": "u"},
             "type": "Normal", "reason": "HelmInstalled", "count": 1,
             "message": "chart sample 0.2.0 installed as tenant-t-home revision 1"}
    path = f"{core_path('namespaces')}/{ns}"
    result: dict[str, list[float]] = {}

    async def requests() -> None:
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
                before = cpu()
                for _ in range(n):
                    await call()
                result.setdefault(f"request_{kind}_ms", []).append(
                    round(1000 * (cpu() - before) / n, 3))
        await kube.close()

    async def helm_processes() -> None:
        watch_children_with_pidfds()
        for _ in range(2):
            before = cpu()
            for _ in range(spawns):
                proc = await asyncio.create_subprocess_exec(
                    str(bed.tools / "helm"), "version", "--short",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE)
                await proc.communicate(b"{}")
            result.setdefault("helm_process_ms", []).append(
                round(1000 * (cpu() - before) / spawns, 3))

    log("(u) one request, one helm process, the imports, each on its own")
    asyncio.run(requests())
    asyncio.run(helm_processes())
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
        wait_for(functools.partial(_engaged, op, name), 60, interval=0.02)
        engage.append(_log_time(op, "cluster engaged", cluster=name) - created)
        bed.core("home").delete_namespaced_secret(name, discovery)
    install = install_waits(bed, op, ns, "lat", samples)
    op.stop()
    result = {"secret_to_engaged": _summary(engage), "tenant_to_install_start": _summary(install)}
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
        wait_for(functools.partial(_log_time, op, "helm install start", tenant=f"{ns}/{name}"),
                 120, interval=0.02)
        waits.append(_log_time(op, "helm install start", tenant=f"{ns}/{name}") - created)
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
    result = {"clusters": total, "dead": dead, **_summary(waits),
              "lease_renewals_failed": missed}
    log(f"(f) {result}")
    return result


def sigterm_during_installs(bed: Bed, installs: int = 20) -> dict[str, Any]:
    """(g) SIGTERM while `installs` helm installs wait for Deployments that cannot become
    ready (no nodes); then a restarted operator, not waiting for readiness, converges."""
    discovery = bed.namespace("bench-term", ("home",))
    ns = bed.namespace("bench-term")
    bed.register(discovery, "remote", "remote")
    shutdown = 10.0
    args = ("--helm-wait=true", "--max-concurrent-helm", str(installs), "--max-concurrent-reconciles",
            str(installs), "--helm-timeout", "300s", "--shutdown-timeout", f"{shutdown:.0f}s")
    op = bed.operator(discovery, ns, "0.1.0", *args, chart="hang")
    names = [f"term-{i:02d}" for i in range(installs)]
    for name in names:
        bed.create_tenant("remote", ns, name)

    def running() -> list[int]:
        return [p for p in descendants(op.pid) if Path(cmdline(p)[0] or "x").name == "helm"
                and "upgrade" in cmdline(p)]

    def all_running() -> list[int]:
        now = running()
        return now if len(now) >= installs else []

    helm = wait_for(all_running, 300, interval=0.2, what=f"{installs} helm installs running")
    time.sleep(2)
    start = time.monotonic()
    code = op.stop(grace=120)
    seconds = time.monotonic() - start
    left = [p for p in helm if cmdline(p)]
    op = bed.operator(discovery, ns, "0.1.0", "--helm-wait=false", chart="hang")
    wait_for(lambda: all(bed.tenant_phase("remote", ns, n) == "Ready" for n in names), 600,
             interval=1.0, what="the restarted operator converged")
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
        apis = {cp.name: config.new_client_from_config(str(cp.kubeconfig)) for cp in sims}
        discovery = bed.namespace("bench-wait", ("home",))
        ns = f"bench-wait-{uuid.uuid4().hex[:5]}"
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
            memory = TreeMemory(op.pid)
            helm_done: list[float] = []

            def done(version: str = version, op: OperatorProcess = op,
                     helm_done: list[float] = helm_done, start: float = start) -> bool:
                # when the last helm run ended: the rest of the wait is the pods'
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
            result[phase] = {"seconds": round(seconds, 1),
                             "helm_done_seconds": round(helm_done[0], 1) if helm_done else None,
                             **per_release(op, 2 * n), **cpu_per_release(own, helm, 2 * n),
                             **memory.peak()}
            log(f"(i) {phase}: {result[phase]}")
            op.stop()
        return result
    finally:
        values.unlink(missing_ok=True)
        for cp in sims:
            cp.stop()


STORM_TENANTS = int(os.environ.get("KRYPTON_BENCH_STORM_N", "50"))  # (j) per cluster
STORM_MINUTES = int(os.environ.get("KRYPTON_BENCH_STORM_MINUTES", "12"))
STALL_MINUTES = int(os.environ.get("KRYPTON_BENCH_STALL_MINUTES", "4"))


@contextlib.contextmanager
def stopped_after(op: OperatorProcess) -> Iterator[OperatorProcess]:
    """A started operator, stopped however the block ends."""
    try:
        yield op
    finally:
        op.stop()


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
        return (_sum(text, "krypton_helm_processes_total"), _sum(text, "krypton_api_writes_total"),
                _sum(text, 'krypton_api_writes_total{', 'kind="event"'))

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


def _sum(text: str, name: str, having: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and having in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _summary(values: list[float]) -> dict[str, Any]:
    return {"p50_ms": round(1000 * statistics.median(values), 1),
            "p95_ms": round(1000 * pct(values, 0.95), 1), "samples": len(values)}


def _engaged(op: OperatorProcess, cluster: str) -> bool:
    return op.metric("krypton_cluster_engaged", cluster=cluster) == 1


def _log_time(op: OperatorProcess, event: str, **fields: str) -> float:
    return next((logged_at(e) for e in op.log_events(event, **fields)), 0.0)


def machine() -> dict[str, Any]:
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal:"))
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cores": os.cpu_count(), "memory_gib": round(mem / 1024 / 1024, 1), "cpu": model,
            "kernel": platform.release(), "python": platform.python_version()}


def versions(tools: Path) -> dict[str, str]:
    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    return {"kube-apiserver": out(str(tools / "kube-apiserver"), "--version"),
            "etcd": out(str(tools / "etcd"), "--version").splitlines()[0],
            "helm": out(str(tools / "helm"), "version", "--short"),
            "krypton": "0.1.0"}


def table(results: dict[str, Any]) -> str:
    rows = [("measure", "value")]
    for run in results.get("fleet", []):
        n = run["tenants_per_cluster"]
        rows.append((f"(a) {n} x 2 Ready", f"{run['seconds_to_ready']} s "
                     f"({run['releases_per_second']} releases/s; {_cost(run)})"))
        if "noop_resync" in run:
            r = run["noop_resync"]
            rows.append((f"(b) no-op resync {n} x 2", f"{r['helm_processes']} helm, "
                         f"{r['api_requests']} API requests, {r['api_writes']} writes, "
                         f"{r['operator_cpu_seconds']} CPU s ({r['reconciles']} passes)"))
            if "restart_settled" in run:
                r = run["restart_settled"]
                rows.append((f"(b) restart on the settled {n} x 2",
                             f"{r['operator_cpu_seconds']} CPU s until every Tenant's first "
                             f"pass ({r['seconds']} s)"))
            b = run["version_bump"]
            rows.append((f"(c) version bump {n} x 2", f"{b['seconds']} s "
                         f"({b['releases_per_second']} releases/s; {_cost(b)})"))
    for t in results.get("flux_turns", []):
        k, f = t["krypton"], t["flux"]
        for who, r in (("krypton", k), (f"Flux ({f['chart']} chart)", f)):
            b = r["version_bump"]
            rows.append((f"(x) turn {t['turn']}, {t['releases']} releases, {who}", (
                f"Ready in {r['seconds_to_ready']} s, {r['cpu_ms_per_release']} ms CPU, "
                f"{r['apiserver_writes_per_release']} writes, control planes "
                f"{r['control_plane_cpu_ms_per_release']} ms a release, peak PSS "
                f"{r['peak_tree_pss_mib']} MiB; bump {b['seconds']} s, "
                f"{b['cpu_ms_per_release']} ms, {b['apiserver_writes_per_release']} writes, "
                f"control planes {b['control_plane_cpu_ms_per_release']} ms")))
    for r in results.get("flux_summary", []):
        rows.append((f"(x) krypton / Flux, {r['releases']} releases, {r['turns']} turns",
                     ", ".join(f"{k.replace('_', ' ')} {v['median']} ({v['min']}-{v['max']})"
                               for k, v in r.items() if isinstance(v, dict))))
    if "unit_costs" in results:
        u = results["unit_costs"]
        rows.append(("(u) each on its own", "; ".join(
            f"{k.removesuffix('_ms').removesuffix('_s').replace('_', ' ')} "
            f"{min(v)}-{max(v)}" for k, v in u.items())))
    for d in results.get("clusters", []):
        rows.append((f"(d) {d['clusters']} clusters", f"peak RSS {d['peak_rss_mib']} MiB, "
                     f"idle CPU {d['idle_cpu_percent']} %, {d['threads']} threads, engaged "
                     f"in {d['seconds_to_engage']} s"))
    held = results.get("clusters_holding_release_records") or {}
    for d in held.get("runs", []):
        rows.append((f"(D) {d['clusters']} clusters with records",
                     f"peak RSS {d['peak_rss_mib']} MiB ({held['records_per_control_plane']} "
                     f"records; index {held['release_index_bytes_per_record']} bytes/record)"))
    for k in results.get("helm_concurrency", []):
        rows.append((f"(k) --max-concurrent-helm {k['max_concurrent_helm']}",
                     f"{k['tenants_per_cluster']} x 2 in {k['seconds_to_ready']} s "
                     f"({k['releases_per_second']} releases/s); peak tree PSS "
                     f"{k['peak_tree_pss_mib']} MiB"))
    lat = results.get("latency", {})
    for key, label in (("secret_to_engaged", "Secret -> engaged"),
                       ("tenant_to_install_start", "Tenant -> helm install start")):
        if key in lat:
            rows.append((f"(e) {label}", f"p50 {lat[key]['p50_ms']} ms, p95 {lat[key]['p95_ms']} ms"))
    for f in results.get("starvation", []):
        rows.append((f"(f) {f['dead']} of {f['clusters']} dead",
                     f"Tenant -> install start p50 {f['p50_ms']} ms, p95 {f['p95_ms']} ms; "
                     f"{f['lease_renewals_failed']} Lease renewals failed"))
    if "sigterm" in results:
        g = results["sigterm"]
        rows.append((f"(g) SIGTERM, {g['installs']} installs",
                     f"exit {g['exit_code']} after {g['seconds_to_exit']} s (shutdown timeout "
                     f"{g['shutdown_timeout']:.0f} s), {g['helm_processes_left']} helm left, "
                     f"{g['releases_pending_after_restart']} releases pending after restart"))
    if "sharding" in results:
        h = results["sharding"]
        k = h["kill_to_engaged_elsewhere"]
        rows.append((f"(h) {h['replicas']} replicas, {h['clusters']} clusters, SIGKILL one",
                     f"its clusters engaged elsewhere after p50 {k['p50_s']} s, p95 "
                     f"{k['p95_s']} s ({k['samples']} kills; Lease {h['lease_duration']:.0f} s, "
                     f"retry {h['retry_period']:.0f} s)"))
        rows.append(("(h) SIGTERM one", f"its clusters engaged elsewhere after "
                     f"{h['sigterm_to_engaged_elsewhere_s']} s"))
        j = h["join"]
        rows.append(("(h) a 4th replica joins", f"{j['moved']} of {h['clusters']} clusters "
                     f"moved ({j['to_newcomer']} to it), settled in {j['seconds_to_settle']} s"))
    for key in ("waiting", "waiting_helm_wait"):
        if key in results:
            w = results[key]
            how = "helm --wait" if w["helm_wait"] else "krypton follows"
            for phase in ("install", "bump"):
                if phase in w:
                    rows.append((f"(i) {w['tenants_per_cluster']} x 2, pods "
                                 f"{w['pod_ready_delay']:.0f} s, {phase} ({how})",
                                 f"{w[phase]['seconds']} s ({_cost(w[phase])})"))
    if "failure_storm" in results:
        j = results["failure_storm"]
        for key in ("default", "stalling"):
            run = j[key]
            rows.append((f"(j) {j['releases']} failing upgrades, {run['settings']}",
                         f"helm/min {run['helm_per_minute']}, writes/min "
                         f"{run['writes_per_minute']}, Events/min {run['events_per_minute']}; "
                         f"{run['helm_runs_per_release']} helm runs per release in "
                         f"{run['minutes']} min"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(width)}  {b}" for a, b in rows)


def _cost(run: dict[str, Any]) -> str:
    return (f"{run['cpu_ms_per_release']} CPU ms/release (operator "
            f"{run['operator_cpu_ms_per_release']}, helm {run['helm_cpu_ms_per_release']}); "
            f"peak tree PSS {run['peak_tree_pss_mib']} MiB, RSS sum {run['peak_tree_rss_mib']} "
            f"MiB with {run['helm_processes_at_peak']} helm, operator "
            f"{run.get('operator_pss_mib_at_peak', '?')} MiB of it")


def main() -> int:
    bed = Bed()
    results: dict[str, Any] = {"machine": machine(), "versions": versions(bed.tools),
                               "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
                               "settings": {"max_concurrent_helm":
                                            Settings().max_concurrent_helm,
                                            "max_concurrent_reconciles": 4, "helm_wait": False,
                                            "operator_args": OPERATOR_ARGS,
                                            "operator_env": OPERATOR_ENV}}
    try:
        # (d) first, while the control planes hold no Helm release records: idle clusters
        if "d" in PARTS:
            results["clusters"] = [cluster_scale(bed, m) for m in CLUSTER_COUNTS]
        if "a" in PARTS:
            results["fleet"] = [fleet_run(bed, n) for n in SIZES]
        if "D" in PARTS:  # (d) again, now that the control planes hold release records
            results["clusters_holding_release_records"] = {
                "records_per_control_plane": {c: len(bed.release_records(c))
                                              for c in bed.clusters},
                "release_index_bytes_per_record": release_index_bytes(),
                "runs": [cluster_scale(bed, m) for m in CLUSTER_COUNTS]}
        if "u" in PARTS:
            results["unit_costs"] = unit_costs(bed)
        if "s" in PARTS:
            results["fleet_shape"] = fleet_shape(bed, SHAPE_M)
        if "k" in PARTS:
            results["helm_concurrency"] = [
                {"max_concurrent_helm": c, **fleet_run(bed, CURVE_N, "--max-concurrent-helm",
                                                       str(c), prefix=f"k{c}-")}
                for c in HELM_CURVE]
        if "x" in PARTS:
            results["flux_turns"] = turns = []
            flux = Flux(bed)
            try:
                for turn in range(FLUX_TURNS):
                    for n in FLUX_N:  # krypton, then Flux, on the same bed as it is then
                        k = fleet_run(bed, n, prefix=f"k{turn}-", bump=True)
                        f = flux_run(bed, flux, n, prefix=f"x{turn}-")
                        turns.append({"releases": 2 * n, "turn": turn, "krypton": k,
                                      "flux": f, "ratios": flux_ratios(k, f)})
            finally:
                flux.stop()
            results["flux_summary"] = flux_summary(turns)
        if "e" in PARTS:
            results["latency"] = latencies(bed)
        if "f" in PARTS:
            results["starvation"] = [starvation(bed, 0), starvation(bed, 10)]
        if "g" in PARTS:
            results["sigterm"] = sigterm_during_installs(bed)
        if "h" in PARTS:
            results["sharding"] = sharding(bed)
        if "i" in PARTS:
            results["waiting"] = real_waiting(bed, helm_wait=False)
        if "w" in PARTS:
            results["waiting_helm_wait"] = real_waiting(bed, helm_wait=True)
        if "j" in PARTS:
            results["failure_storm"] = failure_storm(bed)
    finally:
        bed.stop()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
