"""Every reason krypton writes into a condition, an Event, a ``krypton plan`` row or an
error, with what it means and what to do (SPEC R10-R12). Pure.

The operator takes the reasons that put a Tenant in phase Error (``fatal``) and the chart
reasons ``--allow-chart-skip`` forgives (``chart``) from here; the docs' reason reference is
generated from it; a unit test fails when the code can emit a reason this table lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

CONDITION, EVENT, PLAN, ERROR = "condition", "Event", "plan", "error"


@dataclass(frozen=True)
class Reason:
    where: tuple[str, ...]  # CONDITION, EVENT, PLAN, ERROR: where it can be seen
    meaning: str
    action: str = "nothing"
    fatal: bool = False  # a ClusterError with it puts the Tenant in phase Error
    chart: bool = False  # a chart problem that --allow-chart-skip does not block Ready for


def _r(where: str, meaning: str, action: str = "nothing", **kw: bool) -> Reason:
    return Reason(tuple(where.split(",")), meaning, action, **kw)


C, E, CE, CP, CEP = "condition", "Event", "condition,Event", "condition,plan", \
    "condition,Event,plan"
HELM_VERBS = ("Install", "Upgrade")

REASONS: dict[str, Reason] = {
    # --- the helm run and its outcome (R9, R10)
    "Installing": _r(CP, "an install is decided or under way on this cluster"),
    "Upgrading": _r(CP, "an upgrade is decided or under way (new fingerprint, drift, or a "
                    "failed release to repair)"),
    "Installed": _r(CE, "helm installed the release; the workload is ready or not followed"),
    "Upgraded": _r(CE, "helm upgraded the release"),
    "NoChange": _r(CP, "fingerprint unchanged and the release deployed: no helm run (R8)"),
    "HelmSkip": _r(E, "said once when a Tenant comes into sync without a helm run (R8)"),
    **{f"Helm{v}Start": _r(E, f"a helm {v.lower()} still running after 2 s (a slot wait, "
                           "CRDs, --helm-wait) is announced") for v in HELM_VERBS},
    "HelmInstalled": _r(E, "helm install succeeded"),
    "HelmUpgraded": _r(E, "helm upgrade succeeded"),
    **{f"Helm{v}Failed": _r(E, f"helm {v.lower()} failed; the message is helm's error",
                            "fix what helm's error names (values, chart version, objects "
                            "on the cluster); the run is retried on a growing schedule")
       for v in HELM_VERBS},
    "InstallFailed": _r(CP, "the install failed; retried 10 s later, doubling up to "
                        "--retry-backoff-max (R18)", "the message carries helm's error; "
                        "fixing values or version clears it", fatal=True),
    "UpgradeFailed": _r(CP, "the upgrade failed; retried like InstallFailed",
                        "the message carries helm's error", fatal=True),
    "RetryScheduled": _r("plan", "a failed target waits for its next attempt (backoff)",
                         "nothing, or `krypton retry NAMESPACE/NAME` to try at once"),
    "RetriesExhausted": _r(CEP, "the same target failed more than --max-retries times: no "
                           "helm run until it changes (krypton_releases_stalled)",
                           "fix what the last error says, or `krypton retry NAMESPACE/NAME`"),
    "HelmFailed": _r(ERROR, "a helm run failed (the generic form of the errors above)",
                     "see the message"),
    "HelmWorkerFailed": _r("Event,error", "the cluster's helm worker (--helm-engine=worker) "
                           "ended or could not start; its requests failed with this message "
                           "and retry on their schedule, and it starts again after a delay "
                           "doubling from 1 s to 60 s", "read the worker's last words in the "
                           "message; check --helm-worker and the pod's memory"),
    "HelmWorkerOutOfMemory": _r(E, "the cluster's helm worker reached its share of the pod's "
                                "memory (said at start and on /readyz) and ended, or was killed "
                                "past it", "look for a release whose manifest or history is "
                                "unusually large on that cluster, or raise the pod's memory "
                                "limit"),
    "HelmWorkerStuck": _r(E, "a cancelled request (past --helm-timeout, or at shutdown) did "
                          "not end within 5 s and the cluster's helm worker was killed",
                          "nothing: the next request starts a new one"),
    "ReleaseLocked": _r("plan,error", "a pending release record younger than --helm-timeout "
                        "+ 10 s, or helm refusing because another operation holds it",
                        "nothing: krypton looks again when the lock would be a leftover and "
                        "recovers it then"),
    "FieldConflict": _r(CEP, "Helm 4: other field managers own fields of the next apply and "
                        "--helm-force-conflicts=false", "give the fields back, or "
                        "--helm-force-conflicts=true; `krypton diff` lists them"),
    "FieldsTakenOver": _r(E, "Helm 4 took fields over from other field managers "
                          "(--helm-force-conflicts)"),
    "RolledBack": _r(CE, "a failed release was rolled back to its last good revision "
                     "(--rollout-auto-revert)"),
    "RevertFailed": _r(CE, "rolling a failed release back failed", "see the message; the "
                       "release stays failed and is retried on the failure schedule"),
    "DriftRepaired": _r(CE, "a workload object the release renders was changed or deleted "
                        "and the upgrade restored it (--drift-detection)"),
    "WaitingForReadiness": _r(CP, "applied; the workload is not ready yet (followed by "
                              "watches, no helm process held)"),
    "WorkloadReady": _r(CE, "the workload became ready after the helm run"),
    "ReadinessTimeout": _r(CP, "the workload was not ready --helm-timeout after the run",
                           "look at the pods the message names", fatal=True),
    "Degraded": _r(CP, "a workload that was ready is not any more", "look at its pods",
                   fatal=True),
    "FingerprintUpdated": _r(E, "the fingerprint annotation was written (R7)"),
    "FingerprintUpdateFailed": _r(CE, "the fingerprint annotation PATCH failed (RBAC, an "
                                  "admission policy); retried, never by running helm again",
                                  "give the operator `patch` on tenants"),
    "Internal": _r(CE, "a pass failed on a defect of krypton's own (an exception no action "
                   "reports): said in its commit, logged with the trace as \"reconcile "
                   "crashed\", retried on the queue's growing schedule",
                   "report it, with the log line"),
    # --- the chart (R6, R6b)
    "ResolveChart": _r(PLAN, "the pass resolves the chart before deciding (internal step)"),
    "ChartNotLoaded": _r(CEP, "chart repository or registry unreachable, credentials "
                         "refused, chart not in the repository or not loadable",
                         "check --chart-repo/--chart-name, egress and the credentials "
                         "Secret; asked again on a growing schedule", chart=True),
    "ChartVerificationFailed": _r(CEP, "--chart-verify: no valid provenance or cosign "
                                  "signature, or a tag that moved away from --chart-digest; "
                                  "nothing is installed", "sign the chart with the key you "
                                  "configured, or fix --chart-digest"),
    "VersionNotFound": _r(CP, "no chart version matches --chart-version", "fix "
                          "--chart-version; `krypton plan` shows the resolution", chart=True),
    "ChartVersionNotFound": _r(E, "the Event of VersionNotFound", "fix --chart-version"),
    "VersionInvalid": _r(CP, "--chart-version is not a semver or a valid range",
                         "fix --chart-version", chart=True),
    "ChartVersionInvalid": _r(E, "the Event of VersionInvalid", "fix --chart-version"),
    "ChartCRDsFailed": _r(CE, "the chart's crds/ directory could not be applied "
                          "(--chart-crds)", "grant CRD rights, or --chart-crds=skip"),
    "ValuesInvalid": _r(ERROR, "a values file or a cluster's values.yaml is not a YAML "
                        "mapping within limits", "fix the file or the Secret's values.yaml"),
    # --- Tenants and namespaces (R5, R16, R17)
    "Finalizer": _r(PLAN, "the release-cleanup finalizer is added first (internal step)"),
    "ObserveNamespace": _r(PLAN, "the pass looks at the Tenant's namespace first (internal)"),
    "ObserveShared": _r(PLAN, "the pass looks at the chart's shared objects first (internal)"),
    "ObserveWriter": _r(PLAN, "the pass looks whether the krypton instance that wrote the "
                        "release's newest record is at work (internal)"),
    "CountRepairs": _r(PLAN, "the pass counts the release's drift repairs in the last hour "
                       "(internal)"),
    "AnotherWriter": _r("Event,plan", "another krypton instance wrote the release and is at "
                        "work, or the Tenant names another (mesh.openkcm.io/writer): this one "
                        "leaves the release alone (no helm run, no write to the Tenant) until "
                        "it stops or is named (SPEC S6)",
                        "run one krypton per fleet: stop the other instance, or give both the "
                        "same Lease (--leader-elect, as the chart does); while both must run, "
                        "name the one that writes it on the Tenant"),
    "AnotherInstance": _r(E, "krypton runs without the fleet's Lease (--leader-elect off) "
                          "while another instance holds it, or beside another that runs "
                          "without it: two instances write the same releases (an Event on "
                          "that instance's Lease, SPEC S6)",
                          "stop one of them, or start this one with --leader-elect"),
    "DriftRepairsExhausted": _r(CEP, "the release was repaired 3 times in an hour "
                                "and changed behind krypton's back again: no repair until the "
                                "first of them is an hour old (SPEC S6)",
                                "find and stop what else writes the release (a person's helm, "
                                "a tool with krypton's credentials)"),
    "InvalidTenantName": _r(CEP, "the Tenant's name is not a valid namespace name",
                            "rename the Tenant", fatal=True),
    "ReservedNamespace": _r(CEP, "the Tenant is named like a system namespace or the "
                            "operator's own", "rename the Tenant", fatal=True),
    "NamespaceConflict": _r(CEP, "another Tenant owns the namespace or the release, or the "
                            "namespace exists and krypton did not create it",
                            "rename one of them, or --adopt-namespaces", fatal=True),
    "WorkspaceMismatch": _r(CEP, "a Tenant of the original operator whose spec.workspace is "
                            "not its name", "rename the Tenant after its workspace"),
    "SharedObjects": _r(CEP, "the chart renders an object alike for every release and "
                        "another release owns it, or it is claimed for the cluster's first "
                        "Tenant", "install the shared part once per cluster; "
                        "--adopt-orphaned-objects for a gone owner", fatal=True),
    "SharedObjectsAdopted": _r(CE, "an object of a release that no longer exists was adopted "
                               "(--adopt-orphaned-objects)"),
    "OwnershipConflict": _r(CEP, "an object of the chart belongs to another release on the "
                            "cluster (R17)", "the message names the object and its owner",
                            fatal=True),
    "ReleaseUnlocked": _r(E, "a release record left pending by krypton's own run, which ended "
                          "with its helm worker (killed, out of memory, a crash), was marked "
                          "failed before the release was recovered (SPEC S7)"),
    "ReleaseRecordChanged": _r(CE, "a release record changed, appeared or was relabelled "
                               "between krypton's judgement of the history and helm's read "
                               "of it; the helm worker handed helm nothing and the run is "
                               "retried on the failure schedule (SPEC S7)",
                               "find who writes the release's records in the namespace; "
                               "guard them (--record-guard)"),
    "ReleaseRecordUntrusted": _r(CE, "a release record helm would act on was not written by "
                                 "krypton (its content matches no seal krypton keeps), or is "
                                 "over helm's size or inflates past 16 MiB: no helm run on "
                                 "that release (krypton_reconcile_errors_total)",
                                 "remove the records krypton did not write, or `helm "
                                 "rollback` to a revision krypton made; where krypton keeps "
                                 "no seal, `krypton adopt-records` once the records are "
                                 "checked",
                                 fatal=True),
    "NamespaceTerminating": _r(CE, "the Tenant's namespace was deleted by hand and is still "
                               "going: no helm run until it is gone, then the release is "
                               "installed again (retried on the queue's backoff)"),
    "ReleaseRecordAdopted": _r(E, "a release record krypton kept no seal of was adopted: by "
                               "its content (exactly what krypton's chart renders for it, "
                               "SPEC S6), or by an administrator (`krypton adopt-records`); "
                               "its seal is kept in the Tenant's status"),
    "UnknownCluster": _r(CEP, "spec.clusterRef.secretName names no discovered cluster",
                         "fix the name, or register that cluster"),
    "NotTargeted": _r(CP, "the Tenant targets another cluster"),
    "Paused": _r(CP, "reconciliation paused by the Tenant's annotation"),
    "Resumed": _r(C, "reconciliation active again after a pause"),
    "Suspended": _r(C, "phase of a paused Tenant (Ready's reason)"),
    "Deleting": _r(CP, "the Tenant is being deleted: its release is uninstalled"),
    "HelmUninstalled": _r(E, "the release was uninstalled (R14)"),
    "HelmUninstallFailed": _r(E, "the uninstall failed; retried", "see the message"),
    "UninstallFailed": _r(C, "the uninstall failed; retried", "see the message"),
    "ReleaseNotOwned": _r(E, "the deleted Tenant's release belongs to another Tenant: only "
                          "the finalizer went", "nothing; rename one of the two Tenants"),
    "PhaseSet": _r(E, "the Tenant's phase changed"),
    "Pending": _r(C, "phase and Ready reason before the first outcome"),
    "Ready": _r(C, "phase and Ready reason: every targeted cluster is ready"),
    "Error": _r(C, "phase and Ready reason: a cluster has a fatal error"),
    # --- progressive rollout (F1)
    "RolloutPending": _r(CP, "the rollout of the new target is not planned yet (or the "
                         "controller has not read its state)"),
    "RolloutHalted": _r(CEP, "a wave failed: the rollout holds every cluster not reached",
                        "fix the chart or values; a new target supersedes the halted one"),
    "RolloutReverted": _r(E, "the failed releases of a halted wave were rolled back"),
    # --- rollout control (F9)
    "RolloutAwaitingApproval": _r(CEP, "the cluster's wave waits for a person's approval "
                                  "(--rollout-approval)", "krypton rollout approve"),
    "RolloutApproved": _r(E, "a wave was approved, by whom as given"),
    "RolloutControlAsked": _r(E, "someone the home cluster named asked on the fleet page to "
                              "approve, pause, resume or abort the rollout (O16)"),
    "RolloutApprovalIgnored": _r(E, "an approval names another target (an earlier "
                                 "rollout's) or another wave: it lets nothing through",
                                 "krypton rollout approve"),
    "RolloutPaused": _r(CEP, "the rollout is paused: no helm run of it starts",
                        "krypton rollout resume"),
    "RolloutResumed": _r(E, "the paused rollout goes on"),
    "RolloutRevertFailed": _r(E, "some failed releases could not be rolled back",
                              "see the Tenants' RevertFailed Events"),
    "RolloutStateConflict": _r(ERROR, "someone else wrote krypton-rollout between a read and "
                               "a write; read again on the next step"),
    "NotLeader": _r(ERROR, "the rollout state is written only by the leader"),
    # --- clusters from a ClusterProfile inventory (D10)
    "CredentialProviderUnknown": _r("Event,error", "none of a ClusterProfile's access "
                                    "providers is in --cluster-profile-providers",
                                    "add the provider to the admin's file"),
    "ClusterProfileInvalid": _r("Event,error", "a ClusterProfile's server is not an https:// "
                                "URL or its CA not a PEM bundle", "fix the profile"),
    "ClusterProfilePending": _r(ERROR, "a ClusterProfile offers no access provider yet (its "
                                "manager writes the status after the profile): not engaged, "
                                "no Event; it is looked at again when its status changes"),
    "ClusterNameClash": _r("Event,error", "a ClusterProfile has the name of a cluster Secret: "
                           "the Secret's cluster is the one engaged", "rename or remove one"),
    # --- maintenance windows (F8)
    "OutsideMaintenanceWindow": _r(CEP, "the cluster's maintenance window is closed: no "
                                   "upgrade, revert or uninstall starts until the next one "
                                   "opens (said in the message)", "wait, or widen the window"),
    "MaintenanceWindowInvalid": _r("Event,error", "a cluster Secret's maintenance-window "
                                   "annotation is not '<cron> <duration> [<time zone>]'; the "
                                   "cluster is not engaged", "fix the annotation"),
    # --- clusters (D1-D7, O4, F4)
    "KubeconfigRejected": _r("Event,plan,error", "the cluster Secret's kubeconfig is "
                             "untrusted or malformed (exec, files, bad PEM, expired)",
                             "recreate it with `krypton register-cluster`"),
    "KubeconfigLabelIgnored": _r(E, "the kubeconfig label's value is not exactly true",
                                 "set it to true"),
    "CredentialPluginFailed": _r("Event,error", "a cluster's exec credential plugin (a "
                                 "ClusterProfile provider's, a trusted kubeconfig's) failed, "
                                 "hung, or answered what is not a token",
                                 "fix the plugin or the providers file; it runs again with "
                                 "backoff"),
    "ClusterUnreachable": _r("Event,error", "API server down, wrong URL, TLS or auth failure",
                             "fix the Secret; krypton retries with backoff"),
    "ClusterAccessDenied": _r(E, "an engaged cluster's credentials stopped working",
                              "renew the kubeconfig Secret or restore the RBAC"),
    "TenantCRDMissing": _r(E, "an engaged cluster's Tenant CRD was deleted",
                           "kubectl apply -f crds/ there"),
    "ClusterRecovered": _r(E, "a failing cluster works again"),
    "WorkerFailed": _r(E, "the cluster's worker hit an unexpected error; restarted with "
                       "backoff (1 s … 5 min)", "the log line `worker failed` has the detail"),
    "DuplicateCluster": _r(E, "two Secrets reach the same API server", "delete one"),
    "ClusterNameInvalid": _r(E, "the Secret's name is over 51 characters", "use a shorter name"),
    "CRDOutdated": _r(E, "the cluster's Tenant CRD is older than krypton's",
                      "kubectl apply -f crds/mesh.openkcm.io_tenants.yaml, or "
                      "--crd-policy=upgrade"),
    "CRDCurrent": _r(E, "the cluster's Tenant CRD found outdated is krypton's now (looked "
                     "at every 10 s while outdated): its Tenants are listed again"),
    "CRDEnsureFailed": _r("Event,error", "the Tenant CRD could not be created on a cluster",
                          "kubectl apply -f crds/ there, or grant create on CRDs"),
    "CredentialsExpiringSoon": _r(E, "a cluster's client certificate expires soon",
                                  "renew the kubeconfig Secret"),
    "RecordsUnguarded": _r(CE, "the cluster's release records are not guarded at admission "
                           "(S4): a tenant admin who may write Secrets or ConfigMaps in a "
                           "Tenant's namespace can forge a release's history there",
                           "let krypton install the guard (--record-guard=install and the "
                           "RBAC for it), or apply `krypton guard --print` as an admin"),
    "RecordsGuarded": _r(CE, "the cluster's release records are guarded at admission: only "
                         "krypton's user may write them (the condition RecordsGuarded/<c>, "
                         "set by each helm run; the Event when they are guarded again)"),
    "OrphanedReleases": _r(E, "releases of a cluster name no longer discovered",
                           "remove them with the helm uninstall commands the Event gives"),
    "OrphanedReleasesGone": _r(E, "the orphaned releases reported before are gone"),
    "LeaseNotBelieved": _r(E, "a Lease claims a duration over 4 × --lease-duration or a "
                           "renewTime in the future", "find who wrote it; krypton uses its "
                           "own duration meanwhile"),
    "ClusterExists": _r(ERROR, "register-cluster would replace another cluster's Secret",
                        "--overwrite"),
    "Fenced": _r(ERROR, "leadership stale or the worker draining: nothing was started"),
    "SettingsError": _r(ERROR, "a bad flag or environment value (exit 2)", "fix the flag"),
    # --- Kubernetes API errors, as they appear in messages and logs
    "APIError": _r(ERROR, "the API server answered with an error status"),
    "BadResponse": _r(ERROR, "the API server's answer could not be read (not JSON, nested past "
                      "the parser's depth, not an API object)"),
    "TooManyObjects": _r(ERROR, "a list of a cluster passed 32 MiB, or the objects krypton "
                         "keeps of one of its collections would: the watch ends and the list "
                         "starts over on the cluster's backoff; the cluster is reported failing"),
    "ListNeverCompletes": _r(ERROR, "a list of a cluster never came to its end: the same page "
                             "token twice, over 100 pages, or a 410 on every restart; the "
                             "cluster is over its budget and backed off as a whole",
                             "look at what serves that cluster's API"),
    "TooManyPasses": _r(E, "a cluster's Tenants change faster than 20 passes a second (500 "
                        "at once): its passes wait their turn, each taking every change of "
                        "its Tenant so far", "find what edits the cluster's Tenants so often"),
    "AnswerTooLarge": _r(ERROR, "an API server's answer passed its bound as it arrived "
                         "(decompressed bytes counted; to krypton's client or to the helm "
                         "worker's, 64 MiB an answer or a watch event): refused there, and "
                         "retried on the cluster's backoff"),
    "RequestUnsendable": _r(ERROR, "a request krypton built holds a line break in a header or "
                            "its path: a defect of krypton's, not the cluster's",
                            "report it, with the log line"),
    "NotFound": _r(ERROR, "404 from the API server"),
    "AlreadyExists": _r(ERROR, "409 on create"),
    "Conflict": _r(ERROR, "409 on a conditional write; read again and retried"),
    "Gone": _r(ERROR, "410: a watch's resourceVersion expired; relisted"),
    "Forbidden": _r(ERROR, "401/403: credentials or RBAC", "fix the rights"),
}

FATAL = frozenset(name for name, r in REASONS.items() if r.fatal)
CHART = frozenset(name for name, r in REASONS.items() if r.chart)
