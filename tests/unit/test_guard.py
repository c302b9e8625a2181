"""The guard of krypton's release records (decisions/guard, SPEC S4): its manifests as an
admin applies them, how what a cluster holds compares with them, and the time it holds
since. What the policy refuses and lets through is tried on a real API server
(tests/reliability/test_release_records.py)."""

from __future__ import annotations

import pytest

from krypton.decisions import guard

POLICY = {"metadata": {"uid": "p1", "generation": 1}}
BINDING = {"metadata": {"uid": "b1", "generation": 2}}


def test_each_instance_has_a_guard_of_its_own() -> None:
    policy, binding = guard.manifests("system:serviceaccount:krypton:krypton")
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == \
        "krypton-release-records"
    assert binding["spec"]["validationActions"] == ["Deny"]
    namespaced, _ = guard.manifests("u", watch_namespace="team-a")
    assert namespaced["metadata"]["name"] == "krypton-release-records.team-a"


def test_the_user_is_a_cel_string_whatever_it_holds() -> None:
    """A user name with quotes and backslashes cannot end the CEL literal early."""
    policy, _ = guard.manifests('evil" || true || "\\')
    rule = policy["spec"]["validations"][1]["expression"]
    assert 'request.userInfo.username == "evil\\" || true || \\"\\\\"' in rule


def test_a_server_copy_with_defaults_filled_in_is_as_wanted() -> None:
    want, _ = guard.manifests("u")
    served = {**want["spec"], "matchConstraints": {
        **want["spec"]["matchConstraints"], "matchPolicy": "Equivalent",
        "namespaceSelector": {}, "resourceRules": [
            {**want["spec"]["matchConstraints"]["resourceRules"][0], "scope": "*"}]}}
    assert guard.differs(want["spec"], served) == ""


@pytest.mark.parametrize(("change", "where"), [
    ({"failurePolicy": "Ignore"}, "spec.failurePolicy"),
    ({"validations": []}, "spec.validations"),
    ({"matchConditions": [{"name": "krypton-release-record-or-probe", "expression": "false"}]},
     "spec.matchConditions[0].expression"),
])
def test_a_weakened_guard_is_found_out(change: dict[str, object], where: str) -> None:
    want, _ = guard.manifests("u")
    assert guard.differs(want["spec"], {**want["spec"], **change}) == where


def test_the_time_the_guard_holds_since_is_believed_for_the_same_objects_only() -> None:
    key = guard.held(POLICY, BINDING)
    binding = {"metadata": {**BINDING["metadata"],
                            **guard.since_annotation(1_800_000_000.0, key)["metadata"]}}
    assert guard.since(binding, key) == 1_800_000_000.0
    changed = guard.held({"metadata": {"uid": "p1", "generation": 2}}, BINDING)
    remade = guard.held(POLICY, {"metadata": {"uid": "b2", "generation": 2}})
    assert guard.since(binding, changed) == guard.since(binding, remade) == 0.0
    assert guard.since(BINDING, key) == 0.0


def test_only_the_guards_own_refusal_of_the_probe_counts() -> None:
    ours = ("configmaps \"krypton-guard-probe\" is forbidden: ValidatingAdmissionPolicy "
            f"'krypton-release-records' with binding 'krypton-release-records' denied "
            f"request: {guard.PROBED}")
    assert guard.probe_refused(ours, "")
    assert not guard.probe_refused(ours, "team-a")
    assert not guard.probe_refused("configmaps is forbidden: User \"u\" cannot create", "")


def test_a_guard_found_again_keeps_the_time_first_known_for_the_same_objects() -> None:
    from krypton.runtime.recordguard import GuardState, carried

    first = GuardState(True, "in force", "u", 100.0, "p1/1/b1/2")
    later = GuardState(True, "in force", "u", 700.0, "p1/1/b1/2")
    assert carried(first, later).since == 100.0
    remade = GuardState(True, "in force", "u", 700.0, "p2/1/b1/2")
    assert carried(first, remade).since == 700.0  # other objects: a new time
    gone = GuardState(False, "absent", "u")
    assert carried(first, gone) == gone
