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
    RolloutGate,
    TenantKey,
    TenantView,
)
from krypton.decisions.planner import Action, Need, announced, plan
from krypton.decisions.releases import ReleaseState, release_state

FP = "f" * 64
CHART = ChartTarget("https://r", "sample", "0.2.0", {}, FP, "/tmp/chart")
DEPLOYED = ReleaseObservation(ReleaseStatus.DEPLOYED, 1, False)
TENANT = TenantView(TenantKey("ns", "acme"), has_finalizer=True)
SYNCED = replace(TENANT, applied_fingerprint=FP, applied_revision=1)
ABSENT = ReleaseObservation()


def obs(tenant: TenantView = TENANT, chart: object = CHART,
        release: ReleaseObservation = ABSENT,
        namespace: NamespaceState = NamespaceState.OWNED, *, adopt: bool = False,
        own_namespace: bool = True, shared: tuple[str, ...] | None = (),
        release_owner: str | None = None) -> Observation:
    return Observation("c1", tenant, chart, release, namespace, "ns/other",  # type: ignore[arg-type]
                       reserved_namespaces=frozenset({"krypton-system"}), adopt_namespaces=adopt,
                       own_namespace=own_namespace, shared=shared, release_owner=release_owner)


RECORDED = replace(SYNCED, recorded_fingerprint=FP)  # status.clusters[c1] says FP at revision 1
UID = "0b7d6a34-1111-4c55-9c1e-5e0a7d8b1c01"
MINE = ReleaseObservation(ReleaseStatus.DEPLOYED, 1, False, owner_uid=UID)
THEIRS = ReleaseObservation(ReleaseStatus.DEPLOYED, 1, False,
                            owner_uid="9a9a9a9a-2222-4c55-9c1e-5e0a7d8b1c02")
OWNED = replace(TENANT, uid=UID)
# upgraded to "0"*64 before, the upgrade to FP failed twice (generation 1, no retry asked)
FAILING = replace(SYNCED, applied_fingerprint="0" * 64, failures=2, failed_target=f"{FP}/1/")
FAILED2 = ReleaseObservation(ReleaseStatus.FAILED, 2, True)
GONE = replace(OWNED, deleting=True)


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
    # A clusterRef naming no discovered cluster is a Warning with the known ones
    ("targets a known cluster", replace(obs(replace(TENANT, target_cluster="c2")),
                                        known_clusters=frozenset({"c1", "c2"})),
     Action.NOT_TARGETED, "NotTargeted", False),
    ("targets an unknown cluster", replace(obs(replace(TENANT, target_cluster="c3")),
                                           known_clusters=frozenset({"c1", "c2"})),
     Action.NOT_TARGETED, "UnknownCluster", False),
    ("name with a dot", obs(replace(TENANT, key=TenantKey("ns", "a.b"))), Action.BLOCKED,
     "InvalidTenantName", True),
    ("name too long", obs(replace(TENANT, key=TenantKey("ns", "a" * 64))), Action.BLOCKED,
     "InvalidTenantName", True),
    # The original operator's spec.workspace named the namespace
    ("workspace is the name", obs(replace(TENANT, workspace="acme")), Action.INSTALL,
     "Installing", False),
    ("workspace differs from the name", obs(replace(SYNCED, workspace="other"),
                                            release=DEPLOYED), Action.BLOCKED,
     "WorkspaceMismatch", True),
    ("chart not resolved yet", obs(chart=None), Need.RESOLVE_CHART, "ResolveChart", False),
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
    ("namespace not looked at", obs(namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE,
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
    # A lost or failed annotation write is repaired by writing it, never by helm
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
    # Objects every release of the chart claims alike
    ("shared objects not looked at", obs(shared=None), Need.OBSERVE_SHARED, "ObserveShared",
     False),
    ("shared objects owned by another release", obs(shared=(
        "IngressClass nginx (owned by release a/tenant-a-c1)",)), Action.BLOCKED,
     "SharedObjects", True),
    ("shared objects block upgrades too", obs(replace(SYNCED, applied_fingerprint="0" * 64),
                                              release=DEPLOYED, shared=("CRD x (owned by y)",)),
     Action.BLOCKED, "SharedObjects", True),
    ("in sync needs no look", obs(SYNCED, release=DEPLOYED, shared=None), Action.SKIP,
     "NoChange", False),
    # A release belongs to one Tenant, by the UID on its record, else by the
    # owner of its namespace; a Tenant of the same name elsewhere never adopts, annotates
    # or uninstalls it
    ("release labelled as another live Tenant's", obs(OWNED, release=THEIRS,
                                                      release_owner="default/acme"),
     Action.BLOCKED, "NamespaceConflict", True),
    ("another Tenant's release, even as recorded", obs(
        replace(RECORDED, uid=UID, applied_fingerprint=None), release=THEIRS,
        release_owner="default/acme"), Action.BLOCKED, "NamespaceConflict", True),
    ("another Tenant's release, before the chart is known", obs(
        OWNED, chart=None, release=THEIRS, release_owner="default/acme"), Action.BLOCKED,
     "NamespaceConflict", True),
    ("deleting: another live Tenant's release is left", obs(
        GONE, release=THEIRS, release_owner="default/acme"), Action.DROP_FINALIZER,
     "ReleaseNotOwned", False),
    ("deleting: own labelled release, no namespace look", obs(
        GONE, release=MINE, namespace=NamespaceState.UNKNOWN), Action.UNINSTALL, "Deleting",
     False),
    ("deleting: unlabelled release, namespace not looked at", obs(
        GONE, release=DEPLOYED, namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE,
     "ObserveNamespace", False),
    ("deleting: unlabelled release in another Tenant's namespace", obs(
        GONE, release=DEPLOYED, namespace=NamespaceState.CONFLICT), Action.DROP_FINALIZER,
     "ReleaseNotOwned", False),
    ("deleting: owner of the label gone, namespace ours", obs(
        GONE, release=THEIRS, release_owner=""), Action.UNINSTALL, "Deleting", False),
    ("deleting: nothing installed, no look", obs(GONE, namespace=NamespaceState.UNKNOWN),
     Action.UNINSTALL, "Deleting", False),
    ("deleting in a shared release namespace", obs(GONE, release=DEPLOYED, own_namespace=False,
                                                   namespace=NamespaceState.UNKNOWN),
     Action.UNINSTALL, "Deleting", False),
    ("annotate an unlabelled release: namespace first", obs(
        replace(RECORDED, uid=UID, applied_fingerprint=None), release=DEPLOYED,
        namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE, "ObserveNamespace", False),
    ("annotate an unlabelled release in another Tenant's namespace", obs(
        replace(RECORDED, uid=UID, applied_fingerprint=None), release=DEPLOYED,
        namespace=NamespaceState.CONFLICT), Action.BLOCKED, "NamespaceConflict", True),
    ("annotate its own labelled release: no look", obs(
        replace(RECORDED, uid=UID, applied_fingerprint=None), release=MINE,
        namespace=NamespaceState.UNKNOWN), Action.ANNOTATE, "NoChange", False),
    # An upgrade of the release labelled as this Tenant's does not look the
    # namespace up again; any other release is judged by its namespace first
    ("upgrade its own labelled release: no look", obs(
        replace(OWNED, applied_fingerprint="0" * 64, applied_revision=1), release=MINE,
        namespace=NamespaceState.UNKNOWN), Action.UPGRADE, "Upgrading", False),
    ("upgrade an unlabelled release: namespace first", obs(
        replace(OWNED, applied_fingerprint="0" * 64, applied_revision=1), release=DEPLOYED,
        namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE, "ObserveNamespace", False),
    ("upgrade another Tenant's labelled release: namespace first", obs(
        replace(OWNED, applied_fingerprint="0" * 64, applied_revision=1), release=THEIRS,
        namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE, "ObserveNamespace", False),
    ("upgrade another Tenant's labelled release in its namespace", obs(
        replace(OWNED, applied_fingerprint="0" * 64, applied_revision=1), release=THEIRS,
        namespace=NamespaceState.CONFLICT), Action.BLOCKED, "NamespaceConflict", True),
    ("install where the namespace is not looked at yet", obs(
        OWNED, namespace=NamespaceState.UNKNOWN), Need.OBSERVE_NAMESPACE, "ObserveNamespace",
     False),
    # The operator's first install creates the namespace without looking; a dry
    # run (no create_namespace), a release that exists, or shared objects in the way look first
    ("operator's first install: the create looks", replace(obs(
        OWNED, namespace=NamespaceState.UNKNOWN), create_namespace=True), Action.INSTALL,
     "Installing", False),
    ("operator's first install: shared objects still looked for", replace(obs(
        OWNED, namespace=NamespaceState.UNKNOWN, shared=None), create_namespace=True),
     Need.OBSERVE_SHARED, "ObserveShared", False),
    ("operator's first install with shared objects in the way: namespace first", replace(obs(
        OWNED, namespace=NamespaceState.UNKNOWN, shared=("CRD x (owned by a/b)",)),
        create_namespace=True), Need.OBSERVE_NAMESPACE, "ObserveNamespace", False),
    ("operator's first install, shared objects and a foreign namespace", replace(obs(
        OWNED, namespace=NamespaceState.CONFLICT, shared=("CRD x (owned by a/b)",)),
        create_namespace=True), Action.BLOCKED, "NamespaceConflict", True),
    ("operator's first install refused before: namespace first", replace(obs(
        replace(OWNED, error=("NamespaceConflict", "namespace 't' is owned by Tenant x/t")),
        namespace=NamespaceState.UNKNOWN), create_namespace=True), Need.OBSERVE_NAMESPACE,
     "ObserveNamespace", False),
    ("operator's reinstall of a failed release: namespace first", replace(obs(
        OWNED, release=ReleaseObservation(R.FAILED, 1), namespace=NamespaceState.UNKNOWN),
        create_namespace=True), Need.OBSERVE_NAMESPACE, "ObserveNamespace", False),
    # R18: a target whose helm runs failed before waits for its next attempt,
    # and stalls past --max-retries; any change of the target starts a fresh budget
    ("failed before, next attempt not due", replace(obs(FAILING, release=FAILED2),
                                                    retry_wait=30.0),
     Action.BACKOFF, "RetryScheduled", False),
    ("failed before, next attempt due", obs(FAILING, release=FAILED2), Action.UPGRADE,
     "Upgrading", False),
    ("failed first install, not due", replace(obs(replace(FAILING, applied_fingerprint=None),
                                                  release=ReleaseObservation(R.FAILED, 1)),
                                              retry_wait=5.0),
     Action.BACKOFF, "RetryScheduled", False),
    ("failed more often than --max-retries", obs(replace(FAILING, failures=9),
                                                 release=FAILED2),
     Action.STALLED, "RetriesExhausted", True),
    ("stalled, even when the attempt would be due", replace(
        obs(replace(FAILING, failures=9), release=FAILED2), retry_wait=0.0),
     Action.STALLED, "RetriesExhausted", True),
    ("stalled, then the chart changed", obs(replace(FAILING, failures=9,
                                                    failed_target=f"{'0' * 64}/1/"),
                                            release=FAILED2), Action.UPGRADE, "Upgrading", False),
    ("stalled, then the Tenant changed", obs(replace(FAILING, failures=9, generation=2),
                                             release=FAILED2), Action.UPGRADE, "Upgrading", False),
    ("stalled, then a retry was asked for", obs(replace(FAILING, failures=9, retry_token="t2"),
                                                release=FAILED2), Action.UPGRADE, "Upgrading",
     False),
    ("stalled, and deleted: the uninstall is not braked", obs(
        replace(FAILING, failures=9, deleting=True), release=FAILED2), Action.UNINSTALL,
     "Deleting", False),
    ("stalled, and in sync again by hand: nothing to brake", obs(
        replace(FAILING, failures=9, applied_fingerprint=FP, applied_revision=3),
        release=ReleaseObservation(R.DEPLOYED, 3, True)), Action.SKIP, "NoChange", False),
    ("a locked release is waited for first", obs(
        SYNCED, release=ReleaseObservation(R.PENDING_UPGRADE, 2, True, True), shared=None),
     Action.WAIT, "ReleaseLocked", False),
]


@pytest.mark.parametrize(("observation", "action", "reason", "permanent"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan(observation: Observation, action: Action | Need, reason: str, permanent: bool) -> None:
    decided = plan(observation)
    assert (decided.action, decided.reason, decided.permanent) == (action, reason, permanent)
    assert decided.message


def test_an_unknown_cluster_is_named_with_the_known_ones() -> None:
    decided = plan(replace(obs(replace(TENANT, target_cluster="prod-eu")),
                           known_clusters=frozenset({"c1", "prod-us"})))
    assert decided.message == ("spec.clusterRef.secretName names cluster 'prod-eu', which is "
                               "not discovered; known clusters: c1, prod-us")


def test_the_stalled_message_names_the_count_the_last_error_and_the_way_out() -> None:
    failing = replace(FAILING, failures=9, error=("UpgradeFailed", "conflict with kubectl"))
    decided = plan(obs(failing, release=FAILED2))
    assert decided.message == (
        "9 attempts of chart 0.2.0 failed; the last: conflict with kubectl; no helm run until "
        "the chart, its values or the Tenant change, or a retry is asked for: krypton retry "
        "ns/acme --cluster c1")
    # once said, the message stays as said (it is not nested into itself on each pass)
    said = replace(failing, error=("RetriesExhausted", decided.message))
    assert plan(obs(said, release=FAILED2)).message == decided.message


def test_the_backoff_says_which_attempt_comes_when() -> None:
    decided = plan(replace(obs(FAILING, release=FAILED2), retry_wait=39.6))
    assert decided.message == "attempt 2 of chart 0.2.0 failed; attempt 3 of 9 in 40s"


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


OLD = "0" * 64  # the fingerprint applied before the target
S = ReleaseState
STATES = [
    # (id, tenant, release, state): the release judged against the target fingerprint FP
    ("deployed as applied", SYNCED, DEPLOYED, S.IN_SYNC),
    ("deployed, no revision recorded yet", replace(SYNCED, applied_revision=None), DEPLOYED,
     S.IN_SYNC),
    ("annotation lost, record intact", replace(RECORDED, applied_fingerprint=None), DEPLOYED,
     S.UNRECORDED),
    ("recent pending operation", SYNCED, ReleaseObservation(R.PENDING_UPGRADE, 2, True, True),
     S.LOCKED),
    ("old pending upgrade", SYNCED, ReleaseObservation(R.PENDING_UPGRADE, 2, True), S.STALE),
    ("old pending install", TENANT, ReleaseObservation(R.PENDING_INSTALL, 1, False), S.STALE),
    ("uninstall left behind", SYNCED, ReleaseObservation(R.UNINSTALLING, 2, True), S.STALE),
    ("last operation failed", SYNCED, ReleaseObservation(R.FAILED, 2, True), S.FAILED),
    ("status helm does not know", TENANT, ReleaseObservation(R.UNKNOWN, 1, False), S.FAILED),
    ("applied, then deleted", SYNCED, ABSENT, S.DRIFTED),
    ("applied, then rolled back by hand", SYNCED, ReleaseObservation(R.DEPLOYED, 3, True),
     S.DRIFTED),
    ("never applied, nothing there", TENANT, ABSENT, S.ABSENT),
    ("never applied, uninstalled history", TENANT, ReleaseObservation(R.UNINSTALLED, 2, True),
     S.ABSENT),
    ("older target deployed", replace(SYNCED, applied_fingerprint=OLD), DEPLOYED, S.OUT_OF_SYNC),
]


@pytest.mark.parametrize(("tenant", "release", "state"), [s[1:] for s in STATES],
                         ids=[s[0] for s in STATES])
def test_release_state(tenant: TenantView, release: ReleaseObservation, state: ReleaseState) -> None:
    assert release_state(tenant, FP, release) is state


# F1 with --rollout-auto-revert: the release moved from OLD (revision 1) to FP, which failed
# as revision 2; the halted rollout asks this cluster to revert.
FAILED_UPGRADE = replace(TENANT, applied_fingerprint=OLD, recorded_fingerprint=OLD,
                         applied_revision=1, recorded_version="0.1.0", failed_fingerprint=FP)
FAILED_REV = ReleaseObservation(R.FAILED, 2, True)
HALTED = RolloutGate(open=False, reason="RolloutHalted")
REVERT = RolloutGate(open=False, reason="RolloutHalted", revert=True)
GATE_REVERT = RolloutGate(open=False, reason="RolloutHalted", revert=True, revert_healthy_to="0.1.0")
GATED = [
    ("halted, revert asked", FAILED_UPGRADE, FAILED_REV, REVERT, Action.REVERT),
    ("halted, no revert asked", FAILED_UPGRADE, FAILED_REV, HALTED, Action.HOLD),
    ("revert asked, release locked", FAILED_UPGRADE,
     ReleaseObservation(R.PENDING_UPGRADE, 2, True, True), REVERT, Action.WAIT),
    ("revert done", replace(FAILED_UPGRADE, reverted_fingerprint=FP, applied_revision=3),
     ReleaseObservation(R.DEPLOYED, 3, True), REVERT, Action.HOLD),
    # an older CRD drops revertedFingerprint: the recorded revision still says it is done
    ("revert done, record pruned", replace(FAILED_UPGRADE, applied_revision=3),
     ReleaseObservation(R.DEPLOYED, 3, True), REVERT, Action.HOLD),
    ("failed first install: nothing to go back to",
     replace(TENANT, failed_fingerprint=FP), ReleaseObservation(R.FAILED, 1, False), REVERT,
     Action.HOLD),
    ("failed on an older target", replace(FAILED_UPGRADE, failed_fingerprint=OLD), FAILED_REV,
     REVERT, Action.HOLD),
    ("not reached yet", replace(SYNCED, applied_fingerprint=OLD), DEPLOYED,
     RolloutGate(open=False, reason="RolloutPending"), Action.HOLD),
    ("gate open", replace(SYNCED, applied_fingerprint=OLD), DEPLOYED, RolloutGate(),
     Action.UPGRADE),
    # restoring what was applied moves nothing: never held
    ("drift repair while halted", SYNCED, ABSENT, HALTED, Action.INSTALL),
    ("first install while halted", TENANT, ABSENT, HALTED, Action.INSTALL),
    ("in sync while halted", SYNCED, DEPLOYED, HALTED, Action.SKIP),
    # F7: the wave failed its metric gate; its releases are Ready on the target and go back
    ("gate failed, revert asked", SYNCED, DEPLOYED, GATE_REVERT, Action.REVERT),
    ("gate failed, release locked", SYNCED, ReleaseObservation(R.PENDING_UPGRADE, 2, True, True),
     GATE_REVERT, Action.WAIT),
    ("gate failed, reverted", replace(SYNCED, applied_fingerprint=OLD, recorded_fingerprint=OLD,
                                      failed_fingerprint=FP, reverted_fingerprint=FP),
     DEPLOYED, GATE_REVERT, Action.HOLD),
    ("gate failed, no revert asked", SYNCED, DEPLOYED, HALTED, Action.SKIP),
]


@pytest.mark.parametrize(("tenant", "release", "gate", "action"), [g[1:] for g in GATED],
                         ids=[g[0] for g in GATED])
def test_the_rollout_gate_and_revert(tenant: TenantView, release: ReleaseObservation,
                                     gate: RolloutGate, action: Action) -> None:
    decided = plan(replace(obs(tenant, release=release), rollout=gate))
    assert decided.action is action
    if action is Action.HOLD:
        assert decided.reason == gate.reason


def test_announced_is_the_plan_in_the_status() -> None:
    decided = plan(obs())
    assert decided.action is Action.INSTALL
    assert not announced(obs(), decided)
    # what the announcing pass wrote, as ClusterProgress/c1 holds it (reason, message)
    said = obs(replace(TENANT, progress=("Installing", "install: install chart 0.2.0")))
    assert announced(said, decided)
    # a new target is a new plan: what an earlier pass announced does not count for it
    other = obs(replace(TENANT, progress=(decided.reason, "install: install chart 0.1.0")))
    assert not announced(other, decided)


def test_shared_objects_are_named_with_their_owner() -> None:
    said = [f"CustomResourceDefinition c{i}.example.io (owned by release a/tenant-a-c1)"
            for i in range(7)]
    decided = plan(obs(shared=tuple(said)))
    assert said[0] in decided.message and said[4] in decided.message
    assert said[5] not in decided.message and "(and 2 more)" in decided.message


def test_objects_gone_from_an_in_sync_release_are_drift() -> None:
    gone = ("ConfigMap tenant-acme-c1", "Service web")
    assert release_state(SYNCED, FP, DEPLOYED, gone) is ReleaseState.DRIFTED
    decided = plan(replace(obs(SYNCED, release=DEPLOYED), missing=gone))
    assert (decided.action, decided.drift) == (Action.UPGRADE, True)
    assert "ConfigMap tenant-acme-c1; Service web" in decided.message
    # restoring what was applied moves nothing: not held by a closed rollout gate
    held = replace(obs(SYNCED, release=DEPLOYED), missing=gone,
                   rollout=RolloutGate(open=False, reason="RolloutPending"))
    assert plan(held).action is Action.UPGRADE


@pytest.mark.parametrize(("observation", "served"), [
    (obs(), True),
    (obs(replace(TENANT, paused=True)), False),
    (obs(replace(TENANT, deleting=True)), False),
    (obs(replace(TENANT, target_cluster="c2")), False),
    (obs(replace(TENANT, target_cluster="c1")), True),
    (obs(replace(TENANT, key=TenantKey("ns", "kube-system"))), False),  # refused for good
    (obs(replace(TENANT, key=TenantKey("ns", "a.b"))), False),
    (obs(OWNED, release=THEIRS, release_owner="default/acme"), False),
    (obs(chart=ChartProblem("ChartNotLoaded", "down")), True),  # served, waiting for the chart
])
def test_a_cluster_serves_what_the_admission_rules_admit(observation: Observation,
                                                         served: bool) -> None:
    from krypton.decisions.planner import admission

    assert (admission(observation) is None) is served


CLOSED = {"window": "0 22 * * 1-5 6h Europe/Berlin", "window_opens": "2026-11-27T21:00:00Z",
          "window_wait": 3600.0}
OLD = replace(SYNCED, applied_fingerprint="0" * 64)  # applied before; the target is FP


@pytest.mark.parametrize(("observation", "action"), [
    # outside the window: no upgrade, revert, uninstall, nor a reinstall of what went
    (replace(obs(OLD, release=DEPLOYED), **CLOSED), Action.OUTSIDE_WINDOW),
    (replace(obs(replace(OWNED, deleting=True), release=MINE), **CLOSED), Action.OUTSIDE_WINDOW),
    (replace(obs(SYNCED), **CLOSED), Action.OUTSIDE_WINDOW),  # applied, then deleted by hand
    # a new Tenant's first install goes ahead, unless the flag says otherwise
    (replace(obs(), **CLOSED), Action.INSTALL),
    (replace(obs(), **CLOSED, window_first_install=False), Action.OUTSIDE_WINDOW),
    # what starts nothing is not held
    (replace(obs(SYNCED, release=DEPLOYED), **CLOSED), Action.SKIP),
    (replace(obs(replace(TENANT, paused=True)), **CLOSED), Action.PAUSE),
    # the window open (or none): as always
    (obs(OLD, release=DEPLOYED), Action.UPGRADE),
])
def test_a_closed_maintenance_window_holds_what_would_change_the_cluster(
        observation: Observation, action: Action) -> None:
    decided = plan(observation)
    assert decided.action is action
    if action is Action.OUTSIDE_WINDOW:
        assert decided.reason == "OutsideMaintenanceWindow"
        assert decided.message.endswith("maintenance window of cluster c1 (0 22 * * 1-5 6h "
                                        "Europe/Berlin); the next one opens at "
                                        "2026-11-27T21:00:00Z")
