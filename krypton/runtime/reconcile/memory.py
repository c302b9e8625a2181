"""What a cluster's runtime remembers of each Tenant (SPEC A1): one TenantMemory per Tenant,
made when the Tenant is first seen and dropped in one place, :meth:`Memory.drop`, when it
goes. Everything else the runtime keeps is per cluster or per release.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from krypton.adapters import metrics
from krypton.decisions.model import TenantKey


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
        self._namespaces: dict[str, set[str]] = {}

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

    def drop(self, key: TenantKey) -> None:
        """The Tenant went: everything remembered of it goes, its metric series too."""
        self.unpublish(key)
        if self._kept.pop(key, None) is not None:
            names = self._namespaces[key.name]
            names.discard(key.namespace)
            if not names:
                del self._namespaces[key.name]
            self._count()

    def _count(self) -> None:
        if self.cluster:  # a cluster's runtime (not the CLI's view of one)
            metrics.TENANT_RECORDS.labels(self.cluster).set(len(self._kept))

