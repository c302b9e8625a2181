"""O1: flags, environment, defaults, precedence and the exit-2 path."""

from __future__ import annotations

import subprocess
import sys

import pytest

from krypton.app.config import load
from krypton.decisions.errors import SettingsError
from krypton.decisions.options import option
from krypton.decisions.settings import OPTIONS, Settings, duration, parse_args


def settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    return load(parse_args(argv), env or {}, check_helm=False)


def test_defaults_match_the_seed() -> None:
    s = settings([])
    assert (s.chart_repo, s.chart_name, s.chart_version) == (
        "https://charts.jetstack.io", "cert-manager", "1.19.1")
    assert s.namespace == "default"
    assert s.kubeconfig_label == "sigs.k8s.io/multicluster-runtime-kubeconfig"
    assert s.kubeconfig_key == "kubeconfig"
    assert s.watch_kubeconfig_secret_key == "kubeconfig"
    assert s.ensure_watch_crds is False and s.helm_timeout == 180
    # the one refined default: Ready still waits for the workload, followed by
    # krypton's watches instead of a helm process held for it
    assert s.helm_wait is False
    assert s.health_probe_bind_address == ":8081" and s.metrics_bind_address == ":8080"


def test_flag_beats_env_beats_default() -> None:
    assert settings([], {"KRYPTON_CHART_NAME": "env"}).chart_name == "env"
    assert settings(["--chart-name", "flag"], {"KRYPTON_CHART_NAME": "env"}).chart_name == "flag"


@pytest.mark.parametrize(("env", "field", "value"), [
    ({"WATCH_KUBECONFIG": "/a"}, "watch_kubeconfig", "/a"),
    ({"WATCH_CLUSTER_KUBECONFIG": "/b"}, "watch_kubeconfig", "/b"),
    ({"WATCH_CONTEXT": "c"}, "watch_context", "c"),
    ({"WATCH_KUBECONFIG_SECRET": "s"}, "watch_kubeconfig_secret", "s"),
    ({"WATCH_KUBECONFIG_SECRET_NAMESPACE": "n"}, "watch_kubeconfig_secret_namespace", "n"),
    ({"WATCH_KUBECONFIG_SECRET_KEY": "k"}, "watch_kubeconfig_secret_key", "k"),
    ({"ENSURE_WATCH_CRDS": "true"}, "ensure_watch_crds", True),
    ({"WATCH_NAMESPACE": "team"}, "watch_namespace", "team"),
    ({"ALLOW_CHART_SKIP": "true"}, "allow_chart_skip", True),
    ({"KRYPTON_MAX_CONCURRENT_HELM": "3"}, "max_concurrent_helm", 3),
    ({"KRYPTON_RESYNC_PERIOD": "2m"}, "resync_period", 120.0),
])
def test_seed_environment_names(env: dict[str, str], field: str, value: object) -> None:
    assert getattr(settings([], env), field) == value


def test_bool_flags_take_an_optional_value() -> None:
    assert settings(["--helm-wait=false"]).helm_wait is False
    assert settings(["--ensure-watch-crds"]).ensure_watch_crds is True


def test_values_files_are_deep_merged_in_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("x: {y: 1, z: 2}\n")
    b.write_text("x: {z: 3}\n")
    s = settings(["--chart-values-file", str(a), "--chart-values-file", str(b)])
    assert s.chart_values == {"x": {"y": 1, "z": 3}}


BAD = [
    (["--max-concurrent-helm", "0"], {}, "--max-concurrent-helm"),
    (["--max-concurrent-reconciles", "many"], {}, "--max-concurrent-reconciles"),
    (["--resync-period", "soon"], {}, "--resync-period"),
    (["--helm-timeout=-5s"], {}, "--helm-timeout"),
    (["--helm-wait", "maybe"], {}, "--helm-wait"),
    (["--crd-policy", "replace"], {}, "--crd-policy"),
    (["--log-format", "xml"], {}, "--log-format"),
    (["--metrics-bind-address", "8080"], {}, "--metrics-bind-address"),
    (["--chart-repo", "ftp://x"], {}, "--chart-repo"),
    (["--chart-name", " "], {}, "--chart-name"),
    (["--chart-values-file", "/does/not/exist"], {}, "--chart-values-file"),
    ([], {"ENSURE_WATCH_CRDS": "yes please"}, "$ENSURE_WATCH_CRDS"),
    ([], {"ALLOW_CHART_SKIP": "2"}, "$ALLOW_CHART_SKIP"),
    (["--renew-deadline", "20s"], {}, "--renew-deadline"),
]


@pytest.mark.parametrize(("argv", "env", "fragment"), BAD)
def test_bad_values(argv: list[str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        settings(argv, env)
    assert fragment in str(err.value)


def test_values_file_that_is_not_a_mapping(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "v.yaml"
    f.write_text("- a\n")
    with pytest.raises(SettingsError, match="not a YAML mapping"):
        settings(["--chart-values-file", str(f)])


def test_duration() -> None:
    assert duration("90") == 90 and duration("1.5m") == 90 and duration("500ms") == 0.5


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--max-concurrent-helm", "0"], "invalid --max-concurrent-helm"),
    (["--helm-executable", "/nonexistent/helm"], "helm executable"),
])
def test_cli_exits_2_with_one_line(argv: list[str], fragment: str) -> None:
    result = subprocess.run([sys.executable, "-m", "krypton", "run", *argv],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]


def test_help_documents_every_flag_and_env() -> None:
    out = subprocess.run([sys.executable, "-m", "krypton", "run", "--help"],
                         capture_output=True, text=True, timeout=30, env={"COLUMNS": "200"}).stdout
    for opt in OPTIONS:
        assert opt.flag in out
        assert f"${opt.envs[0]}" in out


def test_release_namespace_watch_puts_every_release_in_the_watch_namespace() -> None:
    s = settings(["--release-namespace", "watch", "--watch-namespace", "team"])
    assert s.shared_release_namespace == "team"
    assert s.release_namespace_for("acme") == "team"
    default = settings(["--watch-namespace", "team"])
    assert default.shared_release_namespace is None
    assert default.release_namespace_for("acme") == "acme"
    with pytest.raises(SettingsError, match="needs --watch-namespace"):
        settings(["--release-namespace", "watch"])
    with pytest.raises(SettingsError, match="--release-namespace"):
        settings(["--release-namespace", "elsewhere"])



def test_sharding_runs_a_rollout_but_not_beside_a_leader_election() -> None:
    s = settings(["--sharding", "--rollout-canary-clusters", "a"])
    assert s.sharding and s.rollout_canary_clusters == "a"
    with pytest.raises(SettingsError, match="invalid --sharding"):
        settings(["--sharding", "--leader-elect"])


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "krypton", *argv], capture_output=True,
                          text=True, timeout=30, env={"COLUMNS": "200"})


def test_krypton_alone_prints_help_and_starts_nothing() -> None:
    result = _cli()
    assert result.returncode == 0
    assert result.stdout.startswith("usage: krypton") and "register-cluster" in result.stdout
    flags_only = _cli("--no-self-cluster")
    assert flags_only.returncode == 2
    assert "krypton run --no-self-cluster" in flags_only.stderr


@pytest.mark.parametrize(("argv", "hint"), [
    (["run", "--chart-versio", "1.2.3"], "did you mean --chart-version?"),
    (["plan", "--helm-wiat"], "did you mean --helm-wait?"),
    (["stauts"], "did you mean status?"),
])
def test_a_misspelt_flag_or_command_gets_a_suggestion(argv: list[str], hint: str) -> None:
    result = _cli(*argv)
    assert result.returncode == 2
    assert hint in result.stderr.splitlines()[-1]
    assert result.stderr.startswith(f"usage: krypton {argv[0]}" if argv[0] != "stauts"
                                    else "usage: krypton [-h]")


def test_run_help_groups_flags_by_topic() -> None:
    out = _cli("run", "--help").stdout
    sections = [line for line in out.splitlines() if line.endswith(" options:")]
    assert sections == ["chart options:", "clusters and discovery options:",
                        "watch cluster options:", "Tenants and namespaces options:",
                        "reconcile options:", "helm options:",
                        "progressive rollout and maintenance windows options:",
                        "leader election, sharding and shutdown options:",
                        "logs, health and metrics options:"]
    helm = out.split("helm options:", 1)[1].split("progressive rollout", 1)[0]
    assert "--helm-timeout" in helm and "--chart-repo" not in helm


def test_the_pods_namespace_and_server_come_from_the_environment_given() -> None:
    """decisions/settings reads no environment of its own: what the pod's
    environment says arrives through `env`."""
    s = settings(["--chart-repo", "https://c.example", "--chart-name", "x",
                  "--chart-version", "1.0.0"],
                 {"POD_NAMESPACE": "ops", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
                  "KUBERNETES_SERVICE_PORT": "443"})
    assert (s.pod_namespace, s.pod_server) == ("ops", "https://10.0.0.1:443")
    assert "ops" in s.reserved_namespaces
    bare = settings(["--chart-repo", "https://c.example", "--chart-name", "x",
                     "--chart-version", "1.0.0"], {})
    assert (bare.pod_namespace, bare.pod_server) == ("", "")
    assert "ops" not in bare.reserved_namespaces


def test_a_bad_maintenance_window_is_refused_at_start() -> None:
    base = ["--chart-repo", "https://c.example", "--chart-name", "x", "--chart-version", "1.0.0"]
    assert settings([*base, "--maintenance-window", "0 22 * * 1-5 6h Europe/Berlin"],
                    {}).maintenance_window == "0 22 * * 1-5 6h Europe/Berlin"
    with pytest.raises(SettingsError, match="invalid --maintenance-window: .*unknown time zone"):
        settings([*base, "--maintenance-window", "0 22 * * * 1h Nowhere/Town"], {})


def test_the_binary_engine_keeps_its_old_name() -> None:
    """--helm-engine=binary, and cli, its old name (it collided with krypton's own cli/)."""
    parse = option("helm_engine").parse
    assert (parse("binary"), parse("cli"), parse("worker")) == ("binary", "binary", "worker")
    with pytest.raises(ValueError, match="not one of worker, binary"):
        parse("library")


@pytest.mark.parametrize("flag", ["web_address", "health_probe_bind_address",
                                  "metrics_bind_address"])
def test_a_listener_is_turned_off_by_0(flag: str) -> None:
    """0 turns a listener off, as its help says (the chart's fleet page is off so)."""
    parse = option(flag).parse
    assert (parse("0"), parse(":8080"), parse("127.0.0.1:8082")) == ("0", ":8080", "127.0.0.1:8082")
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse("8080")
