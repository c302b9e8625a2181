"""SPEC R18, H2: a release that keeps failing is retried on a growing schedule kept
in the Tenant's status (it survives passes and restarts), stalls after --max-retries, and
runs again when its target changes or a retry is asked for. Every test counts the helm
processes the operator started (its own metric) and reads the retry state it wrote."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from krypton.decisions.model import epoch_seconds
from krypton.testing.operator import OperatorProcess, wait_for
from tests.integration.conftest import Fleet, unique
from tests.integration.test_cli import krypton

FAIL = "failRender: this chart refuses to render\n"  # the sample chart's template `fail`
WRITER = "mesh.openkcm.io/writer"  # the label on records, and the annotation naming one (S6)


def runs(op: OperatorProcess, operation: str) -> float:
    return op.metric("krypton_helm_processes_total", operation=operation)


def record(fleet: Fleet, name: str) -> dict[str, Any]:
    status = fleet.remote.tenant(fleet.tenant_ns, name).get("status") or {}
    return (status.get("clusters") or {}).get("remote") or {}


def failures(fleet: Fleet, name: str) -> int:
    return int(record(fleet, name).get("failures") or 0)


@pytest.mark.helm3lane  # Helm 3 fails the same way: the same brakes
def test_a_failing_install_slows_down_and_stalls(fleet: Fleet, tmp_path: Path) -> None:
    """A template `fail` in per-cluster values: attempts at 0, 5, 10 s (the cap 5 s), then
    RetriesExhausted after --max-retries 2; nothing runs while stalled; `krypton retry`
    gives a fresh budget; fixed values (a new target) install."""
    fleet.register("remote", fleet.remote, values=FAIL)
    op = fleet.start("--max-retries", "2", "--retry-backoff-max", "5s")
    name = fleet.tenant(fleet.remote, unique("brk"))
    wait_for(lambda: failures(fleet, name) == 1, 60, what="the first failure recorded")
    first = record(fleet, name)
    gap = epoch_seconds(first["nextAttemptTime"]) - epoch_seconds(first["lastFailureTime"])
    # the first retry min(10 s, the cap) later, jittered by up to a tenth (whole seconds)
    assert 4.0 <= gap <= 7.0
    stalled = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                          "RetriesExhausted", timeout=60)
    assert stalled["message"].startswith("3 attempts of chart 0.2.0 failed; the last: ")
    assert "refuses to render" in stalled["message"]
    assert f"krypton retry {fleet.tenant_ns}/{name} --cluster remote" in stalled["message"]
    fleet.remote.wait_event(fleet.tenant_ns, name, "RetriesExhausted")
    assert runs(op, "install") == 3
    wait_for(lambda: op.metric("krypton_releases_stalled", cluster="remote") == 1, 15,
             what="the stalled metric")
    # stalled: a minute of resyncs, watch events and its own backoff would bring nothing
    passes = op.metric("krypton_reconciles_total", cluster="remote")
    fleet.remote.patch_tenant(fleet.tenant_ns, name, {"metadata": {"labels": {"poke": "1"}}})
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote") > passes, 30,
             what="a pass after the poke")
    assert runs(op, "install") == 3
    # krypton retry: a fresh budget (three more attempts), then stalled again
    again = krypton(fleet, "retry", f"{fleet.tenant_ns}/{name}", *fleet.args()[:4])
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"remote: retry of {fleet.tenant_ns}/{name} asked for")
    wait_for(lambda: runs(op, "install") == 6, 60, what="three more attempts")
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                "RetriesExhausted", timeout=30)
    # the values fixed: a new target, installed at once
    fleet.home.core.patch_namespaced_secret("remote", fleet.discovery_ns, {
        "data": {"values.yaml": ""}})
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready", timeout=90)
    assert failures(fleet, name) == 0
    assert runs(op, "install") == 7  # one more run, for the new target


@pytest.mark.helm3lane  # Helm 3 fails the same way: the same brakes
def test_the_backoff_survives_a_restart(fleet: Fleet) -> None:
    """Stopped between two attempts, a new operator waits for the next attempt the status
    names (no helm run before it), and counts on from there."""
    fleet.register("remote", fleet.remote, values=FAIL)
    op = fleet.start("--retry-backoff-max", "60s")
    name = fleet.tenant(fleet.remote, unique("rst"))
    wait_for(lambda: failures(fleet, name) == 2, 60, what="two failures")
    op.stop()
    due = epoch_seconds(record(fleet, name)["nextAttemptTime"])
    assert due is not None and due - time.time() > 5  # ~20 s after the second failure
    again = fleet.start("--retry-backoff-max", "60s")
    started = 0.0

    def attempted() -> bool:
        nonlocal started
        if runs(again, "install") >= 1:
            started = started or time.time()
            return True
        return False

    wait_for(attempted, 90, interval=0.2, what="the third attempt")
    assert started >= due - 1.0, f"attempt {due - started:.1f}s before it was due"
    wait_for(lambda: failures(fleet, name) == 3, 30, what="the third failure counted")


@pytest.mark.helm3lane  # Helm 3 fails the same way: the same brakes
def test_a_new_chart_version_resets_the_count(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote, values=FAIL)
    op = fleet.start("--retry-backoff-max", "60s")
    name = fleet.tenant(fleet.remote, unique("bump"))
    wait_for(lambda: failures(fleet, name) == 2, 60, what="two failures")
    op.stop()
    old = record(fleet, name)["failedTarget"]
    fleet.start("--retry-backoff-max", "60s", version="0.3.0")
    # counted from one again: three would mean the old target's count went on
    wait_for(lambda: record(fleet, name).get("failedTarget") != old, 60,
             what="a failure of the new target")
    assert failures(fleet, name) == 1


@pytest.mark.helm3lane  # Helm 3 fails the same way: the same brakes
def test_a_failing_first_install_cycle_is_braked_too(fleet: Fleet) -> None:
    """An object the API server refuses: helm leaves a failed release, and the recovery
    (uninstall, then install) is counted against the same budget: in 40 s at most four
    installs and three uninstalls (attempts at 0, 10, 30 s), not one cycle a second."""
    fleet.register("remote", fleet.remote, values="invalidObject: true\n")
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("cyc"))
    wait_for(lambda: failures(fleet, name) == 1, 60, what="the first failure")
    since = time.time()
    wait_for(lambda: time.time() - since > 40, 50, interval=1.0, what="40 s")
    installs = runs(op, "install")
    assert 2 <= installs <= 4
    assert runs(op, "uninstall") <= installs - 1
    wait_for(lambda: failures(fleet, name) == runs(op, "install"), 15,
             what="every install counted as one failure")


def test_field_conflicts_are_taken_over_and_named(fleet: Fleet) -> None:
    """Helm 4: a field a `kubectl patch` took (manager kubectl-patch), then a chart bump.
    Taken over by default, with an Event naming it."""
    name, release = _patched_by_hand(fleet, "fld")
    # krypton diff says so before the upgrade (Helm 4's own dry run does not)
    diff = krypton(fleet, "diff", *fleet.args(version="0.3.0"))
    assert diff.returncode == 2, diff.stderr
    assert f"#   ConfigMap {name}/{release} .data.chartVersion (kubectl-patch)" in diff.stdout
    bumped = fleet.start(version="0.3.0")
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterReady/remote", "True", "Upgraded")
    event = fleet.remote.wait_event(fleet.tenant_ns, name, "FieldsTakenOver")
    assert event.type == "Normal"
    assert f"ConfigMap {name}/{release} .data.chartVersion (kubectl-patch)" in event.message
    assert runs(bumped, "upgrade") == 2  # refused, then forced
    data = yaml.safe_load(_kubectl(fleet, "-n", name, "get", "configmap", release, "-o",
                                   "yaml"))["data"]
    assert data["chartVersion"] == "0.3.0"


def test_field_conflicts_refused_say_what_and_slow_down(fleet: Fleet) -> None:
    name, release = _patched_by_hand(fleet, "nof")
    held = fleet.start("--helm-force-conflicts=false", version="0.3.0")
    refused = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                          "FieldConflict")
    assert f"ConfigMap {name}/{release} .data.chartVersion (kubectl-patch)" in \
        refused["message"]
    assert "--helm-force-conflicts" in refused["message"]
    since = time.time()
    wait_for(lambda: time.time() - since > 25, 35, interval=1.0, what="25 s")
    assert 2 <= runs(held, "upgrade") <= 3  # at 0, ~10 and ~30 s: not one a second


def _patched_by_hand(fleet: Fleet, prefix: str) -> tuple[str, str]:
    """A Tenant installed at 0.2.0 whose ConfigMap's chartVersion a `kubectl patch` then set
    (field manager kubectl-patch); the operator that installed it stopped."""
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique(prefix))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    _kubectl(fleet, "-n", name, "patch", "configmap", release, "-p",
             '{"data":{"chartVersion":"by hand"}}')
    op.stop()
    return name, release


def _kubectl(fleet: Fleet, *args: str) -> str:
    return subprocess.run([str(fleet.testbin / "kubectl"), "--kubeconfig",
                           str(fleet.remote.cp.kubeconfig), *args], check=True,
                          capture_output=True, text=True).stdout


# -- another writer, and drift repaired in a loop (SPEC S6) ---------------------------------


def _helm_runs(*ops: OperatorProcess) -> float:
    return sum(runs(op, o) or 0 for op in ops for o in ("install", "upgrade", "rollback"))


def _passes(op: OperatorProcess) -> float:
    return op.metric("krypton_reconciles_total", cluster="remote") or 0


def test_two_instances_on_one_fleet_never_take_turns(fleet: Fleet) -> None:
    """A second krypton started by hand beside the first, neither with the fleet's Lease,
    another chart version, resync every 3 s. Each keeps a Lease of its own while it runs:
    the second leaves the first's releases alone and says so once per release
    (AnotherWriter), both say the other runs beside them (AnotherInstance): over ten resync
    periods of each, no helm run (before: a turn every three resync periods each, and
    before that one per pass). The first stopped (its Lease deleted), the second has every
    Tenant on its version at its next pass: it yields no more."""
    fleet.register("remote", fleet.remote)
    first = fleet.start("--resync-period", "3s")
    names = [fleet.tenant(fleet.remote, unique("two")) for _ in range(2)]
    for name in names:
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    second = fleet.start("--resync-period", "3s", version="0.3.0")
    before = _helm_runs(first, second)
    passes = (_passes(first), _passes(second))
    wait_for(lambda: _passes(first) >= passes[0] + 10 * len(names) and
             _passes(second) >= passes[1] + 10 * len(names), 120, interval=0.5,
             what="ten resync periods of each")
    assert _helm_runs(first, second) == before  # a fight runs helm at every pass of either
    assert second.metric("krypton_releases_yielded_total", cluster="remote") >= 10
    for name in names:
        said = fleet.remote.wait_event(fleet.tenant_ns, name, "AnotherWriter")
        assert "another krypton instance that is at work" in said.message, said.message
    for op in (first, second):
        seen = wait_for(lambda o=op: o.log_events("another krypton instance runs beside this "
                                                  "one"), 30, what="each says the other")
        assert seen[0]["level"] == "warning", seen
    assert len([e for e in fleet.home.events(fleet.tenant_ns)
                if e.reason == "AnotherInstance"]) == 2
    first.stop()
    yielded = second.metric("krypton_releases_yielded_total", cluster="remote")
    def version(name: str) -> str:
        return str(fleet.remote.core.read_namespaced_config_map(
            f"tenant-{name}-remote", name).data.get("chartVersion"))

    wait_for(lambda: all(version(n) == "0.3.0" for n in names), 60,
             what="the second instance's version everywhere")
    for name in names:
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    # at most a pass per Tenant in flight when the first stopped still left it alone
    assert second.metric("krypton_releases_yielded_total", cluster="remote") <= \
        yielded + len(names)


def test_the_instance_a_tenant_names_writes_its_release_and_no_other(fleet: Fleet) -> None:
    """SPEC S6: an administrator settles two live writers by naming one on the Tenant
    (annotation mesh.openkcm.io/writer). The other, on another chart version, leaves that
    release alone whether the named one is at work or not, and says so once, while it
    upgrades the Tenant nobody named; naming it instead hands the release over at its next
    pass."""
    fleet.register("remote", fleet.remote)
    first = fleet.start("--resync-period", "3s")
    owned, free = (fleet.tenant(fleet.remote, unique(n)) for n in ("owned", "free"))
    for name in (owned, free):
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    labels = fleet.remote.core.read_namespaced_secret(
        f"sh.helm.release.v1.tenant-{owned}-remote.v1", owned).metadata.labels
    fleet.remote.patch_tenant(fleet.tenant_ns, owned, {"metadata": {"annotations": {
        WRITER: labels[WRITER]}}})
    first.stop()  # the named one is not at work: still nobody else's
    second = fleet.start("--resync-period", "3s", version="0.3.0")

    def version(name: str) -> str:
        return str(fleet.remote.core.read_namespaced_config_map(
            f"tenant-{name}-remote", name).data.get("chartVersion"))

    wait_for(lambda: version(free) == "0.3.0", 60, what="the Tenant nobody named upgraded")
    passes = _passes(second)
    wait_for(lambda: _passes(second) >= passes + 10, 60, what="five resync periods")
    assert version(owned) == "0.2.0" and runs(second, "upgrade") == 1
    said = fleet.remote.wait_event(fleet.tenant_ns, owned, "AnotherWriter")
    assert labels[WRITER] in said.message and WRITER in said.message, said.message
    assert len([e for e in fleet.remote.events(fleet.tenant_ns, owned)
                if e.reason == "AnotherWriter"]) == 1
    ours = fleet.remote.core.read_namespaced_secret(
        f"sh.helm.release.v1.tenant-{free}-remote.v2", free).metadata.labels[WRITER]
    fleet.remote.patch_tenant(fleet.tenant_ns, owned, {"metadata": {"annotations": {
        WRITER: ours}}})
    wait_for(lambda: version(owned) == "0.3.0", 60, what="the release handed over")
    fleet.remote.wait_phase(fleet.tenant_ns, owned, "Ready")


def test_drift_repaired_again_and_again_is_braked(fleet: Fleet) -> None:
    """The release's object deleted behind krypton's back, again and again (something else
    at work on it): three repairs within the hour, then no fourth but
    DriftRepairsExhausted, said once; no helm run after that."""
    fleet.register("remote", fleet.remote)
    op = fleet.start("--resync-period", "2s")
    name = fleet.tenant(fleet.remote, unique("loop"))
    release = f"tenant-{name}-remote"
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    for revision in (2, 3, 4):
        fleet.remote.core.delete_namespaced_config_map(release, name)
        wait_for(lambda r=revision: fleet.remote.release_records(name, release)[-1] == (
            r, "deployed"), 60, what=f"repair {revision - 1}")
    fleet.remote.core.delete_namespaced_config_map(release, name)
    said = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                       "DriftRepairsExhausted")
    assert "repaired 3 times in the last hour" in said["message"], said["message"]
    passes = _passes(op)
    wait_for(lambda: _passes(op) >= passes + 3, 30, what="three passes more")
    assert runs(op, "upgrade") == 3
    assert fleet.remote.release_records(name, release)[-1] == (4, "deployed")


def test_an_instance_without_a_lease_says_so_while_another_holds_the_fleets(
        fleet: Fleet) -> None:
    """SPEC S6: `krypton run` elects no leader unless told. Started so beside an instance
    that holds the fleet's Lease, it says at start that two instances write the same
    releases: a Warning log line and a Warning Event AnotherInstance on that Lease."""
    lease = unique("fleet")
    fleet.start("--leader-elect", "--leader-election-id", lease)
    second = fleet.start("--leader-election-id", lease)
    said = wait_for(lambda: second.log_events("another krypton instance holds the fleet's "
                                              "lease"), 30, what="the warning at start")
    assert said[0]["level"] == "warning" and "--leader-elect" in said[0]["detail"], said
    event = fleet.home.wait_event(fleet.tenant_ns, lease, "AnotherInstance")
    assert event.type == "Warning" and "two instances write the same releases" in \
        event.message, event.message
