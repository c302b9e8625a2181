"""The Tenant CRD embedded in the package (byte-identical to crds/ at the top level)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml


def crd_text() -> str:
    """The manifest as shipped beside this module (package data, not a file of the user's)."""
    return Path(__file__).with_name("crd.yaml").read_text()


@cache
def crd_manifest() -> dict[str, Any]:
    return yaml.safe_load(crd_text())  # type: ignore[no-any-return]


REVISION_ANNOTATION = "mesh.openkcm.io/crd-revision"
FIX = ("kubectl --context <that cluster> apply -f crds/mesh.openkcm.io_tenants.yaml (from "
       "krypton's release), or run krypton with --crd-policy=upgrade")
# Fields krypton writes or reads whose absence from a served schema makes the API server drop
# them: (path in the schema, what it is for).
REQUIRED_FIELDS = (
    (("spec", "workspace"), "spec.workspace"),
    (("status", "clusters"), "status.clusters"),
)


# status.clusters.<c>: the field of the seals since revision 9, and its name before (read
# while a Tenant has it, removed by the next write of the seals)
SEALS, SEALS_BEFORE = "seals", "records"


def seals_field(live: dict[str, Any] | None) -> str:
    """The field krypton writes the seals to on a cluster serving Tenant CRD `live`: the
    one before revision 9 where the served schema has only that one (a field it lacks
    would be pruned, and the seals lost), else ``seals``; "" (both) while the served CRD
    is not known (--crd-policy=skip). Pure."""
    if live is None:
        return ""
    node = _schema(live)
    for part in ("status", "clusters"):
        node = (node.get("properties") or {}).get(part) or {}
    fields = (node.get("additionalProperties") or {}).get("properties") or {}
    return SEALS_BEFORE if SEALS_BEFORE in fields and SEALS not in fields else SEALS


def seals_of(entry: dict[str, Any]) -> Any:
    """The seals a ``status.clusters.<c>`` entry holds, under either name."""
    return entry[SEALS] if SEALS in entry else entry.get(SEALS_BEFORE)


def sealed(field: str, seals: list[str]) -> dict[str, Any]:
    """A ``status.clusters.<c>`` update that writes `seals` to `field` (:func:`seals_field`;
    "": to both), the field's old name removed where the new one is written."""
    if not field:
        return {SEALS: seals, SEALS_BEFORE: seals}
    return {field: seals, **({SEALS_BEFORE: None} if field == SEALS else {})}


def revision(crd: dict[str, Any]) -> int | None:
    value = ((crd.get("metadata") or {}).get("annotations") or {}).get(REVISION_ANNOTATION)
    try:
        return int(str(value))
    except ValueError:
        return None


def replaces(live: dict[str, Any], policy: str) -> bool:
    """Whether krypton replaces the served Tenant CRD `live` with the one it ships (SPEC R2,
    S6): krypton's own older revision (the revision annotation is krypton's mark) by
    default, and with --crd-policy=upgrade also a CRD without that mark (the prototype's,
    an admin's copy); never a newer revision, never with --crd-policy=skip. Pure."""
    want, have = revision(crd_manifest()), revision(live)
    if policy == "skip" or want is None:
        return False
    return policy == "upgrade" if have is None else have < want


def outdated(live: dict[str, Any]) -> str | None:
    """Why a cluster's Tenant CRD is older than the one this krypton ships (SPEC R2), None
    when it is not: an older or missing revision annotation, or a schema without fields
    krypton writes (the API server prunes them, so they never stick). Pure."""
    want, have = revision(crd_manifest()), revision(live)
    problems = []
    if have is None or (want is not None and have < want):
        problems.append(f"revision {have if have is not None else 'none'} (this krypton ships "
                        f"revision {want})")
    schema = _schema(live)
    missing = [name for path, name in REQUIRED_FIELDS if not _has(schema, path)]
    if missing:
        problems.append(f"its schema lacks {', '.join(missing)}")
    return "; ".join(problems) or None


def served_phases(live: dict[str, Any] | None) -> frozenset[str] | None:
    """The phases a served Tenant CRD accepts (its status.phase enum); None when it accepts
    any (no enum, or not known). An older CRD lacks ``Suspended``. Pure."""
    node = _schema(live or {})
    for part in ("status", "phase"):
        node = (node.get("properties") or {}).get(part) or {}
    enum = node.get("enum")
    return frozenset(str(v) for v in enum) if isinstance(enum, list) else None


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("storage"):
            return ((version.get("schema") or {}).get("openAPIV3Schema") or {})
    return {}


def _has(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    node = schema
    for part in path:
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return True
        node = (node.get("properties") or {}).get(part) or {}
        if not node:
            return False
    return True
