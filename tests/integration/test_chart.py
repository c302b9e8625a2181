"""The operator chart (O6): lint, rendering in both modes, CRD handling, and its RBAC
checked on a real API server with `kubectl auth can-i`."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "chart"


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([helm, "template", "krypton", str(CHART), "-n", "krypton-system",
                          *args], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def test_helm_lint(helm_bin: str) -> None:
    result = subprocess.run([helm_bin, "lint", str(CHART), "--strict"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_wide_mode(helm_bin: str) -> None:
    docs = render(helm_bin, "--include-crds")
    assert kinds(docs) == sorted(["ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding",
                                  "Role", "RoleBinding", "Role", "RoleBinding", "Service",
                                  "Deployment", "CustomResourceDefinition"])
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert not [r for r in cluster_role["rules"] if "secrets" in r["resources"]]
    discovery = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith(
        "-discovery"))
    assert discovery["metadata"]["namespace"] == "krypton-system"
    reads = next(r for r in discovery["rules"] if r["resources"] == ["secrets"]
                 and "list" in r["verbs"])
    assert reads["verbs"] == ["get", "list", "watch"]
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd == yaml.safe_load((ROOT / "crds" / "mesh.openkcm.io_tenants.yaml").read_text())


def test_security_context_probes_and_args(helm_bin: str) -> None:
    deployment = next(d for d in render(helm_bin) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["securityContext"]["runAsNonRoot"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"]
    assert "--helm-driver=configmap" in container["args"]


def test_namespaced_mode_renders_roles_only(helm_bin: str) -> None:
    docs = render(helm_bin, "--set", "watchNamespace=team-a", "--set",
                  "watchCluster.secretName=home-kubeconfig")
    assert "ClusterRole" not in kinds(docs) and "ClusterRoleBinding" not in kinds(docs)
    main = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "krypton")
    assert main["metadata"]["namespace"] == "team-a"
    lease = next(d for d in docs if d["metadata"]["name"].endswith("-leader-election")
                 and d["kind"] == "Role")
    assert lease["metadata"]["namespace"] == "team-a"
    env = {e["name"]: e.get("value") for e in next(
        d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WATCH_NAMESPACE"] == "team-a"
    assert env["WATCH_KUBECONFIG_SECRET"] == "home-kubeconfig"


def test_skip_crds_renders_no_crd(helm_bin: str) -> None:
    docs = render(helm_bin, "--skip-crds")
    assert "CustomResourceDefinition" not in kinds(docs)
    assert "Deployment" in kinds(docs)


@pytest.mark.parametrize("namespaced", [False, True])
def test_rbac_on_a_real_api_server(home: Any, helm_bin: str, kubectl_bin: str,
                                   namespaced: bool) -> None:
    release_ns = f"krypton-{uuid.uuid4().hex[:5]}"
    kc = str(home.kubeconfig)
    # the multi-instance path: CRDs applied once, then the chart with --skip-crds
    subprocess.run([kubectl_bin, "--kubeconfig", kc, "apply", "-f", str(ROOT / "crds")],
                   check=True, capture_output=True)
    args = [helm_bin, "--kubeconfig", kc, "install", release_ns, str(CHART), "-n", release_ns,
            "--create-namespace", "--skip-crds"]
    if namespaced:
        args += ["--set", f"watchNamespace={release_ns}"]
    subprocess.run(args, check=True, capture_output=True)
    sa = f"system:serviceaccount:{release_ns}:{release_ns}"

    def can(verb: str, resource: str, namespace: str | None) -> bool:
        resource, _, sub = resource.partition("/")
        cmd = [kubectl_bin, "--kubeconfig", kc, "auth", "can-i", verb, resource, "--as", sa]
        cmd += [f"--subresource={sub}"] if sub else []
        cmd += ["-n", namespace] if namespace else ["--all-namespaces"]
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip() == "yes"

    assert can("get", "secrets", release_ns)
    assert can("watch", "secrets", release_ns)
    assert not can("get", "secrets", "kube-system")
    assert not can("list", "secrets", None)
    assert not can("delete", "secrets", release_ns)
    assert can("create", "leases.coordination.k8s.io", release_ns)
    assert can("patch", "tenants.mesh.openkcm.io/status", release_ns)
    assert can("create", "namespaces", None) is (not namespaced)
    assert can("list", "tenants.mesh.openkcm.io", "default") is (not namespaced)
    subprocess.run([helm_bin, "--kubeconfig", kc, "uninstall", release_ns, "-n", release_ns],
                   check=True, capture_output=True)
