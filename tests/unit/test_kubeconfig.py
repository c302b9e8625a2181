"""D4/D5: the corpus of bad kubeconfigs, each rejected with a precise, secret-free reason."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest
import yaml

from krypton.app.config import file_reader
from krypton.decisions.clusters.kubeconfig import expiry_warnings, inline_files, parse
from krypton.decisions.errors import KubeconfigRejected
from krypton.testing import pki

CA = pki.make_ca("unit-ca")
NOW = dt.datetime.now(dt.UTC)
GOOD = pki.issue(CA, "alice")
OTHER = pki.issue(CA, "bob")
EXPIRED = pki.issue(CA, "old", not_before=NOW - dt.timedelta(days=10),
                    not_after=NOW - dt.timedelta(days=1))
SOON = pki.issue(CA, "soon", not_after=NOW + dt.timedelta(days=5))
FUTURE = pki.issue(CA, "future", not_before=NOW + dt.timedelta(days=5))
SECRET_TOKEN = "s3cr3t-token-value"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def config(user: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None,
           **top: Any) -> str:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster if cluster is not None else {
            "server": "https://127.0.0.1:6443", "certificate-authority-data": b64(CA.cert)}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": SECRET_TOKEN}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    doc.update(top)
    return yaml.safe_dump(doc)


def pair(kp: pki.KeyPair, key: bytes | None = None) -> dict[str, str]:
    return {"client-certificate-data": b64(kp.cert), "client-key-data": b64(key or kp.key)}


BAD = [
    ("missing", None, "data key is missing"),
    ("empty", "", "empty"),
    ("whitespace", "  \n", "empty"),
    ("garbage", "\x00\x01 : [ not yaml", "not valid YAML"),
    ("not a mapping", "- a\n- b\n", "not a YAML mapping"),
    ("not utf-8", b"\xff\xfe\x00", "not UTF-8"),
    ("no context", config(**{"current-context": "", "contexts": []}), "no usable context"),
    ("dangling context", config(**{"current-context": "nope"}), "'nope'"),
    ("no server", config(cluster={"certificate-authority-data": b64(CA.cert)}), "server URL"),
    ("bad server scheme", config(cluster={"server": "ftp://x"}), "server URL"),
    ("exec plugin", config(user={"exec": {"command": "/bin/sh"}}), "user.exec"),
    ("auth provider", config(user={"auth-provider": {"name": "oidc"}}), "user.auth-provider"),
    ("ca file", config(cluster={"server": "https://x", "certificate-authority": "/etc/ca"}),
     "cluster.certificate-authority"),
    ("client cert file", config(user={"client-certificate": "/c", "client-key": "/k"}),
     "user.client-certificate"),
    ("token file", config(user={"tokenFile": "/var/run/secrets/token"}), "user.tokenFile"),
    ("malformed ca", config(cluster={"server": "https://x",
                                     "certificate-authority-data": b64(b"nope")}),
     "certificate-authority-data is not a valid PEM"),
    ("ca not base64", config(cluster={"server": "https://x",
                                      "certificate-authority-data": "%%%"}), "not valid base64"),
    ("malformed client cert", config(user={"client-certificate-data": b64(b"x"),
                                           "client-key-data": b64(GOOD.key)}),
     "client-certificate-data is not a valid PEM"),
    ("malformed key", config(user={"client-certificate-data": b64(GOOD.cert),
                                   "client-key-data": b64(b"junk")}), "not a valid unencrypted"),
    ("cert without key", config(user={"client-certificate-data": b64(GOOD.cert)}),
     "must be given together"),
    ("key mismatch", config(user=pair(GOOD, OTHER.key)), "does not match"),
    ("expired", config(user=pair(EXPIRED)), "expired"),
    ("not yet valid", config(user=pair(FUTURE)), "not valid before"),
    ("token not a string", config(user={"token": 12}), "not a string"),
    # every field of an untrusted kubeconfig is checked inside the D3/D4 path
    ("unterminated ipv6", config(cluster={"server": "https://[::1"}), "cannot be parsed"),
    ("port out of range", config(cluster={"server": "https://h:99999"}), "cannot be parsed"),
    ("port not a number", config(cluster={"server": "https://h:port"}), "cannot be parsed"),
    ("server not a string", config(cluster={"server": 6443}), "no server URL"),
    ("server with path", config(cluster={"server": "https://h/api/v1/proxy"}), "path"),
    ("server with query", config(cluster={"server": "https://h?x=1"}), "query"),
    ("server with userinfo", config(cluster={"server": "https://u:p@h"}), "user information"),
    ("server with newline", config(cluster={"server": "https://h\n"}), "control characters"),
    ("insecure as string", config(cluster={"server": "https://h",
                                           "insecure-skip-tls-verify": "false"}),
     "must be a boolean"),
    ("insecure as number", config(cluster={"server": "https://h",
                                           "insecure-skip-tls-verify": 0}), "must be a boolean"),
    ("tls-server-name number", config(cluster={"server": "https://h", "tls-server-name": 5}),
     "not a string"),
    ("token with newline", config(user={"token": SECRET_TOKEN + "\n"}), "newline"),
    ("token not latin-1", config(user={"token": "t\u00f6k\u20ac"}), "HTTP header"),
    ("username number", config(user={"username": 42, "password": "pw-123456"}), "not a string"),
    ("username without password", config(user={"username": "admin"}), "together"),
    ("token over http", config(cluster={"server": "http://h:8080"}), "in clear"),
    ("current-context number", config(**{"current-context": 7}), "not a string"),
    # helm would honour a proxy and krypton's client would not: refused
    ("proxy-url", config(cluster={"server": "https://h", "proxy-url": "http://127.0.0.1:3128"}),
     "proxy-url"),
    ("alias bomb", "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
     "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
     "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n", "expands"),
    ("too large", "a: " + "x" * (1 << 20) + "\n", "over the limit"),
]


@pytest.mark.parametrize(("data", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_rejected(data: str | bytes | None, fragment: str) -> None:
    with pytest.raises(KubeconfigRejected) as err:
        parse(data)
    assert fragment in str(err.value)
    assert err.value.reason == "KubeconfigRejected"
    assert SECRET_TOKEN not in str(err.value)
    assert "PRIVATE KEY" not in str(err.value)


def test_http_allowed_when_trusted_and_without_credentials() -> None:
    assert parse(config(cluster={"server": "http://h:8080"}), trust=True).server == "http://h:8080"
    assert parse(config(cluster={"server": "http://h:8080"}, user={})).server == "http://h:8080"


@pytest.mark.parametrize(("server", "normal"), [
    ("https://h:6443/", "https://h:6443"), ("https://[::1]:6443", "https://[::1]:6443"),
    ("https://H.example", "https://h.example")])
def test_server_url_normalised(server: str, normal: str) -> None:
    assert parse(config(cluster={"server": server})).server == normal


def test_good_token_config_is_reduced_to_its_context() -> None:
    extra = config()
    doc = yaml.safe_load(extra)
    doc["contexts"].append({"name": "other", "context": {"cluster": "c", "user": "u"}})
    kc = parse(yaml.safe_dump(doc))
    assert kc.context == "ctx" and kc.token == SECRET_TOKEN and kc.ca_pem == CA.cert
    assert [c["name"] for c in kc.config["contexts"]] == ["ctx"]
    assert kc.warnings == ()


def test_client_cert_expiring_soon_warns() -> None:
    kc = parse(config(user=pair(SOON)))
    assert len(kc.warnings) == 1 and "expires" in kc.warnings[0]


def test_expiry_is_judged_again_later() -> None:
    """Engaged with a certificate 20 days from expiry: no warning then, one once it is within
    14 days, another wording once it has expired."""
    later = pki.issue(CA, "later", not_after=NOW + dt.timedelta(days=20))
    kc = parse(config(user=pair(later)))
    assert kc.warnings == () and expiry_warnings(kc, NOW) == []
    soon = expiry_warnings(kc, NOW + dt.timedelta(days=7))
    assert len(soon) == 1 and "expires at" in soon[0]
    gone = expiry_warnings(kc, NOW + dt.timedelta(days=21))
    assert len(gone) == 1 and "expired at" in gone[0]
    assert expiry_warnings(parse(config()), NOW + dt.timedelta(days=400)) == []  # a token


def test_proxy_url_is_refused_even_when_trusted() -> None:
    data = config(cluster={"server": "https://h", "proxy-url": "socks5://127.0.0.1:1080"})
    with pytest.raises(KubeconfigRejected, match="proxy-url"):
        parse(data, trust=True)


def test_trust_allows_plugins_and_files() -> None:
    kc = parse(config(user={"exec": {"command": "x"}}), trust=True)
    assert kc.uses_plugins_or_files


def test_explicit_context() -> None:
    doc = yaml.safe_load(config())
    doc["contexts"].append({"name": "second", "context": {"cluster": "c", "user": "u"}})
    assert parse(yaml.safe_dump(doc), context="second").context == "second"


def test_inline_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "ca.crt").write_bytes(CA.cert)
    (tmp_path / "c.crt").write_bytes(GOOD.cert)
    (tmp_path / "c.key").write_bytes(GOOD.key)
    text = config(cluster={"server": "https://x", "certificate-authority": "ca.crt"},
                  user={"client-certificate": str(tmp_path / "c.crt"), "client-key": "c.key"})
    kc = parse(inline_files(text, file_reader(str(tmp_path))))
    assert not kc.uses_plugins_or_files
    assert kc.cert_pem == GOOD.cert and kc.ca_pem == CA.cert


def test_in_cluster_reference_only_for_the_self_cluster() -> None:
    from krypton.decisions.clusters.incluster import in_cluster_kubeconfig

    text = in_cluster_kubeconfig("self-cluster", "")
    with pytest.raises(KubeconfigRejected, match="tokenFile"):
        parse(text)
    kc = parse(text, allow_in_cluster=True)
    assert kc.in_cluster and not kc.uses_plugins_or_files
    # the same files sent to another server are still rejected
    doc = yaml.safe_load(text)
    doc["clusters"][0]["cluster"]["server"] = "https://attacker.example"
    with pytest.raises(KubeconfigRejected):
        parse(yaml.safe_dump(doc), allow_in_cluster=True)


def test_in_cluster_server_follows_the_pod_environment() -> None:
    """In a pod the API server is the one KUBERNETES_SERVICE_HOST/_PORT name (as client-go's
    in-cluster configuration reads it); the reference is accepted for that server only."""
    from krypton.decisions.clusters.incluster import in_cluster_kubeconfig, service_server

    pod = service_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                          "KUBERNETES_SERVICE_PORT": "6443"})
    assert pod == "https://10.96.0.1:6443"
    assert service_server({"KUBERNETES_SERVICE_HOST": "fd00::1",
                           "KUBERNETES_SERVICE_PORT": "443"}) == "https://[fd00::1]:443"
    assert service_server({}) == ""
    text = in_cluster_kubeconfig("self-cluster", pod)
    kc = parse(text, allow_in_cluster=True, pod_server=pod)
    assert kc.in_cluster and kc.server == "https://10.96.0.1:6443"
    # another server: a plain file reference
    with pytest.raises(KubeconfigRejected, match="tokenFile"):
        parse(text, allow_in_cluster=True, pod_server="https://10.96.0.1:7443")
    with pytest.raises(KubeconfigRejected, match="tokenFile"):
        parse(text, allow_in_cluster=True)
