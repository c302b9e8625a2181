"""Locating (and on first use building) the pinned tool binaries of the test bed (SPEC T2)."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "testbin.sh"


@cache
def testbin() -> Path:
    """The directory with helm, etcd, kube-apiserver, kube-controller-manager and kubectl.

    ``$KRYPTON_TESTBIN_DIR`` names a ready directory; otherwise ``hack/testbin.sh`` is run
    (a no-op when the cache is warm) and its last output line is the directory.
    """
    ready = os.environ.get("KRYPTON_TESTBIN_DIR")
    if ready:
        return Path(ready)
    if not _SCRIPT.exists():
        raise FileNotFoundError(
            "set KRYPTON_TESTBIN_DIR to a directory with the test-bed binaries "
            f"({_SCRIPT} is only in a source checkout)"
        )
    out = subprocess.run(["bash", str(_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])
