"""What krypton status prints: rows, progress bars, the frames of --watch. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from krypton.cli.view import (
    STATUS_COLUMNS,
    assign_replicas,
    bar,
    failing_clusters,
    frame,
    progress,
    render,
    with_replicas,
)
from krypton.decisions.fleetview import tenant_rows
from krypton.decisions.rollouts.rollout import RolloutState


def tenant(name: str, phase: str, conditions: list[tuple[str, str, str, str]],
           clusters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "t", "name": name},
            "status": {"phase": phase, "clusters": clusters or {},
                       "conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                      for t, s, r, m in conditions]}}


READY = tenant("ready", "Ready", [("ClusterReady/a", "True", "Installed", "installed"),
                                  ("Ready", "True", "Ready", "ready on a")],
               {"a": {"release": "tenant-ready-a", "chartVersion": "1.0.0",
                      "fingerprint": "0123456789abcdef"}})
INSTALLING = tenant("slow", "Pending", [("ClusterProgress/a", "True", "Installing",
                                         "helm install of chart 1.0.0 running")])
FAILED = tenant("bad", "Error", [("ClusterError/a", "True", "InstallFailed", "boom"),
                                 ("ClusterProgress/a", "True", "Installing", "x")])
PAUSED = tenant("held", "Suspended", [("Paused", "True", "Paused", "paused by annotation")])
ELSEWHERE = tenant("other", "Pending", [("ClusterProgress/a", "False", "NotTargeted",
                                         "targets b")])


def test_a_row_per_tenant_says_what_is_going_on() -> None:
    rows = {r.tenant: r for r in tenant_rows("a", [READY, INSTALLING, FAILED, PAUSED, ELSEWHERE])}
    assert [r.tenant for r in tenant_rows("a", [READY, FAILED])] == ["bad", "ready"]
    r = rows["ready"]
    assert (r.phase, r.release, r.chart_version, r.fingerprint, r.ready, r.message) == (
        "Ready", "tenant-ready-a", "1.0.0", "0123456789ab", True, "ready on a")
    assert rows["slow"].detail == "Installing: helm install of chart 1.0.0 running"
    assert rows["bad"].detail == "InstallFailed: boom"  # the error before the progress
    assert rows["held"].detail == "Suspended: paused by annotation"
    assert rows["other"].detail == "NotTargeted"
    assert rows["slow"].release == "tenant-slow-a" and not rows["slow"].ready


def test_a_row_says_when_a_newer_chart_is_available() -> None:
    outdated = tenant("old", "Ready", [("ClusterReady/a", "True", "Installed", "installed")],
                      {"a": {"chartVersion": "1.0.0", "newerVersion": "1.1.0"}})
    cleared = tenant("new", "Ready", [("ClusterReady/a", "True", "Installed", "installed")],
                     {"a": {"chartVersion": "1.1.0", "newerVersion": ""}})
    rows = {r.tenant: r for r in tenant_rows("a", [outdated, cleared])}
    assert rows["old"].detail == "chart 1.1.0 is available (the settings take 1.0.0)"
    assert rows["new"].detail == ""


@pytest.mark.parametrize(("done", "total", "expected"), [
    (0, 0, "[----------] 0/0"), (0, 4, "[----------] 0/4"), (1, 4, "[##--------] 1/4"),
    (3, 4, "[#######---] 3/4"), (4, 4, "[##########] 4/4"), (5, 4, "[##########] 5/4"),
])
def test_bar(done: int, total: int, expected: str) -> None:
    assert bar(done, total, width=10) == expected


def test_progress_without_a_rollout_counts_ready_releases() -> None:
    rows = tenant_rows("a", [READY, INSTALLING, FAILED, ELSEWHERE])
    assert progress(rows, None) == [f"releases ready  {bar(1, 3)}"]  # NotTargeted left out


def _rollout(**kw: Any) -> RolloutState:
    return RolloutState(target="fp", version="1.0.0", waves=(("a",), ("b", "c")), **kw)


def test_progress_of_a_rollout_in_its_second_wave() -> None:
    rows = tenant_rows("a", [READY, INSTALLING]) + tenant_rows("b", [READY]) + \
        tenant_rows("z", [READY])  # z is in no wave
    rows[2].chart_version = "0.9.0"  # ready on b, but not on the target yet
    lines = progress(rows, _rollout(wave=1, message="wave 2 of 2: b, c"))
    assert lines == ["rollout to 1.0.0: Progressing - wave 2 of 2: b, c",
                     f"  waves     {bar(1, 2)}",
                     f"  releases  {bar(1, 3)} at 1.0.0 and ready"]


def test_a_halted_rollout_says_why_and_a_complete_one_has_every_wave_done() -> None:
    halted = progress([], _rollout(wave=1, phase="Halted", message="2 failed releases on b"))
    assert halted[0] == "rollout to 1.0.0: Halted"
    assert halted[-1] == "  halted: 2 failed releases on b"
    done = progress([], _rollout(wave=2, phase="Complete"))
    assert done[1] == f"  waves     {bar(2, 2)}"


def test_a_frame_and_its_wide_and_clipped_forms() -> None:
    rows = tenant_rows("a", [READY, FAILED])
    # columns as wide as their widest cell, two spaces apart, no trailing blanks
    assert frame(rows, None, wide=False, when="T").splitlines() == [
        "krypton status --watch  T  (Ctrl-C to quit)",
        "",
        "releases ready  [##########----------] 1/2",
        "",
        "CLUSTER  NAMESPACE  TENANT  PHASE  RELEASE         CHART  FINGERPRINT   DETAIL",
        "a        t          bad     Error  tenant-bad-a                         InstallFailed: boom",
        "a        t          ready   Ready  tenant-ready-a  1.0.0  0123456789ab"]
    wide = frame(rows, None, wide=True, when="T").splitlines()
    assert wide[4:] == [
        "CLUSTER  NAMESPACE  TENANT  PHASE  RELEASE         CHART  FINGERPRINT   DETAIL"
        "               MESSAGE",
        "a        t          bad     Error  tenant-bad-a                         InstallFailed: boom",
        "a        t          ready   Ready  tenant-ready-a  1.0.0  0123456789ab                  "
        "     ready on a"]
    clipped = frame(rows, None, wide=True, when="T", width=30)
    assert max(len(line) for line in clipped.splitlines()) == 30


def test_failing_clusters_are_recent_warnings_on_their_secrets() -> None:
    def event(name: str, reason: str, stamp: str, kind: str = "Secret",
              reporter: str = "mesh.openkcm.io/krypton") -> dict[str, Any]:
        return {"involvedObject": {"kind": kind, "name": name}, "reason": reason,
                "message": f"{reason} on {name}", "lastTimestamp": stamp,
                "reportingComponent": reporter}

    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    events = [event("a", "ClusterUnreachable", "2027-01-15T07:59:00Z"),
              event("a", "WorkerFailed", "2027-01-15T07:58:00Z"),  # older than the first
              event("b", "ClusterUnreachable", "2027-01-15T07:40:00Z"),  # 20 min ago
              event("c", "Engaged", "2027-01-15T07:59:00Z"),  # not a failure
              event("d", "ClusterUnreachable", "2027-01-15T07:59:00Z", kind="Tenant"),
              event("e", "DuplicateCluster", "not a time"),
              # forged: the newest, on a and on f, but not reported by krypton
              event("a", "WorkerFailed", "2027-01-15T07:59:30Z", reporter="mallory"),
              event("f", "WorkerFailed", "2027-01-15T07:59:30Z", reporter="mallory"),
              event("f", "WorkerFailed", "2027-01-15T07:59:30Z", reporter="")]
    assert failing_clusters(events, now) == {"a": "ClusterUnreachable: ClusterUnreachable on a"}


def test_a_sharded_fleet_shows_the_replica_of_each_cluster() -> None:
    rows = assign_replicas(tenant_rows("a", [READY]) + tenant_rows("b", [READY]),
                           {"a": "r1"})
    table = render(rows, with_replicas(STATUS_COLUMNS, rows), "table").splitlines()
    assert table[0].split()[:3] == ["CLUSTER", "REPLICA", "NAMESPACE"]
    assert [line.split()[:2] for line in table[1:]] == [["a", "r1"], ["b", "-"]]
    plain = tenant_rows("a", [READY])
    assign_replicas(plain, {})
    assert plain[0].replica == ""
    assert with_replicas(STATUS_COLUMNS, plain) == STATUS_COLUMNS  # not sharded: no column


def _cluster_event(name: str, reason: str, stamp: str, reporter: str = "mesh.openkcm.io/krypton",
                   message: str = "") -> dict[str, Any]:
    """An Event on cluster `name`'s Secret, reported by `reporter`."""
    return {"involvedObject": {"kind": "Secret", "name": name}, "reason": reason,
            "message": message or f"{reason} of {name}", "lastTimestamp": stamp,
            "reportingComponent": reporter}


@pytest.mark.parametrize(("said", "ended", "notes", "phase"), [
    ("OrphanedReleases", "OrphanedReleasesGone", "orphan_notes", "Orphans"),
    ("RecordsUnguarded", "RecordsGuarded", "unguarded_notes", "Unguarded"),
])
def test_status_shows_a_standing_state_until_the_operator_says_it_ended(
        said: str, ended: str, notes: str, phase: str) -> None:
    """Releases of undiscovered cluster names, release records without their guard: shown
    from the operator's own Events (a forged one is not), until it says they are over."""
    from krypton.cli import view

    events = [_cluster_event("a", said, "2027-01-15T07:00:00Z", message="2 of them"),
              _cluster_event("b", said, "2027-01-15T07:00:00Z"),
              _cluster_event("b", ended, "2027-01-15T07:10:00Z"),
              _cluster_event("c", said, "2027-01-15T07:00:00Z", reporter="mallory")]
    found = getattr(view, notes)(events)
    assert found == {"a": "2 of them"}
    key = {"Orphans": "orphans", "Unguarded": "unguarded"}[phase]
    row = view.cluster_rows("a", **{key: found["a"]})[0]
    assert (row.phase, row.detail) == (phase, f"{said}: 2 of them")


def test_a_failing_release_says_how_often_and_when_next() -> None:
    retrying = tenant("flaky", "Error", [("ClusterError/a", "True", "UpgradeFailed", "boom")],
                      {"a": {"failures": 3, "nextAttemptTime": "2026-11-23T12:00:40Z"}})
    stalled = tenant("stuck", "Error",
                     [("ClusterError/a", "True", "RetriesExhausted", "9 attempts failed")],
                     {"a": {"failures": 9, "nextAttemptTime": "2026-11-23T12:10:00Z"}})
    healed = tenant("fine", "Ready", [("ClusterError/a", "False", "Upgraded", "no error")],
                    {"a": {"failures": 0}})
    rows = {r.tenant: r.detail for r in tenant_rows("a", [retrying, stalled, healed])}
    assert rows == {"flaky": "UpgradeFailed: boom [failed 3x; next attempt 2026-11-23T12:00:40Z]",
                    "stuck": "RetriesExhausted: 9 attempts failed", "fine": ""}
