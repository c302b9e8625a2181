"""Importing a library's modules without its package's own imports (krypton.adapters.packages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from krypton.adapters import packages
from krypton.testing import pki

# What `python -m krypton run` imports, and the watch cluster's client built and opened from
# a kubeconfig file (argv[1]) as the operator builds it; then one file with a token file
# (argv[2]), which only the client library's loader reads. Prints the modules loaded at each
# of the two points, and the Authorization header each configuration sends; first the
# certificates a TLS context made after the imports holds, and the CA file setting the
# process has then.
OPERATOR = """
import asyncio, json, os, ssl, sys, tempfile
from pathlib import Path
import krypton.cli.main, krypton.app.operator
from krypton.adapters import kube, kubeapi
async def main():
    seen = [{"later": ssl.create_default_context().cert_store_stats()["x509"],
             "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE")}]
    for path in sys.argv[1:]:
        cfg = await kubeapi.configuration_from_file(path, workdir=Path(tempfile.mkdtemp()))
        client = kube.Kube(cfg, name="c")
        client._session()
        await client.close()
        seen.append({"modules": sorted(sys.modules),
                     "authorization": (await cfg.auth_settings())["BearerToken"]["value"]})
    print(json.dumps(seen))
asyncio.run(main())
"""

# Modules krypton does not use, and their libraries, that the packages' __init__ load
UNUSED = ("kubernetes.client", "kubernetes.config", "kubernetes.watch", "kubernetes.stream",
          "kubernetes.informer", "kubernetes.aio.watch", "kubernetes.aio.stream",
          "kubernetes.aio.dynamic", "requests", "oauthlib", "websocket", "urllib3",
          "pyhelm3.client", "pyhelm3.models")
# What only the client library's kubeconfig loader needs: the generated API client and the
# libraries of its models (a pod's service account and a self-contained file need none)
LOADER = ("kubernetes.aio.config.kube_config", "kubernetes.aio.client.api_client", "pydantic",
          "dateutil")


def kubeconfig(path: Path, user: dict[str, str]) -> str:
    path.write_text(json.dumps({
        "current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}]}))
    return str(path)


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_the_operator_loads_only_the_modules_it_uses(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    plain = kubeconfig(tmp_path / "plain", {"token": "inline"})
    with_file = kubeconfig(tmp_path / "with-file", {"tokenFile": str(tmp_path / "token")})
    # the process's CA bundle: two certificates, and no CA directory
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(pki.make_ca("one").cert + pki.make_ca("two").cert)
    (tmp_path / "no-ca-dir").mkdir()
    run = subprocess.run([sys.executable, "-c", OPERATOR, plain, with_file],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "SSL_CERT_FILE": str(bundle),
                              "SSL_CERT_DIR": str(tmp_path / "no-ca-dir")})
    tls, first, second = json.loads(run.stdout)
    # the imports leave the process's CA setting as it was: contexts made after them, and
    # helm, which inherits the environment, read the process's own bundle
    assert tls == {"later": 2, "SSL_CERT_FILE": str(bundle)}
    assert {"kubernetes.aio.client.configuration", "kubernetes.aio.config.incluster_config",
            "pyhelm3.command", "pyhelm3.errors"} <= set(first["modules"])
    assert loaded(first["modules"], UNUSED) == []
    assert loaded(first["modules"], LOADER) == []
    assert first["authorization"] == "Bearer inline"
    # a file reference is the library's to read, and its loader is imported for it
    assert "kubernetes.aio.config.kube_config" in second["modules"]
    assert second["authorization"] == "Bearer from-file"


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
