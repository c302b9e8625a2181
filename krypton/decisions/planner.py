"""What should happen next to one Tenant on one cluster. Pure: no I/O, no clock.

The release is first observed into one value, :class:`ReleaseState` (`release_state`); `plan`
then maps the :class:`~krypton.decisions.model.Observation` to one :class:`Plan` through a
single decision table, in order:

1. deleting          -> Uninstall (if our finalizer is on it), else nothing; a release that
                        belongs to another Tenant (by the UID it is labelled with, else by
                        its namespace's owner) is not uninstalled: DropFinalizer
2. paused            -> Pause
3. targeted elsewhere -> NotTargeted (UnknownCluster, a Warning, when no discovered cluster
                        has that name)
4. invalid name      -> Blocked InvalidTenantName (permanent)
   spec.workspace set and not the name -> Blocked WorkspaceMismatch (permanent): the
                        original operator installed into the workspace namespace; krypton
                        never installs a second copy into the namespace named after the Tenant
   reserved name     -> Blocked ReservedNamespace (permanent): kube-system, kube-public,
                        kube-node-lease, default and the operator's own namespaces
   release labelled as another live Tenant's -> Blocked NamespaceConflict (permanent): a
                        Tenant of the same name in another namespace maps to the same
                        release and namespace; it never adopts, annotates or uninstalls it
5. chart unresolved  -> the need ResolveChart (the caller resolves it, then plans again)
   chart problem     -> Blocked with the chart reason
6. no finalizer      -> AddFinalizer (the caller commits it, then plans again)
7. InSync            -> Skip when its workload is ready or was not looked at in this pass;
                        not ready: Unhealthy Degraded if it was ready before, AwaitReady
                        (WaitingForReadiness) within --helm-timeout of the helm run that
                        applied it, Unhealthy ReadinessTimeout after that (SPEC F6)
   Unrecorded        -> Annotate (the release is deployed at the revision and fingerprint we
                        recorded; only the annotation is missing or wrong: write it, no helm),
                        once the namespace is known to be this Tenant's when the release is
                        not labelled with its UID
8. the rollout asks to revert and this release failed on the target -> Revert (Wait while
   the release is locked)
9. the rollout gate is closed and the Tenant would move to a new target -> Hold (drift
   repairs and first installs are not held: they restore or create, they move nothing)
10. namespace unknown -> the need ObserveNamespace (the caller looks, then plans again); except for
    a first install by the operator (`create_namespace`, the release absent, no shared
    object in the way, not refused with NamespaceConflict before): the install creates the
    namespace and judges it, as below, only if it already exists
11. namespace owned by another Tenant, or existing and not created by krypton (unless
    adoption is allowed) -> Blocked NamespaceConflict (permanent)
12. Locked           -> Wait (retry later, no writes)
    shared objects unknown -> the need ObserveShared (the caller looks, then plans again)
    an object the chart renders alike for every release (a CRD, an IngressClass) is owned
    by another release or by nobody -> Blocked SharedObjects (permanent): helm would refuse
    it, every retry again
13. Stale or Failed without a good revision -> uninstall, then install; Stale with a good
    revision -> roll back, then upgrade
14. Absent (or Drifted with the release gone) -> Install; anything else -> Upgrade

Maintenance windows (F8), last: outside its cluster's window an install, upgrade, revert or
uninstall is OutsideMaintenanceWindow (no write but the status, the key back when the window
opens); a new Tenant's first install goes ahead under --maintenance-window-first-install.

Brakes (R18), on every plan that would start helm for a target (chart fingerprint, Tenant
generation, retry annotation) whose runs failed before, as counted in the Tenant's status:
more failures than --max-retries -> Stalled (RetriesExhausted, permanent until the target
changes); the next attempt not due yet -> Backoff (nothing is written, the pass comes back
when it is due). An uninstall is never braked: a Tenant must stay deletable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from krypton.decisions import retry
from krypton.decisions.model import (
    SYSTEM_NAMESPACES,
    WRITER_ANNOTATION,
    ChartProblem,
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseObservation,
    ReleaseStatus,
    TenantView,
    is_valid_namespace_name,
    namespace_refusal,
)
from krypton.decisions.readiness.health import UNHEALTHY, WAITING
from krypton.decisions.releases import ReleaseState, release_state
from krypton.decisions.trust import writers
from krypton.decisions.trust.printable import short

# why a release stays on its version while the fleet-wide rollout holds its cluster (F1, F9)
HELD = {
    "RolloutPending": "the fleet-wide rollout has not reached this cluster yet",
    "RolloutHalted": "the fleet-wide rollout is halted; this cluster stays on its version",
    "RolloutAwaitingApproval": "this cluster's wave of the fleet-wide rollout waits for "
                               "approval (krypton rollout approve)",
    "RolloutPaused": "the fleet-wide rollout is paused (krypton rollout resume); this cluster "
                     "stays where it is",
}


class Action(enum.Enum):
    SKIP = "skip"
    INSTALL = "install"
    UPGRADE = "upgrade"
    UNINSTALL_THEN_INSTALL = "uninstall-then-install"
    ROLLBACK_THEN_UPGRADE = "rollback-then-upgrade"
    BLOCKED = "blocked"
    PAUSE = "pause"
    NOT_TARGETED = "not-targeted"
    WAIT = "wait"
    ANNOTATE = "annotate"
    ADD_FINALIZER = "add-finalizer"
    HOLD = "hold"
    REVERT = "revert"
    AWAIT_READY = "await-ready"
    UNHEALTHY = "unhealthy"
    UNINSTALL = "uninstall"
    DROP_FINALIZER = "drop-finalizer"
    BACKOFF = "backoff"
    STALLED = "stalled"
    OUTSIDE_WINDOW = "outside-window"
    YIELD = "yield"  # another krypton instance wrote the release and is at work (SPEC S6)
    NOTHING = "nothing"


class Need(enum.Enum):
    """What the planner must know before it can choose an action: the caller looks (or
    resolves) and plans again."""

    RESOLVE_CHART = "resolve-chart"
    OBSERVE_NAMESPACE = "observe-namespace"
    OBSERVE_SHARED = "observe-shared"
    OBSERVE_WRITER = "observe-writer"
    COUNT_REPAIRS = "count-repairs"


INSTALLING = {Action.INSTALL, Action.UNINSTALL_THEN_INSTALL}
UPGRADING = {Action.UPGRADE, Action.ROLLBACK_THEN_UPGRADE}
HELM_ACTIONS = INSTALLING | UPGRADING


@dataclass(frozen=True)
class Plan:
    action: Action | Need
    reason: str
    message: str
    permanent: bool = False  # a Blocked plan that retrying cannot fix
    drift: bool = False  # the desired state was reached before and was changed behind our back

    @property
    def runs_helm(self) -> bool:
        return self.action in HELM_ACTIONS or self.action is Action.UNINSTALL


def attempt_target(fingerprint: str, t: TenantView) -> str:
    """What a helm run attempts, for counting its failures: the chart and values (their
    fingerprint), the Tenant's spec (its generation) and the retry annotation. Any change
    of one of them is a new target with a fresh budget."""
    return f"{fingerprint}/{t.generation}/{t.retry_token}"


def plan(obs: Observation) -> Plan:
    """The next step for `obs`; see the module docstring for the order of the rules."""
    decided = _plan(obs)
    if decided.action in HELM_ACTIONS or decided.action is Action.REVERT:
        decided = _yielded(obs, decided)
    if decided.action in HELM_ACTIONS and isinstance(obs.chart, ChartTarget):
        decided = _braked(obs, decided)
    if decided.action in HELM_ACTIONS and decided.drift:
        decided = _repairs_braked(obs, decided)
    return _windowed(obs, decided)


def _yielded(obs: Observation, decided: Plan) -> Plan:
    """A release whose newest record another krypton instance wrote, while that instance
    is at work, is left alone (SPEC S6; :mod:`krypton.decisions.trust.writers`). Where the
    Tenant names the instance that owns it (WRITER_ANNOTATION), that one writes it and
    every other leaves it alone, at work or not."""
    rel, named = obs.release, obs.tenant.writer
    if named and obs.writer:
        if named == obs.writer:
            return decided
        return Plan(Action.YIELD, "AnotherWriter",
                    f"the Tenant names {short(named)} as the krypton instance that writes its "
                    f"release ({WRITER_ANNOTATION}); this one ({obs.writer}) leaves it alone")
    if not obs.writer or not rel.writer or rel.writer == obs.writer:
        return decided
    if obs.writer_active is None:
        return Plan(Need.OBSERVE_WRITER, "ObserveWriter",
                    "look whether the writer of the release's newest record is at work")
    if not obs.writer_active:
        return decided
    return Plan(Action.YIELD, "AnotherWriter",
                f"revision {rel.revision} of the release was written by {short(rel.writer)}, "
                f"another krypton instance that is at work; this one ({obs.writer}) leaves "
                "the release alone instead of changing it back, until the other stops. Run "
                "one krypton per fleet (with --leader-elect, as the chart does)")


def _repairs_braked(obs: Observation, decided: Plan) -> Plan:
    """More than REPAIRS_MAX drift repairs of one release in an hour: something keeps
    changing it behind krypton's back (a person's helm in a loop, another tool acting as
    krypton), and repairing it again would only go on (SPEC S6)."""
    if obs.repairs is None:
        return Plan(Need.COUNT_REPAIRS, "CountRepairs",
                    "count the release's drift repairs in the last hour")
    if obs.repairs < writers.REPAIRS_MAX:
        return decided
    return Plan(Action.STALLED, "DriftRepairsExhausted",
                f"the release was repaired {obs.repairs} times in the last hour and changed "
                f"behind krypton's back again ({decided.message}); no repair until the first "
                "of them is an hour old. Something else writes it (a person's helm, another "
                "tool with krypton's credentials): stop it")


# what waits for the cluster's maintenance window (F8)
CHANGES = HELM_ACTIONS | {Action.REVERT, Action.UNINSTALL}


def _windowed(obs: Observation, decided: Plan) -> Plan:
    """Outside its maintenance window a cluster starts no upgrade, revert or uninstall; a
    new Tenant's first install goes ahead under --maintenance-window-first-install."""
    if not obs.window_opens or decided.action not in CHANGES:
        return decided
    t = obs.tenant
    first = decided.action in INSTALLING and t.applied_fingerprint is None and \
        t.recorded_fingerprint is None and t.applied_revision is None
    if first and obs.window_first_install:
        return decided
    what = "uninstall" if decided.action is Action.UNINSTALL else \
        ("first install" if first else "change")
    return Plan(Action.OUTSIDE_WINDOW, "OutsideMaintenanceWindow",
                f"the {what} waits for the maintenance window of cluster {obs.cluster} "
                f"({obs.window}); the next one opens at {obs.window_opens}")


def _braked(obs: Observation, decided: Plan) -> Plan:
    t, chart = obs.tenant, obs.chart
    assert isinstance(chart, ChartTarget)
    if t.failures <= 0 or t.failed_target != attempt_target(chart.fingerprint, t):
        return decided
    if retry.exhausted(t.failures, obs.max_retries):
        if t.error is not None and t.error[0] == "RetriesExhausted":
            message = t.error[1]  # as the run that exhausted the budget said it
        else:
            message = stalled_message(t.failures, chart.version,
                                      t.error[1] if t.error else "", obs.cluster, t)
        return Plan(Action.STALLED, "RetriesExhausted", message, permanent=True)
    if obs.retry_wait > 0:
        return Plan(Action.BACKOFF, "RetryScheduled",
                    f"attempt {t.failures} of chart {chart.version} failed; attempt "
                    f"{t.failures + 1} of {obs.max_retries + 1} in {obs.retry_wait:.0f}s")
    return decided


def stalled_message(failures: int, version: str, error: str, cluster: str,
                    t: TenantView) -> str:
    """What a stalled release says: how often it failed, the last error, the way out."""
    last = f"; the last: {error}" if error else ""
    return (f"{failures} attempts of chart {version} failed{last}; no helm run until the "
            f"chart, its values or the Tenant change, or a retry is asked for: krypton retry "
            f"{t.key} --cluster {cluster}")


def admission(obs: Observation) -> Plan | None:
    """Rules 1-4 and the release's owner: whether this cluster serves the Tenant at all, or
    the plan that says why not (None: it does). The progressive rollout counts only the
    Tenants a cluster serves, by this same function."""
    t = obs.tenant
    if t.deleting:
        return _deleting(obs)
    if t.paused:
        return Plan(Action.PAUSE, "Paused", "reconciliation paused by annotation")
    if t.target_cluster and t.target_cluster != obs.cluster:
        known = obs.known_clusters
        if known is not None and t.target_cluster not in known:
            return Plan(Action.NOT_TARGETED, "UnknownCluster",
                        f"spec.clusterRef.secretName names cluster {short(t.target_cluster)}, which "
                        f"is not discovered; known clusters: {', '.join(sorted(known)) or 'none'}")
        return Plan(Action.NOT_TARGETED, "NotTargeted",
                    f"spec.clusterRef.secretName targets cluster {short(t.target_cluster)}")
    if not is_valid_namespace_name(t.key.name):
        return Plan(Action.BLOCKED, "InvalidTenantName",
                    f"tenant name {t.key.name!r} is not a valid namespace name "
                    "(lower-case alphanumerics and '-', at most 63 characters)",
                    permanent=True)
    if t.workspace and t.workspace != t.key.name:
        return Plan(Action.BLOCKED, "WorkspaceMismatch",
                    f"spec.workspace {short(t.workspace)} differs from the Tenant name: krypton "
                    f"installs into namespace {t.key.name!r} only, and a release the original "
                    f"operator put into {short(t.workspace)} would be installed twice; rename the "
                    "Tenant after its workspace (or remove spec.workspace when that namespace "
                    "holds no release)", permanent=True)
    if obs.own_namespace and (t.key.name in SYSTEM_NAMESPACES
                              or t.key.name in obs.reserved_namespaces):
        return Plan(Action.BLOCKED, "ReservedNamespace",
                    f"namespace {t.key.name!r} is reserved (system or krypton's own namespace); "
                    "krypton never installs into it", permanent=True)
    if obs.release_owner:
        return Plan(Action.BLOCKED, "NamespaceConflict",
                    f"namespace {t.key.name!r} and its release belong to Tenant "
                    f"{obs.release_owner}: a Tenant of the same name in another namespace "
                    "maps to the same namespace and release on every cluster; rename this "
                    "Tenant", permanent=True)
    return None


def _plan(obs: Observation) -> Plan:
    t = obs.tenant
    refused = admission(obs)
    if refused is not None:
        return refused
    if obs.chart is None:
        return Plan(Need.RESOLVE_CHART, "ResolveChart", "resolve the chart version")
    if isinstance(obs.chart, ChartProblem):
        return Plan(Action.BLOCKED, obs.chart.reason, obs.chart.message,
                    permanent=obs.chart.reason in ("VersionInvalid",))
    if not t.has_finalizer:
        return Plan(Action.ADD_FINALIZER, "Finalizer", "add the release-cleanup finalizer")
    rel, target = obs.release, obs.chart.fingerprint
    state = release_state(t, target, rel, obs.missing)
    if (healthy := _revert_healthy(obs, target, obs.chart.version)) is not None:
        return healthy
    if state is ReleaseState.IN_SYNC:
        return _in_sync(obs, obs.chart.version)
    if state is ReleaseState.UNRECORDED:
        if rel.owner_uid != t.uid and (blocked := _namespace_rules(obs)) is not None:
            return blocked  # a release not labelled as this Tenant's: its namespace decides
        why = ("fingerprint annotation missing" if t.applied_fingerprint is None
               else "fingerprint annotation differs from the deployed release")
        return Plan(Action.ANNOTATE, "NoChange",
                    f"{why}: chart {obs.chart.version} is deployed at revision {rel.revision} as "
                    "recorded; write the annotation", drift=t.applied_fingerprint is None)
    version = obs.chart.version
    if (failed := _revert_failed(obs, target, version, state)) is not None:
        return failed
    drift = target in (t.applied_fingerprint, t.recorded_fingerprint)
    moving = t.applied_fingerprint is not None or rel.status is not ReleaseStatus.ABSENT
    if not obs.rollout.open and moving and not drift:
        reason = obs.rollout.reason or "RolloutPending"
        return Plan(Action.HOLD, reason, HELD.get(reason, HELD["RolloutPending"]))
    # A release labelled as this Tenant's is in this Tenant's namespace: the namespace was
    # judged before the release was made there, and whoever could forge the label (write
    # Secrets in that namespace) could rewrite the release itself. Not looked up again.
    if rel.owner_uid != t.uid and (blocked := _namespace_rules(obs, _creates(obs))) is not None:
        return blocked
    if state is ReleaseState.LOCKED:
        return _locked(rel)
    if obs.shared is None:
        return Plan(Need.OBSERVE_SHARED, "ObserveShared",
                    "look for objects of the chart that other releases own")
    if obs.shared:
        more = f" (and {len(obs.shared) - 5} more)" if len(obs.shared) > 5 else ""
        return Plan(Action.BLOCKED, "SharedObjects",
                    f"chart {version} cannot be installed once per Tenant on this cluster: "
                    f"{'; '.join(obs.shared[:5])}{more}; install the shared part once per "
                    "cluster (see the docs, \"Shared objects and charts with CRDs\")", permanent=True)
    return _helm_action(obs, state, version, drift)


def _revert_healthy(obs: Observation, target: str, version: str) -> Plan | None:
    """The wave failed its metric gate (F7): a release Ready on the target goes back too."""
    t, rel = obs.tenant, obs.release
    if not (obs.rollout.revert and obs.rollout.revert_healthy_to and
            target in (t.applied_fingerprint, t.recorded_fingerprint) and
            t.reverted_fingerprint != target and rel.status is ReleaseStatus.DEPLOYED):
        return None
    if rel.locked:
        return _locked(rel)
    return Plan(Action.REVERT, "RolloutHalted",
                f"chart {version} failed the rollout's metric gate: roll back to chart "
                f"{obs.rollout.revert_healthy_to}")


def _revert_failed(obs: Observation, target: str, version: str, state: ReleaseState
                   ) -> Plan | None:
    """The rollout halted and asks to revert: this release failed on the target."""
    t, rel = obs.tenant, obs.release
    # (the last check also stops a second rollback where an older CRD drops
    # revertedFingerprint: the revision a rollback made is the one recorded)
    if not (obs.rollout.revert and t.failed_fingerprint == target and
            t.reverted_fingerprint != target and t.applied_revision is not None and
            rel.revision != t.applied_revision):
        return None
    if state is ReleaseState.LOCKED:
        return _locked(rel)
    return Plan(Action.REVERT, "RolloutHalted",
                f"chart {version} failed and the rollout halted: roll back to revision "
                f"{t.applied_revision} (chart {t.recorded_version or 'as applied'})")


def _helm_action(obs: Observation, state: ReleaseState, version: str, drift: bool) -> Plan:
    """The helm run that brings the release to the target (steps 13 and 14)."""
    t, rel = obs.tenant, obs.release
    if state in (ReleaseState.STALE, ReleaseState.FAILED) and (
            rel.status in (ReleaseStatus.PENDING_INSTALL, ReleaseStatus.UNINSTALLING)
            or not rel.has_good_revision):
        return Plan(Action.UNINSTALL_THEN_INSTALL, "Installing",
                    f"release left {rel.status.value}: uninstall and install chart {version}",
                    drift=drift)
    if state is ReleaseState.STALE:
        return Plan(Action.ROLLBACK_THEN_UPGRADE, "Upgrading",
                    f"release left {rel.status.value}: roll back, then upgrade to {version}",
                    drift=drift)
    if rel.status in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED):
        why = "release missing" if drift else "install"
        return Plan(Action.INSTALL, "Installing", f"{why}: install chart {version}", drift=drift)
    if drift and obs.missing:
        more = f" (and {len(obs.missing) - 5} more)" if len(obs.missing) > 5 else ""
        return Plan(Action.UPGRADE, "Upgrading",
                    f"objects of the release are gone: {'; '.join(obs.missing[:5])}{more}: "
                    f"upgrade to chart {version} to restore them", drift=True)
    if drift:
        why = ("fingerprint annotation missing" if t.applied_fingerprint is None
               else f"release {rel.status.value} at revision {rel.revision}, not as applied")
        return Plan(Action.UPGRADE, "Upgrading", f"{why}: upgrade to chart {version}", drift=True)
    return Plan(Action.UPGRADE, "Upgrading", f"fingerprint changed: upgrade to chart {version}")


def _deleting(obs: Observation) -> Plan:
    """A Tenant being deleted: uninstall its release, unless the release is not its own
    (labelled with another live Tenant's UID, or unlabelled in a namespace another Tenant
    owns), which is left alone while the finalizer goes (SPEC S2)."""
    t, rel = obs.tenant, obs.release
    if not t.has_finalizer:
        return Plan(Action.NOTHING, "Deleting", "Tenant is being deleted")
    if obs.release_owner:
        return Plan(Action.DROP_FINALIZER, "ReleaseNotOwned",
                    f"release not uninstalled: it belongs to Tenant {obs.release_owner}")
    present = rel.status not in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED)
    if present and rel.owner_uid != t.uid and obs.own_namespace:
        if obs.namespace is NamespaceState.UNKNOWN:
            return Plan(Need.OBSERVE_NAMESPACE, "ObserveNamespace", "look up the namespace")
        if obs.namespace is NamespaceState.CONFLICT:
            return Plan(Action.DROP_FINALIZER, "ReleaseNotOwned",
                        f"release not uninstalled: namespace {t.key.name!r} and its release "
                        f"belong to Tenant {obs.namespace_owner}")
    return Plan(Action.UNINSTALL, "Deleting", "Tenant is being deleted: uninstall release")


def _creates(obs: Observation) -> bool:
    """A first install may create the namespace without looking first: the create tells
    whether it exists, and one that does is judged then by the same rules. Where shared
    objects are in the way, the namespace is looked up first, so that a namespace that
    is not the Tenant's is the reason given; after a NamespaceConflict too, so that a
    refused Tenant costs its resyncs one read, not a create and a read."""
    error = obs.tenant.error
    return obs.create_namespace and obs.release.status is ReleaseStatus.ABSENT and \
        not obs.shared and (error is None or error[0] != "NamespaceConflict")


def _namespace_rules(obs: Observation, creates: bool = False) -> Plan | None:
    """Look up the namespace (unless the install `creates` it), or refuse one that is not
    this Tenant's to use (R5, R16)."""
    t = obs.tenant
    if obs.namespace is NamespaceState.UNKNOWN and not creates:
        return Plan(Need.OBSERVE_NAMESPACE, "ObserveNamespace", "look up the namespace")
    why = namespace_refusal(t.key.name, obs.namespace, obs.namespace_owner,
                            obs.adopt_namespaces)
    return None if why is None else Plan(Action.BLOCKED, "NamespaceConflict", why, permanent=True)


HEALTH_REASONS = UNHEALTHY | {WAITING}


def _in_sync(obs: Observation, version: str) -> Plan:
    """The release is as applied; judge its workload (SPEC F6) when it was looked at."""
    t, health = obs.tenant, obs.health
    ready_before = t.readiness is not None and t.readiness[0]
    was = t.readiness[1] if t.readiness is not None else ""
    if health is None or health.ready:
        if health is not None and not ready_before and was in HEALTH_REASONS:
            return Plan(Action.SKIP, "WorkloadReady", f"chart {version}: every workload is ready")
        return Plan(Action.SKIP, "NoChange", f"chart {version} already deployed")
    if ready_before or was == "Degraded":
        return Plan(Action.UNHEALTHY, "Degraded",
                    f"chart {version} was ready and is not any more: {health.summary()}")
    # a missing time never counts as elapsed (SPEC F5b; the observation counts from when
    # it first saw the release without one)
    if was != "ReadinessTimeout" and (obs.since_applied is None
                                      or obs.since_applied < obs.readiness_timeout):
        return Plan(Action.AWAIT_READY, "WaitingForReadiness",
                    f"chart {version} applied; waiting for {health.summary()}")
    return Plan(Action.UNHEALTHY, "ReadinessTimeout",
                f"chart {version} not ready {obs.readiness_timeout:.0f}s after it was applied: "
                f"{health.summary()}")


def _locked(rel: ReleaseObservation) -> Plan:
    return Plan(Action.WAIT, "ReleaseLocked",
                f"release is {rel.status.value} at revision {rel.revision}: another helm "
                "operation may be running")


def announced(obs: Observation, p: Plan) -> bool:
    """The Tenant's status already says that `p` is under way on this cluster: the pass
    that decided it wrote that (its one status write) and the helm run may start."""
    return obs.tenant.progress == (p.reason, p.message)
