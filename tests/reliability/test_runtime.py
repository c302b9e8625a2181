"""The runtime's guarantees (issue 11) against the real test bed: no Tenant is reconciled from
a cache that has not synced; SIGTERM with helm running is bounded and leaves nothing behind."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path

import yaml

from krypton.testing.operator import OperatorProcess, wait_for
from tests.integration.conftest import Fleet, unique

# Everything the operator needs on a cluster (cluster-wide mode, helm's secret driver) but the
# Secrets, where Helm keeps its release records.
RULES = [
    {"apiGroups": ["mesh.openkcm.io"], "resources": ["tenants", "tenants/status",
                                                      "tenants/finalizers"], "verbs": ["*"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["namespaces", "events", "configmaps"], "verbs": ["*"]},
]
SECRETS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}


def _kubectl(fleet: Fleet, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(fleet.testbin / "kubectl"), "--kubeconfig",
                           str(fleet.remote.cp.kubeconfig), *args], input=stdin, check=True,
                          capture_output=True, text=True).stdout


def test_no_reconcile_before_the_release_records_are_listed(fleet: Fleet) -> None:
    """Credentials that cannot list Helm's release records: the release cache never syncs.
    Reconciling anyway would take every release for missing and install or upgrade it; the
    operator waits instead (and says so in /readyz), and starts once the list succeeds."""
    sa, role = f"limited-{uuid.uuid4().hex[:5]}", f"krypton-limited-{uuid.uuid4().hex[:5]}"
    _kubectl(fleet, "create", "serviceaccount", sa, "-n", fleet.tenant_ns)
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": sa,
                             "namespace": fleet.tenant_ns}]}
    cluster_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": role}, "rules": RULES}
    _kubectl(fleet, "apply", "-f", "-", stdin=yaml.safe_dump_all([cluster_role, binding]))
    token = _kubectl(fleet, "create", "token", sa, "-n", fleet.tenant_ns,
                     "--duration=1h").strip()
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "limited",
                  "clusters": [{"name": "remote", "cluster": {
                      "server": fleet.remote.cp.server,
                      "certificate-authority-data": base64.b64encode(
                          fleet.remote.cp.ca_pem).decode()}}],
                  "users": [{"name": sa, "user": {"token": token}}],
                  "contexts": [{"name": "limited", "context": {"cluster": "remote",
                                                               "user": sa}}]}
    fleet.register("remote", kubeconfig=yaml.safe_dump(kubeconfig))
    op = fleet.start("--api-timeout", "2s")
    name = fleet.tenant(fleet.remote, unique("early"))

    # The list keeps failing (retried with backoff 0.5, 1, 2, 4 s): five failures take about
    # 7.5 s, well past the 2 s after which the operator once started reconciling regardless.
    wait_for(lambda: len(op.log_events("watch failed, retrying", cluster="remote")) >= 5, 60,
             what="five failed lists of the release records")
    assert "CacheNotSynced" in op.readyz()
    assert op.metric("krypton_helm_processes_total") == 0
    assert not (fleet.remote.tenant(fleet.tenant_ns, name).get("status") or {}).get("conditions")

    cluster_role["rules"] = RULES + [SECRETS]
    _kubectl(fleet, "apply", "-f", "-", stdin=yaml.safe_dump(cluster_role))
    fleet.remote.wait_phase(fleet.tenant_ns, name, "Ready")
    assert op.metric("krypton_helm_processes_total", operation="install") == 1
    _kubectl(fleet, "delete", "clusterrole,clusterrolebinding", role)


def _descendants(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return []  # gone
    return out + [d for child in out for d in _descendants(child)]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []  # gone


def test_sigterm_with_helm_running_stops_within_the_shutdown_timeout(fleet: Fleet) -> None:
    """SIGTERM while helm waits for a Deployment that cannot become ready (no nodes): the
    operator stops taking work, gives helm --shutdown-timeout, then stops it (SIGTERM, at
    most 5 s, SIGKILL) and exits 0, leaving no helm process and no work directory."""
    fleet.register("remote", fleet.remote)
    args = fleet.args("--shutdown-timeout", "3s", "--helm-timeout", "300s")
    args[args.index("--chart-name") + 1] = "workload"
    args[args.index("--chart-version") + 1] = "1.0.0"
    op = OperatorProcess(args, helm_dir=fleet.testbin)
    fleet.operators.append(op)
    op.start()
    op.wait_ready()
    name = fleet.tenant(fleet.remote, unique("waiting"))
    helm = wait_for(lambda: [p for p in _descendants(op.pid)
                             if Path(_cmdline(p)[0]).name == "helm" and "upgrade" in _cmdline(p)],
                    60, what="a helm upgrade --install running")
    line = _cmdline(helm[0])
    workdir = Path(line[line.index("--kubeconfig") + 1]).parents[2]
    assert workdir.name.startswith("krypton-run-") and workdir.exists()
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterProgress/remote", "True",
                                "Installing")

    code = op.stop(grace=25)  # SIGKILL (-9) after 25 s: far beyond 3 s + helm's 5 s
    assert code == 0, op.log_tail()
    assert all(not _cmdline(p) for p in helm), "helm outlived the operator"
    assert not workdir.exists()
    assert op.log_events("stopped")
