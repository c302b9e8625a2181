"""What is wrong with an engaged cluster, said once per episode (SPEC D8).

Lost access (401/403), a deleted or outdated Tenant CRD, answers krypton refuses, an absence
longer than two API timeouts, releases of cluster names no longer discovered, a client
certificate near its expiry and release records without their guard (SPEC S4): each is a
Warning Event on the cluster's Secret, a log line and
a metric when it starts, and a Normal Event when it ends. Also the gauges of its Tenants.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.budget import PASS_RATE, QUIET, Budget
from krypton.decisions import conditions as cond
from krypton.decisions import crd
from krypton.decisions.clusters.kubeconfig import Kubeconfig, expiry_warnings
from krypton.decisions.errors import (
    HOSTILE_ANSWERS,
    ClusterUnreachable,
    Forbidden,
    KryptonError,
    NotFound,
)
from krypton.decisions.releases import ReleaseIndex, orphan_message, orphaned
from krypton.runtime.reconcile import ClusterRuntime
from krypton.runtime.recordguard import GuardState, carried

Reporter = Callable[[str, str, str, str], Awaitable[None]]
REPEAT_WARNING = 86400.0  # a still-expiring certificate is reported again after a day


class ClusterHealth:
    """The standing problems of one engaged cluster, and their reports."""

    def __init__(self, name: str, report: Reporter, api_timeout: float) -> None:
        self.name, self.report, self.api_timeout = name, report, api_timeout
        self.log = structlog.get_logger("krypton.worker").bind(cluster=name)
        self.problem = ""  # why an engaged cluster is failing (lost access, CRD gone), "" = fine
        self.budget = Budget()  # its strikes: over its budget, its lists, watches and passes wait
        self.crd_outdated = ""  # why its Tenant CRD is older than krypton's, "" = current
        self.guard = GuardState(False, "not looked at yet")  # its release records' guard (S4)
        self.guard_known = False  # judged once at least
        self.orphans: list[tuple[str, str, str]] = []  # releases of undiscovered cluster names
        self._away_since = 0.0  # monotonic time its watches first failed to reach it
        self._held_at = -QUIET  # monotonic time a pass last waited for the cluster's rate
        self._looked: tuple[frozenset[str], int] | None = None  # (names, changes) looked at
        self._reports: set[asyncio.Task[None]] = set()

    def watch_failed(self, exc: Exception) -> None:
        """A watch of an engaged cluster failed. Lost access (401/403: revoked credentials,
        an expired certificate, removed RBAC), a deleted Tenant CRD and answers krypton
        refuses (over a bound, not JSON) are not passing faults: the cluster is reported
        failing (Warning Event once per episode, metric, /readyz, krypton status) until a
        list or a watch is accepted again, or for an answer refused, until it is within its
        budget again (:meth:`settle`)."""
        self.log.warning("watch failed, retrying", error=str(exc))
        if isinstance(exc, Forbidden):
            reason = "ClusterAccessDenied"
        elif isinstance(exc, NotFound) and "tenants" in str(exc):
            reason = "TenantCRDMissing"
        elif isinstance(exc, KryptonError) and exc.reason in HOSTILE_ANSWERS:
            self.answer_refused(exc)
            return
        elif isinstance(exc, ClusterUnreachable):
            # away for a moment is the network's weather; away for longer than two API
            # timeouts is worth saying (SPEC S3)
            now = time.monotonic()
            self._away_since = self._away_since or now
            if now - self._away_since < 2 * self.api_timeout:
                return
            reason = "ClusterUnreachable"
        else:
            return
        self._failing(reason, exc, "krypton keeps retrying")

    def answer_refused(self, exc: KryptonError) -> None:
        """An answer of the cluster past a bound, or not one (SPEC S3), met by a watch, a
        list or a pass: a strike against its budget (SPEC S5), and the cluster failing."""
        wait = self.budget.strike()
        self.log.info("cluster over its budget, backing off", reason=exc.reason,
                      wait=round(wait, 1), strikes=self.budget.strikes)
        self._failing(exc.reason, exc, "the cluster is over its budget: its lists, watches "
                      "and passes wait, longer after each answer past a bound, until it "
                      "answers within them")

    def passes_held(self, wait: float) -> None:
        """A pass waits for the cluster's rate (SPEC S5): counted, and said once (a Warning
        Event) when the cluster starts changing its Tenants faster than the rate, not again
        until it has gone QUIET seconds within it."""
        metrics.PASSES_HELD.labels(self.name).inc()
        now, last = time.monotonic(), self._held_at
        self._held_at = now
        if now - last < QUIET:
            return
        self.log.warning("cluster's Tenants change faster than its pass rate", wait=round(wait, 2))
        self._spawn(self.report(self.name, "Warning", "TooManyPasses", (
            f"the cluster's Tenants change faster than {PASS_RATE:.0f} passes a second: its "
            "passes wait their turn, and the changes of a Tenant that waits are taken "
            "together by its one pass")))

    def _failing(self, reason: str, exc: Exception, retrying: str) -> None:
        if self.problem:
            return
        self.problem = f"{reason}: {exc}"
        metrics.CLUSTER_HEALTHY.labels(self.name).set(0)
        self.log.error("cluster failing after engagement", reason=reason, error=str(exc))
        self._spawn(self.report(self.name, "Warning", reason, f"{exc}; {retrying}"))

    def watch_restored(self) -> None:
        """A list or a watch was accepted again. A cluster over its budget is not restored
        by that (its next answer may well be the same): only by :meth:`settle`."""
        if self.budget.over:
            return
        self._restored()

    def settle(self) -> None:
        """Called every few seconds: a cluster over its budget that has gone its backoff
        without a strike is within its budget again, and recovered."""
        if self.budget.settled():
            self._restored()

    def _restored(self) -> None:
        self._away_since = 0.0
        metrics.CLUSTER_HEALTHY.labels(self.name).set(1)
        if not self.problem:
            return
        self.problem = ""
        self.log.info("cluster healthy again")
        self._spawn(self.report(self.name, "Normal", "ClusterRecovered",
                                "its watches work again; the earlier failure is over"))

    def _spawn(self, report: Awaitable[None]) -> None:
        task = asyncio.ensure_future(report)
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def judge_crd(self, served: dict[str, Any]) -> None:
        """An older Tenant CRD (the original operator's, or an earlier krypton revision kept
        by --crd-policy=create) makes the API server drop fields krypton writes: reported
        when found and when its reason changes, with the command that fixes it (SPEC R2);
        a Normal Event once a current one is served."""
        reason, was = crd.outdated(served) or "", self.crd_outdated
        self.crd_outdated = reason
        metrics.CRD_OUTDATED.labels(self.name).set(1 if reason else 0)
        if reason and reason != was:
            message = (f"the Tenant CRD on this cluster is outdated: {reason}; the API server "
                       f"drops what it lacks. Fix: {crd.FIX}")
            self.log.warning("tenant CRD outdated", detail=reason)
            await self.report(self.name, "Warning", "CRDOutdated", message)
        elif was and not reason:
            self.log.info("tenant CRD current")
            await self.report(self.name, "Normal", "CRDCurrent",
                              "the Tenant CRD on this cluster is krypton's now; its Tenants are "
                              "listed again")

    def judge_guard(self, state: GuardState) -> None:
        """The guard of the cluster's release records (SPEC S4, S6), as last found: a cluster
        without it is a Warning Event when that starts or its reason changes, and a Normal
        Event when it is guarded again; the gauge and /readyz always say it, from the moment
        it is judged."""
        was = self.guard
        self.guard = state = carried(was, state)
        first, self.guard_known = not self.guard_known, True
        metrics.RECORDS_GUARDED.labels(self.name).set(1 if state.guarded else 0)
        if state.guarded:
            if first or not was.guarded:
                self.log.info("release records guarded", detail=state.message)
            if not first and not was.guarded:
                self._spawn(self.report(self.name, "Normal", "RecordsGuarded", state.message))
        elif first or was.guarded or was.message != state.message:
            self.log.warning("release records unguarded", detail=state.message)
            self._spawn(self.report(self.name, "Warning", "RecordsUnguarded",
                                    f"{state.message}; a tenant admin who may write Secrets "
                                    "or ConfigMaps in a Tenant's namespace can forge the "
                                    "release's history here"))

    async def look_for_orphans(self, releases: ReleaseIndex, known: frozenset[str] | None,
                               changes: int, *, own_namespace: bool) -> None:
        """Releases here that were made for a cluster name no longer discovered (issue
        25.3), looked for when the release records (their count of `changes`) or the
        `known` names changed since the last look: a change of what is found is a Warning
        Event on the cluster's Secret (with the commands that remove them) and a metric, and
        their end a Normal Event. krypton neither adopts nor removes them."""
        if known is None or (known, changes) == self._looked:
            return
        self._looked = (known, changes)
        found = orphaned(releases.clusters(), self.name, known, own_namespace=own_namespace)
        if found == self.orphans:
            return
        self.orphans = found
        metrics.ORPHANED_RELEASES.labels(self.name).set(len(found))
        if found:
            message = orphan_message(found)
            self.log.warning("orphaned releases", detail=message)
            await self.report(self.name, "Warning", "OrphanedReleases", message)
        else:
            await self.report(self.name, "Normal", "OrphanedReleasesGone",
                              "no release of an undiscovered cluster is left")

    def count_phases(self, rt: ClusterRuntime, queued: int) -> None:
        """The cluster's gauges of its Tenants (phases, stalled releases, queue, followed
        workloads) and of its maintenance window."""
        store = rt.tenants
        phases = [(t.get("status") or {}).get("phase") for t in list(store.values())]
        metrics.TENANTS_READY.labels(self.name).set(phases.count("Ready"))
        metrics.TENANTS_ERROR.labels(self.name).set(phases.count("Error"))
        error = cond.cluster_type(cond.ERROR, self.name)
        metrics.RELEASES_STALLED.labels(self.name).set(sum(
            cond.holds(t, error, "RetriesExhausted") for t in list(store.values())))
        metrics.QUEUE_DEPTH.labels(self.name).set(queued)
        metrics.WINDOW_OPEN.labels(self.name).set(1 if rt.window_state(time.time())[0] else 0)
        if rt.readiness is not None:
            metrics.WORKLOADS_FOLLOWED.labels(self.name).set(rt.readiness.followed())

    async def judge_credentials(self, kc: Kubeconfig, warned: float) -> float:
        """Judge the client certificate's expiry again (not only at engagement): one that
        enters its last 14 days (or expires) raises CredentialsExpiringSoon, again at most
        once a day after `warned`. Returns when it was last said."""
        warnings = expiry_warnings(kc)
        if not warnings or time.monotonic() - warned < REPEAT_WARNING:
            return warned
        for warning in warnings:
            self.log.warning("credentials expiring soon", detail=warning)
            await self.report(self.name, "Warning", "CredentialsExpiringSoon", warning)
        return time.monotonic()
