"""The decision table of krypton.decisions.planner, row by row."""

from __future__ import annotations

from dataclasses import replace

import pytest

from krypton.decisions.model import (
    ChartProblem,
    ChartTarget,
    NamespaceState,
    Observation,
    ReleaseObservation,
    ReleaseStatus,
    TenantKey,
    TenantView,
)
from krypton.decisions.planner import Action, plan

FP = "f" * 64
CHART = ChartTarget("https://r", "sample", "0.2.0", {}, FP, "/tmp/chart")
DEPLOYED = ReleaseObservation(ReleaseStatus.DEPLOYED, 1, False)
TENANT = TenantView(TenantKey("ns", "acme"), has_finalizer=True)
SYNCED = replace(TENANT, applied_fingerprint=FP, applied_revision=1)
ABSENT = ReleaseObservation()


def obs(tenant: TenantView = TENANT, chart: object = CHART,
        release: ReleaseObservation = ABSENT,
        namespace: NamespaceState = NamespaceState.OWNED, *, adopt: bool = False,
        own_namespace: bool = True) -> Observation:
    return Observation("c1", tenant, chart, release, namespace, "ns/other",  # type: ignore[arg-type]
                       reserved_namespaces=frozenset({"krypton-system"}), adopt_namespaces=adopt,
                       own_namespace=own_namespace)


RECORDED = replace(SYNCED, recorded_fingerprint=FP)  # status.clusters[c1] says FP at revision 1


R = ReleaseStatus
CASES = [
    # (id, observation, action, reason, permanent)
    ("deleting with finalizer", obs(replace(TENANT, deleting=True)), Action.UNINSTALL, "Deleting", False),
    ("deleting without finalizer", obs(replace(TENANT, deleting=True, has_finalizer=False)),
     Action.NOTHING, "Deleting", False),
    ("paused wins over everything else", obs(replace(TENANT, paused=True, target_cluster="x")),
     Action.PAUSE, "Paused", False),
    ("targets another cluster", obs(replace(TENANT, target_cluster="c2")), Action.NOT_TARGETED,
     "NotTargeted", False),
    ("targets this cluster", obs(replace(TENANT, target_cluster="c1")), Action.INSTALL,
     "Installing", False),
    ("name with a dot", obs(replace(TENANT, key=TenantKey("ns", "a.b"))), Action.BLOCKED,
     "InvalidTenantName", True),
    ("name too long", obs(replace(TENANT, key=TenantKey("ns", "a" * 64))), Action.BLOCKED,
     "InvalidTenantName", True),
    # issue 16: the original operator's spec.workspace named the namespace
    ("workspace is the name", obs(replace(TENANT, workspace="acme")), Action.INSTALL,
     "Installing", False),
    ("workspace differs from the name", obs(replace(SYNCED, workspace="other"),
                                            release=DEPLOYED), Action.BLOCKED,
     "WorkspaceMismatch", True),
    ("chart not resolved yet", obs(chart=None), Action.RESOLVE_CHART, "ResolveChart", False),
    ("chart not loaded", obs(chart=ChartProblem("ChartNotLoaded", "down")), Action.BLOCKED,
     "ChartNotLoaded", False),
    ("version invalid", obs(chart=ChartProblem("VersionInvalid", "x")), Action.BLOCKED,
     "VersionInvalid", True),
    ("version not found", obs(chart=ChartProblem("VersionNotFound", "x")), Action.BLOCKED,
     "VersionNotFound", False),
    ("no finalizer yet", obs(replace(TENANT, has_finalizer=False)), Action.ADD_FINALIZER,
     "Finalizer", False),
    ("in sync", obs(SYNCED, release=DEPLOYED, namespace=NamespaceState.UNKNOWN), Action.SKIP,
     "NoChange", False),
    ("in sync without recorded revision", obs(replace(SYNCED, applied_revision=None),
                                              release=DEPLOYED), Action.SKIP, "NoChange", False),
    ("namespace not looked at", obs(namespace=NamespaceState.UNKNOWN), Action.OBSERVE_NAMESPACE,
     "ObserveNamespace", False),
    ("namespace of another tenant", obs(namespace=NamespaceState.CONFLICT), Action.BLOCKED,
     "NamespaceConflict", True),
    ("absent", obs(namespace=NamespaceState.ABSENT), Action.INSTALL, "Installing", False),
    # R16: a namespace krypton did not create is not taken over unless allowed
    ("unmanaged namespace refused", obs(namespace=NamespaceState.UNMANAGED), Action.BLOCKED,
     "NamespaceConflict", True),
    ("unmanaged namespace adopted with the flag", obs(namespace=NamespaceState.UNMANAGED,
                                                      adopt=True), Action.INSTALL,
     "Installing", False),
    *[(f"reserved {ns}", obs(replace(TENANT, key=TenantKey("ns", ns))), Action.BLOCKED,
       "ReservedNamespace", True)
      for ns in ("kube-system", "kube-public", "kube-node-lease", "default", "krypton-system")],
    ("reserved even when paused is off and in sync", obs(
        replace(SYNCED, key=TenantKey("ns", "default")), release=DEPLOYED), Action.BLOCKED,
     "ReservedNamespace", True),
    # --release-namespace=watch: the release goes into the watch namespace, so a Tenant's
    # name names no namespace (O5)
    *[(f"shared release namespace, tenant named {ns}", obs(
        replace(TENANT, key=TenantKey("ns", ns)), own_namespace=False), Action.INSTALL,
       "Installing", False) for ns in ("kube-system", "default", "krypton-system")],
    ("shared release namespace, still a valid name needed", obs(
        replace(TENANT, key=TenantKey("ns", "a.b")), own_namespace=False), Action.BLOCKED,
     "InvalidTenantName", True),
    # issue 9.11: a lost or failed annotation write is repaired by writing it, never by helm
    ("annotation missing, release as recorded", obs(replace(RECORDED, applied_fingerprint=None),
                                                    release=DEPLOYED), Action.ANNOTATE,
     "NoChange", False),
    ("annotation wrong, release as recorded", obs(replace(RECORDED, applied_fingerprint="0" * 64),
                                                  release=DEPLOYED), Action.ANNOTATE,
     "NoChange", False),
    ("annotation missing, release moved on", obs(replace(RECORDED, applied_fingerprint=None),
                                                 release=ReleaseObservation(R.DEPLOYED, 2, True)),
     Action.UPGRADE, "Upgrading", False),
    ("annotation missing, release failed", obs(replace(RECORDED, applied_fingerprint=None),
                                               release=ReleaseObservation(R.FAILED, 1, False)),
     Action.UNINSTALL_THEN_INSTALL, "Installing", False),
    ("annotation missing, desired changed", obs(
        replace(RECORDED, applied_fingerprint=None, recorded_fingerprint="0" * 64),
        release=DEPLOYED), Action.UPGRADE, "Upgrading", False),
    ("uninstalled history", obs(release=ReleaseObservation(R.UNINSTALLED, 2, True)),
     Action.INSTALL, "Installing", False),
    ("fingerprint changed", obs(replace(SYNCED, applied_fingerprint="0" * 64), release=DEPLOYED),
     Action.UPGRADE, "Upgrading", False),
    ("annotation removed", obs(replace(SYNCED, applied_fingerprint=None), release=DEPLOYED),
     Action.UPGRADE, "Upgrading", False),
    ("rolled back by hand", obs(SYNCED, release=ReleaseObservation(R.DEPLOYED, 3, True)),
     Action.UPGRADE, "Upgrading", False),
    ("release deleted by hand", obs(SYNCED), Action.INSTALL, "Installing", False),
    ("failed with a good revision", obs(SYNCED, release=ReleaseObservation(R.FAILED, 2, True)),
     Action.UPGRADE, "Upgrading", False),
    ("failed first install", obs(release=ReleaseObservation(R.FAILED, 1, False)),
     Action.UNINSTALL_THEN_INSTALL, "Installing", False),
    ("pending install", obs(release=ReleaseObservation(R.PENDING_INSTALL, 1, False)),
     Action.UNINSTALL_THEN_INSTALL, "Installing", False),
    ("uninstalling", obs(release=ReleaseObservation(R.UNINSTALLING, 1, False)),
     Action.UNINSTALL_THEN_INSTALL, "Installing", False),
    ("pending upgrade", obs(SYNCED, release=ReleaseObservation(R.PENDING_UPGRADE, 2, True)),
     Action.ROLLBACK_THEN_UPGRADE, "Upgrading", False),
    ("pending rollback", obs(release=ReleaseObservation(R.PENDING_ROLLBACK, 3, True)),
     Action.ROLLBACK_THEN_UPGRADE, "Upgrading", False),
    ("pending upgrade without good revision", obs(release=ReleaseObservation(
        R.PENDING_UPGRADE, 1, False)), Action.UNINSTALL_THEN_INSTALL, "Installing", False),
    ("unknown status", obs(release=ReleaseObservation(R.UNKNOWN, 1, False)),
     Action.UNINSTALL_THEN_INSTALL, "Installing", False),
]


@pytest.mark.parametrize(("observation", "action", "reason", "permanent"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan(observation: Observation, action: Action, reason: str, permanent: bool) -> None:
    decided = plan(observation)
    assert (decided.action, decided.reason, decided.permanent) == (action, reason, permanent)
    assert decided.message


def test_helm_actions_are_flagged() -> None:
    assert plan(obs()).runs_helm
    assert not plan(obs(SYNCED, release=DEPLOYED)).runs_helm


DRIFT = [
    ("release deleted", obs(SYNCED), True),
    ("rolled back", obs(SYNCED, release=ReleaseObservation(R.DEPLOYED, 3, True)), True),
    ("annotation removed, status remembers", obs(replace(SYNCED, applied_fingerprint=None,
                                                         recorded_fingerprint=FP),
                                                 release=DEPLOYED), True),
    ("annotation rewritten by hand", obs(replace(RECORDED, applied_fingerprint="0" * 64),
                                         release=DEPLOYED), False),
    ("left failed", obs(SYNCED, release=ReleaseObservation(R.FAILED, 2, True)), True),
    ("new chart version", obs(replace(SYNCED, applied_fingerprint="0" * 64), release=DEPLOYED),
     False),
    ("first install", obs(), False),
]


@pytest.mark.parametrize(("observation", "drift"), [d[1:] for d in DRIFT],
                         ids=[d[0] for d in DRIFT])
def test_drift_is_flagged(observation: Observation, drift: bool) -> None:
    assert plan(observation).drift is drift


def test_locked_release_waits_without_touching_it() -> None:
    locked = ReleaseObservation(R.PENDING_UPGRADE, 2, True, locked=True)
    assert plan(obs(SYNCED, release=locked)).action is Action.WAIT
    stale = ReleaseObservation(R.PENDING_UPGRADE, 2, True, locked=False)
    assert plan(obs(SYNCED, release=stale)).action is Action.ROLLBACK_THEN_UPGRADE
