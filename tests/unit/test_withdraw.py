"""A cluster that leaves the fleet is taken off its Tenants (SPEC D4) through the commit's own
status write: its conditions and its record go, the phase is worked out from what remains,
a conflicting write is read again and retried, and its annotation and the finalizer go."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace
from typing import Any

import structlog

from krypton.decisions.errors import Conflict
from krypton.decisions.model import FINALIZER
from krypton.decisions.settings import Settings
from krypton.runtime.reconcile import status
from krypton.runtime.reconcile.memory import Memory


def _condition(type_: str, on: bool, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": "True" if on else "False", "reason": reason,
            "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z", "observedGeneration": 1}


TENANT: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "t", "resourceVersion": "1", "generation": 1,
                 "finalizers": [FINALIZER, "other.example/keep"],
                 "annotations": {"mesh.openkcm.io/fingerprint-gone": "f" * 64,
                                 "mesh.openkcm.io/fingerprint-stays": "e" * 64}},
    "status": {"phase": "Error", "conditions": [
        _condition("ClusterReady/gone", False, "UpgradeFailed"),
        _condition("ClusterError/gone", True, "UpgradeFailed"),
        _condition("ClusterProgress/gone", False, "UpgradeFailed"),
        _condition("RecordsGuarded/gone", True, "RecordsGuarded"),
        _condition("ClusterReady/stays", True, "Installed"),
        _condition("ClusterError/stays", False, "Installed"),
        _condition("ClusterProgress/stays", False, "InstallComplete")],
        "clusters": {"gone": {"chartVersion": "0.2.0"}, "stays": {"chartVersion": "0.3.0"}}}}


def _merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch applied (RFC 7386), as the API server applies one."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merged(out.get(k), v)
    return out


class _Kube:
    """A Tenant whose first status write conflicts: someone wrote it meanwhile."""

    def __init__(self) -> None:
        self.tenant = copy.deepcopy(TENANT)
        self.status_patches: list[dict[str, Any]] = []
        self.meta_patches: list[dict[str, Any]] = []

    async def patch_tenant_status(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.status_patches.append(patch)
        if patch["metadata"]["resourceVersion"] != self.tenant["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        self.tenant["status"] = _merged(self.tenant["status"], patch["status"])
        self.tenant["metadata"]["resourceVersion"] = "3"
        return copy.deepcopy(self.tenant)

    async def get_tenant(self, _key: object) -> dict[str, Any]:
        return copy.deepcopy(self.tenant)

    async def patch_tenant(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.meta_patches.append(patch)
        return copy.deepcopy(self.tenant)


def test_a_leaving_cluster_is_taken_off_in_one_status_write_retried_on_a_conflict() -> None:
    kube = _Kube()
    kube.tenant["metadata"]["resourceVersion"] = "2"  # written since the cache's copy
    events: list[str] = []

    async def emit(_involved: object, _type: str, reason: str, _message: str) -> None:
        events.append(reason)

    rt = SimpleNamespace(name="gone", kube=kube, recorder=SimpleNamespace(emit=emit),
                         wrote=lambda obj: obj, settings=Settings(),
                         state=SimpleNamespace(phases=None), memory=Memory("gone"),
                         log=structlog.get_logger(), unpublish=lambda _key: None)
    asyncio.run(status.withdraw(rt, copy.deepcopy(TENANT)))  # type: ignore[arg-type]

    assert [p["metadata"]["resourceVersion"] for p in kube.status_patches] == ["1", "2"]
    written = kube.tenant["status"]
    assert sorted(c["type"] for c in written["conditions"]) == [
        "ClusterError/stays", "ClusterProgress/stays", "ClusterReady/stays", "Ready"]
    assert written["clusters"] == {"stays": {"chartVersion": "0.3.0"}}
    assert written["phase"] == "Ready"  # the leaving cluster's error no longer counts
    assert events == ["PhaseSet"]
    [meta] = kube.meta_patches
    assert meta["metadata"]["finalizers"] == ["other.example/keep"]
    assert meta["metadata"]["annotations"] == {"mesh.openkcm.io/fingerprint-gone": None}


def test_a_record_written_with_a_field_removed_sends_it_as_null() -> None:
    """The seals written under their name of revision 9 take the old name away: the merge
    patch sends the old field as null, the status compared is without it."""
    from krypton.decisions import crd

    kube = _Kube()

    async def emit(*_a: object) -> None:
        return None

    rt = SimpleNamespace(name="gone", kube=kube, recorder=SimpleNamespace(emit=emit),
                         wrote=lambda obj: obj, settings=Settings(),
                         state=SimpleNamespace(phases=None), memory=Memory("gone"),
                         log=structlog.get_logger())
    tenant = copy.deepcopy(TENANT)
    tenant["status"]["clusters"]["gone"]["records"] = ["s0"]
    kube.tenant = copy.deepcopy(tenant)
    kube.tenant["metadata"]["resourceVersion"] = "1"
    obj, written = asyncio.run(status.write_status(  # type: ignore[arg-type]
        rt, tenant, [], structlog.get_logger(), applied=crd.sealed("seals", ["s1", "s0"])))
    assert written
    [patch] = kube.status_patches
    assert patch["status"]["clusters"]["gone"] == {"chartVersion": "0.2.0", "records": None,
                                                   "seals": ["s1", "s0"]}
    assert patch["status"]["clusters"]["stays"] == {"chartVersion": "0.3.0"}
    assert kube.tenant["status"]["clusters"]["gone"] == {"chartVersion": "0.2.0",
                                                         "seals": ["s1", "s0"]}
