"""SPEC F5b, T7: a chart with the shapes of real ones (a kept CRD in templates/, a
fixed-name IngressClass and webhook configuration, a pre-install hook Job, a LoadBalancer
Service) installed into three Tenants of one cluster at once, on simulated nodes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from krypton.testing import ControlPlane
from krypton.testing.operator import kubeconfig_secret, wait_for
from tests.integration.conftest import Cluster, Fleet

pytestmark = pytest.mark.helm3lane  # also run on Helm 3 (make test-helm3)

CRD = ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "gadgets.shared.krypton.test")
INGRESS_CLASS = ("networking.k8s.io", "v1", "ingressclasses", "krypton-shared")
WEBHOOK = ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
           "krypton-shared-webhook")


@pytest.fixture(scope="module")
def fresh(testbin: Path) -> Iterator[Cluster]:
    """A cluster of its own with two simulated nodes: the chart's fixed-name objects of
    another test are not there."""
    with ControlPlane("shared", testbin, auth="token", nodes=2, pod_ready_delay=0.5).start() as cp:
        yield Cluster("fresh", cp)


def owner(cluster: Cluster, what: tuple[str, str, str, str]) -> str | None:
    """The release a cluster-scoped object's annotations name; None when it is absent."""
    group, version, plural, name = what
    try:
        obj = client.CustomObjectsApi(cluster.api).get_cluster_custom_object(
            group, version, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    annotations = obj["metadata"].get("annotations") or {}
    return f"{annotations.get('meta.helm.sh/release-namespace')}/" \
           f"{annotations.get('meta.helm.sh/release-name')}"


def start(fleet: Fleet, *extra: str) -> Any:
    return fleet.start("--max-concurrent-reconciles", "4", *extra, chart="shared",
                       version="1.0.0")


def test_one_release_holds_the_shared_objects_and_the_way_out_is_named(fleet: Fleet,
                                                                         fresh: Cluster) -> None:
    ns = fleet.tenant_ns
    fresh.ensure_namespace(ns)
    names = [f"sh{i}-{uuid.uuid4().hex[:4]}" for i in range(3)]
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, kubeconfig_secret(
        "fresh", fresh.cp.kubeconfig.read_text(), namespace=fleet.discovery_ns))
    op = start(fleet)
    # the three Tenants at once: their first installs run in parallel, as on a new cluster
    fresh.add_tenant(ns, names[0])
    for name in names[1:]:
        fresh.create_tenant(ns, name)
    first, second, third = names
    releases = {n: f"tenant-{n}-fresh" for n in names}
    fresh.wait_phase(ns, first, "Ready", timeout=180)
    for name in (second, third):
        refused = fresh.wait_condition(ns, name, "ClusterError/fresh", "True", "SharedObjects")
        assert "IngressClass krypton-shared" in refused["message"]
        assert f"{first}/{releases[first]}" in refused["message"] or \
            f"Tenant {ns}/{first}" in refused["message"]
        assert 'see the docs, "Shared objects and charts with CRDs"' in refused["message"]
        assert fresh.release_records(name, releases[name]) == []  # never installed
    for what in (CRD, INGRESS_CLASS, WEBHOOK):
        assert owner(fresh, what) == f"{first}/{releases[first]}"
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    op.stop()

    # the owner goes: its IngressClass and webhook with it, its CRD is kept, naming a
    # release that no longer exists; the next Tenant is told so, and how to take it over
    op = start(fleet)
    fresh.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1", ns, "tenants",
                                                 first)
    wait_for(lambda: owner(fresh, INGRESS_CLASS) is None, 120, what="the owner uninstalled")
    assert owner(fresh, CRD) == f"{first}/{releases[first]}"  # kept, its release gone
    orphaned = fresh.wait_condition(ns, second, "ClusterError/fresh", "True", "SharedObjects",
                                    timeout=60)
    wait_for(lambda: "which no longer exists" in (fresh.condition(
        ns, second, "ClusterError/fresh") or {}).get("message", ""), 60,
        what="the gone owner named")
    orphaned = fresh.condition(ns, second, "ClusterError/fresh") or orphaned
    assert "CustomResourceDefinition gadgets.shared.krypton.test" in orphaned["message"]
    assert "--adopt-orphaned-objects" in orphaned["message"]
    op.stop()

    # allowed to adopt: the first Tenant now (the second created) takes it over, once
    op = start(fleet, "--adopt-orphaned-objects")
    fresh.wait_phase(ns, second, "Ready", timeout=180)
    adopted = fresh.wait_event(ns, second, "SharedObjectsAdopted")
    assert "CustomResourceDefinition gadgets.shared.krypton.test" in adopted.message
    for what in (CRD, INGRESS_CLASS, WEBHOOK):
        assert owner(fresh, what) == f"{second}/{releases[second]}"
    assert fresh.condition(ns, third, "ClusterError/fresh")["reason"] == "SharedObjects"
    # a Tenant added later is refused, and nothing under the live release is touched
    late = f"late-{uuid.uuid4().hex[:4]}"
    fresh.create_tenant(ns, late)
    refused = fresh.wait_condition(ns, late, "ClusterError/fresh", "True", "SharedObjects")
    assert f"owned by release {second}/{releases[second]}" in refused["message"]
    assert owner(fresh, INGRESS_CLASS) == f"{second}/{releases[second]}"
    hook_jobs = client.BatchV1Api(fresh.api).list_namespaced_job(second).items
    assert hook_jobs == []  # the pre-install hook completed and was deleted (hook-succeeded)
