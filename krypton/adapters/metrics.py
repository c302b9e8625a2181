"""Prometheus metrics of the operator (SPEC O3), in one place so names stay consistent."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

RECONCILES = Counter("krypton_reconciles_total", "Reconcile passes", ["cluster"])
RECONCILE_ERRORS = Counter("krypton_reconcile_errors_total", "Passes that ended in an error",
                           ["cluster", "reason"])
RECONCILE_SECONDS = Histogram("krypton_reconcile_duration_seconds", "Histogram of pass durations",
                              ["cluster"])
QUEUE_DEPTH = Gauge("krypton_workqueue_depth", "Keys waiting",
                    ["cluster"])
ENGAGED = Gauge("krypton_engaged_clusters", "Clusters with a running, engaged worker")
CLUSTER_ENGAGED = Gauge("krypton_cluster_engaged",
                        "1 while engaged, 0 from discovery until then (unreachable, refused, "
                        "failing)", ["cluster"])
TENANTS_READY = Gauge("krypton_tenants_ready", "Tenants in phase Ready on the cluster", ["cluster"])
WORKLOADS_FOLLOWED = Gauge("krypton_workloads_followed",
                           "Releases applied without helm's wait whose workload is not ready yet, "
                           "followed by watches", ["cluster"])
SHARD_MEMBERS = Gauge("krypton_shard_members", "Live replicas sharing the fleet (`--sharding`)")
SHARD_OWNED = Gauge("krypton_shard_clusters_owned",
                    "Clusters whose Lease this replica holds (`--sharding`)")
SHARD_HANDOVERS = Counter("krypton_shard_handovers_total",
                          "Cluster Leases this replica took (`taken`) or released (`released`)",
                          ["direction"])
TENANTS_ERROR = Gauge("krypton_tenants_error", "Tenants in phase Error on the cluster", ["cluster"])
HELM_SECONDS = Histogram("krypton_helm_operation_duration_seconds", "Histogram per helm operation",
                         ["operation", "result"],
                         buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300))
HELM_RUNS = Counter("krypton_helm_processes_total", "Helm runs started (a helm process, or a "
                    "request to a cluster's helm worker)", ["operation"])
HELM_WORKERS = Gauge("krypton_helm_workers", "Helm worker processes running")
HELM_WORKER_EXITS = Counter("krypton_helm_worker_exits_total", "Helm workers that ended "
                            "other than by being stopped, by reason", ["cluster", "reason"])
API_REQUESTS = Counter("krypton_api_requests_total",
                       "Kubernetes API requests made (list pages and watch connections included)",
                       ["cluster", "verb"])
API_WRITES = Counter("krypton_api_writes_total", "API writes (status, tenant, namespace, event)",
                     ["cluster", "kind"])
TENANTS_REMEMBERED = Gauge("krypton_tenants_remembered",
                           "Tenants the cluster's runtime keeps a memory of (those in its "
                           "Tenant cache; it returns there when Tenants go)", ["cluster"])
TENANT_RECORDS = Gauge("krypton_tenant_records",
                       "Deprecated: the same as krypton_tenants_remembered, under the name it "
                       "had before (a release record is helm's)", ["cluster"])
DEPRECATED = frozenset({"krypton_tenant_records"})  # exported for old dashboards, not shown
TENANT_RELEASE = Gauge(
    "krypton_tenant_release_info",
    "1 per Tenant \u00d7 cluster; newer_version: a newer chart in the repository, which the "
    "settings do not take (\"\" when none is)",
    ["cluster", "namespace", "tenant", "release", "chart_version", "fingerprint",
     "newer_version"],
)
CREDENTIAL_PLUGIN_RUNS = Counter("krypton_credential_plugin_runs_total",
                                 "Runs of a cluster's exec credential plugin, by result (ok, "
                                 "failed) and why it ran (first; expiring: four fifths of the "
                                 "token's life over; refused: the API server refused the "
                                 "token before that)", ["cluster", "result", "why"])
WINDOW_OPEN = Gauge("krypton_cluster_maintenance_window_open",
                    "1 while the cluster's maintenance window is open (or it has none), 0 while "
                    "it is closed: no upgrade, revert or uninstall starts there", ["cluster"])
BUILD = Info("krypton_build", "1, with krypton's and Python's version")
ROLLOUT_WAVE = Gauge("krypton_rollout_wave", "Wave of the progressive rollout in progress (1-based)")
ROLLOUT_HALTED = Gauge("krypton_rollout_halted", "1 while the progressive rollout is halted")
ROLLOUT_AWAITING = Gauge("krypton_rollout_awaiting_approval",
                         "1 while a wave of the progressive rollout waits for a person's "
                         "approval (krypton rollout approve)")
ROLLOUT_PAUSED = Gauge("krypton_rollout_paused",
                       "1 while the progressive rollout is paused (krypton rollout pause)")
ROLLOUT_FAILURE_BUDGET = Gauge("krypton_rollout_failure_budget",
                               "The failure budget of the wave in progress (or of the one that "
                               "halted): failures used and allowed, in --rollout-failure-unit",
                               ["count", "unit"])
ROLLOUT_GATE = Gauge("krypton_rollout_gate",
                     "The metric gate's last evaluation for a cluster of a soaking wave: 1 "
                     "passed, 0 failed, -1 unanswered", ["cluster"])
ROLLOUT_GATE_EVALUATIONS = Counter("krypton_rollout_gate_evaluations",
                                   "Metric gate evaluations by result", ["cluster", "result"])
WORKER_FAILURES = Counter("krypton_worker_failures_total",
                          "Workers that ended with an unexpected error (each restarted)",
                          ["cluster"])
CLUSTER_HEALTHY = Gauge("krypton_cluster_healthy",
                        "1 while an engaged cluster can be watched, 0 after `ClusterAccessDenied`"
                        " / `TenantCRDMissing`, an answer refused (`AnswerTooLarge`, "
                        "`BadResponse`, `TooManyObjects`, `ListNeverCompletes`) or "
                        "`ClusterUnreachable` for longer than two --api-timeout, until a list "
                        "or watch is accepted again (after a refused answer: until the cluster "
                        "is within its budget again)",
                        ["cluster"])
CRD_OUTDATED = Gauge("krypton_cluster_crd_outdated",
                     "1 while the cluster's Tenant CRD is older than krypton's (`CRDOutdated`)", ["cluster"])
RECORDS_GUARDED = Gauge("krypton_cluster_records_guarded",
                        "1 while the cluster's release records are guarded at admission (only "
                        "krypton's user may write them), 0 while `RecordsUnguarded`", ["cluster"])
WATCH_RELISTS = Counter("krypton_watch_relists_total",
                        "Full lists after a watch's resourceVersion expired (410 Gone), e.g. "
                        "after an API server restart",
                        ["cluster", "watch"])
LEASE_NOT_BELIEVED = Gauge("krypton_lease_not_believed",
                           "1 while a Lease says what krypton does not believe (a duration over 4 \u00d7 "
                           "`--lease-duration`, a `renewTime` in the future) and is judged with "
                           "krypton's own duration", ["lease"])
RECORDS_ADOPTED = Counter("krypton_records_adopted_total",
                          "Release records krypton kept no seal of, adopted by their content "
                          "(`ReleaseRecordAdopted`, SPEC S6)", ["cluster"])
RELEASES_YIELDED = Counter("krypton_releases_yielded_total",
                           "Passes that left a release to another krypton instance at work, "
                           "which wrote it (`AnotherWriter`, SPEC S6)", ["cluster"])
RELEASES_STALLED = Gauge("krypton_releases_stalled",
                         "Releases whose helm runs failed more than `--max-retries` times for one "
                         "target (`RetriesExhausted`)",
                         ["cluster"])
ORPHANED_RELEASES = Gauge("krypton_orphaned_releases",
                          "Releases on the cluster made for a cluster name no longer discovered "
                          "(`OrphanedReleases`)", ["cluster"])
LEASE_HOLDER = Gauge("krypton_lease_holder",
                     "1 for the holder of the leader Lease while this replica stands by", ["lease", "holder"])
PASSES_HELD = Counter("krypton_cluster_passes_held_total",
                      "Passes that waited for their cluster's pass rate (S5, `TooManyPasses`)",
                      ["cluster"])
EVENT_LOOP_LAG = Gauge("krypton_event_loop_lag_seconds",
                       "How late the event loop's heartbeat ran last")

_PER_CLUSTER = (RECONCILES, RECONCILE_ERRORS, RECONCILE_SECONDS, QUEUE_DEPTH, CLUSTER_ENGAGED,
                TENANTS_READY, TENANTS_ERROR, API_REQUESTS, API_WRITES, TENANT_RELEASE,
                WORKER_FAILURES, CLUSTER_HEALTHY, WATCH_RELISTS, CRD_OUTDATED, WORKLOADS_FOLLOWED,
                ORPHANED_RELEASES, RELEASES_STALLED, ROLLOUT_GATE, ROLLOUT_GATE_EVALUATIONS,
                TENANTS_REMEMBERED, TENANT_RECORDS, WINDOW_OPEN, CREDENTIAL_PLUGIN_RUNS, RECORDS_GUARDED,
                PASSES_HELD, HELM_WORKER_EXITS, RECORDS_ADOPTED, RELEASES_YIELDED)


def drop_cluster(cluster: str) -> None:
    """Drop every series of a cluster that is no longer discovered (its Secret is gone)."""
    for metric in _PER_CLUSTER:
        for sample_labels in _label_sets(metric):
            if sample_labels and sample_labels[0] == cluster:
                try:
                    metric.remove(*sample_labels)
                except KeyError:
                    pass


def _label_sets(metric: Counter | Gauge | Histogram) -> set[tuple[str, ...]]:
    """The label values of every child of `metric`, from its public samples (a histogram's
    bucket samples add an ``le`` label, which is not one of the metric's own)."""
    return {tuple(v for k, v in sample.labels.items() if k != "le")
            for family in metric.collect() for sample in family.samples}
