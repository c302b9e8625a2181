"""O7: krypton plan, status, register-cluster and crds against the real test bed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from krypton.testing.operator import wait_for

from .conftest import Fleet, unique

ROOT = Path(__file__).resolve().parents[2]


def krypton(fleet: Fleet, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    environ = {**os.environ, "PATH": f"{fleet.testbin}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "krypton", *args], capture_output=True,
                          text=True, timeout=120, env=environ)


def run_flags(fleet: Fleet, version: str = "0.2.0") -> list[str]:
    flags = fleet.args(version=version)
    return [f for f in flags if f not in ("--resync-period", "600s", "--helm-timeout", "60s")]


def test_plan_shows_install_skip_upgrade_then_nothing(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    same = fleet.tenant(fleet.remote, unique("same"))
    drift = fleet.tenant(fleet.remote, unique("drift"))
    for name in (same, drift):
        fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    op.stop()
    new = fleet.tenant(fleet.remote, unique("new"))
    fleet.remote.patch_tenant(fleet.tenant_ns, drift, {"metadata": {"annotations": {
        "mesh.openkcm.io/fingerprint-remote": None}}})

    result = krypton(fleet, "plan", *run_flags(fleet))
    assert result.returncode == 2, result.stdout + result.stderr
    rows = {line.split()[2]: line for line in result.stdout.splitlines()[1:]}
    assert " install " in rows[new] and "- -> 0.2.0" in rows[new]
    assert " skip " in rows[same] and "NoChange" in rows[same]
    assert " annotate " in rows[drift] and "annotation missing" in rows[drift]
    as_json = json.loads(krypton(fleet, "plan", *run_flags(fleet), "-o", "json").stdout)
    assert {r["tenant"]: r["action"] for r in as_json} == {new: "install", same: "skip",
                                                           drift: "annotate"}
    bump = krypton(fleet, "plan", *run_flags(fleet, version="0.3.0"), "-o", "json")
    assert bump.returncode == 2
    assert sorted(r["action"] for r in json.loads(bump.stdout)) == ["install", "upgrade", "upgrade"]

    fleet.start()
    fleet.remote.wait_phase(fleet.tenant_ns, new, "Ready")
    wait_for(lambda: krypton(fleet, "plan", *run_flags(fleet)).returncode == 0, 60,
             what="plan exit 0 after convergence")
    # a chart version the repository lacks changes nothing, and blocks every row: not 0
    missing = krypton(fleet, "plan", *run_flags(fleet, version="9.9.9"), "-o", "json")
    assert {r["action"] for r in json.loads(missing.stdout)} == {"blocked"}
    assert missing.returncode == 2

    status = krypton(fleet, "status", *run_flags(fleet))
    assert status.returncode == 0
    lines = status.stdout.splitlines()
    assert lines[0].split()[:7] == ["CLUSTER", "NAMESPACE", "TENANT", "PHASE", "RELEASE", "CHART",
                                    "FINGERPRINT"]
    assert any(new in line and "Ready" in line and "0.2.0" in line for line in lines)
    as_yaml = yaml.safe_load(krypton(fleet, "status", *run_flags(fleet), "-o", "yaml").stdout)
    assert {r["tenant"] for r in as_yaml} == {new, same, drift}


def test_register_cluster_good_and_refused(fleet: Fleet, tmp_path: Path) -> None:
    common = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig), "--namespace",
              fleet.discovery_ns]
    ok = krypton(fleet, "register-cluster", "remote", "--kubeconfig",
                 str(fleet.remote.cp.kubeconfig), *common)
    assert ok.returncode == 0, ok.stderr
    assert "registered" in ok.stdout and "v1.34.4" in ok.stdout
    secret = fleet.home.core.read_namespaced_secret("remote", fleet.discovery_ns)
    assert secret.metadata.labels["sigs.k8s.io/multicluster-runtime-kubeconfig"] == "true"
    op = fleet.start()
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 30,
             what="registered cluster engaged")

    doc = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                        "command": "/bin/true"}}
    evil = tmp_path / "evil"
    evil.write_text(yaml.safe_dump(doc))
    refused = krypton(fleet, "register-cluster", "evil", "--kubeconfig", str(evil), *common)
    assert refused.returncode == 2
    assert "refused" in refused.stderr and "user.exec" in refused.stderr
    assert fleet.home.core.list_namespaced_secret(
        fleet.discovery_ns, field_selector="metadata.name=evil").items == []


def test_crds_prints_the_canonical_crd(fleet: Fleet) -> None:
    out = krypton(fleet, "crds")
    assert out.returncode == 0
    assert out.stdout == (ROOT / "crds" / "mesh.openkcm.io_tenants.yaml").read_text()


def test_plan_and_diff_say_what_a_change_would_change(fleet: Fleet, tmp_path: Path) -> None:
    """Issue 13: plan names what differs from what a release was made with (the repository
    URL as typed, which values keys), and diff shows the manifest change per Tenant x cluster:
    nothing for a new spelling of the same repository, the changed ConfigMap for a value."""
    fleet.register("remote", fleet.remote)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("diff"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"

    unchanged = krypton(fleet, "diff", *run_flags(fleet))
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert f"=== remote/{fleet.tenant_ns}/{name} ({release}): no change" in unchanged.stdout

    values = tmp_path / "values.yaml"
    values.write_text("data:\n  colour: blue\n")
    flags = [*run_flags(fleet), "--chart-values-file", str(values)]
    planned = json.loads(krypton(fleet, "plan", *flags, "-o", "json").stdout)
    assert [(r["tenant"], r["action"], r["change"]) for r in planned] == \
        [(name, "upgrade", "values: data.colour")]
    diff = krypton(fleet, "diff", *flags)
    assert diff.returncode == 2, diff.stdout + diff.stderr
    assert f"--- remote/{name} deployed (revision 1) ConfigMap {release}" in diff.stdout
    assert f"+++ remote/{name} next (chart 0.2.0) ConfigMap {release}" in diff.stdout
    assert "+  colour: blue" in diff.stdout

    url = fleet.chart_repo.url
    moved = url.replace("127.0.0.1", "localhost")
    assert moved != url
    respelt = [moved if f == url else f for f in run_flags(fleet)]
    planned = json.loads(krypton(fleet, "plan", *respelt, "-o", "json").stdout)
    assert [(r["action"], r["change"]) for r in planned] == [("upgrade", f"repo {url} -> {moved}")]
    same = krypton(fleet, "diff", *respelt)
    assert same.returncode == 0, same.stdout + same.stderr  # the same chart, the same manifest
