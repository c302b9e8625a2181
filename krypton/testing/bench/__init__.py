"""``make bench``: krypton's performance on the local test bed (SPEC P1).

Writes ``bench/results.json`` and prints a table:

(a) seconds until N Tenants on each of 2 clusters are Ready (N = 50, 200), releases/second;
(b) a no-op resync of the 200 x 2 fleet: helm processes, API requests and API writes made by
    the operator (its own counters), and its CPU seconds;
(c) seconds to roll a chart version bump through 200 x 2;
(d) peak RSS, idle CPU and OS threads with M engaged clusters (M = 10, 100, 1000 Secrets
    pointing at the two control planes under different names);
(e) p50/p95 latency from Secret creation to cluster engaged and from Tenant creation to the
    helm install starting;
(f) starvation: p50/p95 Tenant created -> helm install started on healthy clusters of a
    100-cluster fleet, with 10 of them pointing at a loopback listener that accepts TCP and
    never answers, against the same fleet with no dead cluster; Lease renewals missed;
(g) SIGTERM during 20 running helm installs: seconds to exit, helm processes left, and
    releases left pending once a restarted operator has converged;
(h) sharding: 3 replicas serving 30 clusters (with the default Lease settings): seconds from a
    replica's SIGKILL until every one of its clusters is engaged by another (p50/p95 over
    several kills), seconds from a SIGTERM until its clusters are engaged elsewhere, and how
    many clusters move when a fourth replica joins;
(i) real waiting: on two clusters with simulated nodes (kwok), a chart whose pod takes 20 s to
    become Ready, 100 Tenants x 2 clusters: seconds until all are Ready, then seconds until a
    chart version bump (which rolls every pod) is Ready everywhere, with CPU and memory;
    part ``w`` measures the same with ``--helm-wait=true`` (not run by default: minutes).

(x) on request: krypton and Flux's source-controller and helm-controller (built by
    hack/flux.sh) taking turns on the same bed and chart, N releases x 2 clusters for each N of
    KRYPTON_BENCH_FLUX_N (200,500), KRYPTON_BENCH_FLUX_TURNS times (1): (a) and (c) for krypton,
    then for Flux N HelmReleases made before the controllers start, as (a) makes its Tenants,
    seconds until all are Ready, then a chart version bump. Each reports CPU per release, the
    peak PSS of its tree, the API writes and the control planes' CPU; then krypton's ratios
    to Flux, per turn and their medians. Flux's HelmReleases share one HelmChart by their
    chartRef, the bump editing it (KRYPTON_BENCH_FLUX_CHART=shared), or each has a chart
    template of its own, the bump editing each (=each). KRYPTON_BENCH_FLUX_PROFILE=defaults
    runs Flux at its own defaults (kstatus wait, client-side OpenAPI validation); =matched
    sets disableWait and disableOpenAPIValidation on install and upgrade, as krypton's
    defaults pass helm no wait and no client-side validation.

(s) on request: the fleet's shape, KRYPTON_BENCH_SHAPE_M (40) cluster names of the two control
    planes, 2 Tenants each (spec.clusterRef): seconds until Ready and a chart bump, with CPU
    per release and peak memory, where each cluster's helm serves only a few releases and
    more clusters have helm work than helm workers may run. Every name of a control plane
    sees all its Tenants and says NotTargeted on those of the others (M/2 conditions on
    each Tenant, M^2/2 status writes in all): at 200 names that, not helm, is the run.

(p) on request: (a) and (c) at KRYPTON_BENCH_PROXIED_N (200) x 2 with both clusters reached
    through a CONNECT proxy on loopback (krypton.testing.tunnel): their kubeconfigs name the
    API servers kubernetes.default.svc, which only the proxy resolves, and HTTPS_PROXY names
    the proxy to the operator and its helm.

(a) and (c) also report CPU per release (operator and helm, milliseconds) and the peak memory
of the operator's process tree (the operator, its helm processes or workers) while they run: the sum
of RSS, which counts the helm binary's shared pages once per process, and the sum of PSS,
which shares them out (what the tree costs the node).

Figures only: nothing here passes or fails on timing.
"""
