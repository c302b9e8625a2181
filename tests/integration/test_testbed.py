"""The test bed itself: real control planes, real helm, a real chart repository."""

from __future__ import annotations

import asyncio
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from pyhelm3.command import Command

from krypton.testing import ControlPlane


def api_for(cp: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cp.kubeconfig))


def test_control_planes_use_both_credential_kinds(home: ControlPlane, remote: ControlPlane) -> None:
    home_user = home.kubeconfig_dict()["users"][0]["user"]
    remote_user = remote.kubeconfig_dict()["users"][0]["user"]
    assert set(home_user) == {"client-certificate-data", "client-key-data"}
    assert set(remote_user) == {"token"}
    for cp in (home, remote):
        version = client.VersionApi(api_for(cp)).get_code()
        assert version.git_version == "v1.34.4"


def test_chart_repository_serves_an_index(chart_repo: object) -> None:
    with urllib.request.urlopen(f"{chart_repo.url}/index.yaml") as resp:  # type: ignore[attr-defined]
        index = yaml.safe_load(resp.read())
    versions = sorted(e["version"] for e in index["entries"]["sample"])
    assert versions == ["0.1.0", "0.2.0", "0.3.0"]


def test_helm_installs_the_test_chart_on_remote(remote: ControlPlane, chart_repo: object,
                                                helm_bin: str, tmp_path: Path) -> None:
    api = api_for(remote)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "smoke"}})
    kubeconfig = tmp_path / "remote.kubeconfig"
    kubeconfig.write_text(remote.kubeconfig.read_text())
    kubeconfig.chmod(0o600)
    helm = Command(executable=helm_bin, kubeconfig=kubeconfig)
    result = asyncio.run(helm.install_or_upgrade(
        "smoke", "sample", {"data": {"hello": "world"}}, repo=chart_repo.url,  # type: ignore[attr-defined]
        version="0.2.0", namespace="smoke", wait=True, timeout="60s"))
    assert result["info"]["status"] == "deployed"

    cm = core.read_namespaced_config_map("smoke", "smoke")
    assert cm.data == {"chartVersion": "0.2.0", "hello": "world"}
    records = core.list_namespaced_secret("smoke", label_selector="owner=helm,name=smoke").items
    assert [(s.metadata.labels["status"], s.metadata.labels["version"]) for s in records] == \
        [("deployed", "1")]


def test_stop_leaves_no_process(testbin: Path) -> None:
    cp = ControlPlane("leakcheck", testbin).start()
    pids = cp.pids
    workdir = cp.workdir
    assert len(pids) == 2
    cp.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not workdir.exists()


def test_apiserver_restart_keeps_data(testbin: Path) -> None:
    with ControlPlane("restart", testbin, auth="token").start() as cp:
        core = client.CoreV1Api(api_for(cp))
        core.create_namespace({"metadata": {"name": "kept"}})
        cp.stop_apiserver()
        cp.restart_apiserver()
        core = client.CoreV1Api(api_for(cp))
        assert core.read_namespace("kept").metadata.name == "kept"


NODE_MONITOR_GRACE = 50.0  # kube-controller-manager's default in Kubernetes 1.34 (not set here)


def test_simulated_nodes_and_pods_stay_ready_past_the_grace_periods(simulated: ControlPlane
                                                                    ) -> None:
    """T7: across three node-monitor grace periods every simulated node stays
    Ready (kwok renews its Lease as a kubelet does) and a running pod stays Ready; the pod
    is scheduled by ``kubernetes.io/os: linux``, as real charts select nodes."""
    import concurrent.futures
    import datetime as dt
    import time
    import uuid

    from kubernetes import watch

    from krypton.testing.operator import wait_for

    api = api_for(simulated)
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = f"long-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": ns}})
    labels = {"app": "long"}
    apps.create_namespaced_deployment(ns, {
        "metadata": {"name": "long"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeSelector": {"kubernetes.io/os": "linux"},
                     "containers": [{"name": "c", "image": "busybox"}]}}}})

    def ready(obj: Any) -> bool:
        return any(c.type == "Ready" and c.status == "True"
                   for c in obj.status.conditions or [])

    def pod_ready() -> list[str]:
        pods = core.list_namespaced_pod(ns, label_selector="app=long").items
        return [p.metadata.name for p in pods if ready(p)]

    wait_for(pod_ready, 60, what="the pod Ready")
    # every change of the nodes and of the pod across three grace periods, as the API server
    # sends it: a NotReady node or pod at any moment of the window is seen, not only at a
    # sample; the window's length is what the test is about, not a wait for something
    window = int(3 * NODE_MONITOR_GRACE + 10)
    started = time.monotonic()

    def not_ready(list_call: Any, **kw: Any) -> list[str]:
        seen = []
        for event in watch.Watch().stream(list_call, timeout_seconds=window, **kw):
            obj = event["object"]
            if event["type"] == "DELETED" or not ready(obj):
                seen.append(f"{time.monotonic() - started:.0f}s {event['type']} "
                            f"{obj.kind or ''} {obj.metadata.name}")
        return seen

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        nodes = pool.submit(not_ready, core.list_node, label_selector="type=kwok")
        pods = pool.submit(not_ready, core.list_namespaced_pod, namespace=ns,
                           label_selector="app=long")
        bad = nodes.result() + pods.result()
    assert time.monotonic() - started >= 3 * NODE_MONITOR_GRACE  # the whole window watched
    assert not bad, bad
    assert len(pod_ready()) == 1
    # each node's Lease (named after it) is renewed, within a kubelet's 40 s
    leases = client.CoordinationV1Api(api).list_namespaced_lease("kube-node-lease").items
    renewed = {lease.metadata.name: lease.spec.renew_time for lease in leases}
    now = dt.datetime.now(dt.UTC)
    for node in core.list_node(label_selector="type=kwok").items:
        assert node.metadata.name in renewed, sorted(renewed)
        assert (now - renewed[node.metadata.name]).total_seconds() < 45
    core.delete_namespace(ns)
