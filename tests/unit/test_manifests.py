"""What plan and diff say changed (krypton.decisions.charts.manifests)."""

from __future__ import annotations

import pytest

from krypton.decisions.charts.manifests import changed_keys, manifest_diff, what_changed

pytestmark = pytest.mark.unit


def test_changed_keys_are_dotted_paths_of_changed_added_and_removed_leaves() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "gone": True, "same": [1, 2]}
    new = {"a": 1, "b": {"c": 20, "d": 3, "e": 4}, "same": [1, 2], "list": [1]}
    assert changed_keys(old, new) == ["b.c", "b.e", "gone", "list"]
    assert changed_keys({}, {}) == []
    assert changed_keys({"x": {}}, {"x": {"y": None}}) == ["x", "x.y"]


@pytest.mark.parametrize(("applied", "values", "expected"), [
    ("https://127.0.0.1:8879|sample|0.2.0", {}, "repo https://127.0.0.1:8879 -> https://localhost:8879"),
    ("https://localhost:8879|sample|0.1.0", {}, "version 0.1.0 -> 0.2.0"),
    ("https://localhost:8879|sample|0.2.0", {"data": {"colour": "red"}}, "values: data.colour"),
    ("https://localhost:8879|other|0.2.0", None, "chart other -> sample"),
    ("https://localhost:8879|sample|0.2.0", {}, ""),
    (None, {"k": 1}, "values: k"),  # a release made before lastAppliedChart was recorded
])
def test_what_changed(applied: str | None, values: dict | None, expected: str) -> None:  # type: ignore[type-arg]
    assert what_changed(applied, "https://localhost:8879", "sample", "0.2.0", values,
                        {} if values is None else {}) == expected


def test_what_changed_lists_at_most_eight_keys() -> None:
    text = what_changed(None, "r", "n", "1", {}, {f"k{i}": i for i in range(10)})
    assert text.endswith("k7 (and 2 more)") and "k8" not in text


def _cm(version: str) -> dict:  # type: ignore[type-arg]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
            "data": {"chartVersion": version}}


def test_manifest_diff_shows_changed_objects_only_and_masks_secrets() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "stringData": {"password": "hunter2-old"}}
    new_secret = dict(secret, stringData={"password": "hunter2-new"})
    hook = {"kind": "Job", "metadata": {"name": "j", "annotations": {"helm.sh/hook": "post-install"}}}
    same = {"kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}
    text = manifest_diff([_cm("0.2.0"), secret, same], [_cm("0.3.0"), new_secret, same, hook],
                         before="c/t deployed", after="c/t next")
    assert "--- c/t deployed ConfigMap x" in text and "+++ c/t next ConfigMap x" in text
    assert "-  chartVersion: 0.2.0" in text and "+  chartVersion: 0.3.0" in text
    assert "Secret s" in text and "<masked " in text  # it changed, and says so
    assert "hunter2" not in text
    assert "Service" not in text and "Job" not in text
    assert manifest_diff([_cm("1"), same], [same, _cm("1")], before="a", after="b") == ""
    added = manifest_diff([], [_cm("1")], before="a", after="b")
    assert "+kind: ConfigMap" in added
