"""Cluster assignment across replicas (krypton.decisions.clusters.sharding, SPEC F4): balanced within
the bound, identical on every replica, and stable when a replica joins or leaves."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter
from typing import Any

import pytest

from krypton.decisions.clusters.sharding import CLUSTER_ANNOTATION, EPSILON, assign, bound, owners

pytestmark = pytest.mark.unit

CLUSTERS = [f"cluster-{i:03d}" for i in range(30)]
THREE = ["replica-a", "replica-b", "replica-c"]


def test_thirty_clusters_over_three_replicas_are_ten_each_give_or_take_three() -> None:
    loads = Counter(assign(CLUSTERS, THREE).values())
    assert set(loads) == set(THREE)
    assert all(7 <= n <= 13 for n in loads.values()), loads
    assert sum(loads.values()) == 30


@pytest.mark.parametrize("clusters,members", [(30, 3), (1000, 7), (5, 4), (3, 5), (101, 2)])
def test_no_member_exceeds_the_bound(clusters: int, members: int) -> None:
    names = [f"c{i}" for i in range(clusters)]
    loads = Counter(assign(names, [f"m{j}" for j in range(members)]).values())
    assert max(loads.values()) <= math.ceil(clusters * (1 + EPSILON) / members)
    assert sum(loads.values()) == clusters and bound(clusters, members) >= clusters / members


def test_every_replica_computes_the_same_answer_whatever_the_order_it_sees() -> None:
    shuffled = CLUSTERS[:]
    random.Random(7).shuffle(shuffled)
    assert assign(CLUSTERS, THREE) == assign(shuffled, list(reversed(THREE)))


def test_a_fourth_replica_takes_about_a_quarter_and_nothing_else_moves_much() -> None:
    clusters = [f"c{i}" for i in range(400)]
    before = assign(clusters, THREE)
    after = assign(clusters, [*THREE, "replica-d"])
    moved = [c for c in clusters if before[c] != after[c]]
    to_new = [c for c in moved if after[c] == "replica-d"]
    # an even share for the new member is 100; what moves beyond it is bound churn
    assert 70 <= len(to_new) <= 125, len(to_new)
    assert len(moved) <= 0.4 * len(clusters), len(moved)


def test_losing_a_replica_moves_only_its_clusters_and_a_few_pushed_by_the_bound() -> None:
    clusters = [f"c{i}" for i in range(300)]
    before = assign(clusters, THREE)
    after = assign(clusters, THREE[:2])
    orphans = [c for c in clusters if before[c] == "replica-c"]
    moved = [c for c in clusters if before[c] != after[c]]
    assert set(orphans) <= set(moved)
    assert len(moved) - len(orphans) <= 0.15 * len(clusters)
    assert set(after.values()) == set(THREE[:2])


def test_a_pinned_cluster_goes_to_its_replica_if_live_and_is_placed_normally_if_not() -> None:
    pins = {"cluster-000": "replica-b", "cluster-001": "gone"}
    out = assign(CLUSTERS, THREE, pins)
    assert out["cluster-000"] == "replica-b"
    assert out["cluster-001"] in THREE


def test_nothing_is_assigned_without_a_member() -> None:
    assert assign(CLUSTERS, []) == {}


def _lease(holder: str, renewed: str, *, cluster: str = "", seconds: int = 15) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": {CLUSTER_ANNOTATION: cluster}} if cluster else {}
    return {"metadata": meta, "spec": {"holderIdentity": holder, "renewTime": renewed,
                                       "leaseDurationSeconds": seconds}}


def test_people_see_each_clusters_replica_and_whether_it_is_alive() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC).timestamp()
    members = [_lease("r0", "2026-01-01T11:59:50.000000Z"),  # 10 s ago, 15 s Lease: live
               _lease("r1", "2026-01-01T11:59:40.000000Z"),  # 20 s ago: expired
               _lease("r2", "garbage"),
               # What a hand-written Lease says is believed only within bounds
               _lease("r3", "2026-01-01T11:58:00.000000Z", seconds=2147483647),  # 120 s ago
               _lease("r4", "2099-01-01T00:00:00.000000Z"),  # renewed in the future
               _lease("r5", "2026-01-01T11:59:00.000000Z", seconds=60)]  # 4 x 15 s: believed
    clusters = [_lease("r0", "", cluster="a"), _lease("r1", "", cluster="b"),
                _lease("", "", cluster="c"), _lease("r2", "", cluster="d"),
                _lease("r9", "", cluster="e"), _lease("r0", ""),  # no cluster name: skipped
                _lease("r3", "", cluster="f"), _lease("r4", "", cluster="g"),
                _lease("r5", "", cluster="h")]
    assert owners(clusters, members, now, 15.0) == {
        "a": "r0", "b": "r1 (expired)", "c": "(released)", "d": "r2 (expired)",
        "e": "r9 (expired)", "f": "r3 (expired)", "g": "r4 (expired)", "h": "r5"}
