"""Operating krypton (R14, O3, O4, O5, O9): finalizer, health and metrics, leader election,
several namespaced instances side by side, graceful shutdown."""

from __future__ import annotations

import base64
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from krypton.testing.operator import OperatorProcess, wait_for

from .conftest import Fleet, unique


def _gone(fn) -> bool:  # type: ignore[no-untyped-def]
    try:
        fn()
        return False
    except client.exceptions.ApiException as exc:
        return exc.status == 404


def test_delete_uninstalls_then_removes_the_finalizer(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("del"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    tenant = fleet.remote.tenant(fleet.tenant_ns, name)
    assert "mesh.openkcm.io/release-cleanup" in tenant["metadata"]["finalizers"]
    fleet.remote.custom.delete_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name)
    wait_for(lambda: _gone(lambda: fleet.remote.tenant(fleet.tenant_ns, name)), 60,
             what="tenant gone")
    assert fleet.remote.release_records(name, release) == []
    # the namespace is kept by default
    assert fleet.remote.core.read_namespace(name).status.phase == "Active"


def test_failed_uninstall_keeps_the_finalizer(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("stuck"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    record = f"sh.helm.release.v1.{release}.v1"
    # A corrupted release record makes the real helm fail to uninstall.
    fleet.remote.core.patch_namespaced_secret(record, name, {"data": {
        "release": base64.b64encode(b"not a release").decode()}})
    fleet.remote.custom.delete_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name)
    wait_for(lambda: [e for e in fleet.remote.events(fleet.tenant_ns, name)
                      if e.reason == "HelmUninstallFailed"], 60, what="uninstall failure event")
    tenant = fleet.remote.tenant(fleet.tenant_ns, name)
    assert tenant["metadata"]["deletionTimestamp"]
    assert "mesh.openkcm.io/release-cleanup" in tenant["metadata"]["finalizers"]
    # Remove the corrupt record: the retry succeeds and the Tenant goes away.
    fleet.remote.core.delete_namespaced_secret(record, name)
    wait_for(lambda: _gone(lambda: fleet.remote.tenant(fleet.tenant_ns, name)), 90,
             what="tenant gone after retry")


def test_delete_namespace_on_uninstall(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.start("--delete-namespace-on-uninstall")
    name = fleet.tenant(fleet.home, unique("nsdel"))
    fleet.home.wait_phase(fleet.tenant_ns, name, "Ready")
    fleet.home.custom.delete_namespaced_custom_object(
        "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", name)
    # kube-controller-manager runs on home, so namespace deletion completes
    wait_for(lambda: _gone(lambda: fleet.home.core.read_namespace(name)), 90,
             what="namespace deleted")


def test_health_and_metrics_during_a_run(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("m"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    base = f"http://127.0.0.1:{op.health_port}"
    assert urllib.request.urlopen(f"{base}/healthz").read() == b"ok"
    # ready, and what each helm process may use of the pod's memory (SPEC S7; the bed's
    # cgroup, where it sets a limit, wins over --memory-limit)
    ready, helm = urllib.request.urlopen(f"{base}/readyz").read().decode().splitlines()
    assert ready == "ok" and helm.startswith("helm: 4 at once, ") and " MiB each " in helm, helm
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{base}/nope")
    fp = fleet.remote.tenant(fleet.tenant_ns, name)["status"]["clusters"]["remote"]["fingerprint"]
    wait_for(lambda: op.metric("krypton_tenants_ready", cluster="remote") >= 1, 15,
             what="ready gauge")
    text = op.metrics_text()
    assert (f'krypton_tenant_release_info{{chart_version="0.2.0",cluster="remote",'
            f'fingerprint="{fp}",namespace="{fleet.tenant_ns}",'
            # the repository has 0.3.0, which the pin to 0.2.0 does not take
            f'newer_version="0.3.0",release="tenant-{name}-remote",tenant="{name}"}} 1.0') in text
    for metric in ("krypton_reconciles_total", "krypton_reconcile_duration_seconds_bucket",
                   "krypton_workqueue_depth", "krypton_engaged_clusters",
                   "krypton_tenants_error", "krypton_helm_operation_duration_seconds_bucket"):
        assert metric in text
    assert op.metric("krypton_helm_operation_duration_seconds_count", operation="install",
                     result="success") == 1
    assert op.stop() == 0  # SIGTERM: graceful exit with status 0


def _lease_holder(fleet: Fleet, namespace: str, name: str) -> str:
    lease = client.CoordinationV1Api(fleet.home.api).read_namespaced_lease(name, namespace)
    return lease.spec.holder_identity or ""


def _renew_time(fleet: Fleet, namespace: str, name: str) -> object:
    lease = client.CoordinationV1Api(fleet.home.api).read_namespaced_lease(name, namespace)
    return lease.spec.renew_time


def test_leader_election_standby_takes_over(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    lease = unique("lease")
    args = ("--leader-elect", "--leader-election-id", lease, "--lease-duration", "6s",
            "--renew-deadline", "4s", "--retry-period", "1s")
    first = fleet.start(*args)
    wait_for(lambda: _lease_holder(fleet, fleet.tenant_ns, lease), 30, what="a leader")
    second = fleet.start(*args)
    # the standby waits while the leader renews: two renewals after it started means it had
    # at least one attempt of its own (--retry-period 1s) and lost it
    holder = _lease_holder(fleet, fleet.tenant_ns, lease)
    wait_for(lambda: f"standby: leader Lease {fleet.tenant_ns}/{lease} held by {holder}"
             in second.readyz(), 30, what="standby naming the holder")
    seen: set[object] = set()

    def renewed_twice() -> bool:
        seen.add(_renew_time(fleet, fleet.tenant_ns, lease))
        return len(seen) >= 3

    wait_for(renewed_twice, 30, what="two renewals by the leader")
    leaders = [op for op in (first, second) if "became leader" in op.log_text()]
    assert leaders == [first]
    name = fleet.tenant(fleet.remote, unique("le"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert "cluster engaged" not in second.log_text()
    # kill -9 the leader: the standby takes over within the lease duration (+ retry period)
    first.kill()
    killed_at = time.monotonic()
    wait_for(lambda: "became leader" in second.log_text(), 20, interval=0.1,
             what="standby takes over")
    assert time.monotonic() - killed_at < 6 + 2 + 1
    other = fleet.tenant(fleet.remote, unique("le2"))
    fleet.remote.wait_phase(fleet.tenant_ns, other, "Ready")
    # SIGTERM releases the lease
    assert second.stop() == 0
    assert _lease_holder(fleet, fleet.tenant_ns, lease) == ""


def test_two_namespaced_instances_side_by_side(fleet: Fleet) -> None:
    ns_a, ns_b = fleet.tenant_ns, unique("team-b")
    for c in (fleet.home, fleet.remote):
        c.ensure_namespace(ns_b)
    disc_b = unique("disc-b")
    fleet.home.ensure_namespace(disc_b)
    fleet.register("remote", fleet.remote)
    fleet.home.core.create_namespaced_secret(disc_b, {
        "metadata": {"name": "remote", "namespace": disc_b,
                     "labels": {"sigs.k8s.io/multicluster-runtime-kubeconfig": "true"}},
        "data": {"kubeconfig": base64.b64encode(fleet.remote.cp.kubeconfig.read_bytes()).decode()}})
    a = fleet.start("--leader-elect", "--leader-election-id", "krypton")
    args_b = [x for x in fleet.args("--leader-elect", "--leader-election-id", "krypton",
                                    version="0.3.0")]
    args_b[args_b.index(fleet.discovery_ns)] = disc_b
    args_b[args_b.index(ns_a)] = ns_b
    b = OperatorProcess(args_b, helm_dir=fleet.testbin).start()
    fleet.operators.append(b)
    b.wait_ready()
    ta = fleet.tenant(fleet.remote, unique("a"))
    tb = unique("b")
    fleet.remote.create_tenant(ns_b, tb)
    fleet.remote.wait_phase(ns_a, ta, "Ready")
    fleet.remote.wait_phase(ns_b, tb, "Ready")
    # each instance installed only its own Tenants, with its own chart version
    assert fleet.remote.tenant(ns_a, ta)["status"]["clusters"]["remote"]["chartVersion"] == "0.2.0"
    assert fleet.remote.tenant(ns_b, tb)["status"]["clusters"]["remote"]["chartVersion"] == "0.3.0"
    assert a.metric("krypton_helm_processes_total", operation="install") == 1
    assert b.metric("krypton_helm_processes_total", operation="install") == 1
    # distinct leases, each in its instance's watch namespace
    assert _lease_holder(fleet, ns_a, "krypton") and _lease_holder(fleet, ns_b, "krypton")
    # a change to each Tenant makes each instance pass again; still no cross-talk afterwards
    passes = (a.metric("krypton_reconciles_total"), b.metric("krypton_reconciles_total"))
    for ns, name in ((ns_a, ta), (ns_b, tb)):
        fleet.remote.patch_tenant(ns, name, {"metadata": {"annotations": {"touched": "1"}}})
    wait_for(lambda: a.metric("krypton_reconciles_total") > passes[0]
             and b.metric("krypton_reconciles_total") > passes[1], 30, what="passes after a change")
    assert fleet.remote.tenant(ns_a, ta)["status"]["clusters"]["remote"]["chartVersion"] == "0.2.0"
    assert fleet.remote.tenant(ns_b, tb)["status"]["clusters"]["remote"]["chartVersion"] == "0.3.0"
    assert a.metric("krypton_helm_processes_total", operation="install") == 1
    assert b.metric("krypton_helm_processes_total", operation="install") == 1
