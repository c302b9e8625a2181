"""An uninstall never deletes a cluster-scoped object that another live release's
manifest lists too (look._rendered_elsewhere), with fakes of krypton's own ports."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace
from typing import Any

import pytest

from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.releases import ReleaseIndex
from krypton.runtime.reconcile.look import _rendered_elsewhere

pytestmark = pytest.mark.unit

CLASS = ObjectRef("networking.k8s.io/v1", "IngressClass", "nginx", None)
MANIFEST = "---\napiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: nginx\n"


def _record(ns: str, name: str, status: str, uid: str | None) -> dict[str, Any]:
    labels = {"owner": "helm", "name": name, "version": "1", "status": status}
    if uid:
        labels["mesh.openkcm.io/tenant-uid"] = uid
    return {"metadata": {"namespace": ns, "name": f"sh.helm.release.v1.{name}.v1",
                         "labels": labels}}


class _Kube:
    reads = 0

    async def cluster_scoped(self, _api_version: str, kind: str) -> bool:
        return kind == "IngressClass"

    async def release_record(self, _driver: str, _ns: str, _name: str) -> dict[str, Any]:
        self.reads += 1
        release = base64.b64encode(json.dumps({"manifest": MANIFEST}).encode()).decode()
        return {"data": {"release": base64.b64encode(release.encode()).decode()}}


def _runtime(*others: tuple[str, str, str, str | None], live: set[str]) -> Any:
    index = ReleaseIndex()
    for ns, name, status, uid in others:
        index.on_event("ADDED", _record(ns, name, status, uid))
    return SimpleNamespace(kube=_Kube(), releases=index, state=SimpleNamespace(manifest_objects={}),
                           settings=SimpleNamespace(helm_driver="secret"),
                           tenant_with_uid=lambda uid: "t/x" if uid in live else "")


@pytest.mark.parametrize(("other", "refused"), [
    (("b", "tenant-b-c", "deployed", "u-b"), True),  # B's Tenant is served here: live
    (("b", "tenant-b-c", "deployed", None), True),  # made before labels: live, to be safe
    (("b", "tenant-b-c", "deployed", "u-gone"), False),  # its Tenant no longer exists
    (("b", "tenant-b-c", "failed", "u-b"), False),  # not deployed
])
def test_a_live_release_listing_the_object_refuses_the_uninstall(other: tuple[str, str, str, str | None],
                                                                  refused: bool) -> None:
    rt = _runtime(("a", "tenant-a-c", "deployed", "u-a"), other, live={"u-a", "u-b"})
    found = asyncio.run(_rendered_elsewhere(rt, [CLASS], "tenant-a-c", "a"))
    assert bool(found) is refused
    if refused:
        assert found == ["IngressClass nginx is also in the manifest of release b/tenant-b-c, "
                         "which would lose it (uninstall that release first, or upgrade this "
                         "one with values that do not render it)"]


def test_namespaced_objects_are_not_looked_for_elsewhere() -> None:
    rt = _runtime(("b", "tenant-b-c", "deployed", "u-b"), live={"u-b"})
    mine = ObjectRef("v1", "ConfigMap", "nginx", None)
    assert asyncio.run(_rendered_elsewhere(rt, [mine], "tenant-a-c", "a")) == []


def test_a_release_revision_is_read_once_for_every_uninstall() -> None:
    """The manifests of the other releases are read once per revision, not once per
    uninstall: deleting many Tenants at once is not N x N reads."""
    rt = _runtime(("b", "tenant-b-c", "deployed", "u-b"), live={"u-b"})
    for _ in range(3):
        assert asyncio.run(_rendered_elsewhere(rt, [CLASS], "tenant-a-c", "a"))
    assert rt.kube.reads == 1
    rt.releases.on_event("ADDED", {**_record("b", "tenant-b-c", "deployed", "u-b"), "metadata": {
        "namespace": "b", "labels": {"owner": "helm", "name": "tenant-b-c", "version": "2",
                                     "status": "deployed",
                                     "mesh.openkcm.io/tenant-uid": "u-b"}}})
    assert asyncio.run(_rendered_elsewhere(rt, [CLASS], "tenant-a-c", "a"))
    assert rt.kube.reads == 2  # a new revision is read again
