"""The environment helm runs in (krypton.adapters.helm.helm_environment): one Go processor
unless the operator's own environment says otherwise, everything else passed through."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from krypton.adapters.helm import Helm, helm_environment, inherit_go_processors

# A stand-in for helm that prints what its environment says
FAKE_HELM = "#!/bin/sh\nprintf '%s|%s' \"${GOMAXPROCS-unset}\" \"${KRYPTON_PROBE-unset}\"\n"


@pytest.fixture
def fake_helm(tmp_path: Path) -> str:
    path = tmp_path / "helm"
    path.write_text(FAKE_HELM)
    path.chmod(0o755)
    return str(path)


def seen_by_helm(executable: str) -> str:
    helm = Helm(executable, timeout=10, wait=False)
    return asyncio.run(helm._command.run(["version"])).decode()


def test_helm_runs_on_one_go_processor(fake_helm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setenv("KRYPTON_PROBE", "kept")
    assert seen_by_helm(fake_helm) == "1|kept"


def test_the_operators_own_gomaxprocs_passes_through(fake_helm: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMAXPROCS", "3")
    monkeypatch.delenv("KRYPTON_PROBE", raising=False)
    assert seen_by_helm(fake_helm) == "3|unset"


def test_the_operators_start_leaves_helm_nothing_to_copy() -> None:
    unset: dict[str, str] = {"KRYPTON_PROBE": "kept"}
    inherit_go_processors(unset)
    assert unset == {"KRYPTON_PROBE": "kept", "GOMAXPROCS": "1"}
    assert helm_environment(unset) is None
    own = {"GOMAXPROCS": "3"}
    inherit_go_processors(own)
    assert own == {"GOMAXPROCS": "3"}
