"""The environment helm runs in (krypton.adapters.helm.helm_environment): one Go processor
unless the operator's own environment says otherwise, everything else passed through, the
language included (no message catalogue is chosen for helm)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from krypton.adapters.helm import Helm, helm_environment

# A stand-in for helm that prints what its environment says
FAKE_HELM = ("#!/bin/sh\nprintf '%s|%s|%s|%s' \"${GOMAXPROCS-unset}\" \"${LC_MESSAGES-unset}\" "
             "\"${LC_ALL-unset}\" \"${KRYPTON_PROBE-unset}\"\n")


@pytest.fixture
def fake_helm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    path = tmp_path / "helm"
    path.write_text(FAKE_HELM)
    path.chmod(0o755)
    for name in ("GOMAXPROCS", "LC_MESSAGES", "LC_ALL", "KRYPTON_PROBE"):
        monkeypatch.delenv(name, raising=False)
    return str(path)


def seen_by_helm(executable: str) -> str:
    helm = Helm(executable, timeout=10, wait=False)
    return asyncio.run(helm._command.run(["version"])).decode()


def test_helm_runs_on_one_go_processor_and_keeps_the_operators_language(
        fake_helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KRYPTON_PROBE", "kept")
    assert seen_by_helm(fake_helm) == "1|unset|unset|kept"


def test_the_operators_own_settings_pass_through(fake_helm: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMAXPROCS", "3")
    monkeypatch.setenv("LC_MESSAGES", "de_DE.UTF-8")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    assert seen_by_helm(fake_helm) == "3|de_DE.UTF-8|C.UTF-8|unset"


def test_the_operators_own_environment_is_never_written(fake_helm: str) -> None:
    """What helm needs is given to helm only: a credential plugin or any other child of the
    operator inherits the operator's environment as it was started."""
    import os

    before = dict(os.environ)
    assert seen_by_helm(fake_helm) == "1|unset|unset|unset"
    assert dict(os.environ) == before
    env = helm_environment({"KRYPTON_PROBE": "kept"}, "configmap")
    assert env == {"KRYPTON_PROBE": "kept", "GOMAXPROCS": "1", "HELM_DRIVER": "configmap"}


def test_each_clusters_helm_keeps_client_gos_cache_where_it_is_told(tmp_path: Path) -> None:
    """A cluster's cache directory, whatever the operator's own environment names: one
    cluster's answers are never another's (the reliability test shows it with real helm)."""
    env = helm_environment({"KUBECACHEDIR": "/shared"}, cache_dir=tmp_path / "kube-cache")
    assert env["KUBECACHEDIR"] == str(tmp_path / "kube-cache")
    assert helm_environment({"KUBECACHEDIR": "/shared"})["KUBECACHEDIR"] == "/shared"
