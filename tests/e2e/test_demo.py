"""O11: `make demo` runs start to finish (non-interactive: it tears down by itself)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_demo_runs_end_to_end(testbin, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**os.environ, "KRYPTON_TESTBIN_DIR": str(testbin), "DEMO_HOLD": "0",
           "KRYPTON_DEMO_DIR": str(tmp_path / "demo")}
    result = subprocess.run([sys.executable, "-m", "krypton.testing.demo"], capture_output=True,
                            text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "registered: Secret krypton-system/remote created" in out
    status = out.split("==> krypton status")[1].split("==>")[0]
    assert status.count(" Ready ") == 3
    assert "initech" in status
    pods = out.split("==> the pods of acme on remote")[1].split("==>")[0]
    running = [ln for ln in pods.splitlines() if ln.startswith("tenant-acme-remote-")
               and " 1/1 " in ln and " Running " in ln and "remote-node-" in ln]
    assert len(running) == 2, pods
    plan = out.split("==> krypton plan")[1].split("==>")[0]
    actions = [line.split()[3] for line in plan.strip().splitlines()[2:]]
    assert sorted(actions) == ["paused", "upgrade", "upgrade", "upgrade"]
    assert "operator exited with 0" in out
    assert not (tmp_path / "demo").exists()
