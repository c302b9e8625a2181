"""The table of bad inputs (SPEC S1 over D3-D5, R5, R6, O1): each case with the reason or
exit status it must produce, against the real control planes where a cluster is involved."""

from __future__ import annotations

import base64
import datetime as dt
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from krypton.testing import ControlPlane, free_port, pki
from krypton.testing.operator import OperatorProcess, kubeconfig_secret, wait_for
from tests.integration.conftest import Cluster, Fleet

# -- O1: flags and environment -> exit status 2 with one line, before any cluster ----------

FLAG_CASES = [
    (["--max-concurrent-helm", "0"], {}, "--max-concurrent-helm"),
    (["--max-concurrent-reconciles", "abc"], {}, "--max-concurrent-reconciles"),
    (["--resync-period", "never"], {}, "--resync-period"),
    (["--helm-timeout=-1s"], {}, "--helm-timeout"),
    (["--helm-wait=perhaps"], {}, "--helm-wait"),
    (["--crd-policy=force"], {}, "--crd-policy"),
    (["--log-format=xml"], {}, "--log-format"),
    (["--log-level=loud"], {}, "--log-level"),
    (["--metrics-bind-address=8080"], {}, "--metrics-bind-address"),
    (["--chart-repo=ftp://charts"], {}, "--chart-repo"),
    (["--helm-executable=/nonexistent/helm"], {}, "helm executable"),
    (["--chart-values-file=/nonexistent/values.yaml"], {}, "--chart-values-file"),
    (["--helm-driver=sql"], {}, "--helm-driver"),
    ([], {"ENSURE_WATCH_CRDS": "maybe"}, "$ENSURE_WATCH_CRDS"),
    ([], {"KRYPTON_LEASE_DURATION": "2s", "KRYPTON_RENEW_DEADLINE": "5s"}, "--renew-deadline"),
]


@pytest.mark.parametrize(("argv", "env", "fragment"), FLAG_CASES,
                         ids=[c[2] for c in FLAG_CASES])
def test_bad_flag_exits_2(argv: list[str], env: dict[str, str], fragment: str,
                          testbin: Path) -> None:
    environ = {**os.environ, "PATH": f"{testbin}:{os.environ['PATH']}", **env,
               "KUBECONFIG": "/nonexistent"}
    result = subprocess.run([sys.executable, "-m", "krypton", "run", *argv],
                            capture_output=True, text=True, timeout=30, env=environ)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr


# -- D3-D5 and R5: one operator, many bad Secrets and Tenants --------------------------------


def _doc(cp: ControlPlane) -> dict[str, Any]:
    return yaml.safe_load(cp.kubeconfig.read_text())


def _with_user(cp: ControlPlane, user: dict[str, Any]) -> str:
    d = _doc(cp)
    d["users"][0]["user"] = user
    return yaml.safe_dump(d)


def _with_cluster(cp: ControlPlane, **fields: Any) -> str:
    d = _doc(cp)
    d["clusters"][0]["cluster"].update(fields)
    return yaml.safe_dump(d)


def _pair(cert: bytes, key: bytes) -> dict[str, str]:
    return {"client-certificate-data": base64.b64encode(cert).decode(),
            "client-key-data": base64.b64encode(key).decode()}


def secret_cases(home: ControlPlane, remote: ControlPlane) -> list[tuple[str, Any, str, str]]:
    """(secret name, kubeconfig text or None for a missing key, reason, message fragment)."""
    now = dt.datetime.now(dt.UTC)
    expired = home.issue_client_cert("old", "system:masters", not_before=now - dt.timedelta(days=9),
                                     not_after=now - dt.timedelta(days=1))
    other = home.issue_client_cert("other", "system:masters")
    soon = home.issue_client_cert("soon", "system:masters", not_after=now + dt.timedelta(days=2))
    no_ctx = _doc(remote)
    no_ctx["current-context"] = ""
    no_ctx["contexts"] = []
    foreign_ca = pki.make_ca("foreign").cert  # a valid CA that did not sign the server
    return [
        ("missing-key", None, "KubeconfigRejected", "data key 'kubeconfig'"),
        ("empty", "", "KubeconfigRejected", "empty"),
        ("garbage", "\x00 : [ not yaml", "KubeconfigRejected", "not valid YAML"),
        ("no-context", yaml.safe_dump(no_ctx), "KubeconfigRejected", "no usable context"),
        ("exec", _with_user(remote, {"exec": {"command": "/bin/sh"}}), "KubeconfigRejected",
         "user.exec"),
        ("auth-provider", _with_user(remote, {"auth-provider": {"name": "gcp"}}),
         "KubeconfigRejected", "user.auth-provider"),
        ("token-file", _with_user(remote, {"tokenFile": "/etc/passwd"}), "KubeconfigRejected",
         "user.tokenFile"),
        ("cert-file", _with_user(remote, {"client-certificate": "/c", "client-key": "/k"}),
         "KubeconfigRejected", "user.client-certificate"),
        ("bad-ca-pem", _with_cluster(remote, **{"certificate-authority-data":
                                                base64.b64encode(b"junk").decode()}),
         "KubeconfigRejected", "not a valid PEM"),
        ("key-mismatch", _with_user(home, _pair(expired.cert, other.key)), "KubeconfigRejected",
         "does not match"),
        ("expired", _with_user(home, _pair(expired.cert, expired.key)), "KubeconfigRejected",
         "expired"),
        ("unreachable", _with_cluster(remote, server=f"https://127.0.0.1:{free_port()}"),
         "ClusterUnreachable", "unreachable"),
        ("wrong-token", _with_user(remote, {"token": "not-the-token"}), "ClusterUnreachable",
         "unauthorized"),
        ("wrong-ca", _with_cluster(remote, **{"certificate-authority-data":
                                              base64.b64encode(foreign_ca).decode()}),
         "ClusterUnreachable", "CERTIFICATE_VERIFY_FAILED"),
        ("expiring-soon", _with_user(home, _pair(soon.cert, soon.key)), "CredentialsExpiringSoon",
         "expires"),
        # Every field of an untrusted kubeconfig is checked in the D3/D4 path
        ("ipv6-unterminated", _with_cluster(remote, server="https://[::1"), "KubeconfigRejected",
         "cannot be parsed"),
        ("token-newline", _with_user(remote, {"token": f"{_token(remote)}\n"}),
         "KubeconfigRejected", "newline"),
        ("username-number", _with_user(remote, {"username": 12345, "password": "pw-secret-1"}),
         "KubeconfigRejected", "not a string"),
        ("tls-name-number", _with_cluster(remote, **{"tls-server-name": 42}),
         "KubeconfigRejected", "not a string"),
        ("insecure-string", _with_cluster(remote, **{"insecure-skip-tls-verify": "false"}),
         "KubeconfigRejected", "must be a boolean"),
        ("token-over-http", _with_cluster(remote, server=f"http://127.0.0.1:{free_port()}"),
         "KubeconfigRejected", "in clear"),
        ("server-with-path", _with_cluster(remote, server=remote.server + "/api/v1/namespaces"),
         "KubeconfigRejected", "path"),
        ("alias-bomb-kubeconfig", ALIAS_BOMB + yaml.safe_dump(_doc(remote)), "KubeconfigRejected",
         "expands"),
        ("x" * 52, remote.kubeconfig.read_text(), "ClusterNameInvalid", "at most 51"),
    ]


ALIAS_BOMB = "".join(f"{k}: &{k} [" + ",".join([f"*{p}"] * 9 if p else ["lol"] * 9) + "]\n"
                     for p, k in zip(["", "a", "b", "c", "d", "e", "f", "g"],
                                     ["a", "b", "c", "d", "e", "f", "g", "h"], strict=True))


def _token(cp: ControlPlane) -> str:
    return str(_doc(cp)["users"][0]["user"]["token"])


@pytest.fixture(scope="module")
def bad_fleet(home: ControlPlane, remote: ControlPlane, chart_repo: Any,
              testbin: Path) -> Iterator[tuple[Fleet, dict[str, tuple[str, str]]]]:
    suffix = uuid.uuid4().hex[:6]
    f = Fleet(Cluster("home", home), Cluster("remote", remote), chart_repo, testbin,
              f"bad-{suffix}", f"badt-{suffix}")
    f.home.ensure_namespace(f.discovery_ns)
    for c in (f.home, f.remote):
        c.ensure_namespace(f.tenant_ns)
    expected: dict[str, tuple[str, str]] = {}
    for name, text, reason, fragment in secret_cases(home, remote):
        body = kubeconfig_secret(name, text or "", namespace=f.discovery_ns)
        if text is None:
            body["data"] = {"other": body["data"]["kubeconfig"]}
        f.home.core.create_namespaced_secret(f.discovery_ns, body)
        expected[name] = (reason, fragment)
    values = kubeconfig_secret("bad-values", remote.kubeconfig.read_text(),
                               namespace=f.discovery_ns, values="- not\n- a mapping\n")
    f.home.core.create_namespaced_secret(f.discovery_ns, values)
    expected["bad-values"] = ("ValuesInvalid", "not a YAML mapping")
    bomb = kubeconfig_secret("values-bomb", remote.kubeconfig.read_text(),
                             namespace=f.discovery_ns, values=ALIAS_BOMB)
    f.home.core.create_namespaced_secret(f.discovery_ns, bomb)
    expected["values-bomb"] = ("ValuesInvalid", "expands to more than")
    f.register("remote", f.remote)
    f.start()
    yield f, expected
    for op in f.operators:
        op.stop()


SECRET_NAMES = ["missing-key", "empty", "garbage", "no-context", "exec", "auth-provider",
                "token-file", "cert-file", "bad-ca-pem", "key-mismatch", "expired", "unreachable",
                "wrong-token", "wrong-ca", "expiring-soon", "bad-values", "values-bomb",
                "ipv6-unterminated", "token-newline", "username-number", "tls-name-number",
                "insecure-string", "token-over-http", "server-with-path", "alias-bomb-kubeconfig",
                "x" * 52]


@pytest.mark.parametrize("secret", SECRET_NAMES, ids=[n[:24] for n in SECRET_NAMES])
def test_bad_cluster_secret(bad_fleet: tuple[Fleet, dict[str, tuple[str, str]]],
                            secret: str) -> None:
    f, expected = bad_fleet
    reason, fragment = expected[secret]
    events = wait_for(lambda: [e for e in f.home.events(f.discovery_ns, secret)
                               if e.type == "Warning" and e.reason == reason], 60,
                      what=f"{reason} on {secret}")
    assert fragment.lower() in events[0].message.lower(), events[0].message
    assert "not-the-token" not in events[0].message
    assert f.operators[0].alive()


TENANT_CASES = [
    ("dotted.name", "InvalidTenantName"),
    ("x" * 64, "InvalidTenantName"),
    ("conflict", "NamespaceConflict"),
]


@pytest.mark.parametrize(("name", "reason"), TENANT_CASES, ids=[c[1] + "-" + c[0][:8]
                                                                 for c in TENANT_CASES])
def test_bad_tenant(bad_fleet: tuple[Fleet, dict[str, tuple[str, str]]], name: str,
                    reason: str) -> None:
    f, _ = bad_fleet
    name = name if name != "conflict" else f"conflict-{uuid.uuid4().hex[:5]}"
    if reason == "NamespaceConflict":
        f.remote.core.create_namespace({"metadata": {"name": name, "annotations": {
            "mesh.openkcm.io/owner": f"someone-else/{name}"}}})
    f.tenant(f.remote, name)
    f.remote.wait_condition(f.tenant_ns, name, "ClusterError/remote", "True", reason)
    assert f.remote.phase(f.tenant_ns, name) == "Error"
    # the healthy part of the fleet is unaffected
    ok = f.tenant(f.remote, f"ok-{uuid.uuid4().hex[:5]}")
    f.remote.wait_phase(f.tenant_ns, ok, "Ready")


# -- R6: chart problems, one operator each ---------------------------------------------------

CHART_CASES = [
    ("version", "1.2.3.4", "VersionInvalid", "ChartVersionInvalid"),
    ("version", ">= banana", "VersionInvalid", "ChartVersionInvalid"),
    ("version", "9.9.9", "VersionNotFound", "ChartVersionNotFound"),
    ("version", "^5", "VersionNotFound", "ChartVersionNotFound"),
    ("repo", "unreachable", "ChartNotLoaded", "ChartNotLoaded"),
    ("name", "no-such-chart", "ChartNotLoaded", "ChartNotLoaded"),
]


@pytest.mark.parametrize(("what", "value", "reason", "event"), CHART_CASES,
                         ids=[f"{c[2]}-{c[1]}" for c in CHART_CASES])
def test_bad_chart(fleet: Fleet, what: str, value: str, reason: str, event: str) -> None:
    fleet.register("remote", fleet.remote)
    args = fleet.args()
    if what == "version":
        args[args.index("--chart-version") + 1] = value
    elif what == "repo":
        args[args.index("--chart-repo") + 1] = f"http://127.0.0.1:{free_port()}"
    else:
        args[args.index("--chart-name") + 1] = value
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    name = fleet.tenant(fleet.remote, f"chart-{uuid.uuid4().hex[:5]}")
    fleet.remote.wait_condition(fleet.tenant_ns, name, "ClusterError/remote", "True", reason)
    fleet.remote.wait_event(fleet.tenant_ns, name, event)
    assert fleet.remote.phase(fleet.tenant_ns, name) == "Pending"
