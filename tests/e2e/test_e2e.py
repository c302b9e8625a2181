"""O10: the local two-cluster end to end, run exactly as `make e2e` runs it."""

from __future__ import annotations

import os
import subprocess
import sys

MILESTONES = ["workspace namespace created", "helm install success",
              "tenant phase is Ready on remote cluster", "e2e passed"]


def test_make_e2e_flow(testbin, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run([sys.executable, "-m", "krypton.testing.e2e"], capture_output=True,
                            text=True, timeout=600,
                            env={**os.environ, "KRYPTON_TESTBIN_DIR": str(testbin),
                                 "KRYPTON_PID_FILE": str(tmp_path / "op.pid")})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    positions = [lines.index(m) for m in MILESTONES]
    assert positions == sorted(positions)
    assert "operator stopped (exit 0)" in result.stdout
    assert not (tmp_path / "op.pid").exists()
