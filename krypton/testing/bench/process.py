"""What a process tree costs, read from /proc: CPU, memory, threads, its helm processes."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..operator import (
    descendants,
)
from .config import PROFILE_DIR, TICK


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


def summary(values: list[float]) -> dict[str, Any]:
    return {"p50_ms": round(1000 * statistics.median(values), 1),
            "p95_ms": round(1000 * pct(values, 0.95), 1), "samples": len(values)}
