"""Helm release state read from the cluster's release records, without running helm (R8).

Helm 3 stores one Secret per release revision (label ``owner=helm``) whose labels carry
``name``, ``version`` (the revision) and ``status``. A watch on those Secrets keeps this
index current, so deciding "deployed and unchanged?" costs no process and no API call.
Right after krypton's own helm run the watch may lag; `note` records what helm reported
so that a stale view never triggers a second operation.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
from collections.abc import Mapping
from typing import Any

from krypton.decisions.model import (
    RELEASE_CLUSTER_LABEL,
    RELEASE_OWNER_LABEL,
    ReleaseObservation,
    ReleaseStatus,
    epoch_seconds,
)

GOOD = {ReleaseStatus.DEPLOYED, ReleaseStatus.SUPERSEDED}
BUSY = {ReleaseStatus.PENDING_INSTALL, ReleaseStatus.PENDING_UPGRADE,
        ReleaseStatus.PENDING_ROLLBACK, ReleaseStatus.UNINSTALLING}
Key = tuple[str, str]


def _modified(meta: dict[str, Any]) -> float:
    """When the record was last written: helm's modifiedAt label, else its creation time."""
    label = (meta.get("labels") or {}).get("modifiedAt")
    if label and str(label).isdigit():
        return float(label)
    return epoch_seconds(meta.get("creationTimestamp")) or 0.0


class ReleaseIndex:
    def __init__(self) -> None:
        self._records: dict[Key, dict[int, ReleaseStatus]] = {}
        self._modified: dict[Key, float] = {}
        self._noted: dict[Key, tuple[int, ReleaseStatus]] = {}
        # the latest record's owner (Tenant UID) and cluster labels, as krypton's runs set them
        self._labels: dict[Key, tuple[str | None, str | None]] = {}
        # the last revision our own helm runs produced, and the fingerprint it applied
        self._ours: dict[Key, tuple[int, str]] = {}

    def on_event(self, type_: str, obj: dict[str, Any]) -> Key | None:
        """Apply one watch event; returns the (namespace, release) it concerns."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        name, version = labels.get("name"), str(labels.get("version"))
        if not name or not version.isdigit():
            return None
        key = (str(meta.get("namespace", "")), str(name))
        revisions = self._records.setdefault(key, {})
        if type_ == "DELETED":
            revisions.pop(int(version), None)
            if not revisions:
                del self._records[key]
                self._labels.pop(key, None)
        else:
            revisions[int(version)] = ReleaseStatus.parse(labels.get("status"))
            if int(version) == max(revisions):
                self._modified[key] = _modified(meta)
                self._labels[key] = (labels.get(RELEASE_OWNER_LABEL) or None,
                                     labels.get(RELEASE_CLUSTER_LABEL) or None)
        return key

    def note(self, namespace: str, release: str, revision: int, status: ReleaseStatus,
             fingerprint: str, owner: str | None = None) -> None:
        """Record the outcome of our own helm run until the watch catches up; `owner` is
        the UID of the Tenant it labelled the release with."""
        self._noted[(namespace, release)] = (revision, status)
        self._ours[(namespace, release)] = (revision, fingerprint)
        if owner:
            cluster = self._labels.get((namespace, release), (None, None))[1]
            self._labels[(namespace, release)] = (owner, cluster)

    def names(self) -> list[Key]:
        """Every release with a record: (namespace, name)."""
        return list(self._records)

    def clusters(self) -> dict[Key, str | None]:
        """Every release's cluster label: (namespace, release) -> name (None: unlabelled)."""
        return {key: self._labels.get(key, (None, None))[1] for key in self._records}

    def forget(self, namespace: str, release: str) -> None:
        self._noted.pop((namespace, release), None)
        self._ours.pop((namespace, release), None)

    def ours(self, namespace: str, release: str) -> tuple[int, str] | None:
        """The revision krypton's last helm run on this release produced and the fingerprint
        it applied, if any."""
        return self._ours.get((namespace, release))

    def observe(self, namespace: str, release: str, *, now: float = 0.0,
                lock_timeout: float = 0.0) -> ReleaseObservation:
        """The release as its records say. A pending or uninstalling record younger than
        `lock_timeout` seconds (at time `now`) is reported as locked: some helm run, perhaps
        not ours, may still be working on it; an older one is a leftover to recover."""
        key = (namespace, release)
        revisions = self._records.get(key, {})
        latest = max(revisions, default=0)
        noted = self._noted.get(key)
        owner = self._labels.get(key, (None, None))[0]
        if noted is not None:
            if latest >= noted[0]:
                del self._noted[key]  # the watch has caught up
            else:
                good = noted[0] > 1 or any(s in GOOD for s in revisions.values())
                return ReleaseObservation(noted[1], noted[0], good, owner_uid=owner)
        if not revisions:
            return ReleaseObservation()
        good = any(s in GOOD for r, s in revisions.items() if r < latest)
        status = revisions[latest]
        locked = status in BUSY and now - self._modified.get(key, 0.0) < lock_timeout
        return ReleaseObservation(status, latest, good, locked, owner_uid=owner)


def orphaned(releases: Mapping[Key, str | None], this: str, known: set[str] | frozenset[str],
             *, own_namespace: bool) -> list[tuple[str, str, str]]:
    """The releases on cluster `this` that were made for a cluster name no longer discovered
    (issue 25.3: a cluster Secret renamed or removed leaves them behind), as (namespace,
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


RELEASE_MAX_BYTES = 64 << 20  # a decoded release record (helm's own limit is about 1 MiB stored)


def decode_release(record: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """The release a Helm release record stores: ``data.release`` is base64 of gzip of JSON
    (gzip optional), and the Secret driver base64-encodes that once more. Raises ValueError
    for a record that is not one."""
    text = (record.get("data") or {}).get("release")
    if not isinstance(text, str):
        raise ValueError("release record without data.release")
    raw = base64.b64decode(text)
    if driver != "configmap":
        raw = base64.b64decode(raw)
    if raw[:2] == b"\x1f\x8b":
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
            raw = unzipped.read(RELEASE_MAX_BYTES + 1)
        if len(raw) > RELEASE_MAX_BYTES:
            raise ValueError("release record over the size limit")
    release = json.loads(raw)
    if not isinstance(release, dict):
        raise ValueError("release record is not a JSON object")
    return release
