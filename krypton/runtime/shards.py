"""Several replicas split the fleet (SPEC F4), with Leases as the only coordination.

- **Membership.** Every replica holds a membership Lease (``<id>-member-<hash>``, labelled
  ``krypton.openkcm.io/member-of=<id>``) and renews it every retry period. A member is live
  while its Lease keeps changing: judged on this replica's own clock from the moment it
  last saw the record change, as the leader election does, so clock skew does not matter.
- **Assignment.** Every replica computes the same cluster -> member map from the live
  members and the discovered clusters (:mod:`krypton.decisions.clusters.sharding`).
- **Ownership.** A replica serves a cluster only while it holds that cluster's Lease
  (``<id>-cluster-<name>``, holderIdentity = the replica). It takes the Lease only when it
  is free (released) or its holder is not a live member, with the resourceVersion it read
  (two replicas can never both take it). Ownership is not renewed per cluster: it lasts as
  long as the holder's membership does, so a fleet of thousands of clusters costs one write
  per replica per retry period.
- **Fencing.** Every helm start checks that this replica renewed its membership within the
  renew deadline (shorter than the Lease duration the others wait for) and still holds the
  cluster's Lease as last seen. A replica that cannot renew stops dispatching at once and
  exits (status 1) so that it restarts as a new member.
- **Tidying.** The live member first in name order deletes what dead replicas left: a
  membership Lease unchanged for `STALE_AFTER` Lease durations, and a cluster Lease whose
  cluster is no longer discovered and that no live member holds. Each delete carries the
  resourceVersion judged on, so a Lease renewed or taken meanwhile stays.
- **Handover.** A cluster assigned elsewhere is drained first (as on shutdown) and its
  Lease released after, so the next owner takes it at once; SIGTERM releases every cluster
  and deletes the membership Lease. A killed replica's clusters are taken once its
  membership has not changed for a Lease duration, at the next retry period.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube, now_micro
from krypton.decisions.clusters import sharding
from krypton.decisions.clusters.sharding import CLUSTER_ANNOTATION, CLUSTER_LABEL, MEMBER_LABEL
from krypton.decisions.errors import AlreadyExists, Conflict, TemporaryError
from krypton.decisions.trust import leases
from krypton.runtime.leader import keep_renewed, not_believed

ROLLOUT_ANNOTATION = "krypton.openkcm.io/rollout"  # what the owner publishes for the rollout
log = structlog.get_logger("krypton.shards")
STALE_AFTER = 10  # Lease durations without a change before a dead member's Lease is deleted
RELEASE_ATTEMPTS = 3  # a cluster Lease's release: read and written again after a Conflict
Obj = dict[str, Any]


def _name(prefix: str, kind: str, text: str) -> str:
    """A Lease name for `text`: readable when it fits and is a plain DNS label, else hashed."""
    name = f"{prefix}-{kind}-{text}"
    if len(name) <= 63 and all(c.isalnum() or c == "-" for c in text) and text == text.lower():
        return name
    return f"{prefix}-{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


class Shards:
    def __init__(self, kube: Kube, namespace: str, group: str, identity: str, *,
                 lease_duration: float, renew_deadline: float, retry_period: float,
                 on_change: Callable[[], None]) -> None:
        self.kube, self.namespace, self.group, self.identity = kube, namespace, group, identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.retry_period = retry_period
        self.on_change = on_change
        self.member_lease = _name(group, "member", identity)
        self._renewed_at = 0.0
        self._rv = ""
        self._seen: dict[str, tuple[str, str, float, float]] = {}  # lease -> holder, renew, at, ttl
        self._live: frozenset[str] = frozenset()
        self._doubted: dict[str, list[str]] = {}  # membership lease -> what is not believed
        self._reported: dict[str, tuple[str, ...]] = {}
        self.members = Informer(kube, "member-leases", kube.lease_path(namespace),
                                self._member_event, label_selector=f"{MEMBER_LABEL}={group}")
        self.owners = Informer(kube, "cluster-leases", kube.lease_path(namespace),
                               self._owner_event, label_selector=f"{CLUSTER_LABEL}={group}")
        self.lost = False
        # every discovered cluster's name, None until known (set by the operator)
        self.discovered: Callable[[], frozenset[str] | None] = lambda: None

    # -- membership ------------------------------------------------------------------------

    def holds(self) -> bool:
        """Membership renewed within the renew deadline: the fence of every helm start."""
        return not self.lost and time.monotonic() - self._renewed_at < self.renew_deadline

    async def join(self) -> None:
        """Write this replica's membership Lease and read who else is there."""
        await self._renew()
        self.members.start()
        self.owners.start()
        await asyncio.gather(self.members.synced.wait(), self.owners.synced.wait())
        self._judge()
        log.info("joined the shard members", identity=self.identity, lease=self.member_lease,
                 members=sorted(self._live))

    async def _renew(self) -> None:
        started = time.monotonic()
        now = now_micro()
        body: Obj = {"metadata": {"name": self.member_lease, "namespace": self.namespace,
                                  "labels": {MEMBER_LABEL: self.group}},
                     "spec": {"holderIdentity": self.identity, "renewTime": now,
                              "leaseDurationSeconds": max(1, round(self.lease_duration))}}
        if self._rv:
            body["metadata"]["resourceVersion"] = self._rv
            try:
                written = await self.kube.replace_lease(self.namespace, self.member_lease, body)
            except Conflict:
                self._rv = ""  # written by someone else meanwhile: read it again next time
                raise
        else:
            existing = await self.kube.get_lease(self.namespace, self.member_lease)
            if existing is None:
                body["spec"]["acquireTime"] = now
                written = await self.kube.create_lease(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                written = await self.kube.replace_lease(self.namespace, self.member_lease, body)
        self._rv = str(written["metadata"]["resourceVersion"])
        self._renewed_at = started

    async def hold(self, stopping: asyncio.Event) -> None:
        """Renew every retry period, judge the members and tidy up; return when membership
        is lost (not renewed within the renew deadline) or `stopping` is set."""
        if not await keep_renewed(stopping, every=self.retry_period,
                                  deadline=lambda: self._renewed_at + self.renew_deadline,
                                  renew=self._renew, holds=self.holds, what="membership",
                                  logger=log, each=self._looked_around):
            self.lost = True
            log.error("membership lost", lease=self.member_lease)

    async def _looked_around(self) -> None:
        self._judge()
        await self._report_doubts()
        await self.tidy()

    async def _report_doubts(self) -> None:
        """A membership Lease that says what is not believed (SPEC S2): a Warning log
        line, an Event on it and the metric, once per change of what it says."""
        for name in set(self._reported) - set(self._doubted):
            del self._reported[name]
            metrics.LEASE_NOT_BELIEVED.labels(f"{self.namespace}/{name}").set(0)
        for name, doubts in list(self._doubted.items()):
            if self._reported.get(name) == leases.kinds(doubts):
                continue
            self._reported[name] = leases.kinds(doubts)
            lease = self.members.store.get((self.namespace, name)) or {"metadata": {
                "name": name, "namespace": self.namespace}}
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            await not_believed(self.kube, lease, "membership", holder, doubts)

    def _member_event(self, type_: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            self._seen.pop(name, None)
            self._doubted.pop(name, None)
        else:
            spec = obj.get("spec") or {}
            record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime")))
            ttl, _ = leases.believed_duration(spec, self.lease_duration)
            doubts = leases.doubts(spec, self.lease_duration, time.time())
            if doubts:
                self._doubted[name] = doubts
            else:
                self._doubted.pop(name, None)
            old = self._seen.get(name)
            if old is None or old[:2] != record:
                self._seen[name] = (*record, time.monotonic(), ttl)
        self._judge()

    def _judge(self) -> None:
        now = time.monotonic()
        live = {holder for holder, _, at, ttl in self._seen.values()
                if holder and now - at < ttl}
        if self.holds():
            live.add(self.identity)
        else:
            live.discard(self.identity)
        if live != self._live:
            self._live = frozenset(live)
            metrics.SHARD_MEMBERS.set(len(live))
            log.info("shard members changed", members=sorted(live))
            self.on_change()

    def live(self) -> frozenset[str]:
        return self._live

    # -- ownership -------------------------------------------------------------------------

    def _owner_event(self, _type: str, _obj: Obj) -> None:
        self.on_change()

    def _lease(self, cluster: str) -> Obj | None:
        return self.owners.store.get((self.namespace, _name(self.group, "cluster", cluster)))

    def owner(self, cluster: str) -> str:
        """The holder of the cluster's Lease as last seen ("" when free or none)."""
        lease = self._lease(cluster)
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def owns(self, cluster: str) -> bool:
        return self.holds() and self.owner(cluster) == self.identity

    def assignment(self, clusters: list[str], pins: dict[str, str]) -> dict[str, str]:
        return sharding.assign(clusters, self._live, pins)

    async def claim(self, cluster: str) -> bool:
        """Take the cluster's Lease if it is free or its holder is not a live member."""
        if not self.holds():
            return False
        name = _name(self.group, "cluster", cluster)
        now = now_micro()
        spec = {"holderIdentity": self.identity, "acquireTime": now, "renewTime": now,
                "leaseDurationSeconds": max(1, round(self.lease_duration))}
        meta: Obj = {"name": name, "namespace": self.namespace,
                     "labels": {CLUSTER_LABEL: self.group},
                     "annotations": {CLUSTER_ANNOTATION: cluster}}
        try:
            lease = await self.kube.get_lease(self.namespace, name)
            if lease is None:
                await self.kube.create_lease(self.namespace, {"metadata": meta, "spec": spec})
            else:
                holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
                if holder == self.identity:
                    return True
                if holder and holder in self._live:
                    return False
                spec["leaseTransitions"] = int((lease.get("spec") or {}).get(
                    "leaseTransitions") or 0) + 1
                meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
                await self.kube.replace_lease(self.namespace, name,
                                              {"metadata": meta, "spec": spec})
                if holder:
                    log.info("cluster taken over", cluster=cluster, previous=holder)
        except (AlreadyExists, Conflict):
            return False  # another replica was quicker
        except TemporaryError as exc:
            log.warning("cluster claim failed", cluster=cluster, error=str(exc))
            return False
        metrics.SHARD_HANDOVERS.labels("taken").inc()
        log.info("cluster claimed", cluster=cluster)
        return True

    async def release(self, cluster: str) -> None:
        """Give the cluster's Lease up (after its worker stopped): the next owner takes it at
        once instead of waiting for this replica's membership to expire."""
        name = _name(self.group, "cluster", cluster)
        error: Exception | None = None
        for _ in range(RELEASE_ATTEMPTS):
            try:
                lease = await self.kube.get_lease(self.namespace, name)
                spec = (lease or {}).get("spec") or {}
                if lease is None or spec.get("holderIdentity") != self.identity:
                    return
                await self.kube.replace_lease(self.namespace, name, {
                    "metadata": {**lease["metadata"]}, "spec": {**spec, "holderIdentity": ""}})
            except Conflict as exc:
                # written since the read (this replica's own publication, most often): read
                # it again; a Lease kept by a replica that stopped serving it is served by
                # nobody until that replica's membership expires
                error = exc
                continue
            except TemporaryError as exc:
                error = exc
                break
            metrics.SHARD_HANDOVERS.labels("released").inc()
            log.info("cluster released", cluster=cluster)
            return
        log.warning("cluster release failed", cluster=cluster, error=str(error))

    def published(self, cluster: str) -> str | None:
        """What the cluster's owner published for the rollout (F1); None when the cluster has
        no live owner (free, or held by a replica whose membership expired)."""
        lease = self._lease(cluster) or {}
        if self.owner(cluster) not in self._live:
            return None
        return ((lease.get("metadata") or {}).get("annotations") or {}).get(ROLLOUT_ANNOTATION)

    async def publish(self, cluster: str, text: str) -> None:
        """Write `text` on the cluster's Lease for the replica running the rollout, when this
        replica owns the cluster and the Lease does not say it already. The write carries the
        resourceVersion last seen: it fails (and is tried again next time) if the Lease
        changed hands meanwhile."""
        lease = self._lease(cluster)
        if lease is None or not self.owns(cluster):
            return
        meta = lease["metadata"]
        annotations = meta.get("annotations") or {}
        if annotations.get(ROLLOUT_ANNOTATION) == text:
            return
        try:
            await self.kube.replace_lease(self.namespace, meta["name"], {
                **lease, "metadata": {**meta, "annotations": {**annotations,
                                                                ROLLOUT_ANNOTATION: text}}})
        except TemporaryError as exc:  # a Conflict included: read again, try next time
            log.debug("rollout observation not published", cluster=cluster, error=str(exc))

    async def tidy(self) -> None:
        """Delete what dead replicas left behind (see the module's notes), when this replica
        is the live member first in name order (every retry period; a write only when
        something is stale)."""
        if not self.holds() or min(self._live, default="") != self.identity:
            return
        discovered = self.discovered()
        if discovered is None:
            return
        now = time.monotonic()
        stale = []
        for (_, name), lease in list(self.members.store.items()):
            holder, _, at, ttl = self._seen.get(name, ("", "", now, self.lease_duration))
            if holder not in self._live and now - at > STALE_AFTER * ttl:
                stale.append((name, lease, f"membership of {holder or '(none)'}"))
        for (_, name), lease in list(self.owners.store.items()):
            cluster = ((lease.get("metadata") or {}).get("annotations") or {}).get(
                CLUSTER_ANNOTATION)
            holder = ((lease.get("spec") or {}).get("holderIdentity")) or ""
            if cluster not in discovered and holder not in self._live:
                stale.append((name, lease, f"cluster {cluster} (no longer discovered)"))
        for name, lease, what in stale:
            try:
                await self.kube.delete_lease(self.namespace, name,
                                             str(lease["metadata"]["resourceVersion"]))
                log.info("stale lease deleted", lease=name, of=what)
            except TemporaryError as exc:  # Conflict included: it changed, so it is not stale
                log.debug("stale lease kept", lease=name, error=str(exc))

    def held(self) -> list[str]:
        """Clusters whose Lease names this replica, as last seen."""
        return [str(((lease.get("metadata") or {}).get("annotations") or {}).get(
            CLUSTER_ANNOTATION) or "") for lease in self.owners.store.values()
            if ((lease.get("spec") or {}).get("holderIdentity")) == self.identity]

    async def leave(self) -> None:
        """On shutdown, after every worker stopped: release every cluster and the membership."""
        for cluster in self.held():
            if cluster:
                await self.release(cluster)
        try:
            await self.kube.delete_lease(self.namespace, self.member_lease)
        except TemporaryError as exc:
            log.warning("membership release failed", error=str(exc))
        await self.members.stop()
        await self.owners.stop()
