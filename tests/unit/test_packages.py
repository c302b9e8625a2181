"""Importing a library's modules without its package's own imports (krypton.adapters.packages)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krypton.adapters import packages

# What `python -m krypton run` imports, and one cluster's client built and opened
OPERATOR = """
import asyncio, json, sys
import krypton.cli.main, krypton.app.operator
from krypton.adapters import kube
config = {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c",
          "user": "u"}}], "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
          "users": [{"name": "u", "user": {"token": "t"}}]}
async def main():
    cfg = kube.k8s.Configuration()
    await kube.KubeConfigLoader(config_dict=config).load_and_set(cfg)
    client = kube.Kube(cfg, name="c")
    client._session()
    await client.close()
asyncio.run(main())
print(json.dumps(sorted(sys.modules)))
"""

# Modules krypton does not use, and their libraries, that the packages' __init__ load
UNUSED = ("kubernetes.client", "kubernetes.config", "kubernetes.watch", "kubernetes.stream",
          "kubernetes.informer", "kubernetes.aio.watch", "kubernetes.aio.stream",
          "kubernetes.aio.dynamic", "requests", "oauthlib", "websocket", "urllib3",
          "pyhelm3.client", "pyhelm3.models")


def test_the_operator_loads_only_the_modules_it_uses() -> None:
    run = subprocess.run([sys.executable, "-c", OPERATOR], capture_output=True, text=True,
                         timeout=120, check=True)
    loaded = set(json.loads(run.stdout))
    assert {"kubernetes.aio.client.configuration", "kubernetes.aio.config.kube_config",
            "pyhelm3.command", "pyhelm3.errors"} <= loaded
    unused = sorted(m for m in loaded if m.split(".")[0] in UNUSED
                    or any(m == u or m.startswith(u + ".") for u in UNUSED))
    assert unused == []


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package `lib` whose own __init__ (and its subpackage's) fail when run."""
    sub = tmp_path / "lib" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "lib" / "__init__.py").write_text("raise RuntimeError('lib/__init__ ran')\n")
    (sub / "__init__.py").write_text("raise RuntimeError('lib/sub/__init__ ran')\n")
    (sub / "mod.py").write_text("VALUE = 42\n")
    (tmp_path / "plain.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m in ("lib", "plain") or m.startswith("lib.")]:
        del sys.modules[name]


def test_a_package_registered_without_init_imports_its_modules(library: Path) -> None:
    packages.without_init("lib", "lib.sub")
    import lib.sub.mod  # type: ignore[import-not-found]

    assert lib.sub.mod.VALUE == 42
    assert sys.modules["lib"].sub is sys.modules["lib.sub"]


def test_a_package_imported_before_is_left_as_it_is(library: Path) -> None:
    (library / "lib" / "__init__.py").write_text("READY = True\n")
    import lib  # type: ignore[import-not-found]

    packages.without_init("lib")
    assert sys.modules["lib"] is lib and lib.READY


def test_a_name_that_is_no_package_is_left_to_the_import(library: Path) -> None:
    packages.without_init("plain", "missing_library_name")
    assert "plain" not in sys.modules and "missing_library_name" not in sys.modules
    import plain  # type: ignore[import-not-found]

    assert plain.VALUE == 1
