"""H1: Helm 4 is the default; releases that krypton made with Helm 3 are taken over by krypton
on Helm 4 without an upgrade, and upgraded by Helm 4 when the fingerprint changes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from krypton.app.config import resolve_helm
from krypton.testing.operator import OperatorProcess, wait_for

from .conftest import Cluster, Fleet, unique


def _start(fleet: Fleet, helm_dir: Path, version: str = "0.2.0") -> OperatorProcess:
    # Helm 3 is served by the helm binary only; Helm 4 by the default engine, the worker
    engine = ["--helm-engine=cli"] if helm_dir.name == "lane-helm3" else []
    op = OperatorProcess([*fleet.args(version=version), *engine], helm_dir=helm_dir)
    fleet.operators.append(op)
    op.start()
    op.wait_ready()
    return op


def _apply_operations(cluster: Cluster, namespace: str, name: str) -> set[str]:
    """How helm wrote the release's ConfigMap: "Update" (client-side apply, Helm 3 and Helm 4
    on releases made that way) or "Apply" (server-side apply, Helm 4 installs)."""
    cm = cluster.core.read_namespaced_config_map(name, namespace)
    return {m.operation for m in cm.metadata.managed_fields or [] if m.manager == "helm"}


def _helm_runs(op: OperatorProcess) -> float:
    return (op.metric("krypton_helm_processes_total", operation="install")
            + op.metric("krypton_helm_processes_total", operation="upgrade"))


def test_the_default_helm_is_helm_4_one_pin_for_the_bed_and_the_worker(testbin: Path,
                                                                      tools: Path) -> None:
    """Helm 4.3.2 (SPEC H1, S7): the bed's helm binary and the worker's library are one pin,
    hack/testbin.sh's HELM_VERSION (hack/helmworker.sh refuses a go.mod naming another)."""
    script = (Path(__file__).resolve().parents[2] / "hack" / "testbin.sh").read_text()
    pin = re.search(r'^HELM_VERSION="\$\{HELM_VERSION:-(v[^}]+)\}"$', script, re.M)
    assert pin is not None and pin[1] == "v4.3.2", pin
    version = subprocess.run([str(tools / "helm"), "version", "--template", "{{.Version}}"],
                             capture_output=True, text=True, check=True).stdout
    assert version == pin[1]
    worker = subprocess.run([resolve_helm("krypton-helmworker"), "--version"],
                            capture_output=True, text=True, check=True).stdout
    assert worker.strip().endswith(f"helm {pin[1]}"), worker
    helm3 = subprocess.run([str(tools / "helm3"), "version", "--template", "{{.Version}}"],
                           capture_output=True, text=True, check=True).stdout
    assert helm3.startswith("v3.19.")


def test_helm3_releases_are_taken_over_by_helm4(fleet: Fleet, tools: Path) -> None:
    fleet.register("remote", fleet.remote)
    op = _start(fleet, tools / "lane-helm3")
    names = [fleet.tenant(fleet.remote, unique("mig")) for _ in range(3)]
    for name in names:
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
        assert _apply_operations(fleet.remote, name, f"tenant-{name}-remote") == {"Update"}
    op.stop()

    # krypton on Helm 4: every Tenant is looked at once, nothing is installed or upgraded
    op = _start(fleet, tools)
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="remote") >= len(names), 60,
             what="a pass per Tenant")
    fresh = fleet.tenant(fleet.remote, unique("new"))
    fleet.remote.wait_phase(fleet.tenant_ns, fresh, "Ready")
    assert _apply_operations(fleet.remote, fresh, f"tenant-{fresh}-remote") == {"Apply"}
    assert _helm_runs(op) == 1  # the new Tenant's install only
    for name in names:
        assert fleet.remote.release_records(name, f"tenant-{name}-remote") == [(1, "deployed")]
    op.stop()

    # a chart bump: Helm 4 upgrades the Helm 3 releases (keeping their client-side apply)
    op = _start(fleet, tools, version="0.3.0")
    for name in names:
        release = f"tenant-{name}-remote"
        wait_for(lambda r=release, n=name: fleet.remote.release_records(n, r) ==
                 [(1, "superseded"), (2, "deployed")], 90, what=f"{release} upgraded")
        cm = fleet.remote.core.read_namespaced_config_map(release, name)
        assert cm.data["chartVersion"] == "0.3.0"
        fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterReady/remote", "True",
                                    "Upgraded")
