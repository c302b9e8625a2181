"""Charts in OCI registries (SPEC R6b): references, tags, manifests, digest pins and cosign
signatures, as pure functions over what a registry answered.

Helm stores a chart as an OCI artifact: a manifest whose one layer of media type
``application/vnd.cncf.helm.chart.content.v1.tar+gzip`` is the packaged chart, tagged with
the chart version (``+`` written ``_``, tags allow no ``+``). cosign stores a signature of
the manifest with digest ``sha256:<hex>`` as the tag ``sha256-<hex>.sig`` of the same
repository: a manifest whose layers are "simple signing" payloads naming the signed digest,
each with its base64 signature in the annotation ``dev.cosignproject.cosign/signature``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from krypton.decisions.charts.versions import parse_version
from krypton.decisions.errors import ChartNotLoaded, ChartVerificationFailed, SettingsError

CHART_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
MAX_MANIFEST = 1 << 20  # bytes of one manifest or signature payload
MAX_CHART = 20 << 20  # bytes of one packaged chart (Helm's own limit for an archive)

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
                   r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


@dataclass(frozen=True)
class Reference:
    """Where a chart lives in a registry: ``oci://<host>/<repository>``."""

    host: str  # host[:port]
    repository: str  # path/chart-name

    def __str__(self) -> str:
        return f"oci://{self.host}/{self.repository}"


def reference(repo_url: str, chart: str) -> Reference:
    """The reference of chart `chart` under ``--chart-repo oci://host/path``; ChartNotLoaded
    for one the registry API could not name."""
    rest = repo_url.rstrip("/").removeprefix("oci://")
    host, _, path = rest.partition("/")
    repository = f"{path}/{chart}" if path else chart
    if not _HOST.match(host) or not _PATH.match(repository) or len(repository) > 255:
        raise ChartNotLoaded(f"{repo_url}/{chart} is not a valid OCI reference")
    return Reference(host, repository)


def check_digest(text: str) -> str:
    """A ``--chart-digest`` value: ``sha256:`` and 64 lower-case hex digits."""
    if not _DIGEST.match(text):
        raise SettingsError(f"invalid --chart-digest: {text[:80]!r} is not sha256:<64 hex digits>")
    return text


def tag(version: str) -> str:
    """The tag helm pushes chart version `version` under."""
    return version.replace("+", "_")


def versions(tags: Iterable[Any]) -> list[str]:
    """The chart versions among a repository's tags (signatures and other tags left out)."""
    found = []
    for t in tags:
        if isinstance(t, str) and len(t) <= 128:
            version = t.replace("_", "+")
            try:
                parse_version(version)
            except Exception:  # noqa: BLE001 - not a version tag
                continue
            found.append(version)
    return found


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def manifest(body: bytes, where: str) -> dict[str, Any]:
    """A manifest document; ChartNotLoaded when it is not one."""
    if len(body) > MAX_MANIFEST:
        raise ChartNotLoaded(f"{where}: manifest over {MAX_MANIFEST} bytes")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ChartNotLoaded(f"{where}: manifest is not JSON") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("layers"), list):
        raise ChartNotLoaded(f"{where}: not an image manifest")
    return doc


def chart_layer(doc: dict[str, Any], where: str) -> tuple[str, int]:
    """The digest and size of the chart archive a helm manifest holds."""
    layers = [x for x in doc["layers"] if isinstance(x, dict) and x.get("mediaType") == CHART_LAYER]
    if len(layers) != 1:
        raise ChartNotLoaded(f"{where}: not a Helm chart (no single layer of type {CHART_LAYER})")
    digest, size = layers[0].get("digest"), layers[0].get("size")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ChartNotLoaded(f"{where}: chart layer has no sha256 digest")
    if not isinstance(size, int) or not 0 < size <= MAX_CHART:
        raise ChartNotLoaded(f"{where}: chart layer size {size!r} is not within 1..{MAX_CHART} bytes")
    return digest, size


def signature_tag(digest: str) -> str:
    """The tag cosign stores the signatures of the manifest `digest` under."""
    return digest.replace(":", "-") + ".sig"


def signed_layers(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(payload digest, base64 signature) of each layer of a cosign signature manifest."""
    found = []
    for layer in doc["layers"]:
        if not isinstance(layer, dict):
            continue
        signature = (layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION)
        digest = layer.get("digest")
        if isinstance(signature, str) and isinstance(digest, str) and _DIGEST.match(digest):
            found.append((digest, signature))
    return found


def load_public_key(pem: bytes, where: str) -> Any:
    """A cosign public key (PEM: ECDSA, Ed25519 or RSA); SettingsError if it is none."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise SettingsError(f"invalid {where}: not a PEM public key") from exc
    if not isinstance(key, (ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey,
                            rsa.RSAPublicKey)):
        raise SettingsError(f"invalid {where}: an ECDSA, Ed25519 or RSA public key is needed")
    return key


def verify_signature(key: Any, payload: bytes, signature: str, digest: str) -> str | None:
    """None when `payload` is a cosign "simple signing" document for manifest `digest` and
    `signature` (base64) signs it with `key`; else why not."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return "a signature is not base64"
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(raw, payload, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(raw, payload)
        else:
            key.verify(raw, payload, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return "no signature is valid for the key"
    try:
        doc = json.loads(payload)
        signed = doc["critical"]["image"]["docker-manifest-digest"]
        kind = doc["critical"]["type"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return "a signed payload is not a cosign signature document"
    if kind != "cosign container image signature":
        return f"a signed payload has type {str(kind)[:60]!r}"
    if signed != digest:
        return f"the signature is for {str(signed)[:80]}, not {digest}"
    return None


def verified(key: Any, digest: str, payloads: Iterable[tuple[bytes, str]]) -> None:
    """Raises ChartVerificationFailed unless one of the (payload, signature) pairs is a
    valid cosign signature of manifest `digest` by `key`."""
    reasons = [verify_signature(key, payload, signature, digest)
               for payload, signature in payloads]
    if not reasons:
        raise ChartVerificationFailed(f"no cosign signature for {digest}")
    if None not in reasons:
        raise ChartVerificationFailed(f"cosign signature of {digest} not verified: "
                                      f"{'; '.join(sorted(set(r for r in reasons if r)))}")
