"""The sha256 fingerprint of what a Tenant's release should be (SPEC R7). Pure.

With empty effective values the fingerprint is ``sha256(repo|name|version)``, identical to
the original prototype, so a fleet migrating from it does not upgrade everything. With
values it is ``sha256(repo|name|version|<canonical JSON of the values>)``: keys sorted, no
whitespace, UTF-8.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def canonical_json(values: Mapping[str, Any]) -> str:
    """JSON with sorted keys and no insignificant whitespace."""
    return json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(repo: str, name: str, version: str, values: Mapping[str, Any] | None) -> str:
    """Fingerprint of a chart reference at a resolved version with its effective values."""
    base = f"{repo}|{name}|{version}"
    if not values:
        return sha256_hex(base)
    return sha256_hex(f"{base}|{canonical_json(values)}")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `override` into a copy of `base`; nested mappings merge, anything else replaces."""
    merged: dict[str, Any] = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged
