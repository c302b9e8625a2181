"""What a bench run measures and how large, from its environment (KRYPTON_BENCH_*)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


OUT = Path(os.environ.get("KRYPTON_BENCH_OUT", ROOT / "bench" / "results.json"))


SIZES = [int(x) for x in os.environ.get("KRYPTON_BENCH_N", "50,200").split(",")]


CLUSTER_COUNTS = [int(x) for x in os.environ.get("KRYPTON_BENCH_M", "10,100,1000").split(",")]


# measures to run: a (with b and c), d, e, f, g, h, i, j; on request: w (i with helm's own
# wait), D ((d) once (a) left release records), k (--max-concurrent-helm against throughput),
# u (what one request, one helm process and the process's start cost on their own), p ((a)
# and (c) with the clusters behind a proxy), s (the fleet's shape), x (Flux), v (the fleet
# page: its render, its event streams' cost, and an A/B of (a) and (c) with 50 streams open)
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


PROXIED_N = int(os.environ.get("KRYPTON_BENCH_PROXIED_N", "200"))  # (p): Tenants per cluster
FAILOVERS = int(os.environ.get("KRYPTON_BENCH_FAILOVERS", "6"))  # (h) replicas killed


POD_READY_DELAY = 20.0  # (i): seconds from a pod's scheduling to its readiness


WAITING_TENANTS = int(os.environ.get("KRYPTON_BENCH_WAITING_N", "100"))  # (i) per cluster


TICK = os.sysconf("SC_CLK_TCK")


# a directory: (a) and (c) record the operator with py-spy (sampling, 100 Hz) into it
PROFILE_DIR = os.environ.get("KRYPTON_BENCH_PROFILE", "")  # only samples holding the GIL: CPU spent in Python


# --resync-period of (a)'s operator: (b) measures its first resync, which must come after (a)
# has ended, or (a) counts a resync's passes as the installs' (at 45 s it fell within (a) on a
# slow day, at 1.8 passes per release instead of 1)
FLEET_RESYNC = 120.0


SHAPE_M = int(os.environ.get("KRYPTON_BENCH_SHAPE_M", "40"))  # (s): cluster names


SHAPE_TENANTS = 2  # (s): Tenants per cluster name


STORM_TENANTS = int(os.environ.get("KRYPTON_BENCH_STORM_N", "50"))  # (j) per cluster


STORM_MINUTES = int(os.environ.get("KRYPTON_BENCH_STORM_MINUTES", "12"))


STALL_MINUTES = int(os.environ.get("KRYPTON_BENCH_STALL_MINUTES", "4"))
