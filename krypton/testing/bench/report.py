"""The machine, the versions and the table a run prints."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any


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


Rows = list[tuple[str, str]]


def _fleet_rows(results: dict[str, Any]) -> Rows:
    """(a), (b), (c)."""
    rows: Rows = []
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
    return rows


def _proxied_rows(results: dict[str, Any]) -> Rows:
    """(p)."""
    rows: Rows = []
    if "proxied" in results:
        r = results["proxied"]
        n, b = r["tenants_per_cluster"], r["version_bump"]
        rows.append((f"(p) {n} x 2 through a proxy, Ready", f"{r['seconds_to_ready']} s "
                     f"({r['releases_per_second']} releases/s; {_cost(r)}; the proxy "
                     f"{r['proxy_cpu_seconds']} CPU s)"))
        rows.append((f"(p) version bump {n} x 2", f"{b['seconds']} s "
                     f"({b['releases_per_second']} releases/s; {_cost(b)})"))
    return rows


def _flux_rows(results: dict[str, Any]) -> Rows:
    """(x), each turn and the summary."""
    rows: Rows = []
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
    return rows


def _scale_rows(results: dict[str, Any]) -> Rows:
    """(u), (d), (D), (k), (e), (f)."""
    rows: Rows = []
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
    return rows


def _failure_rows(results: dict[str, Any]) -> Rows:
    """(g), (h), (i), (j)."""
    rows: Rows = []
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
    return rows


def table(results: dict[str, Any]) -> str:
    rows = [("measure", "value"), *_fleet_rows(results), *_proxied_rows(results),
            *_flux_rows(results),
            *_scale_rows(results), *_failure_rows(results)]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(width)}  {b}" for a, b in rows)


def _cost(run: dict[str, Any]) -> str:
    return (f"{run['cpu_ms_per_release']} CPU ms/release (operator "
            f"{run['operator_cpu_ms_per_release']}, helm {run['helm_cpu_ms_per_release']}); "
            f"peak tree PSS {run['peak_tree_pss_mib']} MiB, RSS sum {run['peak_tree_rss_mib']} "
            f"MiB with {run['helm_processes_at_peak']} helm, operator "
            f"{run.get('operator_pss_mib_at_peak', '?')} MiB of it")
