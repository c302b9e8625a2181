"""O11: `make demo` runs start to finish (non-interactive: it tears down by itself)."""

from __future__ import annotations

import os
import subprocess
import sys

from krypton.testing.watching import row


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
    # The demo ends with plan and diff of a changed value, and status --watch
    changed = out.split("==> krypton plan with a changed central value")[1].split("==>")[0]
    rows = [line.split() for line in changed.splitlines() if line.startswith(("remote ", "self-cluster "))]
    assert sorted(r[3] for r in rows) == ["paused", "upgrade", "upgrade", "upgrade"]
    assert all("values: replicas" in " ".join(r) for r in rows if r[3] == "upgrade")
    diff = out.split("==> krypton diff with that value")[1].split("==>")[0]
    assert diff.count("-  replicas: 2") == 3 and diff.count("+  replicas: 3") == 3, diff
    assert "(tenant-initech-self-cluster) paused by annotation: no change" in diff
    watched = out.split("==> krypton status --watch --wide")[1].split("==>")[0]
    frames = watched.split("krypton status --watch  ")[1:]  # the header: two spaces, then the time
    assert row(frames[0], "initech", "self-cluster")[3] == "Suspended", watched
    assert row(frames[-1], "initech", "self-cluster")[3] == "Ready", watched
    assert "releases ready  [####################] 4/4" in frames[-1]
    assert "krypton status --watch exited with 0" in watched
    assert "operator exited with 0" in out
    assert not (tmp_path / "demo").exists()
