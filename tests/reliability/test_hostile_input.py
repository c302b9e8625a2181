"""Hostile and broken input, against the real control planes and helm.

Each test names the class it covers; every one also checks that the operator stayed up and
that the healthy part of the fleet kept working.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from krypton.testing import free_port
from krypton.testing.operator import OperatorProcess, kubeconfig_secret, wait_for
from tests.integration.conftest import Cluster, Fleet, unique
from tests.reliability.test_bad_input import ALIAS_BOMB

CRD = "widgets.shared.krypton.test"


# -- a tiny loopback server that answers whatever a test needs ------------------------------


class Responder:
    """HTTP on 127.0.0.1 answering every GET with `body(path)`: bytes (200), None (404) or
    (status, headers, bytes); optional per-byte delay."""

    def __init__(self, body: Any, *, trickle: float = 0.0,
                 content_type: str = "application/octet-stream") -> None:
        responder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                responder.requests += 1
                data = responder.body(self.path)
                if data is None:
                    self.send_error(404)
                    return
                code, headers = 200, {}
                if isinstance(data, tuple):
                    code, headers, data = data
                self.send_response(code)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", responder.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if responder.trickle:
                        for i in range(len(data)):
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            if responder.closing.wait(responder.trickle):  # pacing
                                return
                    else:
                        self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.body, self.trickle, self.requests = body, trickle, 0
        self.closing = threading.Event()
        self.content_type = content_type
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def responders() -> Iterator[list[Responder]]:
    made: list[Responder] = []
    yield made
    for r in made:
        r.close()


# -- 2. a server answering garbage is a reason, not a crash (supervision: tests/unit) ------


def test_garbage_api_answers_are_reasons_not_crashes(fleet: Fleet,
                                                     responders: list[Responder]) -> None:
    # An "API server" that answers /version well and everything else with objects of the
    # wrong shape: the cluster is reported (BadResponse/CRDEnsureFailed) and retried.
    version = json.dumps({"major": "1", "minor": "34", "gitVersion": "v1.34.4", "gitCommit": "x",
                          "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                          "goVersion": "go1.24", "compiler": "gc",
                          "platform": "linux/amd64"}).encode()
    junk = Responder(lambda path: version if path.startswith("/version") else b"[1, 2]",
                     content_type="application/json")
    responders.append(junk)
    doc = yaml.safe_load(fleet.remote.cp.kubeconfig.read_text())
    doc["clusters"][0]["cluster"] = {"server": junk.url}
    doc["users"][0]["user"] = {}
    fleet.register("junk", kubeconfig=yaml.safe_dump(doc))
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    bad = wait_for(lambda: [e for e in fleet.home.events(fleet.discovery_ns, "junk")
                            if e.type == "Warning"], 60, what="Warning on junk")
    assert "not a Kubernetes API response" in bad[0].message, bad[0].message
    assert "cluster junk: engaging:" in op.readyz()
    ok = fleet.tenant(fleet.remote, unique("ok"))
    fleet.remote.wait_phase(fleet.tenant_ns, ok, "Ready")
    assert op.alive()


# -- 3. a bad watch-cluster configuration: one line, exit 2 ---------------------------------


def _run_operator(args: list[str], env: dict[str, str], testbin: Path) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PATH": f"{testbin}:{os.environ['PATH']}", **env}
    return subprocess.run([sys.executable, "-m", "krypton", "run", "--no-self-cluster",
                           "--health-probe-bind-address", "0", "--metrics-bind-address", "0",
                           *args], capture_output=True, text=True, timeout=60, env=environ)


def test_bad_watch_configuration_exits_2(fleet: Fleet, testbin: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_text("{{{ not a kubeconfig")
    home_kc = str(fleet.home.cp.kubeconfig)
    bad_key = kubeconfig_secret("watch-garbage", "clusters: 5\n", namespace=fleet.discovery_ns)
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, bad_key)
    cases = [
        ([], {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}, "no watch cluster"),
        (["--watch-kubeconfig", str(tmp_path / "missing")], {}, "does not exist"),
        (["--watch-kubeconfig", str(garbage)], {}, "is not usable"),
        (["--watch-kubeconfig-secret", "nope", "--namespace", fleet.discovery_ns],
         {"KUBECONFIG": home_kc}, "not found"),
        (["--watch-kubeconfig-secret", "watch-garbage", "--namespace", fleet.discovery_ns],
         {"KUBECONFIG": home_kc}, "watch-garbage"),
        # client-go merges a list; krypton reads one file and says so (S5)
        ([], {"KUBECONFIG": f"{home_kc}:{tmp_path / 'other'}"}, "$KUBECONFIG lists 2 files"),
    ]
    for args, env, fragment in cases:
        result = _run_operator(args, env, testbin)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (args, result.stderr[-2000:])
        assert len(lines) == 1 and fragment in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr


# -- 4. YAML alias bombs in every values path -----------------------------------------------


def test_alias_bomb_values_file_and_register_refused(fleet: Fleet, testbin: Path,
                                                     tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    result = _run_operator(["--chart-values-file", str(bomb)],
                           {"KUBECONFIG": str(fleet.home.cp.kubeconfig)}, testbin)
    assert result.returncode == 2 and "expands to more than" in result.stderr, result.stderr
    env = {**os.environ, "PATH": f"{testbin}:{os.environ['PATH']}"}
    reg = subprocess.run(
        [sys.executable, "-m", "krypton", "register-cluster", "bombed", "--kubeconfig",
         str(fleet.remote.cp.kubeconfig), "--values", str(bomb), "--watch-kubeconfig",
         str(fleet.home.cp.kubeconfig), "--namespace", fleet.discovery_ns],
        capture_output=True, text=True, timeout=60, env=env)
    assert reg.returncode == 2 and "expands to more than" in reg.stderr, reg.stderr
    with pytest.raises(ApiException):
        fleet.home.core.read_namespaced_secret("bombed", fleet.discovery_ns)


# -- 5, 6. hostile chart repositories --------------------------------------------------------


def _index(version: str, url: str) -> bytes:
    return yaml.safe_dump({"apiVersion": "v1", "entries": {"sample": [
        {"name": "sample", "version": version, "urls": [f"{url}/sample-{version}.tgz"]}]}}).encode()


def _chart_tgz(chart_version: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, text in (("sample/Chart.yaml", f"apiVersion: v2\nname: sample\nversion: "
                                                 f"'{chart_version}'\n"),
                           ("sample/templates/cm.yaml", "apiVersion: v1\nkind: ConfigMap\n"
                                                        "metadata: {name: x}\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _start_with_repo(fleet: Fleet, url: str, *extra: str) -> OperatorProcess:
    fleet.register("remote", fleet.remote)
    args = fleet.args(*extra)
    args[args.index("--chart-repo") + 1] = url
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    return op


@pytest.mark.parametrize("kind", ["huge", "malformed", "trickle"])
def test_hostile_chart_index(fleet: Fleet, responders: list[Responder], kind: str) -> None:
    huge = b"entries:\n  filler: [" + b"x," * (17 << 20) + b"x]\n"
    bodies = {"huge": lambda p: huge if p.endswith("index.yaml") else None,
              "malformed": lambda p: b"entries:\n  sample: {version: 1}\n",
              "trickle": lambda p: _index("0.2.0", "http://x")}
    repo = Responder(bodies[kind], trickle=1.0 if kind == "trickle" else 0.0)
    responders.append(repo)
    op = _start_with_repo(fleet, repo.url, "--chart-fetch-timeout", "3s")
    name = fleet.tenant(fleet.remote, unique("idx"))
    cond = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                       "ChartNotLoaded")
    expected = {"huge": "over the limit", "malformed": "entries.sample is not a list",
                "trickle": "did not arrive within 3s"}[kind]
    assert expected in cond["message"]
    # the failure is cached with backoff: more Tenants do not fetch the index again each
    before = repo.requests
    more = [fleet.tenant(fleet.remote, unique("idx")) for _ in range(3)]
    for m in more:
        fleet.remote.wait_condition(fleet.tenant_ns, m, "ClusterError/remote", "True",
                                    "ChartNotLoaded")
    assert repo.requests - before <= 1
    assert op.alive()
    if kind == "trickle":
        # SIGTERM while a fetch hangs: the process exits by itself, well before SIGKILL
        fleet.tenant(fleet.remote, unique("idx"))
        assert op.stop(grace=20) == 0


def test_chart_version_of_thousands_of_digits(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start(version="1" * 5000)
    name = fleet.tenant(fleet.remote, unique("digits"))
    cond = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                       "VersionInvalid")
    assert "at most 256" in cond["message"]
    assert op.alive()


def test_chart_content_cannot_escape_the_cache(fleet: Fleet, responders: list[Responder]) -> None:
    target = Path(f"/tmp/krypton-escape-{uuid.uuid4().hex[:8]}")
    evil = f"0.2.0/../../../../../../../..{target}"
    repo = Responder(lambda p: (_index("0.2.0", repo.url) if p.endswith("index.yaml")
                                else _chart_tgz(evil)))
    responders.append(repo)
    op = _start_with_repo(fleet, repo.url)
    name = fleet.tenant(fleet.remote, unique("escape"))
    cond = fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                       "ChartNotLoaded")
    assert "not '0.2.0'" in cond["message"], cond["message"]
    assert not target.exists()
    assert op.alive()


# -- 7. health and metrics servers under idle connections -----------------------------------


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_idle_connections_do_not_pile_up_threads(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    before = _threads(op.pid)
    sockets = []
    try:
        for port in (op.health_port, op.metrics_port):
            for _ in range(200):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                sockets.append(s)
        assert _threads(op.pid) < before + 5
        # still answering: the idle connections are capped and time out
        wait_for(lambda: op.readyz().startswith("ok"), 30, what="readyz under load")
        wait_for(lambda: op.metric("krypton_engaged_clusters") >= 1, 30,
                 what="the cluster engaged under load")
    finally:
        for s in sockets:
            s.close()
    assert op.alive()


# -- 10. nothing of ours left in the temp dir ------------------------------------------------


def test_start_and_stop_leave_no_temp_files(fleet: Fleet, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(fleet.home.cp.kubeconfig.read_text())
    fleet.register("remote", fleet.remote)
    args = [a for a in fleet.args() if a != "--no-self-cluster"]
    op = OperatorProcess(args, helm_dir=fleet.testbin, env={"TMPDIR": str(tmp), "HOME": str(home)})
    fleet.operators.append(op)
    op.start()
    op.wait_ready()
    name = fleet.tenant(fleet.remote, unique("tmp"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")  # a chart was pulled
    assert op.stop(grace=20) == 0
    assert sorted(p.name for p in tmp.iterdir()) == []


# -- 11. a fingerprint write that keeps failing never becomes a helm loop -------------------


def _deny_fingerprint_policy(cluster: Cluster, namespace: str, name: str) -> None:
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [{
            "apiGroups": ["mesh.openkcm.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
            "resources": ["tenants"]}]},
            "validations": [{"expression": "!has(object.metadata.annotations) || "
                             "!object.metadata.annotations.exists(k, "
                             "k.startsWith('mesh.openkcm.io/fingerprint-'))",
                             "message": "fingerprint annotations are not allowed here"}]}}
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}}
    api = cluster.custom
    for plural, obj in (("validatingadmissionpolicies", body),
                        ("validatingadmissionpolicybindings", binding)):
        api.create_cluster_custom_object("admissionregistration.k8s.io", "v1", plural, obj)


def _remove_policy(cluster: Cluster, name: str) -> None:
    for plural in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        try:
            cluster.custom.delete_cluster_custom_object("admissionregistration.k8s.io", "v1",
                                                        plural, name)
        except ApiException:
            pass


def test_failing_fingerprint_write_never_loops_helm(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    policy = f"deny-fp-{uuid.uuid4().hex[:6]}"
    _deny_fingerprint_policy(fleet.remote, fleet.tenant_ns, policy)
    try:
        probe = fleet.tenant(fleet.remote, unique("probe"),
                             annotations={"mesh.openkcm.io/paused": "true"})
        # the policy is in force once it refuses a write like ours
        wait_for(lambda: _refused(fleet.remote, fleet.tenant_ns, probe), 30, what="policy active")
        name = fleet.tenant(fleet.remote, unique("fpfail"))
        release = f"tenant-{name}-remote"
        fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True",
                                    "FingerprintUpdateFailed")
        wait_for(lambda: sum(e.count or 1 for e in fleet.remote.events(fleet.tenant_ns, name)
                             if e.reason == "FingerprintUpdateFailed") >= 3, 120,
                 what="three failed annotation writes")
        helm_runs = (op.metric("krypton_helm_processes_total", operation="install")
                     + op.metric("krypton_helm_processes_total", operation="upgrade"))
        assert helm_runs == 1
        assert fleet.remote.release_records(name, release) == [(1, "deployed")]
    finally:
        _remove_policy(fleet.remote, policy)
    # once writes work again the annotation is written; still no second helm run
    wait_for(lambda: fleet.remote.tenant(fleet.tenant_ns, name)["metadata"].get(
        "annotations", {}).get("mesh.openkcm.io/fingerprint-remote"), 360, what="annotation")
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert fleet.remote.release_records(name, release) == [(1, "deployed")]


def _refused(cluster: Cluster, namespace: str, name: str) -> bool:
    try:
        cluster.patch_tenant(namespace, name, {"metadata": {"annotations": {
            "mesh.openkcm.io/fingerprint-probe": "x"}}})
    except ApiException as exc:
        return exc.status in (403, 422)
    cluster.patch_tenant(namespace, name, {"metadata": {"annotations": {
        "mesh.openkcm.io/fingerprint-probe": None}}})
    return False


# -- 12. a cluster that leaves the fleet leaves no stale state --------------------------------


def test_removed_cluster_leaves_no_stale_state(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    op = fleet.start()
    name = fleet.tenant(fleet.remote, unique("gone"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    release = f"tenant-{name}-remote"
    assert op.metric("krypton_tenant_release_info", cluster="remote", tenant=name) == 1
    fleet.unregister("remote")

    def cleared() -> bool:
        t = fleet.remote.tenant(fleet.tenant_ns, name)
        types = {c["type"] for c in (t.get("status") or {}).get("conditions") or []}
        return (not any(x.endswith("/remote") for x in types)
                and "remote" not in ((t.get("status") or {}).get("clusters") or {})
                and "mesh.openkcm.io/fingerprint-remote" not in (t["metadata"].get("annotations")
                                                                 or {})
                and "mesh.openkcm.io/release-cleanup" not in (t["metadata"].get("finalizers")
                                                              or []))
    wait_for(cleared, 60, what="remote cleared from the Tenant")
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Pending"
    text = op.metrics_text()
    assert 'cluster="remote"' not in text
    # releases are kept: removing a cluster from the fleet uninstalls nothing
    assert fleet.remote.release_records(name, release) == [(1, "deployed")]
    # the Tenant can be deleted: no finalizer is left waiting for a worker that is gone
    fleet.remote.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1",
                                                        fleet.tenant_ns, "tenants", name)
    wait_for(lambda: fleet.remote.tenant_gone(fleet.tenant_ns, name), 30, what="Tenant deleted")
    other = fleet.tenant(fleet.home, unique("still"))
    fleet.home.wait_phase(fleet.tenant_ns, other, "Ready")


# -- 13. one API server under two names -------------------------------------------------------


def test_same_cluster_under_two_names_is_engaged_once(fleet: Fleet) -> None:
    fleet.register("remote", fleet.remote)
    fleet.register("remote-alias", fleet.remote)
    op = fleet.start()
    dup = wait_for(lambda: [e for n in ("remote", "remote-alias")
                            for e in fleet.home.events(fleet.discovery_ns, n)
                            if e.reason == "DuplicateCluster"], 60, what="DuplicateCluster")
    assert dup[0].type == "Warning" and "same API server" in dup[0].message
    loser = dup[0].involved_object.name
    winner = "remote" if loser == "remote-alias" else "remote-alias"
    name = fleet.tenant(fleet.remote, unique("dup"))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert fleet.remote.release_records(name, f"tenant-{name}-{winner}") == [(1, "deployed")]
    assert fleet.remote.release_records(name, f"tenant-{name}-{loser}") == []
    conds = {c["type"] for c in fleet.remote.tenant(fleet.tenant_ns, name)["status"]["conditions"]}
    assert not any(c.endswith(f"/{loser}") for c in conds)
    assert f"cluster {loser}: engaging: DuplicateCluster" in op.readyz()


# -- 14. namespaces krypton must not touch ---------------------------------------------------


def test_reserved_and_foreign_namespaces(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    op = fleet.start("--delete-namespace-on-uninstall")
    # a Tenant named like a system namespace or the operator's own namespace
    for reserved in ("kube-public", "default", fleet.discovery_ns):
        fleet.tenant(fleet.home, reserved)
        fleet.home.wait_condition(fleet.tenant_ns, reserved, "ClusterError/home", "True",
                                  "ReservedNamespace")
        assert fleet.home.phase(fleet.tenant_ns, reserved) == "Error"
    ns = fleet.home.core.read_namespace(fleet.discovery_ns)
    assert "mesh.openkcm.io/owner" not in (ns.metadata.annotations or {})
    assert fleet.home.core.list_namespaced_secret(fleet.discovery_ns).items
    # deleting such a Tenant deletes no namespace
    fleet.home.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1",
                                                      fleet.tenant_ns, "tenants",
                                                      fleet.discovery_ns)
    wait_for(lambda: fleet.home.tenant_gone(fleet.tenant_ns, fleet.discovery_ns), 30,
             what="reserved Tenant deleted")
    assert fleet.home.core.read_namespace(fleet.discovery_ns).status.phase == "Active"
    # an existing namespace krypton did not create is not adopted
    foreign = fleet.refused_tenant(fleet.home, "foreign")
    assert fleet.home.release_records(foreign, f"tenant-{foreign}-home") == []
    ok = fleet.tenant(fleet.home, unique("ok"))
    fleet.home.wait_phase(fleet.tenant_ns, ok, "Ready")
    assert op.alive()


def test_adopted_namespace_is_never_deleted(fleet: Fleet) -> None:
    fleet.register("home", fleet.home)
    fleet.start("--delete-namespace-on-uninstall", "--adopt-namespaces")
    foreign = unique("adopt")
    fleet.home.core.create_namespace({"metadata": {"name": foreign}})
    fleet.tenant(fleet.home, foreign)
    fleet.home.wait_phase(fleet.tenant_ns, foreign, "Ready")
    ns = fleet.home.core.read_namespace(foreign)
    assert ns.metadata.annotations.get("mesh.openkcm.io/adopted") == "true"
    fleet.home.custom.delete_namespaced_custom_object("mesh.openkcm.io", "v1alpha1",
                                                      fleet.tenant_ns, "tenants", foreign)
    wait_for(lambda: fleet.home.tenant_gone(fleet.tenant_ns, foreign), 60, what="Tenant deleted")
    assert fleet.home.release_records(foreign, f"tenant-{foreign}-home") == []
    assert fleet.home.core.read_namespace(foreign).status.phase == "Active"


# -- 15. recovery never deletes another release's objects ------------------------------------


def _crd_annotations(cluster: Cluster) -> dict[str, str] | None:
    from kubernetes import client

    try:
        crd = client.ApiextensionsV1Api(cluster.api).read_custom_resource_definition(CRD)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(crd.metadata.annotations or {})


def _delete_crd(cluster: Cluster) -> None:
    from kubernetes import client

    try:
        client.ApiextensionsV1Api(cluster.api).delete_custom_resource_definition(CRD)
    except ApiException:
        pass
    wait_for(lambda: _crd_annotations(cluster) is None, 60, what="test CRD removed")


def test_recovery_keeps_objects_of_other_releases(fleet: Fleet, helm_bin: str,
                                                  tmp_path: Path) -> None:
    _delete_crd(fleet.remote)
    values = tmp_path / "shared.yaml"
    values.write_text("sharedCRD: true\n")
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(fleet.remote.cp.kubeconfig.read_text())
    try:
        fleet.register("remote", fleet.remote)
        op = fleet.start("--chart-values-file", str(values))
        # B's release failed on its first install after creating the shared CRD ...
        b = unique("loser")
        fleet.tenant(fleet.remote, b, annotations={"mesh.openkcm.io/paused": "true"})
        fleet.remote.core.create_namespace({"metadata": {"name": b, "annotations": {
            "mesh.openkcm.io/owner": f"{fleet.tenant_ns}/{b}"}}})
        chart = str(fleet.chart_repo.directory / "sample-0.2.0.tgz")
        failed = subprocess.run([helm_bin, "--kubeconfig", str(kubeconfig), "-n", b, "install",
                                 f"tenant-{b}-remote", chart, "--set", "sharedCRD=true",
                                 "--set", "invalidObject=true"], capture_output=True, text=True)
        assert failed.returncode != 0
        assert fleet.remote.release_records(b, f"tenant-{b}-remote") == [(1, "failed")]
        # ... and A won the CRD (as when two installs race for it)
        a = unique("winner")
        from kubernetes import client

        client.ApiextensionsV1Api(fleet.remote.api).patch_custom_resource_definition(CRD, {
            "metadata": {"annotations": {"meta.helm.sh/release-name": f"tenant-{a}-remote",
                                         "meta.helm.sh/release-namespace": a}}})
        fleet.tenant(fleet.remote, a)
        fleet.remote.wait_phase(fleet.tenant_ns, a, "Ready")
        # recovering B must not uninstall it: helm would delete A's CRD. The chart renders
        # the CRD alike for every release, so B is refused before any recovery.
        fleet.remote.patch_tenant(fleet.tenant_ns, b, {"metadata": {"annotations": {
            "mesh.openkcm.io/paused": None}}})
        cond = fleet.remote.wait_condition(fleet.tenant_ns, b, "ClusterError/remote", "True",
                                           "SharedObjects")
        assert f"CustomResourceDefinition {CRD} (owned by release {a}/tenant-{a}-remote)" in \
            cond["message"], cond["message"]
        assert fleet.remote.phase(fleet.tenant_ns, b) == "Error"
        assert (_crd_annotations(fleet.remote) or {}).get("meta.helm.sh/release-name") == \
            f"tenant-{a}-remote"
        assert fleet.remote.release_records(b, f"tenant-{b}-remote") == [(1, "failed")]
        # a third Tenant is refused the same way, before helm
        c = fleet.tenant(fleet.remote, unique("third"))
        cond = fleet.remote.wait_condition(fleet.tenant_ns, c, "ClusterError/remote", "True",
                                           "SharedObjects")
        assert f"CustomResourceDefinition {CRD} (owned by release {a}/tenant-{a}-remote)" in \
            cond["message"], cond["message"]
        assert fleet.remote.release_records(c, f"tenant-{c}-remote") == []
        assert _crd_annotations(fleet.remote) is not None
        assert fleet.remote.phase(fleet.tenant_ns, a) == "Ready"
        assert op.alive()
    finally:
        for running in fleet.operators:  # a retrying install would create the CRD again
            running.stop()
        _delete_crd(fleet.remote)


def test_a_tenants_uninstall_never_deletes_what_another_release_owns_now(
        fleet: Fleet, tmp_path: Path) -> None:
    """The finalizer's uninstall looks at the release's objects first. When
    one of them (a CRD the release created) is owned by another release by now, helm would
    delete it: the uninstall is refused, the finalizer stays, nothing is deleted, and it
    goes ahead once the object is the release's again."""
    from kubernetes import client

    _delete_crd(fleet.remote)
    values = tmp_path / "shared.yaml"
    values.write_text("sharedCRD: true\n")
    try:
        fleet.register("remote", fleet.remote)
        fleet.start("--chart-values-file", str(values))
        a = fleet.tenant(fleet.remote, unique("owner"))
        fleet.remote.wait_phase(fleet.tenant_ns, a, "Ready")
        mine = {"meta.helm.sh/release-name": f"tenant-{a}-remote",
                "meta.helm.sh/release-namespace": a}
        assert {k: (_crd_annotations(fleet.remote) or {}).get(k) for k in mine} == mine
        crds = client.ApiextensionsV1Api(fleet.remote.api)
        crds.patch_custom_resource_definition(CRD, {"metadata": {"annotations": {
            "meta.helm.sh/release-name": "tenant-other-remote",
            "meta.helm.sh/release-namespace": "other"}}})  # taken over since
        fleet.remote.custom.delete_namespaced_custom_object(
            "mesh.openkcm.io", "v1alpha1", fleet.tenant_ns, "tenants", a)
        refused = fleet.remote.wait_event(fleet.tenant_ns, a, "HelmUninstallFailed")
        assert f"CustomResourceDefinition {CRD} is owned by release other/tenant-other-remote" \
            in refused.message, refused.message
        # What blocks the deletion is in the status (the MESSAGE column of
        # kubectl get tenants), not the progress the Tenant last reported
        fleet.remote.wait_condition(fleet.tenant_ns, a, "ClusterError/remote", "True",
                                    "OwnershipConflict")
        summary = fleet.remote.condition(fleet.tenant_ns, a, "Ready") or {}
        assert summary.get("message", "").startswith("remote: deletion blocked: release "), summary
        assert _crd_annotations(fleet.remote) is not None
        assert fleet.remote.release_records(a, f"tenant-{a}-remote") == [(1, "deployed")]
        assert "mesh.openkcm.io/release-cleanup" in \
            fleet.remote.tenant(fleet.tenant_ns, a)["metadata"]["finalizers"]
        # the object is the release's again: the uninstall goes ahead (and deletes it)
        crds.patch_custom_resource_definition(CRD, {"metadata": {"annotations": mine}})
        wait_for(lambda: fleet.remote.release_records(a, f"tenant-{a}-remote") == [], 90,
                 what="the release uninstalled once the CRD is its own again")
        wait_for(lambda: _crd_annotations(fleet.remote) is None, 30, what="its CRD deleted")
    finally:
        for running in fleet.operators:
            running.stop()
        _delete_crd(fleet.remote)
