"""krypton's exception tree. Callers branch on these types, never on message text.

    KryptonError
    ├── TemporaryError            retried with capped exponential backoff
    │   ├── ClusterUnreachable    API server down, timeout, TLS handshake failed
    │   ├── ChartNotLoaded        chart repository unreachable or chart unloadable
    │   │   └── ChartVerificationFailed  a digest pin, provenance or signature did not hold
    │   ├── HelmFailed            a helm run failed (install/upgrade/rollback/uninstall)
    │   │   ├── ReleaseLocked     another helm operation holds the release
    │   │   ├── ReleaseRecordChanged  a record helm was to read is not the one krypton
    │   │   │                     judged (the helm worker refused it, SPEC S7)
    │   │   ├── OwnershipConflict an object of the release belongs to another release (R17)
    │   │   └── FieldConflict     Helm 4: other field managers own fields of the next apply (H2)
    │   ├── CRDEnsureFailed       the Tenant CRD could not be created on a cluster
    │   ├── APIError              the API server answered a request with an error status
    │   │   ├── NotFound          404
    │   │   ├── AlreadyExists     409 on create
    │   │   ├── Conflict          409 on a conditional write (resourceVersion moved on)
    │   │   ├── Gone              410: a watch's or list page's resourceVersion expired
    │   │   └── Forbidden         401/403: credentials or RBAC; retried with backoff, because
    │   │                         rights are fixed outside krypton, and reported as
    │   │                         ClusterAccessDenied when a watch of an engaged cluster hits it
    │   └── Fenced                nothing may start: leadership not held (fresh), or draining
    └── PermanentError            reported as a condition; not retried until the input changes
        ├── KubeconfigRejected    untrusted or malformed kubeconfig (D3-D5)
        ├── VersionInvalid        chart version is not a semver or a valid range
        ├── VersionNotFound       no chart version matches
        ├── ReleaseRecordUntrusted  a release record krypton did not write, or over a bound
        ├── ClusterExists         register-cluster would replace another cluster's Secret
        ├── RequestUnsendable     a request krypton built holds a line break: krypton's own
        │                         defect, never said as the cluster being unreachable
        └── SettingsError         bad flag or environment value (exit status 2)

Every error carries a short CamelCase ``reason`` (used in conditions and Events) and a
message that never contains credential material.
"""

from __future__ import annotations

# the reasons of answers past a bound, or not answers at all: strikes against the budget of
# the cluster that gave them (SPEC S3, S5)
HOSTILE_ANSWERS = ("AnswerTooLarge", "BadResponse", "TooManyObjects", "ListNeverCompletes")


class KryptonError(Exception):
    reason = "Error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason:
            self.reason = reason

    @property
    def message(self) -> str:
        return str(self)


class TemporaryError(KryptonError):
    """Worth retrying: the same input may succeed later."""


class PermanentError(KryptonError):
    """Retrying with the same input cannot succeed."""


class ClusterUnreachable(TemporaryError):
    reason = "ClusterUnreachable"


class ChartNotLoaded(TemporaryError):
    reason = "ChartNotLoaded"


class ChartVerificationFailed(ChartNotLoaded):
    """The chart is not the one pinned or signed: a tag moved away from --chart-digest, a
    provenance file or cosign signature is missing or does not verify. Never installed;
    looked at again on the chart's failure backoff (the registry may be put right)."""

    reason = "ChartVerificationFailed"


class HelmFailed(TemporaryError):
    reason = "HelmFailed"


class HelmWorkerFailed(HelmFailed):
    """The cluster's helm worker ended, or cannot start (SPEC P5)."""
    reason = "HelmWorkerFailed"


class ReleaseLocked(HelmFailed):
    reason = "ReleaseLocked"


class ReleaseRecordChanged(HelmFailed):
    """A release record changed, appeared or was relabelled between krypton's judgement of
    the history and helm's read of it: the helm worker handed helm nothing (SPEC S7)."""

    reason = "ReleaseRecordChanged"


class OwnershipConflict(HelmFailed):
    reason = "OwnershipConflict"


class FieldConflict(HelmFailed):
    """Helm 4's server-side apply found fields of the next apply owned by other field
    managers (kubectl, an autoscaler), and krypton does not take them over."""

    reason = "FieldConflict"

    def __init__(self, message: str, conflicts: tuple[tuple[str, str, str], ...] = ()) -> None:
        super().__init__(message)
        self.conflicts = conflicts  # (object, manager, field)


class CRDEnsureFailed(TemporaryError):
    reason = "CRDEnsureFailed"


class APIError(TemporaryError):
    reason = "APIError"


class NotFound(APIError):
    reason = "NotFound"


class AlreadyExists(APIError):
    reason = "AlreadyExists"


class Conflict(APIError):
    reason = "Conflict"


class Gone(APIError):
    """410: a watch's or a list page's resourceVersion is too old; list again."""

    reason = "Gone"


class Forbidden(APIError):
    reason = "Forbidden"


class Fenced(TemporaryError):
    reason = "Fenced"


class RequestUnsendable(PermanentError):
    """A request krypton built that cannot be sent as HTTP/1.1 (a header or the path holds a
    line break): a defect of krypton's, said as such (SPEC S3)."""

    reason = "RequestUnsendable"


class KubeconfigRejected(PermanentError):
    reason = "KubeconfigRejected"


class ClusterExists(PermanentError):
    """register-cluster would replace another cluster's Secret."""

    reason = "ClusterExists"


class VersionInvalid(PermanentError):
    reason = "VersionInvalid"


class VersionNotFound(PermanentError):
    reason = "VersionNotFound"


class ReleaseRecordUntrusted(PermanentError):
    """A record of the release that helm would act on was not written by krypton (its seal
    does not match), or is over a size bound: helm is not run on the release until its
    records change (SPEC S3)."""

    reason = "ReleaseRecordUntrusted"


class SettingsError(PermanentError):
    reason = "SettingsError"
