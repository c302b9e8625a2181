"""O10: the local two-cluster end to end, run exactly as `make e2e` runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

MILESTONES = ["workspace namespace created", "helm install success",
              "tenant phase is Ready on remote cluster", "e2e passed"]


def test_make_e2e_flow(testbin, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = subprocess.run([sys.executable, "-m", "krypton.testing.e2e"], capture_output=True,
                            text=True, timeout=600,
                            env={**os.environ, "KRYPTON_TESTBIN_DIR": str(testbin),
                                 "KRYPTON_PID_FILE": str(tmp_path / "op.pid"),
                                 "KRYPTON_E2E_LOG": str(tmp_path / "operator.log")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(MILESTONES) <= set(result.stdout.splitlines())  # the seed's lines, printed
    # what the operator itself did, in the order it logged it (its clock, not the script's)
    logged = [json.loads(line) for line in (tmp_path / "operator.log").read_text().splitlines()
              if line.startswith("{")]
    when = {}
    for entry in logged:
        if entry.get("tenant") == "default/acme":
            when.setdefault(entry["event"], entry["timestamp"])
    order = ["workspace namespace created", "helm install start", "helm install success",
             "tenant phase is Ready"]
    assert all(event in when for event in order), sorted(when)
    assert [when[e] for e in order] == sorted(when[e] for e in order)
    assert "operator stopped (exit 0)" in result.stdout
    assert not (tmp_path / "op.pid").exists()
