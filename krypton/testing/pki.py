"""Certificates for local control planes, generated with `cryptography`.

A tiny private CA signs the API server's serving certificate and the admin client
certificate; a separate RSA key signs service-account tokens. Everything is written as
PEM files into the control plane's work directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyPEM = bytes
CertPEM = bytes


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert: CertPEM
    key: KeyPEM


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> KeyPEM:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(common_name: str, days: int = 365) -> KeyPair:
    """A self-signed CA certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    *,
    organization: str | None = None,
    server: bool = False,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> KeyPair:
    """A leaf certificate signed by `ca`: a serving cert for loopback, or a client cert.

    `not_before`/`not_after` let tests make expired or soon-expiring credentials.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(minutes=5))
        .not_valid_after(not_after or now + dt.timedelta(days=365))
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    # the `kubernetes` Service, as pods on a real node reach it (SPEC T8)
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_keys() -> KeyPair:
    """An RSA key pair for signing service-account tokens (`cert` holds the public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))


def write(directory: Path, stem: str, pair: KeyPair) -> tuple[Path, Path]:
    """Write `<stem>.crt` and `<stem>.key` (mode 0600) and return their paths."""
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(pair.cert)
    key_path.touch(mode=0o600)
    key_path.write_bytes(pair.key)
    return cert_path, key_path
