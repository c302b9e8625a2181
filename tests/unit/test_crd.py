"""Recognising a Tenant CRD older than krypton's. Pure."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from krypton.decisions.conditions import PHASES
from krypton.decisions.crd import (
    crd_manifest,
    outdated,
    replaces,
    revision,
    sealed,
    seals_field,
    seals_of,
    served_phases,
)

PROTOTYPE = yaml.safe_load((Path(__file__).parents[1] / "prototype" / "tenants-crd.yaml")
                           .read_text())


def test_the_shipped_crd_is_current() -> None:
    assert outdated(crd_manifest()) is None
    assert revision(crd_manifest()) == 9  # 9: the seals under a name of their own


def test_the_prototype_crd_is_outdated_on_both_counts() -> None:
    reason = outdated(PROTOTYPE)
    assert reason is not None
    assert "revision none" in reason and "status.clusters" in reason
    assert "spec.workspace" not in reason  # the prototype's schema has it


def test_an_older_revision_without_workspace() -> None:
    older = copy.deepcopy(crd_manifest())
    older["metadata"]["annotations"]["mesh.openkcm.io/crd-revision"] = "3"
    schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    del schema["properties"]["spec"]["properties"]["workspace"]
    assert outdated(older) == ("revision 3 (this krypton ships revision 9); its schema lacks "
                               "spec.workspace")


def test_a_newer_revision_is_not_outdated() -> None:
    newer = copy.deepcopy(crd_manifest())
    newer["metadata"]["annotations"]["mesh.openkcm.io/crd-revision"] = "10"
    assert outdated(newer) is None


def test_fields_kept_by_preserve_unknown_fields_are_not_missing() -> None:
    open_status = copy.deepcopy(PROTOTYPE)
    open_status["metadata"]["annotations"] = {"mesh.openkcm.io/crd-revision": "9"}
    schema = open_status["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["status"] = {"type": "object",
                                      "x-kubernetes-preserve-unknown-fields": True}
    assert outdated(open_status) is None


def test_the_shipped_crd_accepts_every_phase_krypton_writes() -> None:
    assert served_phases(crd_manifest()) == frozenset(PHASES)


def test_an_older_crd_lacks_suspended_and_a_crd_without_enum_takes_any() -> None:
    older = copy.deepcopy(crd_manifest())
    schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["status"]["properties"]["phase"]["enum"] = ["Pending", "Ready", "Error"]
    assert served_phases(older) == frozenset({"Pending", "Ready", "Error"})
    assert served_phases(PROTOTYPE) is None  # its phase is any string
    del schema["properties"]["status"]["properties"]["phase"]["enum"]
    assert served_phases(older) is None
    assert served_phases(None) is None


@pytest.mark.parametrize("have, policy, replaced", [
    ("7", "create", True),  # krypton's own older revision: upgraded by default (SPEC S6)
    ("7", "upgrade", True),
    ("7", "skip", False),
    ("8", "create", True),  # the seals under their old name
    ("9", "create", False),  # the same: nothing to do
    ("10", "upgrade", False),  # a newer krypton's: never downgraded
    (None, "create", False),  # not krypton's (the prototype's, an admin's copy)
    (None, "upgrade", True),
    ("x", "create", False),
])
def test_krypton_replaces_only_its_own_older_crd_unless_told(have: str | None, policy: str,
                                                            replaced: bool) -> None:
    live = copy.deepcopy(crd_manifest())
    if have is None:
        del live["metadata"]["annotations"]
    else:
        live["metadata"]["annotations"]["mesh.openkcm.io/crd-revision"] = have
    assert replaces(live, policy) is replaced


def _clusters_fields(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"]["clusters"]["additionalProperties"]["properties"]


def test_the_seals_go_where_the_served_crd_keeps_them() -> None:
    """Revision 9 names the seals `seals`; a cluster still serving revision 8 (krypton may
    not replace it there) keeps them under `records`, where its schema would not prune them.
    Written under the new name, the old one is removed; read, either name is taken."""
    assert seals_field(crd_manifest()) == "seals"
    eight = copy.deepcopy(crd_manifest())
    del _clusters_fields(eight)["seals"]
    assert seals_field(eight) == "records"
    assert seals_field(None) == ""  # not looked at (--crd-policy=skip): both written
    assert sealed("seals", ["s1"]) == {"seals": ["s1"], "records": None}
    assert sealed("records", ["s1"]) == {"records": ["s1"]}
    assert sealed("", ["s1"]) == {"seals": ["s1"], "records": ["s1"]}
    assert seals_of({"records": ["old"]}) == ["old"]
    assert seals_of({"seals": ["new"], "records": ["old"]}) == ["new"]
    assert seals_of({}) is None
