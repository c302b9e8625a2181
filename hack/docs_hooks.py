"""MkDocs hooks: the reference pages and the figures of the docs site, generated from the
code at build time. Nothing here is written by hand that the code already says:

- reference/flags.md    every flag, its environment variables and default (settings.OPTIONS)
- reference/metrics.md  every metric with its type, labels and help (the metrics registry)
- reference/reasons.md  every condition, Event and plan reason (decisions/reasons.REASONS)
- reference/crd.md      the Tenant CRD's fields and columns (the CRD schema krypton applies)
- figures/*.svg         the benchmark figures (bench/results.json), the package diagram
                        (the imports between krypton's packages)
"""

from __future__ import annotations

import ast
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    generated = {
        "reference/flags.md": flags_page(),
        "reference/metrics.md": metrics_page(),
        "reference/reasons.md": reasons_page(),
        "reference/crd.md": crd_page(),
        **{path: draw() for path, draw in FIGURES.items()},
    }
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    check_readme_figures(generated)
    return files


# The figures the README shows too (it is read where no site is built), committed: each one's
# path in the repository -> the site's path of the same figure (FIGURES draws it).
README_FIGURES = {"bench/helm-concurrency.svg": "figures/bench-helm-concurrency.svg"}


def check_readme_figures(generated: dict[str, str]) -> None:
    """A README figure that is not the site's, as drawn from bench/results.json, fails the
    (strict) build."""
    from mkdocs.exceptions import PluginError

    stale = [path for path, site in README_FIGURES.items()
             if not (ROOT / path).is_file() or (ROOT / path).read_text() != generated[site]]
    if stale:
        raise PluginError(f"{', '.join(stale)}: not what bench/results.json draws; "
                          "run `make figures` and commit the result")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# --- reference pages ------------------------------------------------------------------


def flags_page() -> str:
    from krypton.decisions.settings import OPTIONS, TOPICS

    lines = ["# Flags and environment", "",
             "Precedence: flag > environment > default. Boolean flags take an optional value",
             "(`--helm-wait=false`). Durations: `90`, `90s`, `5m`, `1h`, `500ms`. A bad value or",
             "a missing helm prints one line and exits with status 2 before any cluster is",
             "touched. `krypton run --help` prints the same, grouped the same way.", ""]
    placed: set[str] = set()
    for title, prefixes in TOPICS:
        mine = [o for o in OPTIONS if o.name not in placed
                and any(o.name == p or (p.endswith("_") and o.name.startswith(p))
                        or o.name.startswith(p) for p in prefixes)]
        if not mine:
            continue
        lines += [f"## {title[0].upper()}{title[1:]}", "",
                  "| flag | environment | default | meaning |", "|---|---|---|---|"]
        for o in mine:
            placed.add(o.name)
            default = o.default
            if isinstance(default, float) and o.parse.__name__ == "duration":
                default = f"{default:g}s"
            default = "—" if default in ("", ()) else default
            envs = " / ".join(f"`{e}`" for e in o.envs)
            lines.append(f"| `{o.flag}` | {envs} | `{_cell(default)}` | {_cell(o.help)} |")
        lines.append("")
    rest = [o for o in OPTIONS if o.name not in placed]
    if rest:
        lines += ["## Other", "", "| flag | environment | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{o.flag}` | {' / '.join(f'`{e}`' for e in o.envs)} | "
                  f"`{_cell(o.default if o.default not in ('', ()) else '—')}` | {_cell(o.help)} |"
                  for o in rest]
    return "\n".join(lines) + "\n"


def metrics_page() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from krypton.adapters import metrics

    suffix = {"counter": "_total", "info": "_info"}
    rows = []
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + suffix.get(value._type, "")  # noqa: SLF001
            labels = ", ".join(value._labelnames)  # noqa: SLF001
            rows.append(f"| `{name}` | {value._type} | {labels} | "  # noqa: SLF001
                        f"{_cell(value._documentation)} |")  # noqa: SLF001
    return "\n".join([
        "# Metrics", "",
        "Every metric krypton exports on `--metrics-bind-address` (`/metrics`), from its "
        "registry. A cluster that leaves the fleet takes all its series with it. What to "
        "alert on and the dashboard: [Operations](../operations.md).", "",
        "| metric | type | labels | meaning |", "|---|---|---|---|", *sorted(rows), ""])


def reasons_page() -> str:
    from krypton.decisions.reasons import REASONS

    lines = ["# Reasons", "",
             "Every reason krypton writes into a Tenant's conditions, an Event, a `krypton plan` "
             "row or an error message, with what it means and what to do. *fatal* reasons put "
             "the Tenant in phase Error; *chart* reasons do not block Ready under "
             "`--allow-chart-skip`. Troubleshooting by symptom: "
             "[Operations](../operations.md#troubleshooting).", "",
             "| reason | seen in | meaning | what to do |", "|---|---|---|---|"]
    for name in sorted(REASONS):
        r = REASONS[name]
        marks = [m for m, on in (("fatal", r.fatal), ("chart", r.chart)) if on]
        where = ", ".join(r.where) + (f" ({', '.join(marks)})" if marks else "")
        lines.append(f"| `{name}` | {where} | {_cell(r.meaning)} | {_cell(r.action)} |")
    return "\n".join(lines) + "\n"


def crd_page() -> str:
    from krypton.decisions.crd import crd_manifest

    crd = crd_manifest()
    lines = [f"# The Tenant CRD ({crd['metadata']['name']})", "",
             "Generated from the CRD krypton applies (`crds/mesh.openkcm.io_tenants.yaml`).", ""]
    for version in crd["spec"]["versions"]:
        lines += [f"## {crd['spec']['group']}/{version['name']}", "",
                  "| field | type | description |", "|---|---|---|"]
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in _fields(schema, ""):
            lines.append(f"| `{path}` | {node.get('type', '')} | "
                         f"{_cell(node.get('description', ''))} |")
        columns = version.get("additionalPrinterColumns") or []
        if columns:
            lines += ["", "Columns of `kubectl get tenants`:", "",
                      "| column | JSON path | description |", "|---|---|---|"]
            lines += [f"| {c['name']} | `{c['jsonPath']}` | {_cell(c.get('description', ''))} |"
                      for c in columns]
        lines.append("")
    return "\n".join(lines)


def _fields(node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, child in (node.get("properties") or {}).items():
        if path == "" and name in ("apiVersion", "kind", "metadata"):
            continue
        here = f"{path}.{name}" if path else name
        out.append((here, child))
        out += _fields(child, here)
        extra = child.get("additionalProperties")
        if isinstance(extra, dict):
            out += _fields(extra, f"{here}.<key>")
        items = child.get("items")
        if isinstance(items, dict):
            out += _fields(items, f"{here}[]")
    return out


# --- figures ----------------------------------------------------------------------------


def _results() -> dict[str, Any]:
    return json.loads((ROOT / "bench" / "results.json").read_text())


def _svg(fig: Any) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return out.getvalue()


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "krypton"  # the same figure, byte for byte
    import matplotlib.pyplot as plt

    return plt


def _label(run: dict[str, Any]) -> str:
    return f"{run['commit']}, {run['date']}"


def bench_clusters_figure() -> str:
    plt = _plt()
    now = _results()["current"]
    idle, held = now["clusters"], now["clusters_holding_release_records"]["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    for runs, marker, what in ((idle, "o", "idle (d)"), (held, "^", "watching release records (D)")):
        n = [r["clusters"] for r in runs]
        left.plot(n, [r["peak_rss_mib"] for r in runs], marker=marker, label=what)
        right.plot(n, [r["seconds_to_engage"] for r in runs], marker=marker, label=what)
    left.axhline(250, color="tab:red", linewidth=0.8, linestyle="--", label="goal at 1000")
    left.legend(fontsize="small")
    left.set(xscale="log", xlabel="clusters", ylabel="peak RSS (MiB)", title="operator memory")
    right.legend(fontsize="small")
    right.set(xscale="log", xlabel="clusters", ylabel="seconds", title="time to engage all")
    fig.suptitle(f"bench d and D, on {_label(now)}", fontsize="small")
    fig.tight_layout()
    return _svg(fig)


def bench_cost_figure() -> str:
    plt = _plt()
    results = _results()
    cost, now = results["history"]["operator_cost"], results["current"]
    fleet = next(r for r in now["fleet"] if r["tenants_per_cluster"] == 200)
    values = [cost["before"]["fleet"][0]["operator_cpu_ms_per_release"],
              cost["after_default"]["fleet"][0]["operator_cpu_ms_per_release"],
              cost["after_8_helm"]["fleet"][0]["operator_cpu_ms_per_release"],
              fleet["operator_cpu_ms_per_release"]]
    names = ["before", "after, 4 helm", "after, 8 helm", f"{now['commit']}, 4 helm"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(names, values, color=["tab:gray", "tab:blue", "tab:green", "tab:orange"])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
    ax.set(ylabel="operator CPU ms per install",
           title="the operator's own cost (bench a, 200 x 2)\n2026-11-24: before 5a3296a, "
                 f"after 196554e; {now['date']}: {now['commit']}")
    return _svg(fig)


def bench_concurrency_figure() -> str:
    plt = _plt()
    results = _results()
    now = results["current"]
    curve = now["helm_concurrency"]
    processes = results["history"]["operator_cost"]["helm_processes"]  # a helm process a run
    old = processes["helm_concurrency_curve_100x2"]
    label = f"{_label(now)}, helm workers"
    before = f"{_label(processes)}, helm processes"
    k = [r["max_concurrent_helm"] for r in curve]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    left.plot(k, [r["releases_per_second"] for r in curve], marker="o", label=label)
    left.plot([r["max_concurrent_helm"] for r in old], [r["releases_per_second"] for r in old],
              marker="^", linestyle="none", color="tab:gray", label=before)
    left.legend(fontsize="small", loc="lower right")
    left.set(xscale="log", xticks=k, xticklabels=[str(x) for x in k], ylim=(0, None),
             xlabel="--max-concurrent-helm", ylabel="releases per second",
             title="installs per second (bench k)")
    right.plot(k, [r["peak_tree_pss_mib"] for r in curve], marker="o", color="tab:orange",
               label=label)
    right.plot([r["max_concurrent_helm"] for r in old], [r["peak_tree_pss_mib"] for r in old],
               marker="^", linestyle="none", color="tab:gray", label=before)
    right.axhline(188, color="tab:red", linewidth=0.8, linestyle="--", label="2.0 x the prototype")
    right.axvline(4, color="tab:gray", linewidth=0.8, linestyle=":", label="the default")
    right.legend(fontsize="small", loc="lower right")
    right.set(xscale="log", xticks=k, xticklabels=[str(x) for x in k], ylim=(0, None),
              xlabel="--max-concurrent-helm", ylabel="MiB", title="peak PSS of the operator's tree")
    fig.suptitle(f"bench k, 100 x 2, on {label} (grey: {before})", fontsize="small")
    fig.tight_layout()
    return _svg(fig)


LAYERS = ("decisions", "adapters", "runtime", "app", "cli", "testing")


def package_imports() -> dict[tuple[str, str], int]:
    """(importing package, imported package) -> number of import statements, between
    krypton's top-level packages."""
    edges: dict[tuple[str, str], int] = {}
    for path in (ROOT / "krypton").rglob("*.py"):
        parts = path.relative_to(ROOT / "krypton").parts
        if len(parts) < 2 or parts[0] not in LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("krypton."):
                target = node.module.split(".")[1]
                if target in LAYERS and target != parts[0]:
                    edges[(parts[0], target)] = edges.get((parts[0], target), 0) + 1
    return edges


def packages_figure() -> str:
    plt = _plt()
    place = {"decisions": (2, 0), "adapters": (0.6, 1.2), "runtime": (2, 2.2), "app": (1.2, 3.4),
             "cli": (2.8, 3.4), "testing": (4.2, 2.2)}
    fig, ax = plt.subplots(figsize=(7, 5))
    for (src, dst), count in sorted(package_imports().items()):
        (x0, y0), (x1, y1) = place[src], place[dst]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": "tab:gray",
                                "lw": 0.6 + min(count, 30) / 10, "shrinkA": 22, "shrinkB": 22})
    for name, (x, y) in place.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=11,
                bbox={"boxstyle": "round,pad=0.5", "fc": "white", "ec": "tab:blue"})
    ax.set(xlim=(-0.3, 5), ylim=(-0.6, 4), title="krypton's packages: an arrow is 'imports' "
           "(width: how often)")
    ax.axis("off")
    return _svg(fig)


FIGURES: dict[str, Callable[[], str]] = {
    "figures/bench-clusters.svg": bench_clusters_figure,
    "figures/bench-operator-cost.svg": bench_cost_figure,
    "figures/bench-helm-concurrency.svg": bench_concurrency_figure,
    "figures/packages.svg": packages_figure,
}


if __name__ == "__main__":  # make figures: the README's, drawn as for the site
    for path, site in README_FIGURES.items():
        (ROOT / path).write_text(FIGURES[site]())
