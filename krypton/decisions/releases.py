"""Helm release state read from the cluster's release records, without running helm (R8).

Helm 3 stores one Secret per release revision (label ``owner=helm``) whose labels carry
``name``, ``version`` (the revision) and ``status``. A watch on those Secrets keeps this
index current, so deciding "deployed and unchanged?" costs no process and no API call.
Right after krypton's own helm run the watch may lag; `note` records what helm reported
so that a stale view never triggers a second operation.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from krypton.decisions.model import (
    RELEASE_CLUSTER_LABEL,
    RELEASE_OWNER_LABEL,
    RELEASE_WRITER_LABEL,
    ReleaseObservation,
    ReleaseStatus,
    TenantView,
    epoch_seconds,
)

LABEL_MAX = 63  # a label value is at most this long (a longer one is no label of krypton's)
GOOD = {ReleaseStatus.DEPLOYED, ReleaseStatus.SUPERSEDED}
BUSY = {ReleaseStatus.PENDING_INSTALL, ReleaseStatus.PENDING_UPGRADE,
        ReleaseStatus.PENDING_ROLLBACK, ReleaseStatus.UNINSTALLING}
Key = tuple[str, str]


STATUSES = tuple(ReleaseStatus)
_CODE = {status: code for code, status in enumerate(STATUSES)}
_BITS = 4  # a revision is packed with its status as revision << 4 | status code
assert len(STATUSES) <= 1 << _BITS


def _modified(meta: dict[str, Any], now: float) -> float:
    """When the record was last written: helm's modifiedAt label, else its creation time,
    never later than `now`, when the reader saw it (a record's writer may date it in the
    future, and its lock would never end: SPEC S3)."""
    label = (meta.get("labels") or {}).get("modifiedAt")
    if label and str(label).isdigit() and len(str(label)) < 20:
        return min(float(label), now)
    return min(epoch_seconds(meta.get("creationTimestamp")) or 0.0, now)


class Entry(NamedTuple):
    """What the index keeps of one release: its revisions, each packed with its status
    (sorted), when its latest record was written (while that one is busy, for the lock
    timeout; else when it was made, if labelled with its writer, SPEC S6) and the latest
    record's owner, cluster and writer labels."""

    revisions: tuple[int, ...]
    modified: float | None
    owner: str | None
    cluster: str | None
    writer: str | None = None

    def statuses(self) -> dict[int, ReleaseStatus]:
        mask = (1 << _BITS) - 1
        return {p >> _BITS: STATUSES[p & mask] for p in self.revisions}


def _record(type_: str, meta: dict[str, Any], entry: Entry | None, now: float) -> Entry | None:
    """The release's entry after one record event (None: no record of it is left)."""
    labels = meta.get("labels") or {}
    revision = int(str(labels.get("version")))
    kept = tuple(p for p in (entry.revisions if entry else ()) if p >> _BITS != revision)
    if type_ == "DELETED":
        if not kept:
            return None
        assert entry is not None
        return entry._replace(revisions=kept)
    status = ReleaseStatus.parse(labels.get("status"))
    revisions = tuple(sorted((*kept, revision << _BITS | _CODE[status])))
    if entry is not None and revisions[-1] >> _BITS != revision:
        return entry._replace(revisions=revisions)  # an older revision changed
    # a record of a writer is dated by its creation (helm carries the modifiedAt label of
    # the record before into an upgrade's)
    writer = labels.get(RELEASE_WRITER_LABEL)
    made = min(epoch_seconds(meta.get("creationTimestamp")) or 0.0, now) if writer else None
    return Entry(revisions, _modified(meta, now) if status in BUSY else made,
                 sys.intern(str(labels[RELEASE_OWNER_LABEL])) if labels.get(RELEASE_OWNER_LABEL)
                 else None,
                 sys.intern(str(labels[RELEASE_CLUSTER_LABEL]))
                 if labels.get(RELEASE_CLUSTER_LABEL) else None,
                 sys.intern(str(writer)[:LABEL_MAX]) if writer else None)


def _key(meta: dict[str, Any]) -> Key | None:
    labels = meta.get("labels") or {}
    name, version = labels.get("name"), str(labels.get("version"))
    if not name or not version.isdigit() or int(version) >= 1 << 40:
        return None
    return (sys.intern(str(meta.get("namespace", ""))), str(name))


class ReleaseIndex:
    """Every release's state on one cluster, from its release records' labels, in a compact
    form (one small tuple per release, not the records: a cluster may hold thousands)."""

    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}
        self._noted: dict[Key, tuple[int, ReleaseStatus, str | None]] = {}
        # the last revision our own helm runs produced, the fingerprint it applied and the
        # owner it labelled the release with
        self._ours: dict[Key, tuple[int, str, str | None]] = {}

    def on_event(self, type_: str, obj: dict[str, Any], now: float = float("inf")) -> Key | None:
        """Apply one watch event seen at time `now`; returns the (namespace, release) it
        concerns."""
        meta = obj.get("metadata") or {}
        key = _key(meta)
        if key is None:
            return None
        entry = _record(type_, meta, self._entries.get(key), now)
        if entry is None:
            self._entries.pop(key, None)
            self._noted.pop(key, None)  # the watch caught up with a deletion (SPEC S3)
        else:
            self._entries[key] = entry
        return key

    def replace(self, records: list[dict[str, Any]], now: float = float("inf")) -> set[Key]:
        """Take a new list of every record (a list or relist of the watch) seen at time
        `now`: the index is rebuilt from it, and the releases whose entry changed or went are
        returned."""
        entries: dict[Key, Entry] = {}
        for obj in records:
            meta = obj.get("metadata") or {}
            key = _key(meta)
            if key is not None:
                entry = _record("ADDED", meta, entries.get(key), now)
                if entry is not None:
                    entries[key] = entry
        old, self._entries = self._entries, entries
        for key in old.keys() - entries.keys():
            self._noted.pop(key, None)
        return {k for k in old.keys() | entries.keys() if old.get(k) != entries.get(k)}

    def note(self, namespace: str, release: str, revision: int, status: ReleaseStatus,
             fingerprint: str, owner: str | None = None) -> None:
        """Record the outcome of our own helm run until the watch catches up; `owner` is
        the UID of the Tenant it labelled the release with."""
        self._noted[(namespace, release)] = (revision, status, owner)
        self._ours[(namespace, release)] = (revision, fingerprint, owner)
        entry = self._entries.get((namespace, release))
        if owner and entry is not None:
            self._entries[(namespace, release)] = entry._replace(owner=sys.intern(owner))

    def names(self) -> list[Key]:
        """Every release with a record: (namespace, name)."""
        return list(self._entries)

    def has(self, namespace: str, release: str) -> bool:
        """Whether any record of the release is left."""
        return (namespace, release) in self._entries

    def clusters(self) -> dict[Key, str | None]:
        """Every release's cluster label: (namespace, release) -> name (None: unlabelled)."""
        return {key: entry.cluster for key, entry in self._entries.items()}

    def drop(self, namespace: str, release: str) -> None:
        self._noted.pop((namespace, release), None)
        self._ours.pop((namespace, release), None)

    def ours(self, namespace: str, release: str) -> tuple[int, str] | None:
        """The revision krypton's last helm run on this release produced and the fingerprint
        it applied, if any."""
        ours = self._ours.get((namespace, release))
        return None if ours is None else ours[:2]

    def settled(self, namespace: str, release: str) -> bool:
        """Whether the release's records say what krypton's last helm run of it left: its
        newest revision is that run's, deployed, labelled with the owner the run gave it.
        Older revisions may change (helm supersedes and prunes them) without it mattering."""
        ours, entry = self._ours.get((namespace, release)), self._entries.get((namespace, release))
        if ours is None or entry is None:
            return False
        latest = entry.revisions[-1]
        return (latest >> _BITS == ours[0] and entry.owner == ours[2]
                and STATUSES[latest & ((1 << _BITS) - 1)] is ReleaseStatus.DEPLOYED)

    def observe(self, namespace: str, release: str, *, now: float = 0.0,
                lock_timeout: float = 0.0) -> ReleaseObservation:
        """The release as its records say. A pending or uninstalling record younger than
        `lock_timeout` seconds (at time `now`) is reported as locked: some helm run, perhaps
        not ours, may still be working on it; an older one is a leftover to recover."""
        key = (namespace, release)
        entry = self._entries.get(key)
        revisions = entry.statuses() if entry else {}
        latest = max(revisions, default=0)
        noted = self._noted.get(key)
        owner = entry.owner if entry else None
        if noted is not None:
            if latest >= noted[0]:
                del self._noted[key]  # the watch has caught up
            else:
                good = noted[0] > 1 or any(s in GOOD for s in revisions.values())
                return ReleaseObservation(noted[1], noted[0], good,
                                          owner_uid=noted[2] or owner)
        if entry is None:
            return ReleaseObservation()
        good = any(s in GOOD for r, s in revisions.items() if r < latest)
        status = revisions[latest]
        unlocks_in = lock_timeout - (now - (entry.modified or 0.0)) if status in BUSY else 0.0
        return ReleaseObservation(status, latest, good, unlocks_in > 0,
                                  max(unlocks_in, 0.0), owner_uid=owner, writer=entry.writer,
                                  written=entry.modified or 0.0)


def orphaned(releases: Mapping[Key, str | None], this: str, known: set[str] | frozenset[str],
             *, own_namespace: bool) -> list[tuple[str, str, str]]:
    """The releases on cluster `this` that were made for a cluster name no longer discovered
    (SPEC S2: a cluster Secret renamed or removed leaves them behind), as (namespace,
    release, cluster), sorted. The cluster is the release's label, or for a release made
    before krypton labelled them, read from its name ``tenant-<namespace>-<cluster>`` where
    the namespace is the Tenant's own."""
    found = []
    for (namespace, release), cluster in releases.items():
        if cluster is None and own_namespace and release.startswith(f"tenant-{namespace}-"):
            cluster = release[len(f"tenant-{namespace}-"):]
        if cluster and cluster != this and cluster not in known:
            found.append((namespace, release, cluster))
    return sorted(found)


def orphan_message(found: list[tuple[str, str, str]], limit: int = 5) -> str:
    """What the OrphanedReleases Event says: which, for which names, and how to remove them."""
    names = sorted({cluster for _, _, cluster in found})
    shown = "; ".join(f"helm uninstall {release} -n {namespace}"
                      for namespace, release, _ in found[:limit])
    more = f" (and {len(found) - limit} more)" if len(found) > limit else ""
    return (f"{len(found)} release(s) of cluster name(s) {', '.join(names)} that are no longer "
            f"discovered (a renamed or removed cluster Secret); krypton does not adopt or "
            f"remove them. Remove them with: {shown}{more}")


class ReleaseState(enum.Enum):
    """The release on the cluster, judged against the target fingerprint."""

    IN_SYNC = "in-sync"  # deployed, at the revision recorded, with the target's fingerprint
    UNRECORDED = "unrecorded"  # deployed as recorded; the fingerprint annotation is missing/wrong
    LOCKED = "locked"  # a recent pending operation: another helm run may still be at work
    STALE = "stale"  # a pending operation left behind by a helm run that did not finish
    FAILED = "failed"  # the last operation failed
    DRIFTED = "drifted"  # the target was applied, and the release changed or went since
    ABSENT = "absent"  # no release, and the target was never applied here
    OUT_OF_SYNC = "out-of-sync"  # deployed; the target changed


def release_state(t: TenantView, target: str, rel: ReleaseObservation,
                  missing: tuple[str, ...] = ()) -> ReleaseState:
    """One value for the release of Tenant `t`, given the target fingerprint and the objects
    of its manifest found gone from the cluster."""
    deployed = rel.status is ReleaseStatus.DEPLOYED and not missing
    if deployed and t.applied_fingerprint == target and \
            (t.applied_revision is None or t.applied_revision == rel.revision):
        return ReleaseState.IN_SYNC
    if deployed and t.recorded_fingerprint == target and t.applied_revision == rel.revision:
        return ReleaseState.UNRECORDED
    if rel.locked:
        return ReleaseState.LOCKED
    if rel.status in BUSY:
        return ReleaseState.STALE
    if rel.status in (ReleaseStatus.FAILED, ReleaseStatus.UNKNOWN):
        return ReleaseState.FAILED
    if target in (t.applied_fingerprint, t.recorded_fingerprint):
        return ReleaseState.DRIFTED
    if rel.status in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED):
        return ReleaseState.ABSENT
    return ReleaseState.OUT_OF_SYNC
