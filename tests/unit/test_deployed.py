"""The CLI reading a running operator's settings from its Deployment. Pure."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from krypton.cli.main import build_parser
from krypton.decisions import deployed
from krypton.decisions.deployed import MountedFile, choose, overlay, read
from krypton.decisions.errors import SettingsError


def deployment(*args: str, env: list[dict[str, Any]] | None = None,
               mounts: list[dict[str, Any]] | None = None,
               volumes: list[dict[str, Any]] | None = None,
               command: list[str] | None = None, name: str = "krypton") -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "x", "args": ["run", *args],
                                 "env": env or [], "volumeMounts": mounts or []}
    if command is not None:
        container["command"] = command
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"namespace": "ops", "name": "krypton"},
            "spec": {"template": {"spec": {"containers": [
                {"name": "sidecar", "image": "y", "args": ["serve"]}, container],
                "volumes": volumes or []}}}}


CHART_LIKE = deployment(
    "--chart-repo=https://charts.example", "--chart-name=app", "--chart-version=1.2.3",
    "--chart-values-file=/etc/krypton/values.yaml", "--namespace=fleet",
    "--helm-wait=false", "--helm-driver", "configmap", "--log-format=json",
    "--metrics-bind-address=:8080", "--some-future-flag=1",
    env=[{"name": "ALLOW_CHART_SKIP", "value": "true"},
         {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
         {"name": "WATCH_NAMESPACE", "value": ""},
         {"name": "KRYPTON_HELM_EXECUTABLE", "value": "/usr/local/bin/helm"}],
    mounts=[{"name": "values", "mountPath": "/etc/krypton", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"}],
    volumes=[{"name": "values", "configMap": {"name": "krypton-values"}},
             {"name": "tmp", "emptyDir": {}}])


def test_the_flags_and_literal_environment_of_the_operator_container() -> None:
    found = read(CHART_LIKE)
    assert found.ref == "ops/krypton"
    assert found.raw == {
        "chart_repo": "https://charts.example", "chart_name": "app", "chart_version": "1.2.3",
        "chart_values_file": ["/etc/krypton/values.yaml"], "namespace": "fleet",
        "helm_wait": "false", "helm_driver": "configmap", "allow_chart_skip": "true"}
    # a path, a log format and a port only mean something inside the pod
    assert not {"helm_executable", "log_format", "metrics_bind_address"} & set(found.raw)
    assert found.files == {"/etc/krypton/values.yaml":
                           MountedFile("configMap", "krypton-values", "values.yaml")}


def test_krypton_run_in_the_command_counts_too() -> None:
    d = deployment(command=["krypton", "run", "--chart-name=x"])
    d["spec"]["template"]["spec"]["containers"][1]["args"] = ["--chart-version=2.0.0"]
    assert read(d).raw == {"chart_name": "x", "chart_version": "2.0.0"}


@pytest.mark.parametrize(("mount", "volume", "expected"), [
    ({"mountPath": "/v/"}, {"configMap": {"name": "cm", "items": [
        {"key": "central", "path": "dir/values.yaml"}]}}, MountedFile("configMap", "cm", "central")),
    ({"mountPath": "/v/dir/values.yaml", "subPath": "k"}, {"secret": {"secretName": "s"}},
     MountedFile("secret", "s", "k")),
    ({"mountPath": "/v/dir"}, {"secret": {"secretName": "s"}},
     MountedFile("secret", "s", "values.yaml")),
])
def test_where_a_values_file_comes_from(mount: dict[str, Any], volume: dict[str, Any],
                                        expected: MountedFile) -> None:
    d = deployment("--chart-values-file", "/v/dir/values.yaml",
                   mounts=[{"name": "vol", **mount}], volumes=[{"name": "vol", **volume}])
    assert read(d).files == {"/v/dir/values.yaml": expected}


def test_a_values_file_from_no_configmap_or_secret_is_refused() -> None:
    d = deployment("--chart-values-file=/data/values.yaml",
                   mounts=[{"name": "tmp", "mountPath": "/data"}],
                   volumes=[{"name": "tmp", "emptyDir": {}}])
    with pytest.raises(SettingsError, match="/data/values.yaml from no ConfigMap or Secret"):
        read(d)


def test_a_deployment_that_runs_no_operator() -> None:
    d = deployment()
    d["spec"]["template"]["spec"]["containers"].pop()
    with pytest.raises(SettingsError, match="ops/krypton has no container running"):
        read(d)
    assert choose([d]) is None


def test_choose_one_operator() -> None:
    other = copy.deepcopy(CHART_LIKE)
    other["metadata"]["namespace"] = "ops2"
    assert choose([]) is None
    assert choose([CHART_LIKE]) is CHART_LIKE
    with pytest.raises(SettingsError, match=r"several krypton operators found \(ops/krypton, "
                                            r"ops2/krypton\)"):
        choose([CHART_LIKE, other])


def test_what_the_user_types_wins() -> None:
    args = build_parser().parse_args(["plan", "--chart-version", "9.0.0"])
    taken = overlay(args, read(CHART_LIKE), {"HELM_DRIVER": "secret"},
                    {"/etc/krypton/values.yaml": "/tmp/x/values-0.yaml"})
    assert args.chart_version == "9.0.0"  # the flag
    assert args.helm_driver is None  # the environment variable, read later by app.config.load
    assert args.chart_repo == "https://charts.example"
    assert args.chart_values_file == ["/tmp/x/values-0.yaml"]
    assert sorted(taken) == ["allow_chart_skip", "chart_name", "chart_repo",
                             "chart_values_file", "helm_wait", "namespace"]


def test_the_health_rules_file_is_read_from_the_pods_volume_like_the_values() -> None:
    d = copy.deepcopy(CHART_LIKE)
    d["spec"]["template"]["spec"]["containers"][1]["args"].append(
        "--health-check-expr=/etc/krypton/health-checks.yaml")
    found = read(d)
    assert found.files["/etc/krypton/health-checks.yaml"] == \
        MountedFile("configMap", "krypton-values", "health-checks.yaml")
    args = build_parser().parse_args(["plan"])
    overlay(args, found, {}, {"/etc/krypton/values.yaml": "/tmp/x/values-0.yaml",
                              "/etc/krypton/health-checks.yaml": "/tmp/x/health-1.yaml"})
    assert args.health_check_expr == "/tmp/x/health-1.yaml"


def test_the_label_is_the_one_the_chart_puts_on_its_deployment() -> None:
    root = Path(__file__).resolve().parents[2] / "chart"
    name = yaml.safe_load((root / "Chart.yaml").read_text())["name"]
    helpers = (root / "templates" / "_helpers.tpl").read_text()
    assert "app.kubernetes.io/name: {{ .Chart.Name }}" in helpers
    assert f"app.kubernetes.io/name={name}" == deployed.NAME_LABEL


def test_the_cli_looks_for_the_operator_where_the_kube_context_points(tmp_path: Path) -> None:
    """Without --namespace, the namespace of the user's own context decides
    where the operator Deployment is looked for; a context without one says nowhere."""
    import dataclasses

    from krypton.app.home import context_namespace
    from krypton.decisions.settings import Settings

    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "ops",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": {"token": "abcdefgh"}}],
        "contexts": [{"name": "ops", "context": {"cluster": "c", "user": "u",
                                                 "namespace": "krypton-system"}},
                     {"name": "plain", "context": {"cluster": "c", "user": "u"}}]}))
    mine = dataclasses.replace(Settings(), watch_kubeconfig=str(kubeconfig))
    assert context_namespace(mine) == "krypton-system"
    assert context_namespace(dataclasses.replace(mine, watch_context="plain")) is None
    assert context_namespace(dataclasses.replace(mine, watch_kubeconfig=str(tmp_path / "x"))) \
        is None
