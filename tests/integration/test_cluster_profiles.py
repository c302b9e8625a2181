"""D10: clusters from ClusterProfiles (sigs.k8s.io/cluster-inventory-api), reached with the
exec plugins of the admin's providers file. The plugin is the tests' own
(``token_plugin.py``): real ServiceAccount tokens of the remote cluster, said to expire
within seconds and revoked soon after, so that rotation is exercised for real."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from krypton.testing.operator import OperatorProcess, wait_for

from .conftest import Cluster, Fleet, unique
from .test_cli import krypton, run_flags

GROUP, VERSION, PLURAL = "multicluster.x-k8s.io", "v1alpha1", "clusterprofiles"
PLUGIN = Path(__file__).with_name("token_plugin.py")
GARBAGE = "s3cr3t-not-a-credential"
CLAIMED = 20  # seconds each token is said to last (it is revoked 40 s after it came)


@pytest.fixture(scope="module")
def profile_crd(home_cluster: Cluster, testbin: Path) -> None:
    """The ClusterProfile CRD of the pinned cluster-inventory-api, as its Go module ships it
    (hack/testbin.sh)."""
    crd, = (testbin / "crds").glob("clusterprofiles-*.yaml")
    kubectl = [str(testbin / "kubectl"), "--kubeconfig", str(home_cluster.cp.kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", str(crd)], check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "--for", "condition=established", "--timeout", "60s",
                    f"crd/{PLURAL}.{GROUP}"], check=True, capture_output=True)


@pytest.fixture
def account(remote_cluster: Cluster) -> str:
    """A ServiceAccount of the remote cluster with cluster-admin, in a namespace of its own
    (where the plugin's bound Secrets go)."""
    name = f"fleet-{uuid.uuid4().hex[:6]}"
    remote_cluster.ensure_namespace(name)
    remote_cluster.core.create_namespaced_service_account(name, {"metadata": {"name": name}})
    client.RbacAuthorizationV1Api(remote_cluster.api).create_cluster_role_binding({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": name}]})
    return name


def providers_file(tmp_path: Path, remote: Cluster, account: str) -> Path:
    """The admin's file: the token plugin, one that hangs, one that prints garbage."""
    def shell(name: str, script: str) -> dict[str, Any]:
        return {"name": name, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
            "args": ["-c", f"echo run >> {tmp_path}/{name}.runs; {script}"]}}

    path = tmp_path / "providers.yaml"
    path.write_text(yaml.safe_dump({"providers": [
        {"name": "test-tokens", "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
            "args": [str(PLUGIN)], "provideClusterInfo": True,
            "env": [{"name": "ADMIN", "value": str(remote.cp.kubeconfig)},
                    {"name": "NAMESPACE", "value": account}, {"name": "ACCOUNT", "value": account},
                    {"name": "CLAIMED", "value": str(CLAIMED)},
                    {"name": "RUNS", "value": str(tmp_path / "test-tokens.runs")}]}},
        shell("hang", "exec sleep 3600"),
        shell("garbage", f"echo {GARBAGE}"),
    ]}))
    return path


def server_and_ca(cluster: Cluster) -> tuple[str, str]:
    doc = yaml.safe_load(cluster.cp.kubeconfig.read_text())
    entry = doc["clusters"][0]["cluster"]
    return entry["server"], entry["certificate-authority-data"]


def write_profile(fleet: Fleet, name: str, provider: str, server: str, ca: str) -> None:
    """A ClusterProfile as a cluster manager writes one: its spec, then its status."""
    custom = fleet.home.custom
    custom.create_namespaced_custom_object(GROUP, VERSION, fleet.discovery_ns, PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterProfile",
        "metadata": {"name": name, "labels": {"x-k8s.io/cluster-manager": "tests"}},
        "spec": {"clusterManager": {"name": "tests"}, "displayName": name}})
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, fleet.discovery_ns, PLURAL,
                                                 name, {"status": {"accessProviders": [{
                                                     "name": provider, "cluster": {
                                                         "server": server,
                                                         "certificate-authority-data": ca}}]}})


def event(cluster: Cluster, fleet: Fleet, name: str, reason: str, words: str,
          timeout: float = 60) -> Any:
    """The Event on profile `name` with `reason` whose message says `words`."""
    return wait_for(lambda: next((e for e in cluster.events(fleet.discovery_ns, name)
                                  if e.reason == reason and words in (e.message or "")), None),
                    timeout, what=f"{reason} ({words}) on {name}")


def runs(tmp_path: Path, provider: str) -> list[str]:
    path = tmp_path / f"{provider}.runs"
    return path.read_text().splitlines() if path.exists() else []


def start(fleet: Fleet, providers: Path) -> OperatorProcess:
    return fleet.start("--cluster-profiles", "--cluster-profile-providers", str(providers),
                       "--cluster-profile-selector", "x-k8s.io/cluster-manager=tests")


def test_a_profiles_cluster_keeps_reconciling_across_token_expiries_and_leaves_with_it(
        fleet: Fleet, profile_crd: None, account: str, tmp_path: Path) -> None:
    server, ca = server_and_ca(fleet.remote)
    # named as the other tests name this cluster: the releases it leaves are theirs in kind,
    # not orphans of an undiscovered name for the operators that follow
    write_profile(fleet, "remote", "test-tokens", server, ca)
    providers = providers_file(tmp_path, fleet.remote, account)
    op = start(fleet, providers)
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 60,
             what="the profile's cluster engaged")
    ns = fleet.tenant_ns
    fleet.remote.wait_phase(ns, fleet.tenant(fleet.remote, unique("first")), "Ready")
    assert set(runs(tmp_path, "test-tokens")) == {server}  # told the profile's server
    # Tenants keep coming, one after the other, across three expiries of krypton's token:
    # each is installed (helm runs the plugin itself) and its status written (krypton's own
    # client, which asks the plugin again once four fifths of a token's life are over)
    deadline = time.monotonic() + 4 * CLAIMED + 60
    installed = 0
    while op.metric("krypton_credential_plugin_runs_total", cluster="remote", result="ok") < 4:
        assert time.monotonic() < deadline, "krypton's token was not renewed three times"
        fleet.remote.wait_phase(ns, fleet.tenant(fleet.remote, unique("next")), "Ready")
        installed += 1
    assert installed >= 3  # Tenants kept coming all along
    assert op.metric("krypton_credential_plugin_runs_total", result="failed") == 0
    assert op.metric("krypton_cluster_engaged", cluster="remote") == 1
    # a krypton that kept a token longer would have been refused (it is revoked 40 s after
    # it came) before asking for the next: no request was refused, no pass failed
    assert op.metric("krypton_credential_plugin_runs_total", cluster="remote",
                     why="refused") == 0
    assert op.metric("krypton_credential_plugin_runs_total", cluster="remote",
                     why="expiring") >= 3
    assert op.metric("krypton_reconcile_errors_total", cluster="remote") == 0

    # `krypton status` names the source; it runs only the plugins of the user's own file
    flags = [*run_flags(fleet), "--cluster-profiles", "--cluster-profile-selector",
             "x-k8s.io/cluster-manager=tests"]
    status = krypton(fleet, "status", *flags, "--cluster-profile-providers", str(providers),
                     "-o", "json")
    # the Tenants' rows (the shared cluster may also have a row of orphans other tests left)
    rows = [r for r in json.loads(status.stdout) if r["cluster"] == "remote" and r["tenant"]]
    assert len(rows) == installed + 1 and {r["source"] for r in rows} == {"ClusterProfile"}, \
        status.stdout
    assert {r["phase"] for r in rows} == {"Ready"}
    assert "SOURCE" in krypton(fleet, "status", *flags, "--cluster-profile-providers",
                               str(providers)).stdout.splitlines()[0]
    blind = krypton(fleet, "plan", *flags)
    row, = (r for r in blind.stdout.splitlines() if r.startswith("remote"))
    assert "ClusterProfile" in row and "--cluster-profile-providers" in row

    fleet.home.custom.delete_namespaced_custom_object(GROUP, VERSION, fleet.discovery_ns,
                                                      PLURAL, "remote")
    wait_for(lambda: 'cluster="remote"' not in op.metrics_text(), 30,
             what="the profile's cluster disengaged and forgotten")
    wait_for(lambda: op.metric("krypton_engaged_clusters") == 0, 30, what="no cluster left")


def test_a_profile_krypton_cannot_use_says_why_and_the_fleet_works_on(
        fleet: Fleet, profile_crd: None, account: str, tmp_path: Path) -> None:
    fleet.register("remote", fleet.remote)  # a Secret's cluster: the rest of the fleet
    op = start(fleet, providers_file(tmp_path, fleet.remote, account))
    ns = fleet.tenant_ns
    fleet.remote.wait_phase(ns, fleet.tenant(fleet.remote, unique("before")), "Ready")
    server, ca = server_and_ca(fleet.remote)
    write_profile(fleet, "unknown", "nobody-has-it", server, ca)
    write_profile(fleet, "garbage", "garbage", server, ca)
    write_profile(fleet, "hangs", "hang", server, ca)
    write_profile(fleet, "twice", "test-tokens", server, ca)  # the Secret's API server
    write_profile(fleet, "remote", "test-tokens", server, ca)  # the Secret's name
    home = fleet.home
    unknown = event(home, fleet, "unknown", "CredentialProviderUnknown", "nobody-has-it")
    assert "test-tokens" in unknown.message
    # each was seen first without its status (its manager writes that after it): pending,
    # not refused, so no Event said it offered none
    assert not [e for e in home.events(fleet.discovery_ns) if "offers no" in (e.message or "")
                or "(none)" in (e.message or "")]
    assert unknown.involved_object.kind == "ClusterProfile"
    garbage = event(home, fleet, "garbage", "CredentialPluginFailed", "not JSON")
    assert GARBAGE not in garbage.message
    twice = home.wait_event(fleet.discovery_ns, "twice", "DuplicateCluster", timeout=60)
    assert "engaged cluster remote" in twice.message
    clash = home.wait_event(fleet.discovery_ns, "remote", "ClusterNameClash")
    assert clash.involved_object.kind == "ClusterProfile"
    event(home, fleet, "hangs", "CredentialPluginFailed", "no answer within 30s", timeout=90)
    # the rest of the fleet works on, the Secret's cluster keeps its name
    fleet.remote.wait_phase(ns, fleet.tenant(fleet.remote, unique("after")), "Ready")
    assert op.metric("krypton_cluster_engaged", cluster="remote") == 1
    for name in ("unknown", "garbage", "hangs", "twice"):
        assert op.metric("krypton_cluster_engaged", cluster=name) == 0, name
    # quiet when failing: the broken plugins run again on a growing schedule, not per request
    first = len(runs(tmp_path, "garbage"))
    wait_for(lambda: op.metric("krypton_credential_plugin_runs_total", cluster="garbage",
                               result="failed") >= first + 1, 60, what="a later run")
    assert len(runs(tmp_path, "garbage")) <= 8, runs(tmp_path, "garbage")
    assert len(runs(tmp_path, "hang")) <= 3
    assert GARBAGE not in op.log_text()
    # `krypton status` says which profiles fail and why, from the operator's Events
    status = krypton(fleet, "status", *run_flags(fleet), "--cluster-profiles",
                     "--cluster-profile-selector", "x-k8s.io/cluster-manager=tests", "-o", "json")
    failing = {r["cluster"]: r["detail"] for r in json.loads(status.stdout)
               if r["phase"] == "Failing"}
    assert failing["garbage"].startswith("CredentialPluginFailed: "), status.stdout
    assert failing["twice"].startswith("DuplicateCluster: ")
    assert "remote" not in failing
