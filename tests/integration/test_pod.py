"""krypton as its chart deploys it (SPEC T5, O5, O6, D6): the chart-rendered container args and
env, the chart's ServiceAccount and RBAC only, service-account files at the in-cluster path of a
private mount namespace, the chart's non-root user, a token rotated under the running operator.

Each mode gets a fresh pair of control planes, so the cluster-wide operator sees no Tenant of
another test. The home API server writes an audit log: every request the operator (and the
helm it runs) made under its ServiceAccount is checked for 401 and 403 answers.
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from krypton.testing import ControlPlane
from krypton.testing.image import Image, archive, unpack
from krypton.testing.operator import wait_for
from krypton.testing.pod import SA_DIR, PodOperator

from .conftest import Cluster, unique

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """The image ``make image`` built (``make test`` builds it first), unpacked once."""
    path = archive()
    if not path.exists():
        pytest.fail(f"{path} is missing: run make image (make test does)")
    return unpack(path, tmp_path_factory.mktemp("image"))


@pytest.fixture
def clusters(testbin: Path) -> Iterator[tuple[Cluster, Cluster]]:
    with ControlPlane("pod-home", testbin, auth="cert", controller_manager=True,
                      audit=True).start() as home, \
            ControlPlane("pod-remote", testbin, auth="token").start() as remote:
        yield Cluster("home", home), Cluster("remote", remote)


def chart_values(repo_url: str, version: str, **more: Any) -> dict[str, Any]:
    return {"chart": {"repo": repo_url, "name": "sample", "version": version},
            "helm": {"timeout": "60s"}, **more}


def release_records(cluster: Cluster, namespace: str, release: str) -> list[tuple[int, str]]:
    """Helm release records as the chart's default driver (configmap) stores them."""
    items = cluster.core.list_namespaced_config_map(
        namespace, label_selector=f"owner=helm,name={release}").items
    return sorted((int(c.metadata.labels["version"]), c.metadata.labels["status"]) for c in items)


def register(home: Cluster, name: str, remote: Cluster, namespace: str) -> None:
    """`krypton register-cluster`, as an administrator types it."""
    subprocess.run([sys.executable, "-m", "krypton", "register-cluster", name,
                    "--kubeconfig", str(remote.cp.kubeconfig), "--namespace", namespace,
                    "--watch-kubeconfig", str(home.cp.kubeconfig)], check=True,
                   capture_output=True, text=True)


def page_status(op: PodOperator, token: str | None) -> int:
    """The status of the fleet page (SPEC O16) for a request with `token`."""
    conn = http.client.HTTPConnection("127.0.0.1", op.web_port, timeout=10)
    try:
        conn.request("GET", "/rows.json", headers={"Authorization": f"Bearer {token}"}
                     if token else {})
        return conn.getresponse().status
    finally:
        conn.close()


def jti(token: str) -> str:
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"])


def used_token(cp: ControlPlane, user: str, token_id: str, agent: str) -> bool:
    """Whether `user` made a request with the token `token_id` from a client whose user
    agent starts with `agent` (the API server records the token's id with each request):
    krypton/<version> for the operator's own requests, Helm/... for helm's."""
    return any(f"JTI={token_id}" in ((e["user"].get("extra") or {})
                                     .get("authentication.kubernetes.io/credential-id") or [])
               and (e.get("userAgent") or "").startswith(agent)
               for e in cp.audit_events(user))


def refusals(cp: ControlPlane, user: str) -> list[str]:
    """Requests the API server refused: 403 for `user`, and every 401 (an unusable token
    arrives without a user)."""
    out = []
    for e in cp.audit_events():
        code = (e.get("responseStatus") or {}).get("code")
        who = (e.get("user") or {}).get("username")
        uri = str(e.get("requestURI"))
        if "/configmaps?dryRun=All" in uri and e.get("verb") == "create":
            continue  # the guard's probe (SPEC S4): its refusal is the answer krypton wants
        if code == 401 or (code == 403 and who == user):
            out.append(f"{code} {e.get('verb')} {e.get('requestURI')} by {who} "
                       f"({e.get('userAgent')})")
    return out


def tenant_flow(op: PodOperator, values: dict[str, Any], home: Cluster, remote: Cluster,
                tenant_ns: str, release_ns: Callable[[str], str], testbin: Path) -> None:
    """Self cluster and a registered remote: install, rotate the token, upgrade by a chart
    bump (a new pod, as `helm upgrade` of the operator chart makes), delete."""
    discovery = op.namespace
    secret = wait_for(lambda: home.core.read_namespaced_secret("self-cluster", discovery), 30,
                      what="self-cluster Secret")
    self_kc = yaml.safe_load(base64.b64decode(secret.data["kubeconfig"]))
    # the pod's service account by reference, never a copy of its token
    assert self_kc["users"][0]["user"] == {"tokenFile": f"{SA_DIR}/token"}
    register(home, "remote", remote, discovery)

    a, b = unique("alpha"), unique("beta")
    for cluster, name in ((home, a), (remote, b)):
        wait_for(lambda c=cluster, n=name: c.create_tenant(tenant_ns, n), 60,
                 what=f"Tenant CRD on {cluster.name}")
    # Tenant -> (where it lives, the name krypton knows that cluster by)
    placed = {a: (home, "self-cluster"), b: (remote, "remote")}
    for name, (cluster, known_as) in placed.items():
        release = f"tenant-{name}-{known_as}"
        cluster.wait_phase(tenant_ns, name, "Ready")
        assert release_records(cluster, release_ns(name), release) == [(1, "deployed")]

    lease = client.CoordinationV1Api(home.api).read_namespaced_lease(
        "krypton-leader", values.get("watchNamespace") or op.namespace)
    assert lease.spec.holder_identity.startswith(f"{op.pod_name}_")  # <pod>_<random>, as client-go

    # Token rotation: the kubelet writes a new token and the old one stays valid for a
    # while. Once the operator's own client has moved to the new one (it re-reads the file
    # about once a minute), the old one is revoked; a new Tenant is then installed on the
    # self cluster: helm runs with the pod's token file too.
    old = op.token
    new = op.rotate_token(revoke_previous=False)
    wait_for(lambda: used_token(home.cp, op.username, jti(new), "krypton/"), 150,
             what="the operator's client using the rotated token")
    op.revoke_token(old)
    c = unique("gamma")
    home.create_tenant(tenant_ns, c)
    home.wait_phase(tenant_ns, c, "Ready")
    assert used_token(home.cp, op.username, jti(new), "Helm")
    placed[c] = (home, "self-cluster")
    op.stop()

    bumped = PodOperator(home.cp, bin_dir=testbin, namespace=op.namespace, image=op.image,
                         values={**values, "chart": {**values["chart"], "version": "0.3.0"}})
    try:
        bumped.start()
        bumped.wait_ready()
        for name, (cluster, known_as) in placed.items():
            release = f"tenant-{name}-{known_as}"
            cluster.wait_condition(tenant_ns, name, f"ClusterReady/{known_as}", "True",
                                   "Upgraded")
            assert release_records(cluster, release_ns(name), release) == [
                (1, "superseded"), (2, "deployed")]
        for name, (cluster, _known_as) in placed.items():
            cluster.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1",
                                                           tenant_ns, "tenants", name)
        for name, (cluster, known_as) in placed.items():
            release = f"tenant-{name}-{known_as}"
            wait_for(lambda c=cluster, n=name, r=release: not release_records(c, release_ns(n), r),
                     60, what=f"release {release} uninstalled")
        assert not bumped.log_events("worker failed")
        assert refusals(home.cp, op.username) == []
    finally:
        bumped.stop()


def test_cluster_wide_chart_install(clusters: tuple[Cluster, Cluster], chart_repo: Any,
                                    testbin: Path, image: Image) -> None:
    home, remote = clusters
    values = chart_values(chart_repo.url, "0.2.0", web={"enabled": True, "auth": "kubernetes"})
    op = PodOperator(home.cp, bin_dir=testbin, values=values, namespace="krypton-system",
                     image=image)
    try:
        op.start()
        op.wait_ready()
        # the fleet page asks the home cluster who a token is, as the chart's RBAC allows
        assert page_status(op, None) == 401
        assert page_status(op, op.token) == 200
        home.ensure_namespace("team-a")
        remote.ensure_namespace("team-a")
        # releases go to a namespace named after each Tenant (R5)
        tenant_flow(op, values, home, remote, "team-a", lambda name: name, testbin)
    finally:
        op.stop()


def test_namespaced_chart_install_needs_only_roles(clusters: tuple[Cluster, Cluster],
                                                   chart_repo: Any, testbin: Path,
                                                   image: Image) -> None:
    home, remote = clusters
    values = chart_values(chart_repo.url, "0.2.0", watchNamespace="team-n")
    op = PodOperator(home.cp, bin_dir=testbin, values=values, namespace="krypton-n",
                     image=image)
    kinds = {o["kind"] for o in op.objects}
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    try:
        home.ensure_namespace("team-n")
        remote.ensure_namespace("team-n")
        # CRDs lead: applied once per cluster by an administrator (the chart's crds/ on home)
        subprocess.run([str(testbin / "kubectl"), "--kubeconfig", str(remote.cp.kubeconfig),
                        "apply", "-f", str(ROOT / "crds")], check=True, capture_output=True)
        op.start()
        op.wait_ready()
        # every release lives in the watch namespace
        tenant_flow(op, values, home, remote, "team-n", lambda _name: "team-n", testbin)
    finally:
        op.stop()
