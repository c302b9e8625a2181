"""The pure parts of OCI charts (SPEC R6b): references, tags, manifests, cosign payloads,
registry credentials from a Secret. Signatures here are made with `cryptography`; the
real cosign's are checked against the real registry in tests/reliability/test_oci.py."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from krypton.adapters.registry import Credentials, credentials_from_secret
from krypton.decisions.charts import oci
from krypton.decisions.errors import ChartNotLoaded, ChartVerificationFailed

DIGEST = "sha256:" + "ab" * 32


def test_reference_and_tags() -> None:
    ref = oci.reference("oci://reg.example:5000/charts/", "cert-manager")
    assert (ref.host, ref.repository) == ("reg.example:5000", "charts/cert-manager")
    assert oci.reference("oci://reg.example", "x").repository == "x"
    for bad in ("oci://reg.example/Charts", "oci://reg example/c", "oci://reg.example/../c"):
        with pytest.raises(ChartNotLoaded):
            oci.reference(bad, "chart")
    # helm pushes + as _; signature and other tags are not versions
    assert oci.versions(["1.2.3", "1.2.4_build.1", "latest", "sha256-ab.sig", 7]) == \
        ["1.2.3", "1.2.4+build.1"]
    assert oci.tag("1.2.4+build.1") == "1.2.4_build.1"
    assert oci.signature_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"


def test_chart_layer_is_the_one_helm_layer_within_bounds() -> None:
    layer = {"mediaType": oci.CHART_LAYER, "digest": DIGEST, "size": 1000}
    doc = oci.manifest(json.dumps({"layers": [layer]}).encode(), "w")
    assert oci.chart_layer(doc, "w") == (DIGEST, 1000)
    for layers in ([], [layer, layer], [{**layer, "size": oci.MAX_CHART + 1}],
                   [{**layer, "digest": "sha512:00"}], [{**layer, "mediaType": "other"}]):
        with pytest.raises(ChartNotLoaded):
            oci.chart_layer({"layers": layers}, "w")
    for body in (b"not json", b"[]", b'{"layers": 1}', b"{" * (oci.MAX_MANIFEST + 1)):
        with pytest.raises(ChartNotLoaded):
            oci.manifest(body, "w")


def _payload(digest: str, kind: str = "cosign container image signature") -> bytes:
    return json.dumps({"critical": {"identity": {"docker-reference": "r/c"},
                                    "image": {"docker-manifest-digest": digest},
                                    "type": kind}, "optional": None}).encode()


def test_cosign_payload_must_be_signed_by_the_key_and_name_the_digest() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    public = oci.load_public_key(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), "k")

    def signed(payload: bytes, by: ec.EllipticCurvePrivateKey = key) -> tuple[bytes, str]:
        return payload, base64.b64encode(by.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()

    oci.verified(public, DIGEST, [signed(_payload(DIGEST))])
    oci.verified(public, DIGEST, [signed(_payload(DIGEST), other), signed(_payload(DIGEST))])
    cases = {
        "no cosign signature": [],
        "no signature is valid": [signed(_payload(DIGEST), other)],
        "the signature is for":
            [signed(_payload("sha256:" + "cd" * 32))],
        "has type": [signed(_payload(DIGEST, kind="something else"))],
        "not base64": [(_payload(DIGEST), "%%%")],
    }
    for why, payloads in cases.items():
        with pytest.raises(ChartVerificationFailed, match=why):
            oci.verified(public, DIGEST, payloads)


def test_registry_credentials_from_a_secret() -> None:
    assert credentials_from_secret({"username": "u", "password": "p"}, "h:1") == \
        Credentials("u", "p")
    auth = base64.b64encode(b"u2:p2").decode()
    docker = json.dumps({"auths": {"https://h:1": {"auth": auth}, "other": {"auth": "eDp5"}}})
    assert credentials_from_secret({".dockerconfigjson": docker}, "h:1") == Credentials("u2", "p2")
    assert credentials_from_secret({".dockerconfigjson": docker}, "h:2") is None
    assert credentials_from_secret({".dockerconfigjson": "{not json"}, "h:1") is None
    assert "p2" not in repr(Credentials("u2", "p2"))


def test_credentials_never_go_in_clear_text_to_another_host() -> None:
    """A registry's challenge names the token service the credentials are sent to: over
    plain HTTP only when it is the (plain-HTTP) registry itself."""
    from krypton.adapters.registry import Registry

    ref = oci.reference("oci://reg.example:5000/charts", "c")
    for plain, realm in ((False, "http://reg.example:5000/token"),
                         (True, "http://elsewhere.example/token"), (False, "token")):
        registry = Registry("reg.example:5000", credentials=Credentials("u", "secret-pw"),
                            plain_http=plain)
        with pytest.raises(ChartNotLoaded, match="is not an https URL") as refused:
            asyncio.run(registry._authorize(ref, f'Bearer realm="{realm}",service="s"',
                                            "scope"))
        assert "secret-pw" not in str(refused.value)


def test_a_credentials_secret_is_read_as_far_as_it_is_text() -> None:
    """Values that are not base64 of UTF-8, and data that is not a mapping, are left out
    rather than stopping the reader."""
    from krypton.decisions.clusters.discovery import secret_strings

    secret = {"data": {"username": base64.b64encode(b"u").decode(), "password": "%%%",
                       "token": base64.b64encode(b"\xff\xfe").decode(), "n": 7}}
    assert secret_strings(secret) == {"username": "u"}
    assert secret_strings({"data": ["x"]}) == {} == secret_strings(None)
