"""Prometheus metrics of the operator (SPEC O3), in one place so names stay consistent."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

RECONCILES = Counter("krypton_reconciles_total", "Tenant reconciles", ["cluster"])
RECONCILE_ERRORS = Counter("krypton_reconcile_errors_total", "Tenant reconciles that failed",
                           ["cluster", "reason"])
RECONCILE_SECONDS = Histogram("krypton_reconcile_duration_seconds", "Duration of a reconcile",
                              ["cluster"])
QUEUE_DEPTH = Gauge("krypton_workqueue_depth", "Tenant keys waiting in a cluster's queue",
                    ["cluster"])
ENGAGED = Gauge("krypton_engaged_clusters", "Clusters with a running worker")
CLUSTER_ENGAGED = Gauge("krypton_cluster_engaged", "1 when the cluster is engaged", ["cluster"])
TENANTS_READY = Gauge("krypton_tenants_ready", "Tenants Ready on a cluster", ["cluster"])
WORKLOADS_FOLLOWED = Gauge("krypton_workloads_followed",
                           "Releases whose workload krypton is waiting for (not ready yet, "
                           "followed by watches)", ["cluster"])
SHARD_MEMBERS = Gauge("krypton_shard_members", "Live replicas sharing the fleet (--sharding)")
SHARD_OWNED = Gauge("krypton_shard_clusters_owned",
                    "Clusters whose Lease this replica holds (--sharding)")
SHARD_HANDOVERS = Counter("krypton_shard_handovers_total",
                          "Cluster Leases this replica took or released (--sharding)",
                          ["direction"])
TENANTS_ERROR = Gauge("krypton_tenants_error", "Tenants in Error on a cluster", ["cluster"])
HELM_SECONDS = Histogram("krypton_helm_operation_duration_seconds", "helm operations",
                         ["operation", "result"],
                         buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300))
HELM_RUNS = Counter("krypton_helm_processes_total", "helm processes started", ["operation"])
API_REQUESTS = Counter("krypton_api_requests_total", "Kubernetes API requests made",
                       ["cluster", "verb"])
API_WRITES = Counter("krypton_api_writes_total", "API writes made by reconciles",
                     ["cluster", "kind"])
TENANT_RELEASE = Gauge(
    "krypton_tenant_release_info",
    "1 per Tenant x cluster: its release, chart version and fingerprint",
    ["cluster", "namespace", "tenant", "release", "chart_version", "fingerprint"],
)
BUILD = Info("krypton_build", "krypton version")
ROLLOUT_WAVE = Gauge("krypton_rollout_wave", "Wave of the progressive rollout in progress (1-based)")
ROLLOUT_HALTED = Gauge("krypton_rollout_halted", "1 while the progressive rollout is halted")
WORKER_FAILURES = Counter("krypton_worker_failures_total",
                          "Cluster workers that ended with an unexpected error (then restarted)",
                          ["cluster"])
CLUSTER_HEALTHY = Gauge("krypton_cluster_healthy",
                        "1 while an engaged cluster can be watched; 0 after an access failure "
                        "(401/403, CRD deleted) until a list succeeds again", ["cluster"])
CRD_OUTDATED = Gauge("krypton_cluster_crd_outdated",
                     "1 while the cluster's Tenant CRD is older than krypton's (fields it lacks "
                     "are dropped by the API server)", ["cluster"])
WATCH_RELISTS = Counter("krypton_watch_relists_total",
                        "Full lists after a watch's resourceVersion expired (410 Gone)",
                        ["cluster", "watch"])
LEASE_NOT_BELIEVED = Gauge("krypton_lease_not_believed",
                           "1 while a Lease says what krypton does not believe (a duration over "
                           "4 times its own, a renewTime in the future) and is judged with "
                           "krypton's own duration instead", ["lease"])
RELEASES_STALLED = Gauge("krypton_releases_stalled",
                         "Releases whose helm runs failed more than --max-retries times for "
                         "the same target (RetriesExhausted): no helm run until it changes",
                         ["cluster"])
ORPHANED_RELEASES = Gauge("krypton_orphaned_releases",
                          "Releases on the cluster made for a cluster name no longer discovered "
                          "(a renamed or removed cluster Secret)", ["cluster"])
LEASE_HOLDER = Gauge("krypton_lease_holder",
                     "1 for the holder of the leader Lease while this replica stands by "
                     "(the series of an earlier holder is removed)", ["lease", "holder"])
EVENT_LOOP_LAG = Gauge("krypton_event_loop_lag_seconds",
                       "How late the event loop's heartbeat ran last (0 when on time)")

_PER_CLUSTER = (RECONCILES, RECONCILE_ERRORS, RECONCILE_SECONDS, QUEUE_DEPTH, CLUSTER_ENGAGED,
                TENANTS_READY, TENANTS_ERROR, API_REQUESTS, API_WRITES, TENANT_RELEASE,
                WORKER_FAILURES, CLUSTER_HEALTHY, WATCH_RELISTS, CRD_OUTDATED, WORKLOADS_FOLLOWED,
                ORPHANED_RELEASES, RELEASES_STALLED)


def forget_cluster(cluster: str) -> None:
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
