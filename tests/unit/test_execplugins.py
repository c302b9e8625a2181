"""What an exec credential plugin is told and what krypton takes of its answer. Pure."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from krypton.decisions.clusters import execplugins
from krypton.decisions.clusters.execplugins import CredentialPluginFailed, PluginAccess, Provider

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
EXEC = {"apiVersion": "client.authentication.k8s.io/v1", "command": "/opt/plugins/token",
        "args": ["--audience", "fleet"], "env": [{"name": "MODE", "value": "short"}],
        "provideClusterInfo": True}


def test_an_exec_config_names_the_plugin() -> None:
    assert execplugins.exec_plugin("token", EXEC, "user.exec") == Provider(
        "token", "/opt/plugins/token", ("--audience", "fleet"), (("MODE", "short"),), True)
    older = execplugins.exec_plugin(
        "t", {**EXEC, "apiVersion": "client.authentication.k8s.io/v1beta1"}, "user.exec")
    assert older.api_version == "client.authentication.k8s.io/v1beta1"


@pytest.mark.parametrize(("config", "problem"), [
    ({**EXEC, "apiVersion": "client.authentication.k8s.io/v1alpha1"}, "user.exec.apiVersion"),
    ({**EXEC, "command": ""}, "user.exec.command"),
    ({**EXEC, "args": [1]}, "user.exec.args"),
    ({**EXEC, "env": [{"name": "A"}]}, "user.exec.env"),
])
def test_a_bad_exec_config_names_its_field(config: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        execplugins.exec_plugin("p", config, "user.exec")


def test_the_plugin_is_told_the_cluster_when_it_asks() -> None:
    plugin = execplugins.exec_plugin("token", EXEC, "user.exec")
    info = json.loads(execplugins.exec_info(PluginAccess("https://10.0.0.1:6443", CA, plugin)))
    assert info == {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                    "spec": {"interactive": False, "cluster": {
                        "server": "https://10.0.0.1:6443",
                        "certificate-authority-data": base64.b64encode(CA).decode()}}}
    no_ca = json.loads(execplugins.exec_info(PluginAccess("https://h:6443", b"", plugin)))
    assert no_ca["spec"]["cluster"] == {"server": "https://h:6443"}  # the system's CAs
    quiet = PluginAccess("https://10.0.0.1:6443", CA, Provider("p", "/c"))
    assert "cluster" not in json.loads(execplugins.exec_info(quiet))["spec"]


def answer(api: str = "client.authentication.k8s.io/v1", **status: Any) -> bytes:
    return json.dumps({"apiVersion": api, "kind": "ExecCredential", "status": status}).encode()


def test_the_token_of_an_exec_credential_and_its_expiry() -> None:
    now = 1_795_860_000.0  # 2026-11-28 10:00:00 UTC
    assert execplugins.credential(answer(token="t0k", expirationTimestamp="2026-11-28T10:15:00Z"),
                                  now) == ("t0k", now + 900)
    assert execplugins.credential(answer(token="t0k"), now) == ("t0k", None)
    beta = "client.authentication.k8s.io/v1beta1"
    assert execplugins.credential(answer(beta, token="b"), now, beta) == ("b", None)


@pytest.mark.parametrize(("output", "problem"), [
    (b"garbage", "not JSON"),
    (b"x" * (execplugins.MAX_OUTPUT + 1), "over"),
    (json.dumps({"kind": "Secret"}).encode(), "not an client.authentication.k8s.io/v1"),
    (answer("client.authentication.k8s.io/v1beta1", token="t"), "not an"),
    (answer(), "no usable status.token"),
    (answer(token="a b"), "no usable status.token"),
    (answer(token="t", expirationTimestamp="soon"), "not a time"),
    (answer(token="t", expirationTimestamp="2020-01-01T00:00:00Z"), "expired already"),
])
def test_a_bad_answer_says_what_is_wrong_and_not_what_it_said(output: bytes,
                                                             problem: str) -> None:
    with pytest.raises(CredentialPluginFailed) as caught:
        execplugins.credential(output, 1_795_860_000.0)
    assert problem in str(caught.value)
    assert "garbage" not in str(caught.value) and "a b" not in str(caught.value)
