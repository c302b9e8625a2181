"""F1: progressive rollout over three clusters: canary first, halt and auto-revert on a
failing version, resume after an operator restart."""

from __future__ import annotations

import json
from typing import Any

import pytest

from krypton.testing import ChartRepository
from krypton.testing.operator import OperatorProcess, wait_for
from tests.conftest import CHARTS
from tests.integration.test_cli import krypton, run_flags

from .conftest import Cluster, Fleet, unique

ROLLOUT = ["--rollout-canary-clusters", "home", "--rollout-max-parallel-clusters", "1"]


@pytest.fixture
def repo(helm_bin: str) -> Any:
    r = ChartRepository(helm_bin)
    for version in ("0.2.0", "0.3.0"):
        r.publish(CHARTS / "sample", version)
    r.publish(CHARTS / "broken", "0.9.0")
    r.start()
    yield r
    r.close()


def rollout_state(fleet: Fleet) -> dict[str, Any] | None:
    try:
        cm = fleet.home.core.read_namespaced_config_map("krypton-rollout", fleet.discovery_ns)
    except Exception:  # noqa: BLE001 - not written yet
        return None
    return json.loads(cm.data["state.json"])  # type: ignore[no-any-return]


def start(fleet: Fleet, repo: ChartRepository, version: str, *extra: str) -> OperatorProcess:
    args = fleet.args(*ROLLOUT, *extra, version=version)
    args[args.index(fleet.chart_repo.url)] = repo.url
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    return op


@pytest.fixture
def remote2(third: Any, fleet: Fleet) -> Cluster:
    cluster = Cluster("remote2", third)
    cluster.ensure_namespace(fleet.tenant_ns)
    return cluster


def versions(fleet: Fleet, h: str, r: str, r2: str,
             remote2: Cluster) -> dict[str, tuple[str, list[tuple[int, str]]]]:
    out = {}
    for cluster, tenant, name in ((fleet.home, h, "home"), (fleet.remote, r, "remote"),
                                  (remote2, r2, "remote2")):
        release = f"tenant-{tenant}-{name}"
        cm = cluster.core.read_namespaced_config_map(release, tenant).data["chartVersion"]
        out[name] = (cm, cluster.release_records(tenant, release))
    return out


def test_canary_halt_revert_then_resume_after_restart(fleet: Fleet, repo: ChartRepository,
                                                      remote2: Cluster) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    fleet.register("remote2", remote2)
    op = start(fleet, repo, "0.2.0")
    h = fleet.tenant(fleet.home, unique("h"))
    r = fleet.tenant(fleet.remote, unique("r"))
    r2 = fleet.tenant(remote2, unique("r2"))
    fleet.home.wait_phase(fleet.tenant_ns, h, "Ready")
    fleet.remote.wait_phase(fleet.tenant_ns, r, "Ready")
    remote2.wait_condition(fleet.tenant_ns, r2, "ClusterReady/remote2", "True")
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete", 60)
    op.stop()

    # A version that fails on install: the canary fails, the rollout halts and reverts.
    op = start(fleet, repo, "0.9.0", "--rollout-auto-revert")
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Halted" and s, 90,
                     what="rollout halted")
    assert state["failed"] == ["home"] and state["version"] == "0.9.0"
    wait_for(lambda: (rollout_state(fleet) or {}).get("reverted"), 30, what="reverted")
    wait_for(lambda: versions(fleet, h, r, r2, remote2)["home"][1][-1][1] == "deployed", 60,
             what="canary rolled back")
    now = versions(fleet, h, r, r2, remote2)
    assert now["home"][0] == "0.2.0"  # the canary is back on the previous version
    assert "failed" in [s for _, s in now["home"][1]]
    # The revert ran through the canary's work queue and the Tenant records its real
    # outcome: the revision the rollback made, the fingerprint that failed and was reverted.
    home_ready = fleet.home.wait_condition(fleet.tenant_ns, h, "ClusterReady/home", "True",
                                           "RolledBack")
    assert "0.9.0 failed" in home_ready["message"]
    mine = fleet.home.tenant(fleet.tenant_ns, h)["status"]["clusters"]["home"]
    assert mine["revision"] == now["home"][1][-1][0] and mine["chartVersion"] == "0.2.0"
    assert mine["revertedFingerprint"] == mine["failedFingerprint"] != mine["fingerprint"]
    fleet.home.wait_event(fleet.tenant_ns, h, "RolloutReverted")
    # krypton plan takes the rollout's gate as the operator does: the clusters it
    # holds say held, not "upgrade"
    args = fleet.args(*ROLLOUT, "--rollout-auto-revert", version="0.9.0")
    args[args.index(fleet.chart_repo.url)] = repo.url
    planned = krypton(fleet, "plan", *args, "-o", "json")
    rows = {r["cluster"]: r for r in json.loads(planned.stdout) if r["tenant"]}
    assert {c: (rows[c]["action"], rows[c]["reason"]) for c in ("remote", "remote2")} == \
        {"remote": ("held", "RolloutHalted"), "remote2": ("held", "RolloutHalted")}, planned.stderr
    # ... and so does krypton diff: no manifest change for them, and why
    diff = krypton(fleet, "diff", *args)
    for cluster, tenant in (("remote", r), ("remote2", r2)):
        assert f"=== {cluster}/{fleet.tenant_ns}/{tenant} (tenant-{tenant}-{cluster}) not " \
               "changed: RolloutHalted (" in diff.stdout, diff.stdout + diff.stderr
        assert f"{cluster}/{tenant} next (chart" not in diff.stdout
    # ... and the rollout reports what the releases did, once all of them are through
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["revert_reported"] and s, 30,
                     what="the revert's outcome in the rollout state")
    assert (state["reverted_releases"], state["revert_failures"]) == (1, 0)
    reverted = fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutReverted")
    assert "on home: 1 failed release(s) rolled back" in reverted.message
    assert now["remote"] == ("0.2.0", [(1, "deployed")])  # never touched
    assert now["remote2"] == ("0.2.0", [(1, "deployed")])
    fleet.remote.wait_condition(fleet.tenant_ns, r, "ClusterProgress/remote", "False",
                                "RolloutHalted")
    wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns)
                      if e.reason == "RolloutHalted"], 30, what="RolloutHalted event")
    assert op.metric("krypton_rollout_halted") == 1
    op.stop()

    # A good version supersedes the halted one; restart the operator mid-rollout.
    op = start(fleet, repo, "0.3.0", "--rollout-wave-soak", "6s")
    wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.3.0" and s["wave"] >= 1,
             90, what="canary wave done")
    wait_for(lambda: versions(fleet, h, r, r2, remote2)["home"][0] == "0.3.0", 30, what="canary on 0.3.0")
    canary_records = versions(fleet, h, r, r2, remote2)["home"][1]
    assert canary_records[-1][1] == "deployed"
    op.kill(group=True)
    resumed = rollout_state(fleet)
    assert resumed is not None and resumed["phase"] == "Progressing"

    op = start(fleet, repo, "0.3.0", "--rollout-wave-soak", "6s")
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete", 120,
             what="rollout complete")
    assert "rollout state loaded" in op.log_text() and "rollout started" not in op.log_text()
    final = versions(fleet, h, r, r2, remote2)
    assert {k: v[0] for k, v in final.items()} == {"home": "0.3.0", "remote": "0.3.0",
                                                  "remote2": "0.3.0"}
    assert final["home"][1] == canary_records  # the canary was not upgraded again
    status = krypton(fleet, "status", *run_flags(fleet, version="0.3.0"))
    assert "rollout to 0.3.0: Complete" in status.stdout
    assert "waves     [####################] 3/3" in status.stdout


def _apply_crd(cluster: Cluster) -> None:
    """The Tenant CRD on `cluster`, established, before any operator engages it."""
    from kubernetes import client

    from krypton.decisions.crd import crd_manifest

    crds = client.ApiextensionsV1Api(cluster.api)
    try:
        crds.create_custom_resource_definition(crd_manifest())
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                         crds.read_custom_resource_definition(
                             "tenants.mesh.openkcm.io").status.conditions or []),
             30, what="the Tenant CRD established")


@pytest.mark.parametrize("failing, phase", [(1, "Complete"), (2, "Halted")])
def test_a_budget_of_a_quarter_of_the_clusters(fleet: Fleet, repo: ChartRepository,
                                               failing: int, phase: str) -> None:
    """One wave of 4 clusters (four names of one API server, each with its own
    values: on `failing` of them the chart does not render) and a budget of 25% counted in
    clusters: the wave survives one failed cluster and halts at the second."""
    names = ["w1", "w2", "w3", "w4"]
    for i, name in enumerate(names):
        fleet.register(name, fleet.remote,
                       values='failRender: "broken here"\n' if i < failing else None)
    args = fleet.args("--rollout-max-parallel-clusters", "4", "--rollout-max-failures", "25%",
                      "--rollout-failure-unit", "clusters", "--allow-duplicate-clusters",
                      version="0.2.0")
    args[args.index(fleet.chart_repo.url)] = repo.url
    _apply_crd(fleet.remote)
    fleet.remote.create_tenant(fleet.tenant_ns, unique("q"))  # there before the rollout
    fleet.operators.append(op := OperatorProcess(args, helm_dir=fleet.testbin).start())
    op.wait_ready()
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] in ("Complete", "Halted")
                     and s, 120, what="the wave judged")
    assert state["phase"] == phase, state["message"]
    assert (state["budget_used"], state["budget"], state["budget_unit"]) == \
        (failing, 1, "clusters")
    assert [op.metric("krypton_rollout_failure_budget", count=c, unit="clusters")
            for c in ("used", "allowed")] == [failing, 1]
    if phase == "Halted":
        assert state["failed"] == ["w1", "w2"]
        assert "2 failed clusters, more than the 1 allowed (25% of 4)" in state["message"]
    status = krypton(fleet, "status", *args)
    assert f"failures  {failing} of 1 clusters allowed in the wave" in status.stdout, status.stdout


def test_clusters_that_leave_and_join_mid_rollout(fleet: Fleet, repo: ChartRepository) -> None:
    """A rollout over three names of one API server, one cluster per wave, each
    wave soaking 10 s. The cluster of the wave in progress leaves (its Secret is removed):
    the wave neither fails nor waits for it. A cluster that joins mid-rollout with a release
    on the old version is appended as a further wave and is upgraded only when that wave
    runs, after the others; a brand-new cluster (no release to keep on the old version) is
    installed at once, as a brand-new Tenant is."""
    for name in ("w1", "w2", "w3", "w4"):
        fleet.register(name, fleet.remote)
    _apply_crd(fleet.remote)
    tenant = fleet.tenant(fleet.remote, unique("jl"))

    def start_at(version: str) -> OperatorProcess:
        args = fleet.args("--rollout-max-parallel-clusters", "1", "--rollout-wave-soak", "10s",
                          "--allow-duplicate-clusters", version=version)
        args[args.index(fleet.chart_repo.url)] = repo.url
        op = OperatorProcess(args, helm_dir=fleet.testbin).start()
        fleet.operators.append(op)
        op.wait_ready()
        return op

    def applied(cluster: str) -> dict[str, Any]:
        status = fleet.remote.tenant(fleet.tenant_ns, tenant).get("status") or {}
        return (status.get("clusters") or {}).get(cluster) or {}

    op = start_at("0.2.0")
    wait_for(lambda: all(applied(c).get("chartVersion") == "0.2.0"
                         for c in ("w1", "w2", "w3", "w4")), 90, what="0.2.0 everywhere")
    op.stop()
    fleet.unregister("w4")  # away while the next rollout is planned; its release stays
    start_at("0.3.0")
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.3.0"
                     and s["wave"] == 1 and s, 90, what="the second wave of 0.3.0")
    assert [len(w) for w in state["waves"]] == [1, 1, 1], state["waves"]
    leaving = state["waves"][1][0]
    fleet.unregister(leaving)
    fleet.register("w4", fleet.remote)  # back, with its release on 0.2.0
    fleet.register("w5", fleet.remote)  # new: no release anywhere yet
    final = wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.3.0"
                     and s["phase"] != "Progressing" and s, 120, what="the rollout's end")
    assert final["phase"] == "Complete" and leaving not in final["failed"], final["message"]
    assert sorted(final["waves"][3:]) == [["w4"], ["w5"]], final["waves"]  # appended
    stayed = [c for c in ("w1", "w2", "w3") if c != leaving]
    last = max(applied(c)["lastAppliedTime"] for c in stayed)
    w4, w5 = applied("w4"), applied("w5")
    assert w4["chartVersion"] == w5["chartVersion"] == "0.3.0"
    # w4's upgrade waited for its wave, after the last of the others had soaked 10 s;
    # w5's first install did not
    assert w4["lastAppliedTime"] > last > w5["lastAppliedTime"], (w4, w5, last)


# -- rollout control (F9) ----------------------------------------------------------------------

APPROVAL = ["--rollout-approval", "after-canaries", "--rollout-auto-revert"]


def _annotate(fleet: Fleet, annotations: dict[str, str | None]) -> None:
    fleet.home.core.patch_namespaced_config_map("krypton-rollout", fleet.discovery_ns,
                                                {"metadata": {"annotations": annotations}})


def _rollout(fleet: Fleet, action: str, version: str, by: str = "alice") -> Any:
    return krypton(fleet, "rollout", action, "--by", by, *run_flags(fleet, version=version),
                   "--from-deployment", "none")


def _held(fleet: Fleet, op: OperatorProcess, held: dict[str, tuple[Cluster, str]]
          ) -> tuple[float, float]:
    """Helm processes started anywhere, and API writes to the clusters of `held`, while each
    of their Tenants is changed (an annotation) and its cluster makes a pass of it: what a
    rollout that holds them does when it has the chance to do something."""
    def counts() -> tuple[float, float, list[float]]:
        return (op.metric("krypton_helm_processes_total"),
                sum(op.metric("krypton_api_writes_total", cluster=c) for c in held),
                [op.metric("krypton_reconciles_total", cluster=c) for c in held])
    helm, writes, passes = counts()
    for cluster, tenant in held.values():
        cluster.patch_tenant(fleet.tenant_ns, tenant,
                             {"metadata": {"annotations": {"test.krypton/poke": unique("p")}}})
    wait_for(lambda: all(now > then for now, then in zip(counts()[2], passes, strict=True)),
             30, what="a pass of every held Tenant")
    after = counts()
    return after[0] - helm, after[1] - writes


def test_a_wave_waits_for_its_approval_across_a_restart_and_a_pause(
        fleet: Fleet, repo: ChartRepository, remote2: Cluster) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    fleet.register("remote2", remote2)
    op = start(fleet, repo, "0.2.0")
    h, r, r2 = (fleet.tenant(c, unique(p)) for c, p in ((fleet.home, "h"), (fleet.remote, "r"),
                                                         (remote2, "r2")))
    fleet.home.wait_phase(fleet.tenant_ns, h, "Ready")
    fleet.remote.wait_phase(fleet.tenant_ns, r, "Ready")
    remote2.wait_condition(fleet.tenant_ns, r2, "ClusterReady/remote2", "True")
    first = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Complete" and s, 60)
    assert _rollout(fleet, "approve", "0.2.0").returncode == 1  # nothing is running
    op.stop()

    # 0.3.0: the canary moves, then the next wave waits for a person
    op = start(fleet, repo, "0.3.0", *APPROVAL)
    waiting = wait_for(lambda: (s := rollout_state(fleet)) and s["awaiting"] and s, 90,
                       what="wave 2 awaiting approval")
    assert (waiting["wave"], waiting["version"]) == (1, "0.3.0")
    fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutAwaitingApproval")
    fleet.remote.wait_condition(fleet.tenant_ns, r, "ClusterProgress/remote", "False",
                                "RolloutAwaitingApproval")
    assert op.metric("krypton_rollout_awaiting_approval") == 1
    helm_runs, writes = _held(fleet, op, {"remote": (fleet.remote, r), "remote2": (remote2, r2)})
    print(f"while waiting: {helm_runs:.0f} helm processes, {writes:.0f} writes in a pass each")
    assert helm_runs == 0 and writes <= 2
    # an approval of the previous rollout's target lets nothing through
    _annotate(fleet, {"mesh.openkcm.io/rollout-approve": f"2@{first['target']}"})
    fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutApprovalIgnored")
    assert rollout_state(fleet)["awaiting"]  # type: ignore[index]

    # restarted while it waits: it still waits; paused, then approved: still nothing moves
    op.kill(group=True)
    op = start(fleet, repo, "0.3.0", *APPROVAL)
    status = krypton(fleet, "status", *run_flags(fleet, version="0.3.0"))
    assert "waits for approval" in status.stdout, status.stdout
    paused = _rollout(fleet, "pause", "0.3.0", by="carol")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    wait_for(lambda: (rollout_state(fleet) or {}).get("paused_at"), 30, what="paused")
    approved = _rollout(fleet, "approve", "0.3.0")
    assert approved.returncode == 0 and "approved wave 2/3 (remote)" in approved.stdout, \
        approved.stdout + approved.stderr
    wait_for(lambda: (rollout_state(fleet) or {}).get("approved") == 1, 30, what="approved")
    fleet.remote.wait_condition(fleet.tenant_ns, r, "ClusterProgress/remote", "False",
                                "RolloutPaused")
    helm_runs, _ = _held(fleet, op, {"remote": (fleet.remote, r), "remote2": (remote2, r2)})
    assert helm_runs == 0
    assert versions(fleet, h, r, r2, remote2)["remote"] == ("0.2.0", [(1, "deployed")])
    assert _rollout(fleet, "resume", "0.3.0").returncode == 0
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete", 120,
             what="rollout complete after the approval")
    assert {k: v[0] for k, v in versions(fleet, h, r, r2, remote2).items()} == \
        {"home": "0.3.0", "remote": "0.3.0", "remote2": "0.3.0"}
    fleet.home.wait_event(fleet.discovery_ns, "krypton-rollout", "RolloutApproved")
    op.stop()

    # 0.9.0 fails on the canary (within a budget of one): the next wave waits; aborted, the
    # canary's failed release goes back, and the history tells it all
    op = start(fleet, repo, "0.9.0", *APPROVAL, "--rollout-max-failures", "1")
    wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.9.0" and s["awaiting"],
             120, what="0.9.0 awaiting approval after its canary failed")
    aborted = _rollout(fleet, "abort", "0.9.0", by="bob")
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Halted" and s, 30,
                     what="aborted")
    assert state["aborted"] == "bob" and state["failed"] == ["home"]
    wait_for(lambda: versions(fleet, h, r, r2, remote2)["home"][0] == "0.3.0", 60,
             what="the canary's failed release rolled back")
    assert versions(fleet, h, r, r2, remote2)["remote"][0] == "0.3.0"
    history = _rollout(fleet, "history", "0.9.0")
    print(history.stdout)
    assert history.returncode == 0
    assert "0.2.0 -> 0.3.0: Complete" in history.stdout
    assert history.stdout.count("approved wave 2 by alice") == 1
    assert "0.3.0 -> 0.9.0: Aborted (current)" in history.stdout
    assert "aborted by bob in wave 2/3" in history.stdout
    assert _rollout(fleet, "resume", "0.9.0").returncode == 1  # not running: nothing changed
