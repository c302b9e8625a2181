"""Which replica serves which cluster (SPEC F4): consistent hashing with bounded loads. Pure.

Every replica computes the same answer from the same inputs (the live members and the
discovered clusters), so no replica has to tell another what to take:

- each member has `VNODES` points on a hash ring (sha256 of "member#i");
- clusters are placed in the order of their own hash; each takes the first member clockwise
  from its hash whose load is below the bound ceil(clusters * (1 + EPSILON) / members);
- a cluster pinned to a live member (a label on its Secret) goes there first, and counts.

Adding or losing one of m members moves about 1/m of the clusters (those whose nearest
member changed, plus the few that the bound pushes on), never all of them.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from krypton.decisions.trust import leases

MEMBER_LABEL = "krypton.openkcm.io/member-of"  # on membership Leases: the leader election id
CLUSTER_LABEL = "krypton.openkcm.io/cluster-of"  # on cluster Leases: the leader election id
CLUSTER_ANNOTATION = "krypton.openkcm.io/cluster"  # on cluster Leases: the cluster's name
VNODES = 64  # ring points per member
EPSILON = 0.25  # a member takes at most 25 % more than an even share


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def bound(clusters: int, members: int) -> int:
    """The most clusters one member may be given."""
    return max(1, math.ceil(clusters * (1 + EPSILON) / members)) if members else 0


def assign(clusters: Iterable[str], members: Iterable[str],
           pins: Mapping[str, str] | None = None) -> dict[str, str]:
    """cluster -> member for every cluster; empty when there is no member."""
    live = sorted(set(members))
    names = sorted(set(clusters), key=lambda c: (_point(c), c))
    if not live:
        return {}
    ring = sorted((_point(f"{m}#{i}"), m) for m in live for i in range(VNODES))
    points = [p for p, _ in ring]
    most = bound(len(names), len(live))
    load = dict.fromkeys(live, 0)
    out: dict[str, str] = {}
    for cluster in names:
        pinned = (pins or {}).get(cluster)
        if pinned in load:
            out[cluster] = pinned
            load[pinned] += 1
    for cluster in names:
        if cluster in out:
            continue
        start = bisect.bisect(points, _point(cluster))
        for step in range(len(ring)):
            member = ring[(start + step) % len(ring)][1]
            if load[member] < most:
                break
        else:  # every member at the bound (pins exceeded it): the least loaded
            member = min(live, key=lambda m: (load[m], m))
        out[cluster] = member
        load[member] += 1
    return out


def pins(secrets: Iterable[Mapping[str, Any]], label: str) -> dict[str, str]:
    """cluster -> replica, from the pin label of each cluster Secret that has one."""
    out = {}
    for secret in secrets:
        meta = secret.get("metadata") or {}
        pinned = (meta.get("labels") or {}).get(label)
        if pinned:
            out[str(meta.get("name"))] = str(pinned)
    return out


def owners(cluster_leases: Iterable[Mapping[str, Any]], member_leases: Iterable[Mapping[str, Any]],
           now: float, own_duration: float) -> dict[str, str]:
    """cluster -> the replica serving it, for people (``krypton status``): the holder of the
    cluster's Lease, "(released)" when none, and "<holder> (expired)" when the holder's
    membership was not renewed within its duration by the wall clock (a replica that died;
    its clusters move at the others' next look). A duration or renewTime that is not
    believed (:mod:`krypton.decisions.trust.leases`) does not keep a holder live."""
    live = set()
    for lease in member_leases:
        spec = lease.get("spec") or {}
        if leases.live_by_wall_clock(spec, own_duration, now):
            live.add(str(spec.get("holderIdentity") or ""))
    out = {}
    for lease in cluster_leases:
        cluster = ((lease.get("metadata") or {}).get("annotations") or {}).get(CLUSTER_ANNOTATION)
        if not cluster:
            continue
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        out[str(cluster)] = (holder if holder in live else f"{holder} (expired)") if holder \
            else "(released)"
    return out
