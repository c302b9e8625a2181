"""The chart's ``crds/`` directory under ``--chart-crds`` (SPEC F5, item 2). Pure.

helm installs the CustomResourceDefinitions of a chart's ``crds/`` only when they are absent,
only on install (never on upgrade) and never deletes them. With one release per Tenant that
is N releases racing to create them, and a chart bump that changes a CRD never reaches the
cluster. krypton applies them itself, once per cluster and chart version, before any tenant
release of that version, and runs helm with ``--skip-crds``:

* ``skip``: never; the CRDs are installed by other means.
* ``create``: create the ones that are missing; never change an existing one.
* ``create-replace``: also replace an existing one whose content differs from the chart's
  (the content's digest is kept in an annotation, so an unchanged CRD is not written).

A Tenant's uninstall never deletes them (they belong to no release).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from krypton.decisions.charts.fingerprint import sha256_hex

POLICIES = ("skip", "create", "create-replace")
DIGEST_ANNOTATION = "mesh.openkcm.io/chart-crd-digest"
CRD_KIND = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


def chart_crds(documents: Iterable[Any]) -> list[dict[str, Any]]:
    """The CRDs among the documents of a chart's ``crds/`` files, each with its digest
    annotation set (other kinds, and documents that are not objects, are left out)."""
    out = []
    for doc in documents:
        if not isinstance(doc, Mapping) or (doc.get("apiVersion"), doc.get("kind")) != CRD_KIND:
            continue
        meta = doc.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            continue
        digest = digest_of(doc)
        annotations = dict(meta.get("annotations") or {}, **{DIGEST_ANNOTATION: digest})
        out.append(dict(doc, metadata=dict(meta, annotations=annotations)))
    return out


def digest_of(crd: Mapping[str, Any]) -> str:
    """A digest of the CRD as the chart ships it (without the digest annotation itself)."""
    meta = dict(crd.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k != DIGEST_ANNOTATION}
    return sha256_hex(json.dumps(dict(crd, metadata=meta), sort_keys=True, default=str))


def crd_action(policy: str, live: Mapping[str, Any] | None, want: Mapping[str, Any]) -> str | None:
    """"create", "replace" or None (nothing to do) for one CRD of the chart."""
    if policy == "skip":
        return None
    if live is None:
        return "create"
    if policy != "create-replace":
        return None
    have = ((live.get("metadata") or {}).get("annotations") or {}).get(DIGEST_ANNOTATION)
    want_digest = (want.get("metadata") or {}).get("annotations", {}).get(DIGEST_ANNOTATION)
    return "replace" if have != want_digest else None
