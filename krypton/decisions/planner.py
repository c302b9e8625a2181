"""What should happen next to one Tenant on one cluster. Pure: no I/O, no clock.

`plan` maps an :class:`~krypton.decisions.model.Observation` to one :class:`Plan` through a single
decision table, in order:

1. deleting          -> Uninstall (if our finalizer is on it), else nothing
2. paused            -> Pause
3. targeted elsewhere -> NotTargeted
4. invalid name      -> Blocked InvalidTenantName (permanent)
   spec.workspace set and not the name -> Blocked WorkspaceMismatch (permanent): the
                        original operator installed into the workspace namespace; krypton
                        never installs a second copy into the namespace named after the Tenant
   reserved name     -> Blocked ReservedNamespace (permanent): kube-system, kube-public,
                        kube-node-lease, default and the operator's own namespaces
5. chart unresolved  -> ResolveChart (the caller resolves it, then plans again)
   chart problem     -> Blocked with the chart reason
6. no finalizer      -> AddFinalizer (then plan again)
7. in sync           -> Skip (fingerprint annotation matches, release deployed at the
                        revision we recorded)
   annotation lost   -> Annotate (the release is deployed at the revision and fingerprint we
                        recorded; only the annotation is missing or wrong: write it, no helm)
8. namespace unknown -> ObserveNamespace (the caller looks, then plans again)
9. namespace owned by another Tenant, or existing and not created by krypton (unless
   adoption is allowed) -> Blocked NamespaceConflict (permanent)
10. release locked by a recent pending operation -> Wait (retry later, no writes)
11. release pending or failed without a good revision -> Recover, then install/upgrade
12. release absent   -> Install, else Upgrade
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from krypton.decisions.model import (
    SYSTEM_NAMESPACES,
    ChartProblem,
    NamespaceState,
    Observation,
    ReleaseStatus,
    is_valid_namespace_name,
)


class Action(enum.Enum):
    SKIP = "skip"
    INSTALL = "install"
    UPGRADE = "upgrade"
    UNINSTALL_THEN_INSTALL = "uninstall-then-install"
    ROLLBACK_THEN_UPGRADE = "rollback-then-upgrade"
    BLOCKED = "blocked"
    PAUSE = "pause"
    NOT_TARGETED = "not-targeted"
    OBSERVE_NAMESPACE = "observe-namespace"
    RESOLVE_CHART = "resolve-chart"
    WAIT = "wait"
    ANNOTATE = "annotate"
    ADD_FINALIZER = "add-finalizer"
    UNINSTALL = "uninstall"
    NOTHING = "nothing"


INSTALLING = {Action.INSTALL, Action.UNINSTALL_THEN_INSTALL}
UPGRADING = {Action.UPGRADE, Action.ROLLBACK_THEN_UPGRADE}
HELM_ACTIONS = INSTALLING | UPGRADING


@dataclass(frozen=True)
class Plan:
    action: Action
    reason: str
    message: str
    permanent: bool = False  # a Blocked plan that retrying cannot fix
    drift: bool = False  # the desired state was reached before and was changed behind our back

    @property
    def runs_helm(self) -> bool:
        return self.action in HELM_ACTIONS or self.action is Action.UNINSTALL


def plan(obs: Observation) -> Plan:
    """The next step for `obs`; see the module docstring for the order of the rules."""
    t = obs.tenant
    if t.deleting:
        if t.has_finalizer:
            return Plan(Action.UNINSTALL, "Deleting", "Tenant is being deleted: uninstall release")
        return Plan(Action.NOTHING, "Deleting", "Tenant is being deleted")
    if t.paused:
        return Plan(Action.PAUSE, "Paused", "reconciliation paused by annotation")
    if t.target_cluster and t.target_cluster != obs.cluster:
        return Plan(Action.NOT_TARGETED, "NotTargeted",
                    f"spec.clusterRef.secretName targets cluster {t.target_cluster!r}")
    if not is_valid_namespace_name(t.key.name):
        return Plan(Action.BLOCKED, "InvalidTenantName",
                    f"tenant name {t.key.name!r} is not a valid namespace name "
                    "(lower-case alphanumerics and '-', at most 63 characters)",
                    permanent=True)
    if t.workspace and t.workspace != t.key.name:
        return Plan(Action.BLOCKED, "WorkspaceMismatch",
                    f"spec.workspace {t.workspace!r} differs from the Tenant name: krypton "
                    f"installs into namespace {t.key.name!r} only, and a release the original "
                    f"operator put into {t.workspace!r} would be installed twice; rename the "
                    "Tenant after its workspace (or remove spec.workspace when that namespace "
                    "holds no release)", permanent=True)
    if obs.own_namespace and (t.key.name in SYSTEM_NAMESPACES
                              or t.key.name in obs.reserved_namespaces):
        return Plan(Action.BLOCKED, "ReservedNamespace",
                    f"namespace {t.key.name!r} is reserved (system or krypton's own namespace); "
                    "krypton never installs into it", permanent=True)
    if obs.chart is None:
        return Plan(Action.RESOLVE_CHART, "ResolveChart", "resolve the chart version")
    if isinstance(obs.chart, ChartProblem):
        return Plan(Action.BLOCKED, obs.chart.reason, obs.chart.message,
                    permanent=obs.chart.reason in ("VersionInvalid",))
    if not t.has_finalizer:
        return Plan(Action.ADD_FINALIZER, "Finalizer", "add the release-cleanup finalizer")
    rel = obs.release
    in_sync = (
        t.applied_fingerprint == obs.chart.fingerprint
        and rel.status is ReleaseStatus.DEPLOYED
        and (t.applied_revision is None or t.applied_revision == rel.revision)
    )
    if in_sync:
        return Plan(Action.SKIP, "NoChange", f"chart {obs.chart.version} already deployed")
    if (t.recorded_fingerprint == obs.chart.fingerprint and rel.status is ReleaseStatus.DEPLOYED
            and t.applied_revision is not None and t.applied_revision == rel.revision):
        why = ("fingerprint annotation missing" if t.applied_fingerprint is None
               else "fingerprint annotation differs from the deployed release")
        return Plan(Action.ANNOTATE, "NoChange",
                    f"{why}: chart {obs.chart.version} is deployed at revision {rel.revision} as "
                    "recorded; write the annotation", drift=t.applied_fingerprint is None)
    drift = obs.chart.fingerprint in (t.applied_fingerprint, t.recorded_fingerprint)
    if obs.namespace is NamespaceState.UNKNOWN:
        return Plan(Action.OBSERVE_NAMESPACE, "ObserveNamespace", "look up the namespace")
    if obs.namespace is NamespaceState.CONFLICT:
        return Plan(Action.BLOCKED, "NamespaceConflict",
                    f"namespace {t.key.name!r} is owned by Tenant {obs.namespace_owner}",
                    permanent=True)
    if obs.namespace is NamespaceState.UNMANAGED and not obs.adopt_namespaces:
        return Plan(Action.BLOCKED, "NamespaceConflict",
                    f"namespace {t.key.name!r} exists and was not created by krypton "
                    "(--adopt-namespaces allows taking it over)", permanent=True)
    version = obs.chart.version
    if rel.locked:
        return Plan(Action.WAIT, "ReleaseLocked",
                    f"release is {rel.status.value} at revision {rel.revision}: another helm "
                    "operation may be running")
    if rel.status in (ReleaseStatus.PENDING_INSTALL, ReleaseStatus.UNINSTALLING) or (
        rel.status in (ReleaseStatus.FAILED, ReleaseStatus.PENDING_UPGRADE,
                       ReleaseStatus.PENDING_ROLLBACK, ReleaseStatus.UNKNOWN)
        and not rel.has_good_revision
    ):
        return Plan(Action.UNINSTALL_THEN_INSTALL, "Installing",
                    f"release left {rel.status.value}: uninstall and install chart {version}",
                    drift=drift)
    if rel.status in (ReleaseStatus.PENDING_UPGRADE, ReleaseStatus.PENDING_ROLLBACK):
        return Plan(Action.ROLLBACK_THEN_UPGRADE, "Upgrading",
                    f"release left {rel.status.value}: roll back, then upgrade to {version}",
                    drift=drift)
    if rel.status in (ReleaseStatus.ABSENT, ReleaseStatus.UNINSTALLED):
        why = "release missing" if drift else "install"
        return Plan(Action.INSTALL, "Installing", f"{why}: install chart {version}", drift=drift)
    if drift:
        why = ("fingerprint annotation missing" if t.applied_fingerprint is None
               else f"release {rel.status.value} at revision {rel.revision}, not as applied")
        return Plan(Action.UPGRADE, "Upgrading", f"{why}: upgrade to chart {version}", drift=True)
    return Plan(Action.UPGRADE, "Upgrading", f"fingerprint changed: upgrade to chart {version}")
