"""Cluster discovery and engagement (D1-D5): engage, disengage, bad kubeconfig Secrets."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import yaml

from krypton.testing.operator import wait_for

from .conftest import Fleet, unique


def _warnings_on_secret(fleet: Fleet, name: str) -> dict[str, str]:
    return {e.reason: e.message for e in fleet.home.events(fleet.discovery_ns, name)
            if e.type == "Warning"}


def _kubeconfig_with_user(fleet: Fleet, user: dict[str, object]) -> str:
    doc = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    doc["users"][0]["user"] = user
    return yaml.safe_dump(doc)


def test_deleting_a_secret_stops_its_worker_only(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    wait_for(lambda: op.metric("krypton_engaged_clusters") == 2, 30, what="two engaged")
    fleet.unregister("remote")
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 0, 30,
             what="remote disengaged")
    assert op.metric("krypton_engaged_clusters") == 1
    wait_for(lambda: "cluster removed from the fleet" in op.log_text(), 30, what="removal logged")
    # a Tenant on remote is no longer served, while the other cluster keeps reconciling: a
    # Tenant created on home after it is installed and Ready (a whole pass with helm, far
    # longer than a worker needs to write a first status), and the remote one has none
    orphan = fleet.tenant(fleet.remote, unique("orphan"))
    name = fleet.tenant(fleet.home, unique("still"))
    fleet.home.wait_phase(fleet.tenant_ns, name, "Ready")
    assert fleet.remote.phase(fleet.tenant_ns, orphan) is None
    # and it was only the missing worker: registered again, remote serves it
    fleet.register("remote", fleet.remote)
    fleet.remote.wait_phase(fleet.tenant_ns, orphan, "Ready")


def test_garbage_secret_gets_a_warning_and_the_fleet_is_unaffected(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.register("garbage", kubeconfig="\x00\x01 this is : not [ yaml")
    op = fleet.start()
    warnings = wait_for(lambda: _warnings_on_secret(fleet, "garbage"), 30, what="warning event")
    assert "KubeconfigRejected" in warnings
    name = fleet.tenant(fleet.remote, unique("ok"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert op.alive()
    assert op.metric("krypton_cluster_engaged", cluster="garbage") == 0


def test_exec_plugin_is_rejected_and_never_runs(fleet: Fleet, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    kubeconfig = _kubeconfig_with_user(fleet, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
        "args": ["-c", f"touch {marker}; echo '{{}}'"]}})
    fleet.register("evil", kubeconfig=kubeconfig)
    fleet.register("files", kubeconfig=_kubeconfig_with_user(
        fleet, {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}))
    op = fleet.start()
    evil = wait_for(lambda: _warnings_on_secret(fleet, "evil"), 30, what="warning on evil")
    assert "user.exec" in evil["KubeconfigRejected"]
    files = wait_for(lambda: _warnings_on_secret(fleet, "files"), 30, what="warning on files")
    assert "user.tokenFile" in files["KubeconfigRejected"]
    assert not marker.exists()
    assert "token" not in evil["KubeconfigRejected"].lower().replace("tokenfile", "")
    assert op.metric("krypton_engaged_clusters") == 0


def test_expired_and_mismatched_certificates_are_rejected(fleet: Fleet) -> None:
    cp = fleet.home.cp
    now = dt.datetime.now(dt.UTC)
    expired = cp.issue_client_cert("old", "system:masters", not_before=now - dt.timedelta(days=30),
                                   not_after=now - dt.timedelta(days=1))
    other = cp.issue_client_cert("other", "system:masters")

    def kubeconfig(cert: bytes, key: bytes) -> str:
        doc = yaml.safe_load(cp.kubeconfig.read_text())
        doc["users"][0]["user"] = {"client-certificate-data": base64.b64encode(cert).decode(),
                                   "client-key-data": base64.b64encode(key).decode()}
        return yaml.safe_dump(doc)

    fleet.register("expired", kubeconfig=kubeconfig(expired.cert, expired.key))
    fleet.register("mismatch", kubeconfig=kubeconfig(expired.cert, other.key))
    soon = cp.issue_client_cert("soon", "system:masters", not_after=now + dt.timedelta(days=3))
    fleet.register("soon", kubeconfig=kubeconfig(soon.cert, soon.key))
    op = fleet.start()
    assert "expired" in wait_for(lambda: _warnings_on_secret(fleet, "expired"), 30)[
        "KubeconfigRejected"]
    assert "does not match" in wait_for(lambda: _warnings_on_secret(fleet, "mismatch"), 30)[
        "KubeconfigRejected"]
    assert "expires" in wait_for(lambda: _warnings_on_secret(fleet, "soon"), 30)[
        "CredentialsExpiringSoon"]
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="soon") == 1, 30,
             what="soon-expiring cluster still engaged")


def test_unreachable_cluster_is_retried_with_backoff(fleet: Fleet) -> None:
    from krypton.testing import free_port

    doc = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    fleet.register("down", kubeconfig=yaml.safe_dump(doc))
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    event = wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns, "down")
                              if e.reason == "ClusterUnreachable" and e.count >= 2], 30,
                     what="aggregated unreachable events")
    assert len(event) == 1
    name = fleet.tenant(fleet.remote, unique("ok"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    attempts = sum(1 for line in op.log_text().splitlines()
                   if "cluster engagement failed" in line)
    assert attempts <= 6  # 1s, 2s, 4s, 8s ... not a hot loop


def test_changed_kubeconfig_reengages(fleet: Fleet) -> None:
    fleet.register("remote", kubeconfig=_kubeconfig_with_user(fleet, {"token": "wrong"}))
    op = fleet.start()
    wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns, "remote")
                      if e.reason == "ClusterUnreachable"], 30, what="auth failure event")
    secret = fleet.home.core.read_namespaced_secret("remote", fleet.discovery_ns)
    secret.data["kubeconfig"] = base64.b64encode(
        fleet.remote.cp.kubeconfig.read_bytes()).decode()
    fleet.home.core.replace_namespaced_secret("remote", fleet.discovery_ns, secret)
    wait_for(lambda: op.metric("krypton_cluster_engaged", cluster="remote") == 1, 30,
             what="re-engaged")
    name = fleet.tenant(fleet.remote, unique("re"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
