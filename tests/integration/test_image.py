"""The image ``make image`` built, in a container runtime (podman) where one works: it loads,
its entrypoint answers ``--help``, its helm is the test bed's and its helm worker is on the same
Helm, and it runs as the chart's user.
Without a working runtime the test is skipped and says why. Its podman storage is private."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from krypton.testing.image import archive

ROOT = Path(__file__).resolve().parents[2]
# this machine's podman: runc (crun refuses its hybrid cgroups), limits it may not raise
FLAGS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none"]


def _podman(store: Path) -> list[str]:
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("no podman on this machine (make test installs it where apt-get can)")
    runc = shutil.which("runc") or shutil.which("runc", path="/usr/sbin:/sbin")
    runtime = ["--runtime", runc] if runc else []
    return [podman, "--root", str(store / "root"), "--runroot", str(store / "run"), *runtime]


@pytest.fixture
def store() -> Iterator[Path]:
    """podman's storage for this test only (its run root must be a short path)."""
    path = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_image_runs_in_podman(store: Path, testbin: Path) -> None:
    path = archive()
    if not path.exists():
        pytest.fail(f"{path} is missing: run make image (make test does)")
    podman = _podman(store)
    loaded = subprocess.run([*podman, "load", "-q", "-i", str(path)], capture_output=True,
                            text=True, check=False)
    if loaded.returncode != 0:
        pytest.skip(f"podman cannot load images here: {loaded.stderr.strip()[-300:]}")
    image = loaded.stdout.strip().rsplit(" ", 1)[-1]

    def run(*argv: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
        extra = ["--entrypoint", entrypoint] if entrypoint else []
        return subprocess.run([*podman, "run", "--rm", *FLAGS, *extra, image, *argv],
                              capture_output=True, text=True, check=False, timeout=120)

    probe = run("-u", entrypoint="id")
    if probe.returncode != 0 and "krypton" not in probe.stdout:
        pytest.skip(f"podman cannot run containers here: {probe.stderr.strip()[-300:]}")
    values = yaml.safe_load((ROOT / "chart" / "values.yaml").read_text())
    assert probe.stdout.strip() == str(values["podSecurityContext"]["runAsUser"])
    helped = run("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: krypton"), helped.stderr
    want = subprocess.run([str(testbin / "helm"), "version", "--template", "{{.Version}}"],
                          capture_output=True, text=True, check=True).stdout.strip()
    helm = run("version", "--template", "{{.Version}}", entrypoint="helm")
    assert helm.stdout.strip() == want, helm.stderr
    worker = run("--version", entrypoint="krypton-helmworker")  # on the same Helm (P5)
    assert worker.stdout.strip() == f"protocol 2, helm {want}", worker.stderr
    subprocess.run([*podman, "rmi", "-a", "-f"], capture_output=True, check=False)
