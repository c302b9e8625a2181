"""Plain data shared by the decision logic and the I/O layers. No behaviour, no I/O."""

from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

GROUP = "mesh.openkcm.io"
VERSION = "v1alpha1"
PLURAL = "tenants"
KIND = "Tenant"
CRD_NAME = f"{PLURAL}.{GROUP}"
FINGERPRINT_ANNOTATION = f"{GROUP}/fingerprint-"
PAUSED_ANNOTATION = f"{GROUP}/paused"
FINALIZER = f"{GROUP}/release-cleanup"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "krypton"
OWNER_ANNOTATION = f"{GROUP}/owner"
OWNER_LABEL = f"{GROUP}/tenant"
REPORTING_CONTROLLER = f"{GROUP}/krypton"
HELM_RELEASE_NAME_MAX = 53

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
    UNMANAGED = "unmanaged"  # exists, not labelled by krypton: adopted
    CONFLICT = "conflict"  # owned by another Tenant


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


@dataclass(frozen=True)
class ChartTarget:
    """The chart as resolved for one cluster: what is installed and its fingerprint."""

    repo: str
    name: str
    version: str
    values: dict[str, Any]
    fingerprint: str
    path: str = ""  # local unpacked chart directory

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
    applied_fingerprint: str | None = None
    applied_revision: int | None = None
    recorded_fingerprint: str | None = None  # status.clusters[c].fingerprint
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """Everything observed for one Tenant on one cluster, input of the planner."""

    cluster: str
    tenant: TenantView
    chart: ChartTarget | ChartProblem | None  # None: not resolved yet
    release: ReleaseObservation = ReleaseObservation()
    namespace: NamespaceState = NamespaceState.UNKNOWN
    namespace_owner: str | None = None
