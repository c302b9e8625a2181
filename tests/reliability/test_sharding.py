"""Sharding (SPEC F4) on the real test bed: three replicas split 30 clusters (cluster Secrets
pointing at the two local control planes under different names), a SIGKILLed replica's
clusters are taken only once its membership expired, a SIGTERMed one hands its clusters over
at once, and no release is ever installed twice."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from typing import Any

from kubernetes import client

from krypton.decisions.clusters.sharding import bound
from krypton.testing import ChartRepository
from krypton.testing.operator import OperatorProcess, cluster_holders, logged_at, wait_for
from tests.integration.conftest import Fleet, unique
from tests.integration.test_progressive_rollout import repo, rollout_state  # noqa: F401 - fixture

LEASE, RENEW, RETRY = 6.0, 4.0, 1.0


def _owners(fleet: Fleet, group: str) -> dict[str, str]:
    return cluster_holders(fleet.home.api, fleet.tenant_ns, group)


def _engaged(op: OperatorProcess) -> float:
    return op.metric("krypton_engaged_clusters")


NAMES = [f"c-{i:02d}" for i in range(30)]


def _sharded(fleet: Fleet, group: str) -> tuple[str, ...]:
    """Register the 30 cluster names (even ones: the home control plane, odd: the remote)
    and return the flags of a replica of `group`."""
    for i, name in enumerate(NAMES):
        fleet.register(name, fleet.home if i % 2 == 0 else fleet.remote)
    return ("--sharding", "--leader-election-id", group, "--lease-duration", f"{LEASE:.0f}s",
            "--renew-deadline", f"{RENEW:.0f}s", "--retry-period", f"{RETRY:.0f}s",
            "--allow-duplicate-clusters")


def _split(fleet: Fleet, group: str, ops: dict[str, OperatorProcess]) -> dict[str, str]:
    """cluster -> replica once all 30 are owned by `ops`, each engaged where it is owned."""
    def settled() -> dict[str, str] | None:
        owners = _owners(fleet, group)
        loads = Counter(owners.values())
        done = len(owners) == 30 and set(loads) == set(ops) and \
            all(_engaged(op) == loads[r] for r, op in ops.items())
        return owners if done else None
    return wait_for(settled, 180, interval=0.5, what=f"30 clusters split among {sorted(ops)}")


def _ready_everywhere(fleet: Fleet, tenants: list[tuple[Any, str]]) -> None:
    for cluster, name in tenants:
        wait_for(lambda c=cluster, n=name: len(_ready(c, fleet.tenant_ns, n)) == 15, 240,
                 what="the Tenant Ready on every cluster name of its server")


def test_replicas_split_the_fleet_and_take_over_without_two_owners(fleet: Fleet) -> None:
    group = unique("shard")
    args = _sharded(fleet, group)
    names = NAMES
    pinned = names[7]
    secret = fleet.home.core.read_namespaced_secret(pinned, fleet.discovery_ns)
    secret.metadata.labels["krypton.openkcm.io/shard"] = "r2"
    fleet.home.core.replace_namespaced_secret(pinned, fleet.discovery_ns, secret)
    ops = {f"r{i}": fleet.start(*args, "--shard-identity", f"r{i}") for i in range(3)}
    tenants = [(c, fleet.tenant(c, unique("sh"))) for c in (fleet.home, fleet.remote)]
    owners = _split(fleet, group, ops)
    loads = Counter(owners.values())
    assert all(7 <= n <= 13 for n in loads.values()), loads
    assert owners[pinned] == "r2"
    _ready_everywhere(fleet, tenants)

    # krypton status says which replica serves each cluster
    from tests.integration.test_cli import krypton, run_flags
    shown = krypton(fleet, "status", "-o", "json", *run_flags(fleet), "--leader-election-id",
                    group)
    assert shown.returncode == 0, shown.stderr
    assert {row["cluster"]: row["replica"] for row in json.loads(shown.stdout)} == owners
    # a replica's fleet page (O16): the Tenants of its own clusters, the others said
    from tests.integration.test_fleet_page import get, rows
    mine = {c for c, r in owners.items() if r == "r0"}
    assert {row["cluster"] for row in rows(ops["r0"])} == mine
    _, _, page = get(ops["r0"], "/")
    other = next(c for c, r in owners.items() if r == "r1")
    assert f'<a href="/clusters/{other}">{other}</a>: served by another replica (r1)' in page
    assert "krypton status --from-deployment shows the whole fleet" in page

    victim = next(r for r in ("r0", "r1") if loads[r])
    lost = sorted(c for c, r in owners.items() if r == victim)
    os.kill(ops[victim].pid, signal.SIGKILL)
    killed, killed_at = time.monotonic(), time.time()

    def taken() -> bool:
        now = _owners(fleet, group)
        return all(now[c] not in ("", victim) for c in lost)
    wait_for(taken, LEASE + RETRY + 30, interval=0.2, what="the killed replica's clusters taken")
    took = time.monotonic() - killed
    # never two owners: nobody took them while the victim's membership could still be valid
    # (its last renewal was at most one retry period before the kill)
    assert took >= LEASE - RETRY, took
    survivors = {r: op for r, op in ops.items() if r != victim}
    wait_for(lambda: sum(_engaged(op) for op in survivors.values()) == 30, 60,
             what="30 clusters engaged by the survivors")

    leaving = next(r for r in survivors if r != "r2")
    handed = sorted(c for c, r in _owners(fleet, group).items() if r == leaving)
    started = time.monotonic()
    assert survivors[leaving].stop(grace=60) == 0
    wait_for(lambda: all(_owners(fleet, group)[c] == "r2" for c in handed), 60, interval=0.2,
             what="the stopped replica's clusters taken by the last one")
    handover = time.monotonic() - started
    released = {e.get("cluster") for e in survivors[leaving].log_events("cluster released")}
    assert set(handed) <= released  # handed over, not left to expire
    wait_for(lambda: _engaged(ops["r2"]) == 30, 60, what="30 clusters engaged by r2")
    print(f"killed replica's clusters taken after {took:.1f}s, handover on SIGTERM {handover:.1f}s")

    _never_two_owners(ops, {victim: killed_at})
    for cluster, name in tenants:  # every release installed once, by one owner
        for c in names[0::2] if cluster is fleet.home else names[1::2]:
            assert cluster.release_records(name, f"tenant-{name}-{c}") == [(1, "deployed")]


def test_a_fourth_replica_moves_a_quarter_and_a_paused_owner_starts_nothing(
        fleet: Fleet) -> None:
    group = unique("shp")
    args = _sharded(fleet, group)
    ops = {f"r{i}": fleet.start(*args, "--shard-identity", f"r{i}") for i in range(3)}
    tenants = [(c, fleet.tenant(c, unique("sp"))) for c in (fleet.home, fleet.remote)]
    before = _split(fleet, group, ops)
    _ready_everywhere(fleet, tenants)

    # scale to 4: the newcomer takes about its share; at most the bound of one replica
    # (an even share plus EPSILON, SPEC F4's "about 1/4") moves in all
    ops["r3"] = fleet.start(*args, "--shard-identity", "r3")
    after = _split(fleet, group, ops)
    moved = sorted(c for c in NAMES if after[c] != before[c])
    assert 1 <= Counter(after.values())["r3"] <= len(moved) <= bound(30, 4), moved
    print(f"scale 3 -> 4 replicas: {len(moved)} of 30 clusters moved")
    _never_two_owners(ops, {})  # each moved cluster left its old replica before the new one

    # a partitioned owner: SIGSTOP it past its renew deadline and create a Tenant. Resumed
    # before the others take its clusters, its watches deliver that Tenant with nobody
    # having installed it yet: it must start no helm at all (its membership ran out), exit 1,
    # and leave the clusters to the others
    victim = max(("r0", "r1", "r2", "r3"), key=lambda r: Counter(after.values())[r])
    lost = sorted(c for c, r in after.items() if r == victim)
    os.kill(ops[victim].pid, signal.SIGSTOP)
    paused_at = time.time()
    late = [(c, fleet.tenant(c, unique("late"))) for c in (fleet.home, fleet.remote)]
    member = client.CoordinationV1Api(fleet.home.api).read_namespaced_lease(
        f"{group}-member-{victim}", fleet.tenant_ns)
    renewed = member.spec.renew_time.timestamp()
    wait_for(lambda: time.time() - renewed > RENEW + 0.5, RENEW + 5, interval=0.1,
             what="the paused replica's renew deadline passed")
    assert all(_owners(fleet, group)[c] == victim for c in lost)  # nobody took them yet
    os.kill(ops[victim].pid, signal.SIGCONT)
    assert ops[victim].popen is not None and ops[victim].popen.wait(60) == 1
    started = [e for e in ops[victim].log_entries() if logged_at(e) > paused_at
               and re.fullmatch(r"helm \w+ start", str(e.get("event")))]
    assert started == [], started
    assert ops[victim].log_events("membership lost")
    wait_for(lambda: all(_owners(fleet, group)[c] not in ("", victim) for c in lost),
             LEASE + RETRY + 30, interval=0.2, what="the paused replica's clusters taken")
    _ready_everywhere(fleet, late)
    for cluster, name in late:  # installed once, by the new owners
        for c in NAMES[0::2] if cluster is fleet.home else NAMES[1::2]:
            assert cluster.release_records(name, f"tenant-{name}-{c}") == [(1, "deployed")]


def _never_two_owners(ops: dict[str, OperatorProcess], killed: dict[str, float]) -> None:
    """From the replicas' logs: no cluster was being served by two replicas at any moment
    (served: from "cluster engaging" to "cluster disengaged", or to the SIGKILL)."""
    spans: dict[str, list[tuple[float, float, str]]] = {}
    for replica, op in ops.items():
        ends: dict[str, list[float]] = {}
        for entry in op.log_events("cluster disengaged"):
            ends.setdefault(entry["cluster"], []).append(logged_at(entry))
        for entry in op.log_events("cluster engaging"):
            start = logged_at(entry)
            end = min((t for t in ends.get(entry["cluster"], []) if t >= start),
                      default=killed.get(replica, float("inf")))
            spans.setdefault(entry["cluster"], []).append((start, end, replica))
    assert len(spans) == 30
    for cluster, served in spans.items():
        served.sort()
        for (_, end, first), (start, _, second) in zip(served, served[1:], strict=False):
            assert first == second or start >= end, (cluster, served)


def _ready(cluster: Any, namespace: str, name: str) -> list[str]:
    tenant = cluster.custom.get_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", namespace, "tenants", name)
    return [c["type"] for c in (tenant.get("status") or {}).get("conditions") or []
            if c["type"].startswith("ClusterReady/") and c["status"] == "True"]


def test_one_rollout_for_the_sharded_fleet_gated_on_every_replica(fleet: Fleet,
                                                                   repo: ChartRepository) -> None:  # noqa: F811
    """The rollout controller runs on the replica holding the leader Lease; the canary is
    served by one replica and the other clusters by the other, so each wave is judged from
    what another replica published and opened by a state another replica wrote."""
    group = unique("shro")
    clusters = {"canary": fleet.home, "w1": fleet.remote, "w2": fleet.home, "w3": fleet.remote}
    for name, cluster in clusters.items():
        fleet.register(name, cluster)
    for name in clusters:
        secret = fleet.home.core.read_namespaced_secret(name, fleet.discovery_ns)
        secret.metadata.labels["krypton.openkcm.io/shard"] = "r1" if name == "canary" else "r0"
        fleet.home.core.replace_namespaced_secret(name, fleet.discovery_ns, secret)

    def start(version: str, *extra: str) -> dict[str, OperatorProcess]:
        args = fleet.args("--sharding", "--leader-election-id", group,
                          "--lease-duration", f"{LEASE:.0f}s", "--renew-deadline", f"{RENEW:.0f}s",
                          "--retry-period", f"{RETRY:.0f}s", "--allow-duplicate-clusters",
                          "--rollout-canary-clusters", "canary",
                          "--rollout-max-parallel-clusters", "1", *extra, version=version)
        args[args.index(fleet.chart_repo.url)] = repo.url
        ops = {}
        for r in ("r0", "r1"):
            ops[r] = OperatorProcess([*args, "--shard-identity", r], helm_dir=fleet.testbin)
            fleet.operators.append(ops[r].start())
        for op in ops.values():
            op.wait_ready()
        return ops

    def version_on(cluster: str, tenant: str) -> str | None:
        try:
            return str(clusters[cluster].core.read_namespaced_config_map(
                f"tenant-{tenant}-{cluster}", tenant).data["chartVersion"])
        except client.ApiException:
            return None

    ops = start("0.2.0")
    tenants = {"home": fleet.tenant(fleet.home, unique("h")),
               "remote": fleet.tenant(fleet.remote, unique("r"))}
    on = {c: tenants[cluster.name] for c, cluster in clusters.items()}
    wait_for(lambda: (rollout_state(fleet) or {}).get("phase") == "Complete"
             and all(version_on(c, t) for c, t in on.items()), 120,
             what="the initial rollout complete")
    assert _owners(fleet, group) == {"canary": "r1", "w1": "r0", "w2": "r0", "w3": "r0"}
    assert {c: version_on(c, t) for c, t in on.items()} == dict.fromkeys(clusters, "0.2.0")
    for op in ops.values():
        assert op.stop(grace=30) == 0

    # 0.3.0, the wave after the canary's waiting for approval (F9): the canary (on r1) moves
    # first; the clusters of r0 stay on 0.2.0, their gate closed by the state the leader
    # wrote, until the approval written on the ConfigMap lets the next wave go
    ops = start("0.3.0", "--rollout-approval", "after-canaries")
    waiting = wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.3.0"
                       and s["awaiting"] and s, 90, what="the second wave waiting for approval")
    # planned over every cluster, whichever replica serves it: canary, then one at a time
    assert waiting["waves"] == [["canary"], ["w1"], ["w2"], ["w3"]] and waiting["wave"] == 1
    assert version_on("canary", on["canary"]) == "0.3.0"
    fleet.remote.wait_condition(fleet.tenant_ns, tenants["remote"], "ClusterProgress/w1",
                                "False", "RolloutAwaitingApproval")
    assert {c: version_on(c, on[c]) for c in ("w1", "w2", "w3")} == \
        dict.fromkeys(("w1", "w2", "w3"), "0.2.0")
    wait_for(lambda: all(op.metric("krypton_rollout_awaiting_approval") == 1
                         for op in ops.values()), 30, what="every replica reports the wait")
    fleet.home.core.patch_namespaced_config_map("krypton-rollout", fleet.discovery_ns, {
        "metadata": {"annotations": {"mesh.openkcm.io/rollout-approve":
                                     f"2@{waiting['target']}"}}})
    wait_for(lambda: (s := rollout_state(fleet)) and s["version"] == "0.3.0"
             and s["phase"] == "Complete", 120, what="the 0.3.0 rollout complete")
    assert {c: version_on(c, t) for c, t in on.items()} == dict.fromkeys(clusters, "0.3.0")
    leaders = [r for r, op in ops.items() if op.log_events("became leader")]
    assert len(leaders) == 1, leaders
    for op in ops.values():
        assert op.stop(grace=30) == 0

    # a version that fails: the canary's failure, published by r1, halts the rollout; r0's
    # clusters are held back and their Tenants say why
    ops = start("0.9.0")
    state = wait_for(lambda: (s := rollout_state(fleet)) and s["phase"] == "Halted" and s, 120,
                     what="the rollout halted on the canary")
    assert state["version"] == "0.9.0" and state["failed"] == ["canary"], state
    fleet.remote.wait_condition(fleet.tenant_ns, tenants["remote"], "ClusterProgress/w1",
                                "False", "RolloutHalted")
    assert {c: version_on(c, on[c]) for c in ("w1", "w2", "w3")} == \
        dict.fromkeys(("w1", "w2", "w3"), "0.3.0")
    wait_for(lambda: all(op.metric("krypton_rollout_halted") == 1 for op in ops.values()), 30,
             what="every replica reports the halt")
