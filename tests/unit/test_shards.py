"""F4: a replica's fence over the clusters it serves, and what it publishes on their Leases
for the rollout. The fence needs no request: membership counts only while it was renewed
within the renew deadline, and a cluster only while its Lease names this replica."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from krypton.decisions.errors import Conflict
from krypton.runtime import leader
from krypton.runtime import shards as shards_mod
from krypton.runtime.shards import Shards, _name

NS, GROUP = "ns", "krypton"


class _Leases:
    """The port to the API server: Leases by name, resourceVersions kept and checked."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.deleted: list[str] = []

    def lease_path(self, namespace: str, name: str = "") -> str:
        return f"/leases/{namespace}/{name}"

    async def get_lease(self, _ns: str, name: str) -> dict[str, Any] | None:
        return self.leases.get(name)

    async def create_lease(self, _ns: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._store(body)

    async def replace_lease(self, _ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"].get("resourceVersion") != self.leases[name]["metadata"][
                "resourceVersion"]:
            raise Conflict("the object has been modified")
        return self._store(body)

    async def delete_lease(self, _ns: str, name: str, resource_version: str | None = None) -> None:
        lease = self.leases.get(name)
        if lease is None:
            return
        if resource_version and resource_version != lease["metadata"]["resourceVersion"]:
            raise Conflict("precondition failed")
        self.deleted.append(self.leases.pop(name)["metadata"]["name"])

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.writes)}}
        self.leases[body["metadata"]["name"]] = stored
        return stored


def _replica(monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> tuple[Shards, _Leases]:
    monkeypatch.setattr(shards_mod.time, "monotonic", lambda: clock[0])
    leases = _Leases()
    shards = Shards(leases, NS, GROUP, "me", lease_duration=15, renew_deadline=10,  # type: ignore[arg-type]
                    retry_period=2, on_change=lambda: None)
    return shards, leases


def _seen(shards: Shards, leases: _Leases, cluster: str) -> None:
    """The cluster Lease as the replica's informer delivers it."""
    name = _name(GROUP, "cluster", cluster)
    shards.owners.store[(NS, name)] = leases.leases[name]


def _owner_of_a(monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> tuple[Shards, _Leases]:
    """A replica that joined alone and claimed cluster "a", its Lease seen."""
    shards, leases = _replica(monkeypatch, clock)
    asyncio.run(shards._renew())
    shards._judge()
    assert asyncio.run(shards.claim("a"))
    assert not shards.owns("a")  # claimed, not seen yet: the store decides
    _seen(shards, leases, "a")
    return shards, leases


def test_a_cluster_is_served_only_with_fresh_membership_and_its_lease(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    shards, leases = _owner_of_a(monkeypatch, clock)
    assert shards.owns("a") and shards.holds()
    clock[0] += 9.9
    assert shards.owns("a")
    clock[0] += 0.2  # paused past the renew deadline: nothing may start, before any request
    assert not shards.holds() and not shards.owns("a")
    assert not asyncio.run(shards.claim("b"))  # and nothing is taken
    asyncio.run(shards._renew())
    assert shards.owns("a")
    lease = leases.leases[_name(GROUP, "cluster", "a")]
    lease["spec"]["holderIdentity"] = "other"  # taken over while we were away
    assert not shards.owns("a")


def test_the_owner_publishes_a_change_once_and_nobody_else_publishes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    shards, leases = _owner_of_a(monkeypatch, clock)
    before = leases.writes
    asyncio.run(shards.publish("a", "one"))
    assert leases.writes == before + 1
    _seen(shards, leases, "a")
    assert shards.published("a") == "one"
    asyncio.run(shards.publish("a", "one"))  # unchanged: no write
    assert leases.writes == before + 1
    name = _name(GROUP, "cluster", "a")
    stale = shards.owners.store[(NS, name)]
    leases.leases[name] = {**stale, "metadata": {**stale["metadata"], "resourceVersion": "99"}}
    asyncio.run(shards.publish("a", "two"))  # the Lease moved on meanwhile: refused, no harm
    assert leases.leases[name]["metadata"]["resourceVersion"] == "99"
    clock[0] += 11  # membership stale: not the owner any more, nothing is written
    asyncio.run(shards.publish("a", "three"))
    assert "three" not in str(leases.leases[name])
    shards._judge()  # and what this replica published counts for nobody
    assert shards.published("a") is None


def test_the_first_live_member_deletes_only_what_dead_replicas_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    shards, leases = _replica(monkeypatch, clock)  # identity "me"
    asyncio.run(shards._renew())

    def lease(name: str, holder: str, cluster: str = "") -> None:
        meta: dict[str, Any] = {"name": name, "namespace": NS}
        if cluster:
            meta["annotations"] = {shards_mod.CLUSTER_ANNOTATION: cluster}
        leases._store({"metadata": meta, "spec": {"holderIdentity": holder, "renewTime": "t",
                                                  "leaseDurationSeconds": 15}})
        store = shards.owners if cluster else shards.members
        store.store[(NS, name)] = copy.deepcopy(leases.leases[name])
        if not cluster:
            shards._member_event("ADDED", leases.leases[name])

    lease("krypton-member-dead", "dead")
    lease("krypton-member-zed", "zed")  # live, but after "me" in name order
    lease("krypton-cluster-gone", "", cluster="gone")  # released, Secret deleted
    lease("krypton-cluster-kept", "", cluster="kept")  # released, still discovered
    lease("krypton-cluster-busy", "zed", cluster="busy")  # held by a live member
    lease("krypton-cluster-orphan", "dead", cluster="orphan")
    shards.discovered = lambda: frozenset({"kept"})
    clock[0] += 16  # the dead member stopped renewing a Lease duration ago; zed renews
    asyncio.run(shards._renew())
    shards._member_event("MODIFIED", {**leases.leases["krypton-member-zed"],
                                      "spec": {"holderIdentity": "zed", "renewTime": "t2"}})
    shards._judge()
    asyncio.run(shards.tidy())
    assert leases.deleted == ["krypton-cluster-gone", "krypton-cluster-orphan"]
    # a dead member's Lease goes only after STALE_AFTER Lease durations without a change
    clock[0] = 1000.0 + shards_mod.STALE_AFTER * 15 - 1
    asyncio.run(shards._renew())
    shards._member_event("MODIFIED", {**leases.leases["krypton-member-zed"],
                                      "spec": {"holderIdentity": "zed", "renewTime": "t3"}})
    shards._judge()
    asyncio.run(shards.tidy())
    assert "krypton-member-dead" not in leases.deleted
    clock[0] += 2
    asyncio.run(shards._renew())
    shards._judge()
    asyncio.run(shards.tidy())
    assert leases.deleted[2:] == ["krypton-member-dead"]
    # a Lease written since it was judged is left alone; and only the first member tidies
    lease("krypton-cluster-gone2", "", cluster="gone2")
    leases.leases["krypton-cluster-gone2"]["metadata"]["resourceVersion"] = "moved"
    asyncio.run(shards.tidy())
    assert "krypton-cluster-gone2" in leases.leases
    shards.identity = "zz"
    shards._live = frozenset({"zz", "zed"})
    leases.leases["krypton-cluster-gone2"] = copy.deepcopy(
        shards.owners.store[(NS, "krypton-cluster-gone2")])
    asyncio.run(shards.tidy())
    assert "krypton-cluster-gone2" in leases.leases


def test_membership_written_by_someone_else_is_read_again_and_lost_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    shards, leases = _replica(monkeypatch, clock)
    asyncio.run(shards._renew())

    async def a_period_passes(_stopping: asyncio.Event, seconds: float) -> bool:
        clock[0] += seconds
        return False

    monkeypatch.setattr(leader, "pause", a_period_passes)
    mine = leases.leases[shards.member_lease]
    mine["metadata"]["resourceVersion"] = "elsewhere"  # every replace now conflicts
    rereads = []

    async def get_lease(_ns: str, name: str) -> dict[str, Any] | None:
        rereads.append(name)
        raise Conflict("still moving")  # the read-back path fails too: never renewed again

    leases.get_lease = get_lease  # type: ignore[method-assign]
    asyncio.run(asyncio.wait_for(shards.hold(asyncio.Event()), 5))
    assert shards.lost and not shards.holds()
    assert rereads  # after the first Conflict the Lease was read again, not replaced blindly
    assert clock[0] - 1000.0 >= shards.renew_deadline


def test_every_worker_shares_one_set_of_discovered_names() -> None:
    """Each worker keeps the discovered names it last looked at (orphaned releases): one
    set for all of them until the names change, not a copy each, which grew with the square
    of the fleet (64 MiB at 1000 clusters)."""
    from krypton.adapters.clientconfig import ClientConfig
    from krypton.adapters.kube import Kube
    from krypton.app.discovery import Discovery
    from krypton.decisions.settings import Settings

    settings = Settings()
    found = Discovery(Kube(ClientConfig("http://127.0.0.1:1"), name="home"), settings,
                      None, lambda: None)  # type: ignore[arg-type]
    label = settings.kubeconfig_label
    secrets = {n: {"metadata": {"name": n, "uid": n, "labels": {label: "true"}}}
               for n in ("a", "b")}
    found.secrets.store = secrets  # type: ignore[assignment]
    assert found.names() is None  # not listed yet
    found.secrets.synced.set()
    first = found.names()
    asyncio.run(found.desired())
    assert first == frozenset({"a", "b"})
    assert found.names() is first and found.names() is found.names()
    secrets["c"] = {"metadata": {"name": "c", "uid": "c", "labels": {label: "true"}}}
    asyncio.run(found.desired())
    assert found.names() == frozenset({"a", "b", "c"})
    assert found.details() == []  # no ClusterProfiles asked for


def test_profiles_not_listed_keep_the_fleet_unknown_and_say_why() -> None:
    """--cluster-profiles where their CRD is missing: the Secrets' clusters work, but the
    fleet is not known whole (no orphan is judged, /readyz is not ready) and says why."""
    from dataclasses import replace

    from krypton.adapters.clientconfig import ClientConfig
    from krypton.adapters.kube import Kube
    from krypton.app.discovery import Discovery
    from krypton.decisions.errors import NotFound
    from krypton.decisions.settings import Settings

    settings = replace(Settings(), cluster_profiles=True)
    found = Discovery(Kube(ClientConfig("http://127.0.0.1:1"), name="home"), settings,
                      None, lambda: None)  # type: ignore[arg-type]
    found.secrets.synced.set()
    assert found.profiles is not None and found.names() is None and not found.synced()
    found._profiles_failed(NotFound("list cluster-profiles: not found"))
    assert found.details() == ["ClusterProfiles not listed yet: list cluster-profiles: not found"]
    found.profiles.synced.set()
    assert found.synced() and found.details() == [] and found.names() == frozenset()


def test_a_release_that_crosses_a_write_reads_the_lease_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster handed over must be let go even when its Lease was written between the read
    and the release (the replica's own publication): the holder no longer serves it, so a
    Lease still naming it would leave the cluster unserved while it lives."""
    shards, leases = _owner_of_a(monkeypatch, [100.0])
    name = _name(GROUP, "cluster", "a")
    replace = leases.replace_lease
    crossed = []

    async def crossing(ns: str, lease_name: str, body: dict[str, Any]) -> dict[str, Any]:
        if not crossed:  # a publication lands between the release's read and its write
            crossed.append(leases._store(copy.deepcopy(leases.leases[lease_name])))
        return await replace(ns, lease_name, body)

    leases.replace_lease = crossing  # type: ignore[method-assign]
    asyncio.run(shards.release("a"))
    assert crossed
    assert leases.leases[name]["spec"]["holderIdentity"] == ""
