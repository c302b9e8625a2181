"""Shared fixtures: the real test bed (SPEC T1-T3).

Session-scoped ``home`` (client-certificate auth, with kube-controller-manager) and
``remote`` (token auth) control planes, the local chart repository with three versions of
the ``sample`` chart, and the helm binary. Tests marked ``unit`` touch none of them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHARTS = Path(__file__).parent / "charts"
SAMPLE_VERSIONS = ("0.1.0", "0.2.0", "0.3.0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for marker in ("unit", "integration", "e2e", "reliability"):
            if marker in parts:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def tools() -> Path:
    """The tool directory as built: helm is Helm 4, helm3 is Helm 3."""
    from krypton.testing import testbin as find

    return find()


@pytest.fixture(scope="session")
def testbin(tools: Path) -> Path:
    """The tools the suite runs with: ``KRYPTON_TEST_HELM=3`` selects the Helm 3 lane (the
    same tools with helm being Helm 3), otherwise helm is Helm 4 (SPEC H1)."""
    return tools / "lane-helm3" if os.environ.get("KRYPTON_TEST_HELM") == "3" else tools


@pytest.fixture(scope="session")
def helm_bin(testbin: Path) -> str:
    return str(testbin / "helm")


@pytest.fixture(scope="session")
def kubectl_bin(testbin: Path) -> str:
    return str(testbin / "kubectl")


def _control_plane(name: str, testbin: Path, **kwargs: object) -> Iterator[object]:
    from krypton.testing import ControlPlane

    with ControlPlane(name, testbin, **kwargs).start() as cp:  # type: ignore[arg-type]
        yield cp


@pytest.fixture(scope="session")
def home(testbin: Path) -> Iterator[object]:
    yield from _control_plane("home", testbin, auth="cert", controller_manager=True)


@pytest.fixture(scope="session")
def remote(testbin: Path) -> Iterator[object]:
    yield from _control_plane("remote", testbin, auth="token")


@pytest.fixture(scope="session")
def third(testbin: Path) -> Iterator[object]:
    """A third cluster, started only for the tests that need three distinct API servers."""
    yield from _control_plane("third", testbin, auth="token")


@pytest.fixture(scope="session")
def simulated(testbin: Path) -> Iterator[object]:
    """A cluster with two simulated nodes (kwok): pods become Ready 1 s after scheduling."""
    yield from _control_plane("sim", testbin, auth="token", nodes=2, pod_ready_delay=1.0,
                              audit=True)


@pytest.fixture(scope="session")
def chart_repo(helm_bin: str) -> Iterator[object]:
    from krypton.testing import ChartRepository

    repo = ChartRepository(helm_bin)
    for version in SAMPLE_VERSIONS:
        repo.publish(CHARTS / "sample", version)
    repo.publish(CHARTS / "workload")
    repo.publish(CHARTS / "shared")
    repo.start()
    try:
        yield repo
    finally:
        repo.close()


SESSION_MARK = "KRYPTON_TEST_SESSION"  # inherited by every process this session starts


def _our_control_plane_pids() -> list[int]:
    """Control-plane processes started by this pytest session (a demo or another checkout's
    suite running beside it on the machine is not this session's)."""
    mark = f"{SESSION_MARK}={os.environ.get(SESSION_MARK, '')}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if not re.search(r"(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) "
                             r".*krypton-cp-", cmdline):
                continue
            if mark not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def _worker(config: pytest.Config) -> bool:
    """A worker of ``pytest -n``: it inherits the mark of the run that started it, and that
    run looks for leaks once every worker is done (a worker's exit status is not the run's)."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _worker(session.config):
        return
    os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"
    session.config._krypton_preexisting = set(_our_control_plane_pids())  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a control-plane process started by this session outlived it."""
    if _worker(session.config):
        return
    before = getattr(session.config, "_krypton_preexisting", set())
    leaked = sorted(set(_our_control_plane_pids()) - before)
    if leaked:
        print(f"\nLEAK: control-plane processes still running after the session: {leaked}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
