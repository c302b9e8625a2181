"""R7: the fingerprint formula, with vectors computed from the spec's definition."""

from __future__ import annotations

import hashlib

import pytest

from krypton.decisions.charts.fingerprint import canonical_json, deep_merge, fingerprint


def test_empty_values_match_the_prototype() -> None:
    expected = hashlib.sha256(b"https://charts.jetstack.io|cert-manager|1.19.1").hexdigest()
    assert fingerprint("https://charts.jetstack.io", "cert-manager", "1.19.1", {}) == expected
    assert fingerprint("https://charts.jetstack.io", "cert-manager", "1.19.1", None) == expected


def test_values_are_canonical_json_with_sorted_keys() -> None:
    values = {"b": 1, "a": {"y": [1, 2], "x": "é"}}
    text = 'https://r|c|1.0.0|{"a":{"x":"é","y":[1,2]},"b":1}'
    assert canonical_json(values) == '{"a":{"x":"é","y":[1,2]},"b":1}'
    assert fingerprint("https://r", "c", "1.0.0", values) == \
        hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(("a", "b"), [
    ({"x": 1}, {"x": 2}),
    ({"x": 1}, {}),
    ({"x": {"y": 1}}, {"x": {"y": "1"}}),
])
def test_any_value_change_changes_the_fingerprint(a: dict, b: dict) -> None:  # type: ignore[type-arg]
    assert fingerprint("r", "c", "1", a) != fingerprint("r", "c", "1", b)


def test_key_order_does_not_matter() -> None:
    assert fingerprint("r", "c", "1", {"a": 1, "b": 2}) == fingerprint("r", "c", "1", {"b": 2, "a": 1})


@pytest.mark.parametrize(("base", "override", "merged"), [
    ({}, {"a": 1}, {"a": 1}),
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}),
    ({"a": {"b": 1}}, {"a": 5}, {"a": 5}),
    ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
])
def test_deep_merge(base: dict, override: dict, merged: dict) -> None:  # type: ignore[type-arg]
    assert deep_merge(base, override) == merged
