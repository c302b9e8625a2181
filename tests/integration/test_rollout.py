"""Core rollout on two engaged clusters: install, fingerprint, quiet second pass (R3-R13)."""

from __future__ import annotations

from krypton.fingerprint import fingerprint
from krypton.testing.operator import wait_for

from .conftest import Fleet, unique


def test_two_clusters_install_and_become_ready(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    a = fleet.tenant(fleet.home, unique("acme"))
    b = fleet.tenant(fleet.remote, unique("bolt"))
    fleet.home.wait_phase(fleet.tenant_ns, a, "Ready")
    fleet.remote.wait_phase(fleet.tenant_ns, b, "Ready")

    for cluster, name in ((fleet.home, a), (fleet.remote, b)):
        release = f"tenant-{name}-{cluster.name}"
        assert cluster.release_records(name, release) == [(1, "deployed")]
        cm = cluster.core.read_namespaced_config_map(release, name)
        assert cm.data["chartVersion"] == "0.2.0"
        ns = cluster.core.read_namespace(name)
        assert ns.metadata.labels["app.kubernetes.io/managed-by"] == "krypton"
        tenant = cluster.tenant(fleet.tenant_ns, name)
        expected = fingerprint(fleet.chart_repo.url, "sample", "0.2.0", {})
        assert tenant["metadata"]["annotations"][f"mesh.openkcm.io/fingerprint-{cluster.name}"] \
            == expected
        status = tenant["status"]
        assert status["clusters"][cluster.name]["fingerprint"] == expected
        assert status["observedGeneration"] == tenant["metadata"]["generation"]
        types = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        assert types[f"ClusterReady/{cluster.name}"] == ("True", "Installed")
        assert types[f"ClusterError/{cluster.name}"][0] == "False"
        assert types["Ready"][0] == "True"
    assert op.metric("krypton_helm_processes_total", operation="install") == 2
