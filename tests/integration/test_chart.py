"""The operator chart (O6): lint, rendering in both modes, CRD handling, and its RBAC
checked on a real API server with `kubectl auth can-i`."""

from __future__ import annotations

import json
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
                                  "ClusterRole", "ClusterRoleBinding",
                                  "Role", "RoleBinding", "Role", "RoleBinding", "Service",
                                  "Deployment", "CustomResourceDefinition"])
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole"
                        and not d["metadata"]["name"].endswith("-record-guard"))
    # the guard of the release records (S4, S6): created, then read, watched and written by
    # name only
    guard = next(d for d in docs if d["metadata"]["name"].endswith("-record-guard")
                 and d["kind"] == "ClusterRole")
    assert [(r.get("resourceNames"), r["verbs"]) for r in guard["rules"]] == [
        (None, ["create"]),
        (["krypton-release-records"], ["get", "list", "watch", "update", "patch"])]
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


def test_sharding_runs_every_replica_with_the_rights_its_leases_need(helm_bin: str) -> None:
    docs = render(helm_bin, "--set", "sharding.enabled=true", "--set", "replicaCount=3")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 3
    assert "--sharding" in args and not any(a.startswith("--leader-elect=") for a in args)
    role = next(d for d in docs if d["kind"] == "Role"
                and d["metadata"]["name"].endswith("-leader-election"))
    verbs = set(role["rules"][0]["verbs"])
    assert {"list", "watch", "create", "update", "delete"} <= verbs
    plain = next(d for d in render(helm_bin) if d["kind"] == "Role"
                 and d["metadata"]["name"].endswith("-leader-election"))
    assert "delete" not in plain["rules"][0]["verbs"]


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


def test_cluster_profiles_mount_the_providers_file_the_operator_reads(
        helm_bin: str, tmp_path: Path) -> None:
    from krypton.app.config import read_providers
    from krypton.decisions.clusters.execplugins import Provider

    provider = {"name": "ocm", "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "/opt/plugins/ocm-token",
        "args": ["--hub"], "provideClusterInfo": True}}
    docs = render(helm_bin, "--set", "clusterProfiles.enabled=true",
                  "--set", "clusterProfiles.namespace=fleet",
                  "--set", "clusterProfiles.selector=x-k8s.io/cluster-manager=ocm",
                  "--set-json", f"clusterProfiles.providers=[{json.dumps(provider)}]",
                  "--set-json", 'extraVolumes=[{"name": "plugins", "emptyDir": {}}]',
                  "--set-json", 'extraVolumeMounts=[{"name": "plugins", '
                                '"mountPath": "/opt/plugins"}]')
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert {"--cluster-profiles", "--cluster-profile-namespace=fleet",
            "--cluster-profile-selector=x-k8s.io/cluster-manager=ocm",
            "--cluster-profile-providers=/etc/krypton/cluster-profile-providers.yaml"} <= set(args)
    assert {"name": "plugins", "mountPath": "/opt/plugins"} in pod["containers"][0]["volumeMounts"]
    assert {"name": "plugins", "emptyDir": {}} in pod["volumes"]
    rendered = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    (tmp_path / "providers.yaml").write_text(rendered["cluster-profile-providers.yaml"])
    assert read_providers(str(tmp_path / "providers.yaml")) == {"ocm": Provider(
        "ocm", "/opt/plugins/ocm-token", ("--hub",), (), True)}
    role = next(d for d in docs if d["kind"] == "Role"
                and d["metadata"]["name"].endswith("-cluster-profiles"))
    assert role["metadata"]["namespace"] == "fleet"
    assert role["rules"][0] == {"apiGroups": ["multicluster.x-k8s.io"],
                                "resources": ["clusterprofiles"],
                                "verbs": ["get", "list", "watch"]}
    assert "-cluster-profiles" not in str(render(helm_bin))  # nothing without the switch


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


def metric_names() -> set[str]:
    """Every sample name krypton's metrics produce, as Prometheus scrapes them."""
    from prometheus_client import REGISTRY

    import krypton.adapters.metrics  # noqa: F401 - registers krypton's metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "info": ("_info",), "gauge": ("",)}
    return {family.name + suffix for family in REGISTRY.collect()
            if family.name.startswith("krypton_") for suffix in suffixes[family.type]}


def named_metrics(expr: str) -> set[str]:
    import re

    return set(re.findall(r"\bkrypton_[a-z_]+\b", expr))


def test_monitoring_names_metrics_that_exist(helm_bin: str) -> None:
    """The ServiceMonitor, PrometheusRule and Grafana dashboard ship behind values
    (off by default), and every query in the dashboard and the alerts names a metric
    krypton exports."""
    assert {"ServiceMonitor", "PrometheusRule"}.isdisjoint(kinds(render(helm_bin)))
    docs = render(helm_bin, "--set", "metrics.serviceMonitor.enabled=true",
                  "--set", "metrics.prometheusRule.enabled=true", "--set", "dashboards.enabled=true",
                  "--set", "metrics.serviceMonitor.labels.release=prom")
    known = metric_names()
    assert {"krypton_reconciles_total", "krypton_reconcile_duration_seconds_bucket",
            "krypton_build_info", "krypton_tenants_error"} <= known

    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    service = next(d for d in docs if d["kind"] == "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == \
        [p["name"] for p in service["spec"]["ports"]]

    rules = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {r["alert"]: r for r in rules}
    assert {"KryptonRolloutHalted", "KryptonClusterNotEngaged", "KryptonClusterUnhealthy",
            "KryptonTenantsInError", "KryptonReconcileErrorsRising"} <= set(alerts)
    for name, rule in alerts.items():
        assert named_metrics(rule["expr"]), name
        assert named_metrics(rule["expr"]) <= known, (name, rule["expr"])
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert "{{ $labels.cluster }}" in alerts["KryptonTenantsInError"]["annotations"]["summary"]
    assert alerts["KryptonReconcileErrorsRising"]["expr"].endswith("> 0.05")

    board = next(d for d in docs if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].endswith("-dashboard"))
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    import json

    dashboard = json.loads(board["data"]["krypton.json"])
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= len(dashboard["panels"]) > 10
    for query in queries:
        assert named_metrics(query) and named_metrics(query) <= known, query
    # every family krypton exports is on the dashboard, but the names kept only as aliases
    from krypton.adapters.metrics import DEPRECATED

    shown = set().union(*map(named_metrics, queries))
    assert not shown & DEPRECATED, shown & DEPRECATED
    families = {n for n in known if not n.endswith(("_sum", "_count"))} - DEPRECATED
    assert {n.removesuffix("_bucket") for n in families} <= \
        {n.removesuffix("_bucket") for n in shown}
