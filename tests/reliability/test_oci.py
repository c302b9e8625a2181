"""Charts from a real OCI registry (SPEC R6b): the CNCF distribution registry of
the test bed, charts pushed with the real ``helm push`` and signed with the real ``cosign``,
provenance made with ``helm package --sign`` and a gpg key of the test bed.

Digests expected here are the ones helm itself printed when it pushed, never ones krypton
computed. The registry password is planted (conftest.PLANTED): the suite's credential scan
fails the run if it shows up in any log, Event, condition or metric.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from krypton.testing.operator import OperatorProcess, wait_for
from krypton.testing.registry import OciRegistry, cosign_keys, gpg_keyring
from tests.conftest import CHARTS
from tests.integration.conftest import Cluster, Fleet, unique
from tests.integration.test_cli import krypton
from tests.reliability.conftest import PLANTED

PASSWORD = PLANTED[-1]
HELM_RUNS = "krypton_helm_processes_total"


def package(helm: Path, where: Path, version: str, app: str = "1.0") -> Path:
    """The sample chart packaged as `version` (app version `app`: another app version is
    another archive, so another digest)."""
    out = where / app
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(helm), "package", str(CHARTS / "sample"), "--version", version,
                    "--app-version", app, "--destination", str(out)],
                   check=True, capture_output=True)
    return out / f"sample-{version}.tgz"


@pytest.fixture
def registry(testbin: Path) -> Iterator[OciRegistry]:
    reg = OciRegistry(testbin, tls=True, auth=True, password=PASSWORD).start()
    yield reg
    reg.close()


@pytest.fixture
def plain_registry(testbin: Path) -> Iterator[OciRegistry]:
    reg = OciRegistry(testbin, tls=False, auth=False).start()
    yield reg
    reg.close()


def applied(cluster: Cluster, fleet: Fleet, tenant: str) -> dict[str, str]:
    return ((cluster.tenant(fleet.tenant_ns, tenant).get("status") or {}).get("clusters")
            or {}).get(cluster.name) or {}


def oci_args(fleet: Fleet, reg: OciRegistry, version: str, *extra: str) -> list[str]:
    args = fleet.args(*extra, version=version)
    args[args.index(fleet.chart_repo.url)] = reg.url
    return args


def start(fleet: Fleet, args: list[str]) -> OperatorProcess:
    op = OperatorProcess(args, helm_dir=fleet.testbin).start()
    fleet.operators.append(op)
    op.wait_ready()
    return op


def test_over_a_registry_with_tls_and_credentials(fleet: Fleet, registry: OciRegistry,
                                                   tmp_path: Path) -> None:
    """Install and upgrade over OCI; a range picks up a newly pushed tag after the index
    TTL; wrong credentials and a registry that is down give ChartNotLoaded naming the
    registry, quietly (no helm run while it lasts), and both recover."""
    first = registry.push(package(fleet.testbin / "helm", tmp_path, "0.2.0"))
    fleet.home.core.create_namespaced_secret(fleet.discovery_ns, {
        "metadata": {"name": "registry-creds"}, "type": "Opaque",
        "stringData": {"username": registry.username, "password": PASSWORD}})
    fleet.register("home", fleet.home)
    op = start(fleet, oci_args(fleet, registry, "~0.2", "--chart-index-ttl", "3s",
                                        "--resync-period", "4s",
                                        "--chart-ca-file", str(registry.ca_file),
                                        "--chart-credentials-secret", "registry-creds"))
    t = fleet.tenant(fleet.home, unique("oci"))
    fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterReady/home", "True")
    mine = applied(fleet.home, fleet, t)
    assert (mine["chartVersion"], mine["chartDigest"]) == ("0.2.0", first)
    assert fleet.home.release_records(t, f"tenant-{t}-home") == [(1, "deployed")]

    # a new patch release in the registry rolls out once the range is looked up again
    second = registry.push(package(fleet.testbin / "helm", tmp_path, "0.2.1"))
    wait_for(lambda: applied(fleet.home, fleet, t).get("chartDigest") == second, 60,
             what="0.2.1 applied")
    assert applied(fleet.home, fleet, t)["chartVersion"] == "0.2.1"
    assert fleet.home.release_records(t, f"tenant-{t}-home") == [(1, "superseded"),
                                                                  (2, "deployed")]
    status = krypton(fleet, "status", *oci_args(fleet, registry, "~0.2"))
    assert f"0.2.1@{second[:19]}" in status.stdout, status.stdout
    # the CLI resolves over the registry with the same Secret (read with the user's access)
    planned = krypton(fleet, "plan", *oci_args(fleet, registry, "~0.2",
                                              "--chart-ca-file", str(registry.ca_file),
                                              "--chart-credentials-secret", "registry-creds"),
                      "-o", "json")
    row = next(r for r in json.loads(planned.stdout) if r["tenant"] == t)
    assert (row["action"], row["chart_version"]) == \
        ("skip", f"0.2.1@{second[:19]} -> 0.2.1@{second[:19]}"), planned.stdout

    # a newer version outside the range is noticed from the registry's tags, not taken (F8)
    registry.push(package(fleet.testbin / "helm", tmp_path, "0.3.0"))
    wait_for(lambda: applied(fleet.home, fleet, t).get("newerVersion") == "0.3.0", 60,
             what="the update notice")
    assert applied(fleet.home, fleet, t)["chartVersion"] == "0.2.1"

    # wrong credentials: the registry is named, the password is nowhere (the suite's scan)
    fleet.home.core.patch_namespaced_secret("registry-creds", fleet.discovery_ns, {
        "data": {"password": base64.b64encode(b"pw-wrong-credential").decode()}})
    refused = fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterError/home", "True",
                                        "ChartNotLoaded")
    assert registry.host in refused["message"] and "HTTP 401" in refused["message"]
    helm_runs = op.metric(HELM_RUNS)
    fleet.home.core.patch_namespaced_secret("registry-creds", fleet.discovery_ns, {
        "data": {"password": base64.b64encode(PASSWORD.encode()).decode()}})
    fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterError/home", "False", timeout=120)

    # the registry down, then up: the same, and no helm run while it was down
    registry.stop()
    down = fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterError/home", "True",
                                     "ChartNotLoaded")
    assert registry.host in down["message"] and "unreachable" in down["message"]
    registry.start()
    fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterError/home", "False", timeout=120)
    assert op.metric(HELM_RUNS) == helm_runs
    assert fleet.home.release_records(t, f"tenant-{t}-home")[-1] == (2, "deployed")
    assert PASSWORD not in op.log_text()


def test_digest_pins_and_cosign_signatures(fleet: Fleet, plain_registry: OciRegistry,
                                           tmp_path: Path) -> None:
    """A digest pin and cosign verification on a plain-HTTP registry: the signed, pinned
    chart installs; a tag pushed again under the pin is refused; an unsigned version is
    never installed, on every Tenant it would reach, and `krypton plan` says so first."""
    helm = fleet.testbin / "helm"
    private, public = cosign_keys(fleet.testbin, tmp_path)
    pinned = plain_registry.push(package(helm, tmp_path, "0.2.0"))
    plain_registry.sign("sample", pinned, private)
    plain_registry.push(package(helm, tmp_path, "0.3.0"))  # never signed
    fleet.register("home", fleet.home)
    fleet.register("remote", fleet.remote)
    verify = ("--chart-plain-http", "--chart-verify", "--chart-cosign-key", str(public),
              "--chart-index-ttl", "3s", "--resync-period", "4s")

    op = start(fleet, oci_args(fleet, plain_registry, "0.2.0", *verify,
                                        "--chart-digest", pinned))
    h = fleet.tenant(fleet.home, unique("h"))
    r = fleet.tenant(fleet.remote, unique("r"))
    fleet.home.wait_condition(fleet.tenant_ns, h, "ClusterReady/home", "True")
    fleet.remote.wait_condition(fleet.tenant_ns, r, "ClusterReady/remote", "True")
    assert applied(fleet.home, fleet, h)["chartDigest"] == pinned

    # plan before the unsigned version is rolled out: refused on both, with the reason
    planned = krypton(fleet, "plan", *oci_args(fleet, plain_registry, "0.3.0", *verify),
                      "-o", "json")
    rows = {row["tenant"]: row for row in json.loads(planned.stdout) if row["tenant"]}
    assert {t: (rows[t]["action"], rows[t]["reason"]) for t in (h, r)} == {
        t: ("blocked", "ChartVerificationFailed") for t in (h, r)}, planned.stdout

    # the tag pushed again with other content (and signed): the pin refuses it
    moved = plain_registry.push(package(helm, tmp_path, "0.2.0", app="2.0"))
    plain_registry.sign("sample", moved, private)
    assert moved != pinned
    refused = fleet.home.wait_condition(fleet.tenant_ns, h, "ClusterError/home", "True",
                                        "ChartVerificationFailed")
    assert pinned in refused["message"] and moved in refused["message"]
    assert fleet.home.release_records(h, f"tenant-{h}-home") == [(1, "deployed")]
    op.stop()

    # an unsigned version with verification on: on every Tenant, an Event, no helm run
    op = start(fleet, oci_args(fleet, plain_registry, "0.3.0", *verify))
    for cluster, t in ((fleet.home, h), (fleet.remote, r)):
        # the home Tenant still says why the pin refused the tag: wait for the new reason's words
        wait_for(lambda c=cluster, t=t: "no cosign signature" in (c.condition(
            fleet.tenant_ns, t, f"ClusterError/{c.name}") or {}).get("message", ""), 90,
            what=f"ChartVerificationFailed for the missing signature on {cluster.name}")
        assert cluster.condition(fleet.tenant_ns, t, f"ClusterError/{cluster.name}")["reason"] \
            == "ChartVerificationFailed"
        wait_for(lambda c=cluster, t=t: [e for e in c.events(fleet.tenant_ns, t)
                                         if e.reason == "ChartVerificationFailed"
                                         and "no cosign signature" in e.message], 30,
                 what=f"the Event on {cluster.name}")
        assert cluster.release_records(t, f"tenant-{t}-{cluster.name}") == [(1, "deployed")]
    assert op.metric(HELM_RUNS, operation="upgrade") == 0


def test_helm_provenance_with_a_keyring(fleet: Fleet, tmp_path: Path) -> None:
    """An http(s) repository with --chart-verify: a chart packaged with ``helm package
    --sign`` verifies against the keyring; one without a .prov file is refused."""
    from krypton.testing import ChartRepository

    secret, public = gpg_keyring(tmp_path)
    (tmp_path / "repo").mkdir()
    repo = ChartRepository(fleet.testbin / "helm", tmp_path / "repo").start()
    try:
        repo.publish(CHARTS / "sample", "0.2.0", sign=("krypton charts", secret))
        repo.publish(CHARTS / "sample", "0.3.0")
        fleet.register("home", fleet.home)

        def args(version: str) -> list[str]:
            flags = fleet.args("--chart-verify", "--chart-keyring", str(public), version=version)
            flags[flags.index(fleet.chart_repo.url)] = repo.url
            return flags

        start(fleet, args("0.2.0"))
        t = fleet.tenant(fleet.home, unique("prov"))
        fleet.home.wait_condition(fleet.tenant_ns, t, "ClusterReady/home", "True", "Installed")
        planned = krypton(fleet, "plan", *args("0.3.0"), "-o", "json")
        rows = [row for row in json.loads(planned.stdout) if row["tenant"] == t]
        assert [x["reason"] for x in rows] == ["ChartVerificationFailed"], planned.stdout
        assert "provenance" in rows[0]["detail"]
    finally:
        repo.stop()
