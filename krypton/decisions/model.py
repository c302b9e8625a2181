"""Plain data shared by the decision logic and the I/O layers. No behaviour, no I/O."""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from krypton.decisions.readiness.health import Health

GROUP = "mesh.openkcm.io"
VERSION = "v1alpha1"
PLURAL = "tenants"
KIND = "Tenant"
CRD_NAME = f"{PLURAL}.{GROUP}"
FINGERPRINT_ANNOTATION = f"{GROUP}/fingerprint-"
PAUSED_ANNOTATION = f"{GROUP}/paused"
RETRY_ANNOTATION = f"{GROUP}/retry"  # a new value asks for a new attempt of a stalled release
ADOPT_ANNOTATION = f"{GROUP}/adopt-records"  # seals an administrator adopted (SPEC S6)
WRITER_ANNOTATION = f"{GROUP}/writer"  # the krypton instance that owns the release (SPEC S6)
FINALIZER = f"{GROUP}/release-cleanup"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "krypton"
OWNER_ANNOTATION = f"{GROUP}/owner"
OWNER_LABEL = f"{GROUP}/tenant"
REPORTING_CONTROLLER = f"{GROUP}/krypton"
# Labels krypton's helm runs put on the release records (``helm --labels``): the UID of the
# one Tenant the release belongs to (SPEC S2), and the cluster name it was made for
# (a release of a cluster name no longer discovered is reported as orphaned, SPEC S2).
RELEASE_OWNER_LABEL = f"{GROUP}/tenant-uid"
RELEASE_CLUSTER_LABEL = f"{GROUP}/cluster"
# ... and which krypton instance wrote it, and whether a drift repair made it (SPEC S6)
RELEASE_WRITER_LABEL = f"{GROUP}/writer"
RELEASE_REPAIR_LABEL = f"{GROUP}/repair"
HELM_RELEASE_NAME_MAX = 53
ADOPTED_ANNOTATION = f"{GROUP}/adopted"  # set on namespaces krypton took over (never deleted)
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_valid_namespace_name(name: str) -> bool:
    """A DNS-1123 label: lower-case alphanumerics and '-', at most 63 characters."""
    return len(name) <= 63 and bool(_DNS_LABEL.match(name))


def release_name(tenant: str, cluster: str) -> str:
    """``tenant-<tenant>-<cluster>``, shortened deterministically past Helm's 53 characters.

    A long name keeps its first 44 characters (trailing '-' and '.' dropped) and gets '-'
    plus the first 8 hex characters of the sha256 of the full name.
    """
    full = f"tenant-{tenant}-{cluster}"
    if len(full) <= HELM_RELEASE_NAME_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    prefix = full[: HELM_RELEASE_NAME_MAX - 9].rstrip("-.")
    return f"{prefix}-{digest}"


ANNOTATION_NAME_MAX = 63
CLUSTER_NAME_MAX = ANNOTATION_NAME_MAX - len("fingerprint-")  # 51
_ANNOTATION_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def cluster_name_problem(cluster: str) -> str | None:
    """Why `cluster` (a Secret name) cannot be a cluster name, or None.

    The name is part of the fingerprint annotation's key, whose name part has at most 63
    characters: a longer Secret name would make every annotation write fail.
    """
    key = f"fingerprint-{cluster}"
    if len(key) > ANNOTATION_NAME_MAX:
        return (f"cluster name {cluster[:20]}... has {len(cluster)} characters; at most "
                f"{CLUSTER_NAME_MAX} fit the annotation {fingerprint_annotation('<cluster>')}")
    if not _ANNOTATION_NAME.match(key):
        return f"cluster name {cluster!r} cannot be part of an annotation key"
    return None


def epoch_seconds(text: Any) -> float | None:
    """An RFC 3339 time as the API server writes it (``2026-11-23T07:21:51Z``) in seconds
    since the epoch; None when `text` is not one (or names no time zone)."""
    try:
        when = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return None if when.tzinfo is None else when.timestamp()


def rfc3339(epoch: float) -> str:
    """`epoch` as the API server writes times (``2026-11-23T07:21:51Z``)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fingerprint_annotation(cluster: str) -> str:
    return f"{FINGERPRINT_ANNOTATION}{cluster}"


@dataclass(frozen=True, order=True)
class TenantKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class NamespaceState(enum.Enum):
    UNKNOWN = "unknown"  # not looked at yet
    ABSENT = "absent"
    OWNED = "owned"  # labelled as this Tenant's
    UNMANAGED = "unmanaged"  # exists, not created by krypton: adopted only with the flag
    CONFLICT = "conflict"  # owned by another Tenant


def namespace_refusal(name: str, state: NamespaceState, owner: str | None,
                      adopt: bool) -> str | None:
    """Why the existing namespace `name` is not the Tenant's to install into (R5, R16):
    another Tenant's, or not krypton's and not to be adopted; None when it may be used. The
    planner's rule, and the install's when its create finds the namespace there."""
    if state is NamespaceState.CONFLICT:
        return f"namespace {name!r} is owned by Tenant {owner}"
    if state is NamespaceState.UNMANAGED and not adopt:
        return (f"namespace {name!r} exists and was not created by krypton "
                "(--adopt-namespaces allows taking it over)")
    return None


class ReleaseStatus(enum.Enum):
    ABSENT = "absent"
    DEPLOYED = "deployed"
    FAILED = "failed"
    PENDING_INSTALL = "pending-install"
    PENDING_UPGRADE = "pending-upgrade"
    PENDING_ROLLBACK = "pending-rollback"
    UNINSTALLING = "uninstalling"
    SUPERSEDED = "superseded"
    UNINSTALLED = "uninstalled"
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: str | None) -> ReleaseStatus:
        try:
            return cls(text or "absent")
        except ValueError:
            return cls.UNKNOWN


@dataclass(frozen=True)
class ReleaseObservation:
    """What the Helm release records on the cluster say about one release."""

    status: ReleaseStatus = ReleaseStatus.ABSENT
    revision: int = 0
    has_good_revision: bool = False  # an earlier revision was deployed or superseded
    locked: bool = False  # pending/uninstalling and recent: another helm run may still be at work
    unlocks_in: float = 0.0  # seconds until a locked record counts as a leftover to recover
    owner_uid: str | None = None  # RELEASE_OWNER_LABEL of the latest record (None: unlabelled)
    # RELEASE_WRITER_LABEL of the latest record (None: unlabelled) and when it was written
    writer: str | None = None
    written: float = 0.0


@dataclass(frozen=True)
class ChartTarget:
    """The chart as resolved for one cluster: what is installed and its fingerprint."""

    repo: str
    name: str
    version: str
    values: dict[str, Any]
    fingerprint: str
    path: str = ""  # local unpacked chart directory
    digest: str = ""  # an OCI chart's manifest digest
    newer: str = ""  # a newer version in the repository, which the settings do not take (F8)

    @property
    def applied(self) -> dict[str, str]:
        """What the status records of the chart a helm run applied or a check found."""
        return {"chartVersion": self.version, **({"chartDigest": self.digest} if self.digest else {})}

    def notice(self, recorded: dict[str, Any]) -> dict[str, str]:
        """The update notice of ``status.clusters.<c>``, given what that record holds: the
        newer version while there is one, cleared ("") once there is none; a record that
        never had one is left without the field."""
        if self.newer or recorded.get("newerVersion"):
            return {"newerVersion": self.newer}
        return {}

    @property
    def ref(self) -> str:
        return f"{self.repo}|{self.name}|{self.version}"


@dataclass(frozen=True)
class ChartProblem:
    """Why the chart could not be resolved: reason is a condition reason of R10."""

    reason: str
    message: str


@dataclass(frozen=True)
class TenantView:
    """The parts of a Tenant object the planner needs."""

    key: TenantKey
    generation: int = 1
    uid: str = ""
    paused: bool = False
    deleting: bool = False
    has_finalizer: bool = False
    target_cluster: str | None = None
    workspace: str | None = None  # spec.workspace of Tenants made by the original operator
    applied_fingerprint: str | None = None
    applied_revision: int | None = None
    recorded_fingerprint: str | None = None  # status.clusters[c].fingerprint
    recorded_version: str | None = None  # status.clusters[c].chartVersion
    failed_fingerprint: str | None = None  # status.clusters[c].failedFingerprint
    reverted_fingerprint: str | None = None  # status.clusters[c].revertedFingerprint
    progress: tuple[str, str] | None = None  # ClusterProgress/c when True: (reason, message)
    readiness: tuple[bool, str] | None = None  # ClusterReady/c: (status, reason)
    error: tuple[str, str] | None = None  # ClusterError/c when True: (reason, message)
    annotations: dict[str, str] = field(default_factory=dict)
    # the retry state of status.clusters[c] (R18): consecutive failed helm runs of
    # `failed_target`, and the RETRY_ANNOTATION value that is part of every target
    failures: int = 0
    failed_target: str = ""
    retry_token: str = ""
    # status.clusters[c].records: seals of the release contents krypton made, newest first
    record_seals: tuple[str, ...] = ()
    # ADOPT_ANNOTATION: seals of records an administrator adopted as they are (SPEC S6)
    adopted_seals: tuple[str, ...] = ()
    # WRITER_ANNOTATION: the krypton instance named to write the release ("": none named)
    writer: str = ""


@dataclass(frozen=True)
class RolloutGate:
    """What the fleet-wide rollout (F1) allows on one cluster: whether Tenants may move to the
    target now (`reason` says why not), and whether the releases that failed on the target
    are to be rolled back (a halted wave with --rollout-auto-revert)."""

    open: bool = True
    reason: str = ""
    revert: bool = False
    # the wave halted on its metric gate (F7): releases Ready on the target are rolled back
    # too, to this version (the one the rollout moved away from)
    revert_healthy_to: str = ""


@dataclass(frozen=True)
class Observation:
    """Everything observed for one Tenant on one cluster, input of the planner."""

    cluster: str
    tenant: TenantView
    chart: ChartTarget | ChartProblem | None  # None: not resolved yet
    release: ReleaseObservation = ReleaseObservation()
    namespace: NamespaceState = NamespaceState.UNKNOWN
    namespace_owner: str | None = None
    # the release is labelled as another Tenant's: that Tenant ("<namespace>/<name>") when
    # it still exists on the cluster, "" when no Tenant with that UID is left; None when the
    # release is this Tenant's, unlabelled or absent (SPEC S2)
    release_owner: str | None = None
    known_clusters: frozenset[str] | None = None  # every discovered cluster (None: not known)
    reserved_namespaces: frozenset[str] = frozenset()  # the operator's own namespaces
    adopt_namespaces: bool = False  # --adopt-namespaces: take over namespaces krypton did not create
    own_namespace: bool = True  # the release goes to a namespace named after the Tenant (R5)
    # a first install creates the namespace, and judges it only if it exists (the operator;
    # a dry run looks it up first, as it creates nothing)
    create_namespace: bool = False
    rollout: RolloutGate = RolloutGate()
    # objects the chart claims that another release (or nobody) owns on the cluster, as
    # "<object> (owned by <owner>)"; None: not looked at yet
    shared: tuple[str, ...] | None = None
    # shared objects of a release that no longer exists, which this release takes over
    # (--adopt-orphaned-objects, the cluster's first Tenant only)
    adopt: tuple[str, ...] = ()
    # objects of the deployed release's manifest that are gone from the cluster (F2)
    missing: tuple[str, ...] = ()
    # the release's workload as read live (F6); None: not looked at in this pass
    health: Health | None = None
    since_applied: float | None = None  # seconds since the last helm run applied the release
    retry_wait: float = 0.0  # seconds until the next attempt of a failed target (<= 0: due)
    max_retries: int = 8  # --max-retries
    readiness_timeout: float = 180.0  # --helm-timeout: how long a fresh release may take
    # the cluster's maintenance window while it is closed (F8): as written, and when and in
    # how many seconds the next one opens; "" while it is open or there is none
    window: str = ""
    window_opens: str = ""
    window_wait: float = 0.0
    window_first_install: bool = True  # --maintenance-window-first-install
    # this krypton instance's name on the records it writes ("": not said, no check), and
    # whether the other writer of the latest record is still at work (None: not looked at)
    writer: str = ""
    writer_active: bool | None = None
    writer_wait: float = 0.0  # seconds it is taken to be at work for, from the look
    # the drift repairs of the release in the last hour (None: not counted yet, as the
    # operator's and krypton plan's observation leaves it)
    repairs: int | None = 0
