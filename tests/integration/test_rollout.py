"""Core rollout on two engaged clusters: install, fingerprint, quiet second pass (R3-R13)."""

from __future__ import annotations

import pytest

from krypton.decisions.charts.fingerprint import fingerprint
from krypton.testing.operator import wait_for

from .conftest import Fleet, unique

pytestmark = pytest.mark.helm3lane  # also run on Helm 3 (make test-helm3)


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


def _snapshot(fleet: Fleet, tenants: list[tuple[object, str]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for cluster, name in tenants:
        t = cluster.tenant(fleet.tenant_ns, name)  # type: ignore[attr-defined]
        out[f"{cluster.name}/{name}/rv"] = t["metadata"]["resourceVersion"]  # type: ignore[attr-defined]
        out[f"{cluster.name}/{name}/events"] = sorted(  # type: ignore[attr-defined]
            (e.reason, e.count) for e in cluster.events(fleet.tenant_ns, name))  # type: ignore[attr-defined]
    return out


def test_second_pass_changes_nothing(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    op = fleet.start("--resync-period", "2s")
    tenants = [(fleet.home, fleet.tenant(fleet.home, unique("q"))),
               (fleet.remote, fleet.tenant(fleet.remote, unique("q")))]
    for cluster, name in tenants:
        cluster.wait_phase(fleet.tenant_ns, name, "Ready")
    # let the watch echoes of our own writes settle, then take the baseline: settled means
    # two passes (a resync) made since the last write (passes go on every 2 s: they are
    # what is measured, not what settles)
    wait_for(lambda: op.metric("krypton_reconciles_total") >= 6, 30, what="passes")
    polls: list[tuple[float, float]] = []

    def settled() -> bool:
        polls.append((op.metric("krypton_reconciles_total"), op.metric("krypton_api_writes_total")))
        since = [passes for passes, writes in polls if writes == polls[-1][1]]
        return polls[-1][0] - since[0] >= 2

    wait_for(settled, 30, interval=0.5, what="echoes settled")
    before = _snapshot(fleet, tenants)
    helm_before = op.metric("krypton_helm_processes_total")
    writes_before = op.metric("krypton_api_writes_total")
    passes = op.metric("krypton_reconciles_total")
    wait_for(lambda: op.metric("krypton_reconciles_total") >= passes + 4, 30,
             what="two more resync passes per tenant")
    assert op.metric("krypton_helm_processes_total") == helm_before
    assert op.metric("krypton_api_writes_total") == writes_before
    assert _snapshot(fleet, tenants) == before


def test_version_bump_and_values_change_upgrade_every_tenant(fleet: Fleet, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    tenants = [(fleet.home, fleet.tenant(fleet.home, unique("up"))),
               (fleet.remote, fleet.tenant(fleet.remote, unique("up")))]
    for cluster, name in tenants:
        cluster.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()

    fleet.start(version="0.3.0")
    for cluster, name in tenants:
        cluster.wait_condition(fleet.tenant_ns, name, f"ClusterReady/{cluster.name}", "True",
                               "Upgraded")
        release = f"tenant-{name}-{cluster.name}"
        assert cluster.core.read_namespaced_config_map(release, name).data["chartVersion"] == \
            "0.3.0"
        assert cluster.release_records(name, release) == [(1, "superseded"), (2, "deployed")]
    fleet.operators[-1].stop()

    values = tmp_path / "values.yaml"
    values.write_text("data:\n  colour: blue\n")
    fleet.start("--chart-values-file", str(values), version="0.3.0")
    expected = fingerprint(fleet.chart_repo.url, "sample", "0.3.0", {"data": {"colour": "blue"}})
    for cluster, name in tenants:
        release = f"tenant-{name}-{cluster.name}"
        wait_for(lambda c=cluster, n=name, r=release:
                 c.core.read_namespaced_config_map(r, n).data.get("colour") == "blue", 60,
                 what="values rendered")
        wait_for(lambda c=cluster, n=name: c.tenant(fleet.tenant_ns, n)["metadata"]["annotations"]
                 [f"mesh.openkcm.io/fingerprint-{c.name}"] == expected, 30, what="fingerprint")
        assert cluster.release_records(name, release)[-1] == (3, "deployed")


def test_kubectl_wait_for_ready(fleet: Fleet, kubectl_bin: str) -> None:
    import subprocess

    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("kw"))
    result = subprocess.run(
        [kubectl_bin, "--kubeconfig", str(fleet.remote.cp.kubeconfig), "-n", fleet.tenant_ns,
         "wait", "--for=condition=Ready", f"tenant/{name}", "--timeout=90s"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "condition met" in result.stdout
