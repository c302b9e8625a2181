"""Real workloads on simulated nodes (SPEC T6): pods are scheduled by kube-scheduler onto kwok
nodes and become Ready after the configured delay; a chart with a Deployment, a Service and a
post-install hook Job is Ready only once its pods are, and fails when they never become Ready."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from kubernetes import client

from krypton.testing import ControlPlane
from krypton.testing.operator import kubeconfig_secret, wait_for

from .conftest import Cluster, Fleet, unique


def _when(text: Any) -> dt.datetime:
    return text if isinstance(text, dt.datetime) else dt.datetime.fromisoformat(str(text))


def test_pods_become_ready_after_the_configured_delay(testbin: Path) -> None:
    with ControlPlane("delay", testbin, auth="token", nodes=1, pod_ready_delay=3.0).start() as cp:
        core = Cluster("delay", cp).core
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "registry.example/x:1"}]}})

        def ready() -> dict[str, Any] | None:
            pod = core.read_namespaced_pod("p", "default")
            conds = {c.type: c for c in pod.status.conditions or []}
            if "Ready" in conds and conds["Ready"].status == "True":
                return conds
            return None
        conds = wait_for(ready, 60, what="pod Ready on a simulated node")
        scheduled = _when(conds["PodScheduled"].last_transition_time)
        became_ready = _when(conds["Ready"].last_transition_time)
        # timestamps have second resolution: a 3 s delay shows as at least 2 s
        assert (became_ready - scheduled).total_seconds() >= 2
        assert core.read_namespaced_pod("p", "default").spec.node_name == "delay-node-0"


def _register_simulated(fleet: Fleet, simulated: Any, values: str | None = None) -> Cluster:
    sim = Cluster("sim", simulated)
    sim.ensure_namespace(fleet.tenant_ns)
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, kubeconfig_secret(
        "sim", simulated.kubeconfig.read_text(), namespace=fleet.discovery_ns, values=values))
    return sim


def test_tenant_is_ready_when_its_pods_are(fleet: Fleet, simulated: Any) -> None:
    sim = _register_simulated(fleet, simulated)
    fleet.start(chart="workload", version="1.0.0")
    name = fleet.tenant(sim, unique("web"))
    release = f"tenant-{name}-sim"
    sim.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
    apps = client.AppsV1Api(sim.api)
    deployment = apps.read_namespaced_deployment(release, name)
    assert deployment.status.ready_replicas == 2  # krypton waited for the pods
    job = client.BatchV1Api(sim.api).read_namespaced_job(f"{release}-smoke", name)
    assert job.status.succeeded == 1  # the post-install hook ran to completion
    pods = sim.core.list_namespaced_pod(name).items
    assert {p.spec.node_name for p in pods if p.metadata.name.startswith(release + "-")} <= \
        {"sim-node-0", "sim-node-1"}


def test_pods_that_never_become_ready_fail_the_install_helm_waits(fleet: Fleet, simulated: Any) -> None:
    sim = _register_simulated(fleet, simulated, values="unschedulable: true\n")
    fleet.start("--helm-wait=true", "--helm-timeout", "15s", chart="workload", version="1.0.0")
    name = fleet.tenant(sim, unique("stuck"))
    cond = sim.wait_condition(fleet.tenant_ns, name, "ClusterError/sim", "True", "InstallFailed",
                              timeout=120)
    # helm 4 names the resource that was not ready before "context deadline exceeded"; the
    # message keeps it
    assert f"resource Deployment/{name}/tenant-{name}-sim not ready" in cond["message"]
    assert sim.phase(fleet.tenant_ns, name) == "Error"
    deployment = client.AppsV1Api(sim.api).read_namespaced_deployment(f"tenant-{name}-sim", name)
    assert not deployment.status.ready_replicas


def test_workload_chart_shared_objects_do_not_depend_on_the_release(helm_bin: str) -> None:
    """The chart's sharedObjects value adds a CRD and an IngressClass whose names are the same
    for every release (the shape of cert-manager's CRDs or ingress-nginx's IngressClass);
    everything else is named after the release."""
    from krypton.testing.pod import render_chart
    from tests.conftest import CHARTS

    def identities(release: str, shared: bool) -> set[tuple[str, str]]:
        docs = render_chart(helm_bin, CHARTS / "workload", release=release, namespace=release,
                            values={"sharedObjects": shared}, include_crds=False)
        return {(d["kind"], d["metadata"]["name"]) for d in docs}

    a, b = identities("tenant-a", True), identities("tenant-b", True)
    assert a & b == {("CustomResourceDefinition", "gadgets.workload.krypton.test"),
                     ("IngressClass", "krypton-test-workload")}
    assert identities("tenant-a", False) & identities("tenant-b", False) == set()


def test_a_second_tenant_is_refused_the_objects_the_first_owns(fleet: Fleet,
                                                              simulated: Any) -> None:
    """With the chart's fixed-name CRD and IngressClass on, the first Tenant on the
    cluster owns them; the second is refused with SharedObjects naming both objects and the
    owning release, before any helm install (helm would refuse it on every retry)."""
    from .test_cli import krypton

    sim = _register_simulated(fleet, simulated, values="sharedObjects: true\n")
    op = fleet.start(chart="workload", version="1.0.0")
    first = fleet.tenant(sim, unique("first"))
    sim.wait_phase(fleet.tenant_ns, first, "Ready", timeout=120)
    second = fleet.tenant(sim, unique("second"))
    c = sim.wait_condition(fleet.tenant_ns, second, "ClusterError/sim", "True", "SharedObjects")
    owner = f"release {first}/tenant-{first}-sim"  # R9: tenant-<tenant>-<cluster>, R5 namespace
    assert f"CustomResourceDefinition gadgets.workload.krypton.test (owned by {owner})" in \
        c["message"]
    assert f"IngressClass krypton-test-workload (owned by {owner})" in c["message"]
    assert sim.phase(fleet.tenant_ns, second) == "Error"
    sim.wait_event(fleet.tenant_ns, second, "SharedObjects")
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    assert sim.release_records(second, f"tenant-{second}-sim") == []
    assert second not in {ns.metadata.name for ns in sim.core.list_namespace().items}
    # the chart was rendered for the two probe releases once, for both Tenants
    assert op.metric("krypton_helm_processes_total", operation="template") == 2

    flags = [f for f in fleet.args(chart="workload", version="1.0.0")
             if f not in ("--resync-period", "600s", "--helm-timeout", "60s")]
    planned = krypton(fleet, "plan", *flags)
    row = next(line for line in planned.stdout.splitlines() if second in line)
    assert "blocked" in row and "SharedObjects" in row, planned.stdout
    assert " skip " in next(line for line in planned.stdout.splitlines() if first in line)

    # The owner goes (its uninstall deletes the objects it owned): the refused Tenant is
    # looked at again at once and installed, and now owns them.
    sim.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1", fleet.tenant_ns,
                                               "tenants", first)
    sim.wait_phase(fleet.tenant_ns, second, "Ready", timeout=120)
    crd = client.ApiextensionsV1Api(sim.api).read_custom_resource_definition(
        "gadgets.workload.krypton.test")
    assert crd.metadata.annotations["meta.helm.sh/release-name"] == f"tenant-{second}-sim"


def _set_scheduling(sim: Cluster, deployment: str, namespace: str, *, possible: bool) -> None:
    """Give the Deployment's pods a node selector no node matches, or take it away."""
    selector = None if possible else {"krypton.test/no-such-node": "true"}
    client.AppsV1Api(sim.api).patch_namespaced_deployment(
        deployment, namespace, {"spec": {"template": {"spec": {"nodeSelector": selector}}}})


def _wait_message(sim: Cluster, namespace: str, name: str, type_: str, status: str,
                  reason: str, text: str, timeout: float = 60) -> dict[str, Any]:
    def match() -> dict[str, Any] | None:
        c = sim.condition(namespace, name, type_)
        ok = c and (c["status"], c["reason"]) == (status, reason) and text in c["message"]
        return c if ok else None
    return wait_for(match, timeout, what=f"{type_}={status} {reason} saying {text!r}")


def test_readiness_is_tracked_without_helm_wait(fleet: Fleet, simulated: Any) -> None:
    """SPEC F6: with --helm-wait=false helm returns once the objects are
    applied and the hook ran; krypton then tracks the workload itself. A Deployment whose pods
    cannot be scheduled keeps the Tenant out of Ready, with WaitingForReadiness naming it,
    while no helm process is held; it is Ready once the pods are; one that stays unready past
    --helm-timeout is an error (ReadinessTimeout, phase Error), and Ready again once it
    recovers."""
    sim = _register_simulated(fleet, simulated, values="unschedulable: true\n")
    op = fleet.start("--helm-wait=false", "--helm-timeout", "20s", chart="workload",
                     version="1.0.0")
    fixed, late = fleet.tenant(sim, unique("fixed")), fleet.tenant(sim, unique("late"))
    for name in (fixed, late):
        # (the first look may find the Deployment before its controller did)
        _wait_message(sim, fleet.tenant_ns, name, "ClusterProgress/sim", "True",
                      "WaitingForReadiness",
                      f"Deployment tenant-{name}-sim in namespace {name}: 0 of 2 replicas "
                      "available")
        ready = sim.condition(fleet.tenant_ns, name, "ClusterReady/sim")
        assert ready is not None and ready["status"] == "False", ready
        # helm is done (the hook Job ran, the release is deployed): nothing holds a process
        assert sim.release_records(name, f"tenant-{name}-sim") == [(1, "deployed")]
        job = client.BatchV1Api(sim.api).read_namespaced_job(f"tenant-{name}-sim-smoke", name)
        assert job.status.succeeded == 1
    assert sim.phase(fleet.tenant_ns, fixed) == "Pending"

    _set_scheduling(sim, f"tenant-{fixed}-sim", fixed, possible=True)
    sim.wait_condition(fleet.tenant_ns, fixed, "ClusterReady/sim", "True", "WorkloadReady",
                       timeout=60)
    assert sim.phase(fleet.tenant_ns, fixed) == "Ready"
    sim.wait_event(fleet.tenant_ns, fixed, "WorkloadReady")
    # seen by the watch, well before the other one's timeout
    progress = sim.condition(fleet.tenant_ns, late, "ClusterProgress/sim")
    assert progress is not None and progress["reason"] == "WaitingForReadiness", progress

    c = sim.wait_condition(fleet.tenant_ns, late, "ClusterError/sim", "True", "ReadinessTimeout",
                           timeout=90)
    # The watch, not polling, follows the Deployment. krypton read it once after
    # helm applied it, once when the watch of Deployments started and, on a busy machine, once
    # more in a pass that came before that watch was live; a look every 5 s over the 20 s
    # until the timeout reads it at least five times (seven when this was measured).
    reads = _reads(simulated, f"/apis/apps/v1/namespaces/{late}/deployments/tenant-{late}-sim")
    assert 1 <= reads <= 3, reads
    assert f"Deployment tenant-{late}-sim in namespace {late}: 0 of 2 replicas available" in \
        c["message"], c["message"]
    assert "not ready 20s after it was applied" in c["message"]
    assert sim.phase(fleet.tenant_ns, late) == "Error"
    sim.wait_event(fleet.tenant_ns, late, "ReadinessTimeout")
    _set_scheduling(sim, f"tenant-{late}-sim", late, possible=True)
    sim.wait_condition(fleet.tenant_ns, late, "ClusterReady/sim", "True", "WorkloadReady",
                       timeout=90)
    sim.wait_phase(fleet.tenant_ns, late, "Ready")
    # one helm install per Tenant, nothing else: waiting and recovering ran no helm
    assert op.metric("krypton_helm_processes_total", operation="install") == 2
    for operation in ("upgrade", "rollback", "uninstall"):
        assert op.metric("krypton_helm_processes_total", operation=operation) == 0
    assert sim.release_records(late, f"tenant-{late}-sim") == [(1, "deployed")]


def _reads(cp: Any, path: str) -> int:
    """GETs of `path` that krypton made (helm and the test bed's controllers never GET it)."""
    return sum(1 for e in cp.audit_events() if e.get("verb") == "get"
               and e.get("requestURI") == path and e.get("stage") == "ResponseComplete"
               and not str(e.get("userAgent", "")).startswith(("Helm", "kube-")))


def test_a_workload_that_loses_its_pods_is_degraded(fleet: Fleet, simulated: Any) -> None:
    """A Tenant that was Ready whose Deployment loses its pods (its nodes
    cordoned, its pods deleted) is Degraded, the Deployment named, until the pods are back;
    krypton runs no helm for it (the release itself is as applied)."""
    sim = _register_simulated(fleet, simulated, values="hook: false\n")
    op = fleet.start("--resync-period", "3s", chart="workload", version="1.0.0")
    name = fleet.tenant(sim, unique("degr"))
    release = f"tenant-{name}-sim"
    sim.wait_phase(fleet.tenant_ns, name, "Ready", timeout=120)
    nodes = [n.metadata.name for n in sim.core.list_node().items]
    try:
        for node in nodes:
            sim.core.patch_node(node, {"spec": {"unschedulable": True}})
        sim.core.delete_collection_namespaced_pod(
            name, label_selector=f"app.kubernetes.io/instance={release}")
        c = sim.wait_condition(fleet.tenant_ns, name, "ClusterReady/sim", "False", "Degraded",
                               timeout=90)
        assert f"Deployment {release} in namespace {name}: " in c["message"], c["message"]
        assert "was ready and is not any more" in c["message"]
        assert sim.phase(fleet.tenant_ns, name) == "Error"
        error = sim.condition(fleet.tenant_ns, name, "ClusterError/sim")
        assert error is not None and (error["status"], error["reason"]) == ("True", "Degraded")
        sim.wait_event(fleet.tenant_ns, name, "Degraded")
    finally:
        for node in nodes:
            sim.core.patch_node(node, {"spec": {"unschedulable": False}})
    sim.wait_condition(fleet.tenant_ns, name, "ClusterReady/sim", "True", "WorkloadReady",
                       timeout=90)
    sim.wait_phase(fleet.tenant_ns, name, "Ready")
    assert sim.release_records(name, release) == [(1, "deployed")]
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    assert op.metric("krypton_helm_processes_total", operation="upgrade") == 0
