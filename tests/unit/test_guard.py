"""The guard of krypton's release records (decisions/guard, SPEC S4): its manifests as an
admin applies them, how what a cluster holds compares with them, and the time it holds
since. What the policy refuses and lets through is tried on a real API server
(tests/reliability/test_release_records.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from krypton.decisions.trust import guard

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


def test_a_guard_changed_counts_from_its_last_change() -> None:
    made = {"metadata": {"creationTimestamp": "2026-12-01T10:00:00Z", "managedFields": [
        {"manager": "kubectl", "time": "2026-12-01T10:05:00Z"}, "not a field", {"time": 7}]}}
    other = {"metadata": {"creationTimestamp": "2026-12-01T10:01:00Z", "managedFields": "x"}}
    at = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC).timestamp()
    assert guard.changed_at(made, other) == guard.changed_at(made) == at + 300
    assert guard.changed_at(other) == at + 60
    assert guard.changed_at({}, {"metadata": None}) == 0.0


class _Cluster:
    """The guard's objects as an admin applied them `age` seconds before the first probe,
    on an API server that enforces them from `enforced` seconds after they were made; each
    probe moves the server's clock on a second."""

    def __init__(self, age: float, enforced: float) -> None:
        from krypton.decisions.model import rfc3339

        self.clock, self.made, self.enforced, self.probes = 1_000_000.0, 1_000_000.0 - age, \
            enforced, 0
        policy, binding = guard.manifests("krypton")
        self.objects = {o["metadata"]["name"] + o["kind"]: {
            **o, "metadata": {**o["metadata"], "creationTimestamp": rfc3339(self.made)}}
            for o in (policy, binding)}

    async def cluster_object(self, what: str, collection: str, name: str) -> object:
        kind = "ValidatingAdmissionPolicy" + ("Binding" if "binding" in what else "")
        return self.objects.get(name + kind)

    async def dry_run_create(self, namespace: str, body: dict[str, object]) -> object:
        from krypton.decisions.errors import Forbidden
        from krypton.decisions.model import rfc3339

        self.probes += 1
        self.clock += 1.0
        if self.clock >= self.made + self.enforced:
            raise Forbidden(f"ValidatingAdmissionPolicy '{guard.policy_name('')}' denied "
                            f"request: {guard.PROBED}")
        return {"metadata": {"creationTimestamp": rfc3339(self.clock)}}


@pytest.mark.parametrize("age, enforced, guarded, probes", [
    (1, 4, True, 3),  # applied a moment ago, in force three probes later
    (100, 4, True, 1),  # long in force
    (100, 10**9, False, 1),  # never enforced: said at once, not asked again
    (1, 10**9, False, 14),  # never enforced though just applied: asked until 15 s after
])
def test_a_guard_an_admin_just_applied_is_given_time_to_come_into_force(
        monkeypatch: pytest.MonkeyPatch, age: float, enforced: float, guarded: bool,
        probes: int) -> None:
    import asyncio

    from krypton.decisions.settings import Settings
    from krypton.runtime import recordguard

    monkeypatch.setattr(recordguard, "PROBE_EVERY", 0.0)
    monkeypatch.setattr(recordguard, "_since", lambda *_a: asyncio.sleep(0, (0.0, "")))
    cluster = _Cluster(age, enforced)
    settings = Settings(record_guard="check")
    state = asyncio.run(recordguard.ensure(cluster, settings, "krypton"))  # type: ignore[arg-type]
    assert (state.guarded, cluster.probes) == (guarded, probes), state


def test_a_watched_object_keeps_the_guard_only_as_the_same_uid_and_generation() -> None:
    key = guard.held(POLICY, BINDING)
    annotated = {"metadata": {**BINDING["metadata"], "annotations": {"a": "b"}}}
    assert guard.keeps(key, 0, POLICY) and guard.keeps(key, 1, annotated)
    assert not guard.keeps(key, 1, POLICY)  # the policy's uid is not the binding's
    assert not guard.keeps(key, 0, {"metadata": {"uid": "p1", "generation": 2}})
    assert not guard.keeps(key, 1, {"metadata": {"uid": "b2", "generation": 2}})
    assert not guard.keeps("", 0, POLICY)


def _kept(cluster: _Cluster) -> tuple[object, list[tuple[str, str]]]:
    """A Keeper of `cluster` whose guard was judged in force since 100.0 for the objects
    the cluster holds now, and the Events its cluster's health says."""
    from krypton.decisions.settings import Settings
    from krypton.runtime.clusterhealth import ClusterHealth
    from krypton.runtime.recordguard import GuardState, Keeper

    said: list[tuple[str, str]] = []

    async def report(_cluster: str, kind: str, reason: str, _message: str) -> None:
        said.append((kind, reason))

    health = ClusterHealth("c1", report, 5.0)
    cluster.name = "c1"  # type: ignore[attr-defined]
    policy, binding = (cluster.objects[guard.policy_name("") + k]
                       for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"))
    health.judge_guard(GuardState(True, "in force", "krypton", 100.0,
                                  guard.held(policy, binding)))
    return Keeper(cluster, Settings(), health), said  # type: ignore[arg-type]


def _remade(cluster: _Cluster, kind: str) -> dict[str, object]:
    """The cluster's guard object of `kind` deleted and made again (another uid)."""
    name = guard.policy_name("") + kind
    obj = cluster.objects[name]
    cluster.objects[name] = {**obj, "metadata": {**obj["metadata"], "uid": "again"}}
    return cluster.objects[name]


def test_a_record_is_trusted_by_the_guard_only_if_it_still_holds_when_used() -> None:
    """The look at use (SPEC S6): the guard's time is given while its policy and binding are
    the objects it was judged by; a binding made again since (a gap the watch may not have
    told yet) gives none, and the cluster is unguarded at once."""
    import asyncio

    cluster = _Cluster(100, 0)
    keeper, said = _kept(cluster)

    async def used() -> tuple[float, float]:
        before = await keeper.since_now()  # type: ignore[attr-defined]
        _remade(cluster, "ValidatingAdmissionPolicyBinding")
        after = await keeper.since_now()  # type: ignore[attr-defined]
        await asyncio.sleep(0)  # the Warning Event's task
        return before, after

    assert asyncio.run(used()) == (100.0, 0.0)
    assert not keeper.health.guard.guarded  # type: ignore[attr-defined]
    assert said == [("Warning", "RecordsUnguarded")]


@pytest.mark.parametrize("kind, event, kept", [
    ("ValidatingAdmissionPolicy", "MODIFIED", True),  # its status or metadata: the same
    ("ValidatingAdmissionPolicyBinding", "DELETED", False),
    ("ValidatingAdmissionPolicy", "ADDED", False),  # made again
])
def test_a_change_the_watch_sees_makes_the_cluster_unguarded_at_once(
        kind: str, event: str, kept: bool) -> None:
    import asyncio

    cluster = _Cluster(100, 0)
    keeper, said = _kept(cluster)
    obj = cluster.objects[guard.policy_name("") + kind]
    if not kept:
        obj = _remade(cluster, kind)

    async def seen() -> None:
        keeper._changed(int(kind.endswith("Binding")), kind.lower(), event, obj)  # type: ignore[attr-defined]
        await asyncio.sleep(0)

    asyncio.run(seen())
    assert keeper.health.guard.guarded is kept  # type: ignore[attr-defined]
    assert keeper._wake.is_set() is not kept  # type: ignore[attr-defined]
    assert said == ([] if kept else [("Warning", "RecordsUnguarded")])
