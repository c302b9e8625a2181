"""S5: a kubeconfig as client-go reads it, row by row of the docs' table (Security model,
"A kubeconfig as client-go reads it"). Each expectation is client-go's documented behaviour
(k8s.io/client-go/tools/clientcmd and rest.Config): krypton reads the same, or refuses the
kubeconfig with the reason, so that krypton and helm (client-go) act as one identity."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from krypton.decisions.clusters.kubeconfig import inline_files, parse
from krypton.decisions.errors import KubeconfigRejected
from tests.unit.test_kubeconfig import CA, GOOD, OTHER, SECRET_TOKEN, b64, config, pair

SERVER = "https://127.0.0.1:6443"


@pytest.mark.parametrize("field", ["as", "as-uid", "as-groups", "as-user-extra"])
@pytest.mark.parametrize("trust", [False, True])
def test_impersonation_is_refused_for_helm_would_act_as_another_user(
        field: str, trust: bool) -> None:
    """client-go sends Impersonate-* headers for these; krypton's checks would run as the
    kubeconfig's own user while helm's writes ran as the impersonated one."""
    value: Any = {"as": "admin", "as-uid": "1", "as-groups": ["system:masters"],
                  "as-user-extra": {"scopes": ["x"]}}[field]
    with pytest.raises(KubeconfigRejected, match=f"sets {field} \\(impersonation\\)"):
        parse(config(user={"token": SECRET_TOKEN, field: value}), trust=trust)


def test_inline_ca_data_wins_over_a_ca_file() -> None:
    """rest.Config: CAData takes precedence over CAFile. The file is dropped, for helm too."""
    kc = parse(config(cluster={"server": SERVER, "certificate-authority": "/nonexistent/ca",
                               "certificate-authority-data": b64(CA.cert)}))
    assert kc.ca_pem == CA.cert and kc.ca_file is None
    assert "certificate-authority" not in kc.config["clusters"][0]["cluster"]


def test_inline_client_pair_wins_over_files() -> None:
    kc = parse(config(user={**pair(GOOD), "client-certificate": "/nonexistent/crt",
                            "client-key": "/nonexistent/key"}))
    assert kc.cert_pem == GOOD.cert and kc.cert_file is None and kc.key_file is None
    assert set(kc.config["users"][0]["user"]) == {"client-certificate-data", "client-key-data"}


def test_inlining_keeps_the_data_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(OTHER.cert)
    text = config(cluster={"server": SERVER, "certificate-authority": "ca.crt",
                           "certificate-authority-data": b64(CA.cert)})
    inlined = inline_files(text, lambda p: (tmp_path / p).read_bytes())
    assert parse(inlined).ca_pem == CA.cert


def test_a_token_beside_a_token_file_is_refused() -> None:
    """clientcmd takes the token; rest.Config then lets the file's content win once it is
    read: two answers to one kubeconfig."""
    with pytest.raises(KubeconfigRejected, match="both token and tokenFile"):
        parse(config(user={"token": SECRET_TOKEN, "tokenFile": "/t"}), trust=True)


@pytest.mark.parametrize("ca", [{"certificate-authority-data": b64(CA.cert)},
                                {"certificate-authority": "/etc/ca.crt"}])
def test_insecure_with_a_ca_is_refused_as_client_go_refuses_it(ca: dict[str, str]) -> None:
    with pytest.raises(KubeconfigRejected, match="insecure-skip-tls-verify with a CA"):
        parse(config(cluster={"server": SERVER, "insecure-skip-tls-verify": True, **ca}),
              trust=True)


def test_relative_file_references_resolve_from_the_kubeconfigs_directory() -> None:
    """clientcmd resolves relative paths against the file that names them; the reduced
    kubeconfig helm is given names the same absolute files krypton reads."""
    kc = parse(config(cluster={"server": SERVER, "certificate-authority": "pki/ca.crt"},
                      user={"client-certificate": "u.crt", "client-key": "../u.key"}),
               trust=True, base="/etc/kube")
    assert (kc.ca_file, kc.cert_file, kc.key_file) == \
        ("/etc/kube/pki/ca.crt", "/etc/kube/u.crt", "/etc/kube/../u.key")
    assert kc.config["clusters"][0]["cluster"]["certificate-authority"] == "/etc/kube/pki/ca.crt"


def test_a_relative_exec_command_resolves_from_the_kubeconfigs_directory() -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "bin/get-token"}}
    kc = parse(config(user=user), trust=True, base="/etc/kube")
    assert kc.config["users"][0]["user"]["exec"]["command"] == "/etc/kube/bin/get-token"
    on_path = parse(config(user={"exec": {**user["exec"], "command": "get-token"}}), trust=True)
    assert on_path.config["users"][0]["user"]["exec"]["command"] == "get-token"


@pytest.mark.parametrize(("user", "what"), [
    ({"tokenFile": "token"}, "tokenFile 'token' is a relative path"),
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./p"}},
     "user.exec.command './p' is a relative path"),
])
def test_a_relative_path_in_a_secret_has_no_directory_and_is_refused(
        user: dict[str, Any], what: str) -> None:
    with pytest.raises(KubeconfigRejected, match=what):
        parse(config(user=user), trust=True)


def test_a_client_pair_half_file_half_data_is_refused() -> None:
    with pytest.raises(KubeconfigRejected, match="one as a file, one as data"):
        parse(config(user={"client-certificate": "/u.crt",
                           "client-key-data": base64.b64encode(GOOD.key).decode()}),
              trust=True)


def test_disable_compression_is_read() -> None:
    plain = parse(config())
    assert not plain.disable_compression
    off = parse(config(cluster={"server": SERVER, "certificate-authority-data": b64(CA.cert),
                                "disable-compression": True}))
    assert off.disable_compression
