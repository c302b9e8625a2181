"""Two-cluster end to end on local control planes (SPEC O10), the local twin of
``hack/e2e-kind.sh``: ``python -m krypton.testing.e2e`` (``make e2e``).

Starts a home and a remote control plane and the local chart repository, puts the remote
kubeconfig Secret on home, starts the operator in the background from the command line
(PID file), applies a Tenant on remote and waits for its namespace, its Helm release and
phase Ready, printing the milestone lines; then tears everything down, stopping the
operator with SIGTERM, about 5 s, then SIGKILL. ``$KRYPTON_E2E_LOG`` names where the
operator's log is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

from . import ChartRepository, ControlPlane, testbin
from .operator import OperatorProcess, kubeconfig_secret, wait_for

CHARTS = Path(__file__).resolve().parents[2] / "tests" / "charts"
PID_FILE = Path(os.environ.get("KRYPTON_PID_FILE", "/tmp/krypton-operator.pid"))


def say(line: str) -> None:
    print(line, flush=True)


def _tenant_ready(tools: Path, work: Path, remote: ControlPlane) -> None:
    """Tenant acme applied on remote, until its release is deployed and it is Ready."""
    kubectl = str(tools / "kubectl")
    tenant = work / "tenant.yaml"
    tenant.write_text("apiVersion: mesh.openkcm.io/v1alpha1\nkind: Tenant\nmetadata:\n"
                      "  name: acme\n  namespace: default\nspec:\n  clusterRef:\n"
                      "    secretName: remote\n")
    subprocess.run([kubectl, "--kubeconfig", str(remote.kubeconfig), "apply", "-f",
                    str(tenant)], check=True, capture_output=True)
    say("Tenant acme applied on remote")
    remote_core = client.CoreV1Api(config.new_client_from_config(str(remote.kubeconfig)))
    wait_for(lambda: remote_core.read_namespace("acme"), 60, what="namespace acme")
    say("workspace namespace created")
    wait_for(lambda: [s for s in remote_core.list_namespaced_secret(
        "acme", label_selector="owner=helm,name=tenant-acme-remote,status=deployed").items],
        120, what="deployed release")
    say("helm install success")
    wait = subprocess.run([kubectl, "--kubeconfig", str(remote.kubeconfig), "wait",
                           "--for=jsonpath={.status.phase}=Ready", "tenant/acme",
                           "--timeout=120s"], capture_output=True, text=True)
    if wait.returncode != 0:
        raise RuntimeError(f"tenant not Ready: {wait.stderr.strip()}")
    say("tenant phase is Ready on remote cluster")


def main() -> int:
    tools = testbin()
    kubectl = str(tools / "kubectl")
    work = Path(tempfile.mkdtemp(prefix="krypton-e2e-"))
    home = remote = repo = op = None
    try:
        say("starting control planes: home (client certificate) and remote (token)")
        home = ControlPlane("home", tools, auth="cert").start()
        remote = ControlPlane("remote", tools, auth="token").start()
        repo = ChartRepository(tools / "helm")
        repo.publish(CHARTS / "sample", "0.1.0")
        repo.start()
        say(f"chart repository at {repo.url}")
        for cp in (home, remote):
            subprocess.run([kubectl, "--kubeconfig", str(cp.kubeconfig), "apply", "-f",
                            str(Path(__file__).resolve().parents[2] / "crds")],
                           check=True, capture_output=True)
        say("Tenant CRD installed on both clusters")
        home_api = client.CoreV1Api(config.new_client_from_config(str(home.kubeconfig)))
        home_api.create_namespace({"metadata": {"name": "krypton-system"}})  # type: ignore[arg-type]
        home_api.create_namespaced_secret("krypton-system", kubeconfig_secret(
            "remote", remote.kubeconfig.read_text(), namespace="krypton-system"))  # type: ignore[arg-type]
        say("remote kubeconfig Secret created on home")
        op = OperatorProcess([
            "--watch-kubeconfig", str(home.kubeconfig), "--namespace", "krypton-system",
            "--chart-repo", repo.url, "--chart-name", "sample", "--chart-version", "0.1.0",
            "--helm-timeout", "60s",
        ], helm_dir=tools, env={"KUBECONFIG": str(home.kubeconfig)}, pid_file=PID_FILE,
            log_path=Path(os.environ.get("KRYPTON_E2E_LOG") or work / "operator.log")).start()
        say(f"operator started in the background, PID {op.pid} (PID file {PID_FILE})")
        op.wait_ready()
        _tenant_ready(tools, work, remote)
        say("e2e passed")
        return 0
    except Exception as exc:  # noqa: BLE001 - report any failure as a failed e2e
        say(f"e2e FAILED: {exc}")
        if op is not None:
            say(f"--- operator log ---\n{op.log_tail(60)}")
        return 1
    finally:
        if op is not None:
            started = time.monotonic()
            code = op.stop(grace=5.0)
            say(f"operator stopped (exit {code}) in {time.monotonic() - started:.1f}s")
        for part in (repo, remote, home):
            if part is not None:
                part.stop() if isinstance(part, ControlPlane) else part.close()
        say("torn down")


if __name__ == "__main__":
    sys.exit(main())
