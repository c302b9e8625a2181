"""The Tenant CRD embedded in the package (byte-identical to crds/ at the top level)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml


def crd_text() -> str:
    return resources.files("krypton").joinpath("crd.yaml").read_text()


@cache
def crd_manifest() -> dict[str, Any]:
    return yaml.safe_load(crd_text())  # type: ignore[no-any-return]
