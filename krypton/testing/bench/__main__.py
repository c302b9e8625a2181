"""``make bench``: every part asked for, on one bed, then results.json and the table."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable
from typing import Any

from krypton.decisions.settings import Settings

from .bed import Bed, helm_room
from .config import (
    CLUSTER_COUNTS,
    CURVE_N,
    FLUX_N,
    FLUX_TURNS,
    HELM_CURVE,
    OPERATOR_ARGS,
    OPERATOR_ENV,
    OUT,
    PARTS,
    PROXIED_N,
    SHAPE_M,
    SIZES,
)
from .costs import cluster_scale, latencies, starvation, unit_costs
from .failures import failure_storm, real_waiting, sharding, sigterm_during_installs
from .fleet import fleet_run, fleet_shape, proxied, release_index_bytes
from .flux import Flux, flux_ratios, flux_run, flux_summary
from .page import page_costs
from .report import machine, table, versions


def _records_held(bed: Bed) -> dict[str, Any]:
    """(D): (d) again, now that the control planes hold release records."""
    return {"records_per_control_plane": {c: len(bed.release_records(c)) for c in bed.clusters},
            "release_index_bytes_per_record": release_index_bytes(),
            "runs": [cluster_scale(bed, m) for m in CLUSTER_COUNTS]}


def _flux_turns(bed: Bed) -> dict[str, Any]:
    """(x): krypton, then Flux, on the same bed as it is then, each size in each turn."""
    turns = []
    flux = Flux(bed)
    try:
        for turn in range(FLUX_TURNS):
            for n in FLUX_N:
                k = fleet_run(bed, n, prefix=f"k{turn}-", bump=True)
                f = flux_run(bed, flux, n, prefix=f"x{turn}-")
                turns.append({"releases": 2 * n, "turn": turn, "krypton": k, "flux": f,
                              "ratios": flux_ratios(k, f)})
    finally:
        flux.stop()
    return {"flux_turns": turns, "flux_summary": flux_summary(turns)}


# each part's letter and what it adds to the results, in the order they run: (d) first,
# while the control planes hold no Helm release records
RUNS: list[tuple[str, Callable[[Bed], dict[str, Any]]]] = [
    ("d", lambda bed: {"clusters": [cluster_scale(bed, m) for m in CLUSTER_COUNTS]}),
    ("a", lambda bed: {"fleet": [fleet_run(bed, n) for n in SIZES]}),
    ("D", lambda bed: {"clusters_holding_release_records": _records_held(bed)}),
    ("u", lambda bed: {"unit_costs": unit_costs(bed)}),
    ("s", lambda bed: {"fleet_shape": fleet_shape(bed, SHAPE_M)}),
    ("k", lambda bed: {"helm_concurrency": [
        {"max_concurrent_helm": c, **fleet_run(bed, CURVE_N, "--max-concurrent-helm", str(c),
                                               *helm_room(c), prefix=f"k{c}-")}
        for c in HELM_CURVE]}),
    ("x", _flux_turns),
    ("p", lambda bed: {"proxied": proxied(bed, PROXIED_N)}),
    ("e", lambda bed: {"latency": latencies(bed)}),
    ("f", lambda bed: {"starvation": [starvation(bed, 0), starvation(bed, 10)]}),
    ("g", lambda bed: {"sigterm": sigterm_during_installs(bed)}),
    ("h", lambda bed: {"sharding": sharding(bed)}),
    ("i", lambda bed: {"waiting": real_waiting(bed, helm_wait=False)}),
    ("w", lambda bed: {"waiting_helm_wait": real_waiting(bed, helm_wait=True)}),
    ("j", lambda bed: {"failure_storm": failure_storm(bed)}),
    ("v", lambda bed: {"fleet_page": page_costs(bed)}),
]


def main() -> int:
    bed = Bed()
    results: dict[str, Any] = {"machine": machine(), "versions": versions(bed.tools),
                               "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
                               "settings": {"max_concurrent_helm":
                                            Settings().max_concurrent_helm,
                                            "max_concurrent_reconciles": 4, "helm_wait": False,
                                            "operator_args": OPERATOR_ARGS,
                                            "operator_env": OPERATOR_ENV}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    try:
        for part, run in RUNS:
            if part in PARTS:
                results.update(run(bed))
                # written after each part: one that fails keeps what the others measured
                OUT.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        bed.stop()
    print(table(results))
    print(f"\nwritten to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
