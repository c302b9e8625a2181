"""Which objects of a release krypton may let helm delete (SPEC R17). Pure.

Recovering a release that failed its first install means uninstalling it, and helm deletes
every object in the failed revision's manifest, whoever owns it now. When two releases of
one chart race for a fixed-name object (a CRD, an IngressClass), the loser's manifest lists
the winner's object: uninstalling the loser would delete it, and with a CRD every custom
resource of that kind. An object may be deleted only if it is absent or carries this
release's own ownership annotations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None  # None: cluster-scoped or not said in the manifest

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.kind} {self.name}{where}"


def manifest_objects(documents: Iterable[Any]) -> list[ObjectRef]:
    """The objects of a rendered manifest (documents that are not objects are skipped)."""
    out = []
    for doc in documents:
        if not isinstance(doc, Mapping):
            continue
        meta = doc.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
            continue
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            continue
        namespace = meta.get("namespace")
        out.append(ObjectRef(api_version, kind, meta["name"],
                             namespace if isinstance(namespace, str) and namespace else None))
    return out


HOOK = "helm.sh/hook"
RESOURCE_POLICY = "helm.sh/resource-policy"


def kept(doc: Any) -> bool:
    """The manifest document says ``helm.sh/resource-policy: keep``: helm's uninstall leaves
    the object in place."""
    if not isinstance(doc, Mapping):
        return False
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    return isinstance(annotations, Mapping) and annotations.get(RESOURCE_POLICY) == "keep"


def shared_candidates(first: Iterable[Any], second: Iterable[Any]) -> tuple[ObjectRef, ...]:
    """Objects one chart renders with the same identity for two different releases in two
    different namespaces: a cluster-scoped object (or one with a fixed namespace) among them
    is claimed by every release of the chart on a cluster, and helm lets only one own it.
    Objects without a namespace may still be namespaced kinds (they land in each release's
    namespace and do not collide): the caller tells them apart by looking on the cluster.
    Hooks are left out: helm does not record an owner on them."""
    def objects(docs: Iterable[Any]) -> list[ObjectRef]:
        kept = [d for d in docs if isinstance(d, Mapping) and HOOK not in
                ((d.get("metadata") or {}).get("annotations") or {})]
        return manifest_objects(kept)
    other = set(objects(second))
    return tuple(dict.fromkeys(ref for ref in objects(first) if ref in other))


def foreign_owner(annotations: Mapping[str, str] | None, release: str, namespace: str) -> str | None:
    """Who owns a live object if not this release: ``<namespace>/<release>`` or a phrase;
    None when this release owns it."""
    annotations = annotations or {}
    name, ns = annotations.get(RELEASE_NAME), annotations.get(RELEASE_NAMESPACE)
    if name == release and ns == namespace:
        return None
    if name is None:
        return "no Helm release (not created by this release)"
    return f"release {ns}/{name}"


def owner_release(annotations: Mapping[str, str] | None) -> tuple[str, str] | None:
    """The (namespace, name) of the release an object's annotations name, if both are."""
    annotations = annotations or {}
    name, ns = annotations.get(RELEASE_NAME), annotations.get(RELEASE_NAMESPACE)
    return (ns, name) if name and ns else None


def conflicts(live: Mapping[ObjectRef, Mapping[str, str] | None], release: str,
              namespace: str) -> list[str]:
    """"<object> is owned by <owner>" for every live object this release must not delete.

    `live` maps each manifest object that exists to its annotations (absent objects are
    left out).
    """
    out = []
    for ref, found in sorted(live.items(), key=lambda item: str(item[0])):
        owner = foreign_owner(found, release, namespace)
        if owner is not None:
            out.append(f"{ref} is owned by {owner}")
    return out
