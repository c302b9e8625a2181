"""What a cluster's runtime remembers of each Tenant (SPEC A1): one TenantMemory per Tenant,
made when the Tenant is first seen and dropped in one place, :meth:`Memory.drop`, when it
goes. Everything else the runtime keeps is per cluster or per release.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from krypton.adapters import metrics
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.model import TenantKey
from krypton.runtime.readiness import ObjKey, object_key


@dataclass
class TenantMemory:
    """One Tenant on one cluster, as the runtime remembers it between passes."""

    # its metadata that a pass acts on (generation, deletion, annotations, finalizers): a
    # change of it, not of its status, cuts a backoff short
    signature: tuple[Any, ...] | None = None
    # the resourceVersions this cluster's writes gave it, until their watch events come
    # back, and the events held while a pass of it runs (versions, one of them urgent)
    own_versions: list[str] = field(default_factory=list)
    held: tuple[tuple[str, ...], bool] = ((), False)
    # the retry state of its last failed helm run, as written (R18), for a CRD that drops it
    retry: dict[str, Any] | None = None
    # when it was first seen without a lastAppliedTime (monotonic)
    unapplied_since: float | None = None
    # the status last written and the one the server stored, both without timestamps
    written: tuple[Any, Any] | None = None
    # when its release's objects were last looked at (monotonic), and those found missing
    looked_at: float | None = None
    gone: tuple[str, ...] = ()
    # the labels of its info metric (krypton_tenant_release), while it has a series
    published: tuple[str, ...] | None = None
    # the other krypton instance its release was last left to (said once), "" when none
    yielded_to: str = ""
    # the (seal, target fingerprint) of a record found not to be what krypton's chart
    # renders (SPEC S6), and how: not rendered again for the same pair
    not_adopted: tuple[tuple[str, str], str] | None = None
    # for the fleet page (SPEC O16): the last Events krypton wrote of it here (time, type,
    # reason, message) and its release's history as last judged (:class:`Judged`)
    said: tuple[tuple[str, str, str, str], ...] = ()
    judged: Judged | None = None
    # the workload objects of its release followed by the cluster's watches (SPEC F6), and
    # whether they were ready when last judged (None: not judged since followed)
    followed: tuple[ObjectRef, ...] = ()
    ready: bool | None = None
    # deleted while a pass of it ran: dropped when that pass ends (it may still write)
    went: bool = False


KEPT = 10  # Events and release records a TenantMemory keeps for the fleet page


@dataclass(frozen=True)
class Judged:
    """A release's history as krypton last judged it before a helm run: when, the verdict
    (trusted, untrusted, ...) and why, and its newest records as (revision, status, whose)."""

    at: str
    trust: str
    message: str
    records: tuple[tuple[int, str, str], ...]


class Memory:
    """What one cluster's runtime remembers of each of its Tenants, and an index of the namespaces each Tenant
    name is in (a release's namespace is its Tenant's name)."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._kept: dict[TenantKey, TenantMemory] = {}
        # derived from the memories: the namespaces of each Tenant name, the Tenants that
        # follow each workload object, how many Tenants follow one
        self._namespaces: dict[str, set[str]] = {}
        self._followers: dict[ObjKey, set[TenantKey]] = {}
        self._following = 0

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[TenantKey]:
        return iter(list(self._kept))

    def __contains__(self, key: object) -> bool:
        return key in self._kept

    def of(self, key: TenantKey) -> TenantMemory:
        """What is remembered of `key`, made on first sight."""
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = TenantMemory()
            self._namespaces.setdefault(key.name, set()).add(key.namespace)
            self._count()
        return kept

    def peek(self, key: TenantKey) -> TenantMemory | None:
        """What is remembered of `key`, without making it."""
        return self._kept.get(key)

    def namespaces_with(self, name: str) -> tuple[str, ...]:
        return tuple(self._namespaces.get(name, ()))

    def unpublish(self, key: TenantKey) -> None:
        """Remove the Tenant's info metric series, if it has one."""
        kept = self._kept.get(key)
        if kept is not None and kept.published is not None:
            metrics.TENANT_RELEASE.remove(*kept.published)
            kept.published = None

    def follow(self, key: TenantKey, refs: tuple[ObjectRef, ...]) -> None:
        """`key`'s release is followed by its workload objects `refs` from now on (none: it
        is not followed), instead of what was followed before."""
        kept = self.of(key) if refs else self._kept.get(key)
        if kept is None:
            return
        for ref in kept.followed:
            k = object_key(ref)
            followers = self._followers[k]
            followers.discard(key)
            if not followers:
                del self._followers[k]
        self._following += bool(refs) - bool(kept.followed)
        kept.followed, kept.ready = refs, None
        for ref in refs:
            self._followers.setdefault(object_key(ref), set()).add(key)

    def followers(self, k: ObjKey) -> tuple[TenantKey, ...]:
        """The Tenants whose releases follow object `k`."""
        return tuple(self._followers.get(k, ()))

    def followed_objects(self) -> frozenset[ObjKey]:
        return frozenset(self._followers)

    def following(self) -> int:
        """How many Tenants' releases are followed."""
        return self._following

    def drop(self, key: TenantKey) -> None:
        """The Tenant went: everything remembered of it goes (what it followed too), its
        metric series as well."""
        self.unpublish(key)
        self.follow(key, ())
        if self._kept.pop(key, None) is not None:
            names = self._namespaces[key.name]
            names.discard(key.namespace)
            if not names:
                del self._namespaces[key.name]
            self._count()

    def _count(self) -> None:
        if self.cluster:  # a cluster's runtime (not the CLI's view of one)
            for gauge in (metrics.TENANTS_REMEMBERED, metrics.TENANT_RECORDS):
                gauge.labels(self.cluster).set(len(self._kept))


class OwnWrites:
    """The resourceVersions this cluster's writes gave each Tenant, until their watch
    events come back: such an event is the write's echo, and the pass that wrote knew what
    it says. Events that come while a pass of their Tenant runs are held until it ends: the
    answer to a write may come after the write's event. Kept in the Tenants' memories."""

    KEPT = 8  # per Tenant (a pass makes at most 4 writes)

    def __init__(self, memory: Memory | None = None) -> None:
        self.memory = memory if memory is not None else Memory("")

    def wrote(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion") and meta.get("name"):
            key = TenantKey(str(meta.get("namespace") or ""), str(meta["name"]))
            versions = self.memory.of(key).own_versions
            versions.append(str(meta["resourceVersion"]))
            del versions[:-self.KEPT]

    def echo(self, key: TenantKey, resource_version: str) -> bool:
        """Whether an event of `key` at `resource_version` is the echo of an own write. A
        Tenant's events come in the order of its versions, so the versions written before
        it go too (a relist skips events)."""
        kept = self.memory.peek(key)
        versions = kept.own_versions if kept is not None else []
        if resource_version not in versions:
            return False
        del versions[:versions.index(resource_version) + 1]
        return True

    def hold(self, key: TenantKey, resource_version: str, *, urgent: bool) -> None:
        """An event of `key` came while a pass of it runs: judged when it ends (`settle`)."""
        kept = self.memory.of(key)
        versions, was_urgent = kept.held
        kept.held = ((*versions, resource_version), was_urgent or urgent)

    def settle(self, key: TenantKey) -> bool | None:
        """The pass of `key` ended: None when every event held meanwhile was the echo of an
        own write (or none came), else whether one of them was urgent."""
        kept = self.memory.peek(key)
        if kept is None:
            return None
        (versions, urgent), kept.held = kept.held, ((), False)
        echoes = [self.echo(key, version) for version in versions]  # each one consumed
        return None if all(echoes) else urgent
