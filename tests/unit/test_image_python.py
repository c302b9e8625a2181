"""The bench's operator starts as the image's does (krypton.testing.operator.image_python):
with its modules' bytecode written, not compiled at every start."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from krypton.testing.operator import compile_like_image

MODULES = ("__init__.py", "a.py", "inner/__init__.py", "inner/b.py")


def test_a_package_is_compiled_where_a_process_that_writes_no_bytecode_finds_it(
        tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "inner").mkdir(parents=True)
    for name in MODULES:
        (package / name).write_text(f"NAME = {name!r}\n")

    compile_like_image(package)

    for name in MODULES:
        assert Path(importlib.util.cache_from_source(str(package / name))).is_file(), name
    # a process told not to write bytecode loads each module from the file written above
    # (`python -v` names the bytecode a module's code came from)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(tmp_path))
    trace = subprocess.run([sys.executable, "-v", "-c", "import pkg.a, pkg.inner.b"], env=env,
                           capture_output=True, text=True, check=True).stderr
    for name in MODULES:
        assert f"code object from '{importlib.util.cache_from_source(str(package / name))}'" \
            in trace, name
