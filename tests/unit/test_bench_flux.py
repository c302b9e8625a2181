"""The bench's comparison with Flux (P4): krypton's ratios per turn and their medians."""

from __future__ import annotations

from krypton.testing.bench.flux import flux_ratios, flux_summary


def run(ready: float, bump: float) -> dict[str, object]:
    return {"releases": 400, "seconds_to_ready": ready, "cpu_ms_per_release": 100.0,
            "peak_tree_pss_mib": 150.0, "apiserver_writes_per_release": 9.0,
            "control_plane_cpu_ms_per_release": 80.0,
            "version_bump": {"seconds": bump, "cpu_ms_per_release": 120.0,
                             "peak_tree_pss_mib": 160.0, "apiserver_writes_per_release": 7.0,
                             "control_plane_cpu_ms_per_release": 0.0}}


def test_ratios_are_krypton_over_flux_and_their_median_spans_the_turns() -> None:
    flux = run(100.0, 200.0) | {"cpu_ms_per_release": 200.0}
    flux["version_bump"] = {**flux["version_bump"],  # type: ignore[dict-item]
                            "control_plane_cpu_ms_per_release": 40.0}
    turns = [{"releases": 400, "ratios": flux_ratios(run(r, 50.0), flux)}
             for r in (50.0, 70.0, 60.0)]
    assert [t["ratios"]["seconds_to_ready"] for t in turns] == [0.5, 0.7, 0.6]
    assert turns[0]["ratios"]["install_cpu_per_release"] == 0.5
    assert turns[0]["ratios"]["bump_seconds"] == 0.25
    assert turns[0]["ratios"]["bump_control_plane_cpu"] == 0.0
    assert "bump_control_plane_cpu" not in flux_ratios(flux, run(1.0, 1.0))  # over 0: none
    [summary] = flux_summary(turns)
    assert summary["turns"] == 3
    assert summary["seconds_to_ready"] == {"median": 0.6, "min": 0.5, "max": 0.7}
