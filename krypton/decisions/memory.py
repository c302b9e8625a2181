"""What each helm process may use of the pod's memory (SPEC S7). Pure.

The operator and its helm processes (helm workers, or helm binaries with
``--helm-engine=binary``) share one pod and one memory limit: the pod's cgroup's, or
``--memory-limit`` where the cgroup sets none. The operator keeps `OPERATOR_SHARE` of it; the
rest is split between the ``--max-concurrent-helm`` processes that may run at once, each
held to its share by the kernel (its data segment, RLIMIT_DATA: an allocation past it fails
and the Go runtime ends the process), with Go's soft limit (GOMEMLIMIT) at `SOFT` of it so
its collector works harder well before. Every answer a helm process reads is bounded to
64 MiB, so one request stays far below a share. A share smaller than `FLOOR` cannot hold a
helm process reading one bounded answer: the concurrency is lowered until each share is at
least that, and said.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
OPERATOR_SHARE = 256 * MiB  # the operator's own part of the pod: its stores are bounded too
# a helm worker (about 50 MiB) reading one answer at its bound: client-go reads a body into a
# buffer that doubles as it grows, so 64 MiB peaks at about 210 MiB resident (measured)
FLOOR = 256 * MiB
SOFT = 0.6  # Go's soft limit, as a part of the share


@dataclass(frozen=True)
class HelmMemory:
    """The pod's memory as the helm processes get it."""

    pod: int  # bytes the operator and its helm processes may use together
    source: str  # where `pod` comes from: "cgroup" or "--memory-limit"
    concurrency: int  # helm processes at once (--max-concurrent-helm, or fewer)
    asked: int  # --max-concurrent-helm
    share: int  # bytes each helm process may use: its RLIMIT_DATA

    @property
    def soft(self) -> int:
        """GOMEMLIMIT, in bytes."""
        return int(self.share * SOFT)

    def said(self) -> str:
        """One line for the log and /readyz."""
        line = (f"helm: {self.concurrency} at once, {self.share // MiB} MiB each (Go's soft "
                f"limit {self.soft // MiB} MiB), of a pod limit of {self.pod // MiB} MiB "
                f"({self.source}; {OPERATOR_SHARE // MiB} MiB kept for the operator)")
        if self.concurrency < self.asked:
            line += (f"; --max-concurrent-helm={self.asked} lowered to {self.concurrency}: "
                     f"{self.asked} shares of at least {FLOOR // MiB} MiB do not fit")
        return line


def divide(cgroup: int | None, flag: int, asked: int) -> HelmMemory:
    """The shares of the pod's memory: `cgroup` is the cgroup's limit in bytes (None: it sets
    none), `flag` --memory-limit, `asked` --max-concurrent-helm."""
    pod, source = (cgroup, "cgroup") if cgroup else (flag, "--memory-limit")
    left = max(pod - OPERATOR_SHARE, FLOOR)
    concurrency = max(1, min(asked, left // FLOOR))
    return HelmMemory(pod=pod, source=source, concurrency=concurrency, asked=asked,
                      share=left // concurrency)


def quantity(text: str) -> int:
    """Bytes from a Kubernetes-style quantity: ``1073741824``, ``512Mi``, ``2Gi``, ``1G``."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    value = text.strip()
    for suffix, factor in units.items():
        if value.endswith(suffix) and value[:-len(suffix)].isdigit():
            return int(value[:-len(suffix)]) * factor
    if value.isdigit():
        return int(value)
    raise ValueError(f"{text!r} is not a memory quantity (such as 1Gi or 512Mi)")
