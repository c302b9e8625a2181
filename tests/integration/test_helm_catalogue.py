"""The message language krypton gives helm (krypton.adapters.helm.MESSAGE_LANGUAGE) names one
of the smallest catalogues of the kubectl library that each helm binary of the test bed was
built with: read from that binary's own build information and that module's source, so a
helm whose kubectl drops the language, or fills its catalogue, fails here first."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from krypton.adapters.helm import MESSAGE_LANGUAGE


def kubectl_module(helm: Path) -> Path:
    """The source of the kubectl module that `helm` was built with (Go's module cache)."""
    go = shutil.which("go")
    assert go, "go builds the test bed's tools and must be on PATH"
    info = subprocess.run([go, "version", "-m", str(helm)], capture_output=True, text=True,
                          check=True).stdout
    version = re.search(r"^\s*dep\s+k8s\.io/kubectl\s+(\S+)", info, re.MULTILINE)
    assert version, f"{helm} names no kubectl module:\n{info}"
    download = subprocess.run([go, "mod", "download", "-json", f"k8s.io/kubectl@{version[1]}"],
                              capture_output=True, text=True, check=True).stdout
    return Path(json.loads(download)["Dir"])


@pytest.mark.parametrize("binary", ["helm", "helm3"])
def test_helm_is_given_one_of_kubectls_smallest_catalogues(tools: Path, binary: str) -> None:
    i18n = kubectl_module(tools / binary) / "pkg" / "util" / "i18n"
    language = MESSAGE_LANGUAGE[1].split(".")[0]
    known = re.search(r'"kubectl":\s*\{(.*?)\}', (i18n / "i18n.go").read_text(), re.DOTALL)
    assert known and f'"{language}"' in known[1]  # else kubectl falls back to its English one

    def size(lang: str) -> int:
        messages = i18n / "translations" / "kubectl" / lang / "LC_MESSAGES"
        return sum((messages / name).stat().st_size for name in ("k8s.po", "k8s.mo"))

    languages = re.findall(r'"(\w+)"', known[1])
    assert size(language) <= 2 * min(size(lang) for lang in languages)
    assert size(language) * 20 < size("default")
