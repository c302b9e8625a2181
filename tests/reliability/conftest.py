"""The reliability suite reuses the integration fixtures (real control planes, real helm).

It also owns the credential scan: when the suite ends, every log line of every
operator started in this session, the last metrics each published, every Event and every
Tenant (status and metadata) on both clusters are searched for the credentials the suite
used: the clusters' tokens and client keys, and the bad tokens and passwords its inputs
carried. Finding one fails the run.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
import yaml

from krypton.testing import ControlPlane
from krypton.testing.operator import STARTED
from tests.integration.conftest import (  # noqa: F401 - fixtures
    Cluster,
    fleet,
    home_cluster,
    pytest_runtest_makereport,
    remote_cluster,
)

# Credentials that the suite's inputs carry besides the control planes' own.
PLANTED = ["not-the-token", "pw-secret-1", "pw-registry-7c41e9d2"]  # the last: test_oci's


def credentials_of(kubeconfig_text: str) -> list[str]:
    """Tokens, passwords and private keys (PEM body lines and base64 form) of a kubeconfig."""
    doc = yaml.safe_load(kubeconfig_text)
    out = []
    for entry in doc.get("users") or []:
        user = entry.get("user") or {}
        for key in ("token", "password"):
            if isinstance(user.get(key), str):
                out.append(user[key])
        if isinstance(user.get("client-key-data"), str):
            b64 = user["client-key-data"]
            out.append(b64[:40])
            pem = base64.b64decode(b64).decode()
            out += [line for line in pem.splitlines() if len(line) > 40]
    return out


def _everything(cluster: Cluster) -> list[str]:
    texts = [json.dumps(cluster.api.sanitize_for_serialization(e))
             for e in cluster.core.list_event_for_all_namespaces().items]
    try:
        tenants = cluster.custom.list_cluster_custom_object("mesh.openkcm.io", "v1alpha1",
                                                           "tenants")["items"]
    except Exception:  # noqa: BLE001 - no CRD yet: nothing to scan
        tenants = []
    texts += [json.dumps({"metadata": t.get("metadata"), "status": t.get("status")})
              for t in tenants]
    return texts


@pytest.fixture(scope="session", autouse=True)
def credential_scan(home: ControlPlane, remote: ControlPlane) -> Iterator[None]:
    yield
    secrets = PLANTED + credentials_of(home.kubeconfig.read_text()) + \
        credentials_of(remote.kubeconfig.read_text())
    secrets = [s for s in secrets if len(s) >= 8]
    assert len(secrets) >= 4, "the scan must know the credentials it looks for"
    found: list[str] = []
    places: list[tuple[str, str]] = []
    for op in STARTED:
        places.append((f"log {op.log_path}", op.log_text()))
        if op.metrics_path.exists():
            places.append((f"metrics {op.metrics_path}", op.metrics_path.read_text()))
    for name, cp in (("home", home), ("remote", remote)):
        cluster = Cluster(name, cp)
        places += [(f"{name} Events/Tenants", text) for text in _everything(cluster)]
    for where, text in places:
        for secret in secrets:
            if secret in text:
                found.append(f"{where}: credential {secret[:4]}... found")
    assert not found, "\n".join(sorted(set(found)))
