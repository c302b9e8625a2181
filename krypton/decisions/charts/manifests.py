"""What a change of the chart would change, for ``krypton plan`` and ``krypton diff``. Pure.

`what_changed` names the parts of the target that differ from what a release was made with
(repository, chart name, version, and which values keys, never their values). `manifest_diff`
is a unified diff between two manifests, object by object, with the values of Secrets masked
so that a diff never shows a credential.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from krypton.decisions.charts.ownership import HOOK

MASK = "<masked {digest}>"  # a Secret value: changed or not is visible, the value is not
KEYS_SHOWN = 8


def _paths(values: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a values tree by dotted path (lists are leaves)."""
    if isinstance(values, Mapping) and values:
        out: dict[str, Any] = {}
        for key, value in values.items():
            out.update(_paths(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): values}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted paths whose value differs, was added or was removed, sorted."""
    before, after = _paths(old), _paths(new)
    return sorted(k for k in before.keys() | after.keys()
                  if k and before.get(k, _ABSENT) != after.get(k, _ABSENT))


_ABSENT = object()


def what_changed(applied_chart: str | None, repo: str, name: str, version: str,
                 old_values: Mapping[str, Any] | None, new_values: Mapping[str, Any]) -> str:
    """"repo A -> B; version 1 -> 2; values: a.b, c" for a release applied as
    `applied_chart` ("repo|name|version", as recorded in ``status.lastAppliedChart``) with
    `old_values` (None: not known), against the target. Empty when nothing differs."""
    parts = []
    old = (applied_chart or "").split("|")
    if len(old) == 3:
        for label, was, now in (("repo", old[0], repo), ("chart", old[1], name),
                                ("version", old[2], version)):
            if was != now:
                parts.append(f"{label} {was} -> {now}")
    if old_values is not None:
        keys = changed_keys(old_values, new_values)
        if keys:
            more = f" (and {len(keys) - KEYS_SHOWN} more)" if len(keys) > KEYS_SHOWN else ""
            parts.append(f"values: {', '.join(keys[:KEYS_SHOWN])}{more}")
    return "; ".join(parts)


def _masked(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    if doc.get("kind") != "Secret":
        return doc
    out = dict(doc)
    for field in ("data", "stringData"):
        if isinstance(doc.get(field), Mapping):
            out[field] = {k: MASK.format(digest=hashlib.sha256(str(v).encode()).hexdigest()[:8])
                          for k, v in doc[field].items()}
    return out


def _objects(docs: Iterable[Any]) -> dict[str, str]:
    """Each object (hooks left out: a release's manifest holds none) as sorted YAML, keyed by
    kind, namespace and name."""
    out = {}
    for doc in docs:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("metadata"), Mapping):
            continue
        meta = doc["metadata"]
        if HOOK in (meta.get("annotations") or {}):
            continue
        key = f"{doc.get('kind')} {meta.get('namespace') or ''}/{meta.get('name')}".replace(" /", " ")
        out[key] = yaml.safe_dump(_masked(doc), sort_keys=True, default_flow_style=False)
    return out


def manifest_diff(deployed: Iterable[Any], rendered: Iterable[Any], *, before: str,
                  after: str) -> str:
    """Unified diff of two manifests (lists of parsed documents), object by object in a
    stable order; empty when they are the same."""
    old, new = _objects(deployed), _objects(rendered)
    lines: list[str] = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, ""), new.get(key, "")
        if a == b:
            continue
        lines += difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                      fromfile=f"{before} {key}", tofile=f"{after} {key}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
