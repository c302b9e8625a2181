"""SPEC O2: in JSON mode every line is JSON, also what the libraries log through the standard
library and what Python warns about, and credentials are scrubbed there too."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROGRAM = """
import logging, warnings
import structlog
from krypton.app import log
log.configure("json", "info")
structlog.get_logger("krypton.test").info("from krypton", cluster="c1")
logging.getLogger("pyhelm3").error("command failed: helm upgrade --install x")
logging.getLogger("kubernetes.aio").warning("Authorization: Bearer abcdefghijklmnopqrstuvwxyz")
try:
    raise ValueError("boom")
except ValueError:
    logging.getLogger("aiohttp").exception("unclosed session")
warnings.warn("a library is deprecated", DeprecationWarning, stacklevel=1)
logging.getLogger("noisy").debug("below the level")
"""


def test_a_json_log_holds_only_json_lines() -> None:
    result = subprocess.run([sys.executable, "-W", "always", "-c", PROGRAM], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # fails on any line that is not JSON
    by_logger = {e.get("logger", "krypton"): e for e in events}
    assert set(by_logger) == {"krypton", "pyhelm3", "kubernetes.aio", "aiohttp", "py.warnings"}
    assert by_logger["pyhelm3"]["level"] == "error"
    assert "timestamp" in by_logger["pyhelm3"]
    assert "ValueError: boom" in by_logger["aiohttp"]["exception"]
    assert "abcdefghijklmnopqrstuvwxyz" not in result.stderr
    assert not any("below the level" in line for line in lines)

