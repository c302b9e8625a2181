"""The chart's crds/ directory under --chart-crds (decisions/charts/chartcrds.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from krypton.adapters.charts import read_chart_crds
from krypton.decisions.charts.chartcrds import DIGEST_ANNOTATION, chart_crds, crd_action, digest_of
from tests.conftest import CHARTS


def _crd(description: str = "rev 1") -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.io"},
            "spec": {"group": "example.io", "description": description}}


WANT = chart_crds([_crd()])[0]
SAME = copy.deepcopy(WANT)  # as applied earlier (the server adds its own fields)
SAME["metadata"]["resourceVersion"] = "7"
OLDER = chart_crds([_crd("rev 0")])[0]
FOREIGN = _crd()  # made by someone else: no digest

ACTIONS = [
    ("skip", None, None), ("skip", FOREIGN, None),
    ("create", None, "create"), ("create", OLDER, None), ("create", FOREIGN, None),
    ("create-replace", None, "create"), ("create-replace", SAME, None),
    ("create-replace", OLDER, "replace"), ("create-replace", FOREIGN, "replace"),
]


@pytest.mark.parametrize(("policy", "live", "action"), ACTIONS)
def test_crd_action(policy: str, live: dict[str, Any] | None, action: str | None) -> None:
    assert crd_action(policy, live, WANT) == action


def test_only_crds_are_kept_with_a_digest_of_their_content() -> None:
    docs = [_crd(), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
            None, "text", {"apiVersion": "apiextensions.k8s.io/v1",
                           "kind": "CustomResourceDefinition", "metadata": {}}]
    kept = chart_crds(docs)
    assert [c["metadata"]["name"] for c in kept] == ["widgets.example.io"]
    digest = kept[0]["metadata"]["annotations"][DIGEST_ANNOTATION]
    assert digest == digest_of(kept[0]) == digest_of(_crd())  # the annotation is not hashed
    assert digest != digest_of(_crd("rev 2"))


def test_a_charts_crds_directory_is_read(tmp_path: Path) -> None:
    crds = read_chart_crds(CHARTS / "withcrds")
    assert [c["metadata"]["name"] for c in crds] == ["widgets.crds.krypton.test"]
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "two.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: a.example.io}\n---\n"
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: b.example.io}\n")
    assert [c["metadata"]["name"] for c in read_chart_crds(tmp_path)] == ["a.example.io",
                                                                          "b.example.io"]
    assert read_chart_crds(tmp_path / "no-such-chart") == []
