"""Helm's release records: the format decoded without helm, within bounds, and which records
krypton lets helm act on (decisions/records). The encoding is helm's storage
format: base64 of gzip of the release JSON, base64-encoded once more by the Secret driver
(the Kubernetes data encoding)."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest

from krypton.decisions.model import ReleaseStatus
from krypton.decisions.trust import records
from krypton.decisions.trust.records import Record, RecordRefused, Trust, Use, decode, judge

RELEASE = {"name": "tenant-a-c1", "namespace": "a", "version": 2,
           "manifest": "---\nkind: ConfigMap\n",
           "info": {"status": "deployed", "last_deployed": "2026-11-26T10:00:00Z"},
           "hooks": [{"name": "h", "kind": "Job", "manifest": "kind: Job", "events": ["pre-delete"],
                      "last_run": {"started_at": "", "phase": ""}}]}


def _stored(payload: bytes, driver: str) -> dict[str, object]:
    text = base64.b64encode(payload).decode()
    if driver == "secret":
        text = base64.b64encode(text.encode()).decode()
    return {"data": {"release": text}}


@pytest.mark.parametrize("driver", ["configmap", "secret"])
@pytest.mark.parametrize("zipped", [True, False])
def test_a_record_decodes_to_the_release(driver: str, zipped: bool) -> None:
    raw = json.dumps(RELEASE).encode()
    assert decode(_stored(gzip.compress(raw) if zipped else raw, driver), driver) == RELEASE


@pytest.mark.parametrize("record", [
    {}, {"data": {}}, {"data": {"release": 7}}, {"data": {"release": "%%%"}},
    _stored(b"not json", "configmap"), _stored(b"[1, 2]", "configmap"),
    _stored(b"\x1f\x8bnot gzip at all", "configmap"),
])
def test_what_is_not_a_release_is_refused(record: dict[str, object]) -> None:
    with pytest.raises(RecordRefused):
        decode(record, "configmap")


def test_a_gzip_bomb_is_refused_as_it_inflates() -> None:
    bomb = gzip.compress(b"{" + b" " * (records.INFLATED_MAX + 10) + b"}")
    assert len(bomb) < 100_000  # small as stored: only inflating shows it
    with pytest.raises(RecordRefused, match="inflates past"):
        decode(_stored(bomb, "secret"), "secret")


def test_a_record_stored_over_helms_size_is_refused() -> None:
    big = json.dumps({"manifest": "x" * (records.STORED_MAX + 1)}).encode()
    with pytest.raises(RecordRefused, match="stored over"):
        decode(_stored(big, "secret"), "secret")


KEY = b"k" * 32


def _labelled(version: object = "2", status: object = "deployed",
              name: str = "sh.helm.release.v1.tenant-a-c1.v2") -> dict[str, object]:
    """A record's metadata as helm writes it: object name sh.helm.release.v1.<release>.v<N>,
    labels name, owner, status and version."""
    return {"metadata": {"name": name, "labels": {
        "name": "tenant-a-c1", "owner": "helm", "status": status, "version": version}}}


def test_a_record_is_read_by_its_body_as_helm_reads_it() -> None:
    assert records.identity(_labelled(), RELEASE, "tenant-a-c1") == (2, ReleaseStatus.DEPLOYED)


@pytest.mark.parametrize(("record", "release", "why"), [
    # helm sorts the records its label query finds by the body's revision: a label that
    # says another revision, or none helm's query would parse, hides the record's real place
    (_labelled(version="1"), RELEASE, "labelled revision '1'"),
    (_labelled(version="x9"), RELEASE, "labelled revision 'x9'"),
    (_labelled(version="2"), {**RELEASE, "version": 7}, "holds revision 7"),
    # helm's upgrade selects "deployed" by label and acts on the body's status
    (_labelled(status="superseded"), RELEASE, "(superseded) but holds revision 2 (deployed)"),
    (_labelled(), {**RELEASE, "info": {"status": "superseded"}}, "holds revision 2 (superseded)"),
    # helm's rollback reads a revision by its object name
    (_labelled(name="sh.helm.release.v1.tenant-a-c1.v5"), RELEASE, "named"),
    ({"metadata": {"name": "sh.helm.release.v1.tenant-a-c1.v2"}}, RELEASE, "labelled revision"),
    (_labelled(), {**RELEASE, "name": "other"}, "holds release 'other'"),
    (_labelled(), {**RELEASE, "version": "2"}, "holds no revision"),
    (_labelled(), {k: v for k, v in RELEASE.items() if k != "version"}, "holds no revision"),
])
def test_a_record_whose_labels_and_body_disagree_is_refused(
        record: dict[str, object], release: dict[str, object], why: str) -> None:
    with pytest.raises(RecordRefused, match=re.escape(why)):
        records.identity(record, release, "tenant-a-c1")


def test_a_seal_holds_what_helm_acts_on_and_nothing_it_rewrites() -> None:
    sealed = records.seal(KEY, RELEASE)
    # helm rewrites the status and times (superseded), and a rollback copies the content
    # into a new revision with fresh hook runs: the seal stays
    rewritten = {**RELEASE, "version": 5, "info": {"status": "superseded"},
                 "hooks": [{**RELEASE["hooks"][0], "last_run": {"phase": "Succeeded"}}]}
    assert records.seal(KEY, rewritten) == sealed
    # what helm acts on changes it: the manifest, a hook, the namespace; and so does the key
    for forged in ({**RELEASE, "manifest": "kind: ClusterRoleBinding"},
                   {**RELEASE, "hooks": [{**RELEASE["hooks"][0], "manifest": "kind: Pod"}]},
                   {**RELEASE, "namespace": "b"}):
        assert records.seal(KEY, forged) != sealed
    assert records.seal(b"x" * 32, RELEASE) != sealed


def test_any_string_a_record_holds_can_be_sealed() -> None:
    """A forged manifest with a lone surrogate (valid JSON, not valid UTF-8) is sealed like
    any other, not an exception in the pass."""
    forged = json.loads('{"name": "r", "namespace": "a", "manifest": "\\ud800"}')
    assert len(records.seal(KEY, forged)) == records.KEY_ID_CHARS + 1 + records.SEAL_CHARS


def test_the_status_keeps_the_newest_seals_once_each() -> None:
    assert records.kept_seals("n", ["a", "n", "b", "c", "d"]) == ["n", "a", "b", "c"]


D, S, F = ReleaseStatus.DEPLOYED, ReleaseStatus.SUPERSEDED, ReleaseStatus.FAILED
PU = ReleaseStatus.PENDING_UPGRADE


def _r(revision: int, status: ReleaseStatus, seal: str | None = None, problem: str = "") -> Record:
    return Record(revision, status, seal if seal is not None else f"forged{revision}", problem)


@pytest.mark.parametrize("history, seals, use, want", [
    # an upgrade starts from the deployed record: krypton's, or refused
    ([_r(1, S, "a"), _r(2, D, "b")], ["b", "a"], Use.UPGRADE, (Trust.TRUSTED, 0, "")),
    ([_r(1, S, "a"), _r(2, D)], ["a"], Use.UPGRADE, (Trust.UNTRUSTED, 0, "")),
    # krypton's record rewritten in place: its content no longer matches
    ([_r(1, D, "a-edited")], ["a"], Use.UPGRADE, (Trust.UNTRUSTED, 0, "")),
    # a failed newest record is not what helm upgrades from: the deployed one is
    ([_r(1, D, "a"), _r(2, F)], ["a"], Use.UPGRADE, (Trust.TRUSTED, 0, "")),
    # a release of an older krypton or the prototype: nothing adopted by itself
    ([_r(1, S), _r(2, D, "p")], [], Use.UPGRADE, (Trust.UNTRUSTED, 0, "")),
    # a rollback goes to the newest sealed good revision, past a forged one
    ([_r(1, S, "a"), _r(2, D), _r(3, PU)], ["a"], Use.ROLLBACK, (Trust.TRUSTED, 1, "a")),
    ([_r(1, S), _r(2, D), _r(3, PU)], ["a"], Use.ROLLBACK, (Trust.UNTRUSTED, 0, "")),
    ([_r(1, S), _r(2, D, "p"), _r(3, PU)], [], Use.ROLLBACK, (Trust.UNTRUSTED, 0, "")),
    ([_r(1, F)], ["a"], Use.ROLLBACK, (Trust.UNTRUSTED, 0, "")),
    # an uninstall of a record krypton did not seal runs no hooks
    ([_r(1, D, "a")], ["a"], Use.UNINSTALL, (Trust.TRUSTED, 0, "")),
    ([_r(1, D, "a"), _r(2, F)], ["a"], Use.UNINSTALL, (Trust.UNSEALED, 0, "")),
    ([], ["a"], Use.UNINSTALL, (Trust.ABSENT, 0, "")),
    # a record over a bound stops every use: helm decodes every record at every run
    ([_r(1, D, "a"), _r(2, S, "", "inflates past 16 MiB")], ["a"], Use.UNINSTALL,
     (Trust.UNTRUSTED, 0, "")),
])
def test_which_history_helm_may_act_on(history: list[Record], seals: list[str], use: Use,
                                       want: tuple[Trust, int, str]) -> None:
    verdict = judge(history, seals, use, release="r")
    assert (verdict.trust, verdict.rollback_to, verdict.seal) == want, verdict.message
    if verdict.trust is Trust.UNTRUSTED:
        assert verdict.message.startswith("release"), verdict.message


def test_a_rollback_to_a_named_revision_needs_that_revision_sealed() -> None:
    history = [_r(1, S, "a"), _r(2, S), _r(3, F)]
    assert judge(history, ["a"], Use.ROLLBACK, release="r", rollback_to=1).rollback_to == 1
    verdict = judge(history, ["a"], Use.ROLLBACK, release="r", rollback_to=2)
    assert verdict.trust is Trust.UNTRUSTED
    assert "r.v2 (superseded) that the rollback would go to was not written by krypton" in \
        verdict.message


def _record(revision: int, status: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"namespace": "a", "labels": {
        "owner": "helm", "name": "tenant-a-c1", "version": str(revision), "status": status,
        **labels}}}


def test_the_owner_and_cluster_labels_of_the_latest_record_are_observed() -> None:
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    index.on_event("ADDED", _record(1, "superseded", **{"mesh.openkcm.io/tenant-uid": "u1"}))
    index.on_event("ADDED", _record(2, "deployed", **{"mesh.openkcm.io/tenant-uid": "u2",
                                                     "mesh.openkcm.io/cluster": "c1"}))
    assert index.observe("a", "tenant-a-c1").owner_uid == "u2"
    assert index.clusters() == {("a", "tenant-a-c1"): "c1"}
    # an older revision arriving late does not take the release back
    index.on_event("MODIFIED", _record(1, "superseded", **{"mesh.openkcm.io/tenant-uid": "u1"}))
    assert index.observe("a", "tenant-a-c1").owner_uid == "u2"
    for revision in (1, 2):
        index.on_event("DELETED", _record(revision, "deployed"))
    assert index.observe("a", "tenant-a-c1").owner_uid is None
    assert index.clusters() == {}


def test_our_own_run_names_the_owner_before_the_watch_brings_it() -> None:
    from krypton.decisions.model import ReleaseStatus
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    index.on_event("ADDED", _record(1, "deployed"))  # unlabelled: made before labels were
    assert index.observe("a", "tenant-a-c1").owner_uid is None
    index.note("a", "tenant-a-c1", 2, ReleaseStatus.DEPLOYED, "f" * 64, "u9")
    assert index.observe("a", "tenant-a-c1").owner_uid == "u9"


def test_releases_of_cluster_names_no_longer_discovered_are_orphans() -> None:
    from krypton.decisions.releases import orphan_message, orphaned

    releases = {
        ("a", "tenant-a-remote"): "remote",  # labelled: the old name of a renamed Secret
        ("b", "tenant-b-remote"): None,  # made before labels: the name says which cluster
        ("c", "tenant-c-remote-renamed"): "remote-renamed",  # this cluster's own
        ("d", "tenant-d-prod"): "prod",  # another cluster, still discovered
        ("e", "tenant-e-2f9c1d7a"): None,  # unlabelled, and its name says nothing known...
        ("f", "somebody-elses"): None,  # not krypton's name: not reported
    }
    found = orphaned(releases, "remote-renamed", {"remote-renamed", "prod"}, own_namespace=True)
    assert found == [("a", "tenant-a-remote", "remote"), ("b", "tenant-b-remote", "remote"),
                     ("e", "tenant-e-2f9c1d7a", "2f9c1d7a")]
    # ...which in a shared release namespace no name can tell: only labels count there
    assert orphaned(releases, "remote-renamed", {"remote-renamed", "prod"},
                    own_namespace=False) == [("a", "tenant-a-remote", "remote")]
    message = orphan_message(found, limit=2)
    assert message.startswith("3 release(s) of cluster name(s) 2f9c1d7a, remote that are no "
                              "longer discovered")
    assert "helm uninstall tenant-a-remote -n a; helm uninstall tenant-b-remote -n b " \
           "(and 1 more)" in message


def test_our_own_run_names_the_owner_of_a_release_the_watch_has_not_brought_yet() -> None:
    from krypton.decisions.model import ReleaseStatus
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    index.note("a", "tenant-a-c1", 1, ReleaseStatus.DEPLOYED, "f" * 64, "u9")
    seen = index.observe("a", "tenant-a-c1")
    assert (seen.status, seen.revision, seen.owner_uid) == (ReleaseStatus.DEPLOYED, 1, "u9")


def test_a_relist_rebuilds_the_index_and_names_the_releases_that_changed() -> None:
    """The release records are not kept: a list hands every record to the
    index, which keeps one entry per release and says which releases differ from before:
    one upgraded meanwhile, one gone, one new; one unchanged is not named."""
    from krypton.decisions.model import ReleaseStatus
    from krypton.decisions.releases import ReleaseIndex

    def record(ns: str, revision: int, status: str) -> dict[str, object]:
        return {"metadata": {"namespace": ns, "labels": {
            "owner": "helm", "name": f"tenant-{ns}-c1", "version": str(revision),
            "status": status}}}

    index = ReleaseIndex()
    assert index.replace([record("a", 1, "deployed"), record("b", 1, "deployed"),
                          record("c", 1, "deployed")]) == \
        {("a", "tenant-a-c1"), ("b", "tenant-b-c1"), ("c", "tenant-c-c1")}
    changed = index.replace([record("a", 1, "deployed"),  # unchanged
                             record("b", 1, "superseded"), record("b", 2, "deployed"),
                             record("d", 1, "pending-install")])
    assert changed == {("b", "tenant-b-c1"), ("c", "tenant-c-c1"), ("d", "tenant-d-c1")}
    assert not index.has("c", "tenant-c-c1") and index.has("d", "tenant-d-c1")
    b = index.observe("b", "tenant-b-c1")
    assert (b.status, b.revision, b.has_good_revision) == (ReleaseStatus.DEPLOYED, 2, True)
    assert index.observe("d", "tenant-d-c1").status is ReleaseStatus.PENDING_INSTALL


@pytest.mark.parametrize("labels", [
    {"name": "r", "version": "1" + "0" * 30, "status": "deployed"},  # a revision past 2**40
    {"name": "r", "version": "-1", "status": "deployed"},
    {"name": "", "version": "1", "status": "deployed"},
    {"name": "r", "version": "1", "status": "no-such-status"},
])
def test_a_record_with_labels_helm_never_writes_is_ignored_or_unknown(
        labels: dict[str, str]) -> None:
    from krypton.decisions.model import ReleaseStatus
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    key = index.on_event("ADDED", {"metadata": {"namespace": "a", "labels": labels}})
    if labels["status"] == "no-such-status":
        assert index.observe("a", "r").status is ReleaseStatus.parse("no-such-status")
    else:
        assert key is None and index.names() == []


def test_records_settle_only_as_our_own_run_left_them() -> None:
    """A change of the records is an echo of krypton's own run (no pass) only while the
    newest revision is that run's, deployed and labelled with the owner the run gave it;
    anything else someone did to them (the newest record removed, failed or relabelled) is
    looked at by a pass."""
    from krypton.decisions.model import ReleaseStatus
    from krypton.decisions.releases import ReleaseIndex

    owner = {"mesh.openkcm.io/tenant-uid": "u1"}
    index = ReleaseIndex()
    index.on_event("ADDED", _record(1, "deployed", **owner))
    assert not index.settled("a", "tenant-a-c1")  # no run of ours yet
    index.on_event("ADDED", _record(2, "pending-upgrade", **owner))  # our run, under way
    index.note("a", "tenant-a-c1", 2, ReleaseStatus.DEPLOYED, "f" * 64, "u1")
    assert not index.settled("a", "tenant-a-c1")  # the watch has not caught up yet
    index.on_event("MODIFIED", _record(2, "deployed", **owner))
    assert index.settled("a", "tenant-a-c1")
    index.on_event("MODIFIED", _record(1, "superseded", **owner))  # helm's own bookkeeping
    assert index.settled("a", "tenant-a-c1")
    index.on_event("DELETED", _record(1, "superseded", **owner))  # --history-max pruning
    assert index.settled("a", "tenant-a-c1")

    for change in (_record(2, "failed", **owner),
                   _record(2, "deployed", **{"mesh.openkcm.io/tenant-uid": "u2"}),
                   _record(3, "deployed", **owner)):
        index.on_event("MODIFIED", change)
        assert not index.settled("a", "tenant-a-c1"), change
        index.on_event("DELETED", change)
        index.on_event("ADDED", _record(2, "deployed", **owner))
        assert index.settled("a", "tenant-a-c1")
    index.on_event("ADDED", _record(1, "superseded", **owner))
    index.on_event("DELETED", _record(2, "deployed", **owner))  # the newest record removed
    assert not index.settled("a", "tenant-a-c1")


def test_a_lock_dated_in_the_future_ends_on_the_readers_clock() -> None:
    """A pending record whose modifiedAt lies in 2100 would hold the release for 74 years;
    it is judged from when the reader saw it."""
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    index.on_event("ADDED", _record(1, "deployed"), now=1000.0)
    index.on_event("ADDED", _record(2, "pending-upgrade", modifiedAt="4102444800"), now=1000.0)
    assert index.observe("a", "tenant-a-c1", now=1100.0, lock_timeout=190.0).locked
    left = index.observe("a", "tenant-a-c1", now=1191.0, lock_timeout=190.0)
    assert not left.locked and left.status is ReleaseStatus.PENDING_UPGRADE


def test_a_release_deleted_before_the_watch_brought_our_run_is_seen_gone() -> None:
    """krypton's own run is remembered until the watch brings its record; when the watch
    brings the record's deletion instead (deleted by hand right after the install), the
    release is absent, not "deployed as noted" until the next resync."""
    from krypton.decisions.releases import ReleaseIndex

    index = ReleaseIndex()
    index.note("a", "tenant-a-c1", 1, ReleaseStatus.DEPLOYED, "f" * 64, "u9")
    assert index.observe("a", "tenant-a-c1").status is ReleaseStatus.DEPLOYED
    index.on_event("ADDED", _record(1, "deployed"))  # the watch brings the record ...
    index.on_event("DELETED", _record(1, "deployed"))  # ... and its deletion, before a pass
    assert index.observe("a", "tenant-a-c1").status is ReleaseStatus.ABSENT
    index.note("a", "tenant-a-c1", 1, ReleaseStatus.DEPLOYED, "f" * 64, "u9")
    index.replace([_record(1, "deployed")])  # a relist with it ...
    index.replace([])  # ... and one without it
    assert index.observe("a", "tenant-a-c1").status is ReleaseStatus.ABSENT


@pytest.mark.parametrize(("created", "since", "use", "want"), [
    # guarded since 100: a record made after that was written by krypton (nobody else
    # could), sealed or not; one made before, or when, or with the guard unknown, is not
    (101.0, 100.0, Use.UPGRADE, Trust.TRUSTED),
    (101.0, 100.0, Use.UNINSTALL, Trust.TRUSTED),
    (100.0, 100.0, Use.UPGRADE, Trust.UNTRUSTED),
    (99.0, 100.0, Use.UPGRADE, Trust.UNTRUSTED),
    (101.0, 0.0, Use.UPGRADE, Trust.UNTRUSTED),
    (0.0, 100.0, Use.UPGRADE, Trust.UNTRUSTED),
])
def test_a_record_made_while_the_cluster_was_guarded_needs_no_seal(
        created: float, since: float, use: Use, want: Trust) -> None:
    history = [Record(1, S, "s1", created=50.0), Record(2, D, "lost", created=created)]
    verdict = judge(history, ["s1"], use, release="r", guarded_since=since)
    assert verdict.trust is (Trust.UNSEALED if want is Trust.UNTRUSTED and
                             use is Use.UNINSTALL else want)


def test_a_rollback_on_a_guarded_cluster_goes_to_the_newest_revision_made_under_guard() -> None:
    history = [Record(1, S, "s1", created=50.0), Record(2, S, "lost", created=150.0),
               Record(3, PU, "lost3", created=160.0)]
    assert judge(history, ["s1"], Use.ROLLBACK, release="r").rollback_to == 1
    assert judge(history, ["s1"], Use.ROLLBACK, release="r",
                 guarded_since=100.0).rollback_to == 2


def test_a_history_that_matches_no_seal_at_all_says_how_to_adopt_it() -> None:
    """Every seal kept, none matching any record: the key was replaced. The message names
    the explicit act that adopts the records, not a removal of krypton's own."""
    lost = judge([Record(1, D, "new-key-1")], ["old-key-1"], Use.UPGRADE, release="r")
    assert lost.trust is Trust.UNTRUSTED and "krypton-record-key was replaced" in lost.message
    forged = judge([Record(1, S, "s1"), Record(2, D, "forged2")], ["s1"], Use.UPGRADE,
                   release="r")
    assert "Remove the records krypton did not write" in forged.message


def test_no_seal_kept_is_never_an_adoption_but_says_how_an_administrator_adopts() -> None:
    """A missing field (a pruned CRD, a status cleared when the cluster left the fleet) is
    not a reason to believe a record: the message names the explicit act instead."""
    verdict = judge([_r(1, D, "p")], [], Use.UPGRADE, release="r")
    assert verdict.trust is Trust.UNTRUSTED
    assert "nothing is adopted by itself" in verdict.message
    assert records.ADOPT_COMMAND in verdict.message


def test_an_adoption_seals_the_good_revisions_as_they_are_newest_first() -> None:
    history = [_r(1, S, "s1"), _r(2, F, "f2"), _r(3, D, "d3"), _r(4, PU, "p4")]
    assert records.adoptable(history) == [(3, "d3"), (1, "s1")]
    with pytest.raises(RecordRefused, match="revision 2: inflates"):
        records.adoptable([_r(1, D, "d1"), _r(2, S, "", "inflates past 16 MiB")])
    with pytest.raises(RecordRefused, match="no deployed or superseded record"):
        records.adoptable([_r(1, F, "f1")])


OLD_KEY, NEW_KEY = b"o" * 32, b"n" * 32


def test_a_seal_names_its_key_and_a_retired_key_still_checks_it() -> None:
    made = records.seal(OLD_KEY, RELEASE)
    assert made.startswith(records.key_id(OLD_KEY) + ":")
    rotated = records.Keys(NEW_KEY, (OLD_KEY,))
    record = Record(1, D, records.seal(NEW_KEY, RELEASE),
                    checks=records.seals(rotated, RELEASE))
    assert judge([record], [made], Use.UPGRADE, release="r").trust is Trust.TRUSTED
    # a seal made before keys had ids (the digest alone) checks too
    legacy = made.split(":", 1)[1]
    assert judge([record], [legacy], Use.UPGRADE, release="r").trust is Trust.TRUSTED
    # without the retired key, nothing the old key made checks
    alone = Record(1, D, records.seal(NEW_KEY, RELEASE),
                   checks=records.seals(records.Keys(NEW_KEY), RELEASE))
    assert judge([alone], [made], Use.UPGRADE, release="r").trust is Trust.UNTRUSTED


def test_a_rotation_retires_the_key_and_a_prune_drops_it_once_no_seal_uses_it() -> None:
    data = {"key": base64.b64encode(OLD_KEY).decode()}
    rotated = records.rotated(data, NEW_KEY)
    keys = records.keys_of(rotated)
    assert keys == records.Keys(NEW_KEY, (OLD_KEY,))
    old = records.key_id(OLD_KEY)
    assert records.pruned(rotated, [f"{old}:ab", f"{records.key_id(NEW_KEY)}:cd"])[1] == []
    assert records.pruned(rotated, ["digest-without-an-id"])[1] == []  # whose key is unknown
    kept, removed = records.pruned(rotated, [f"{records.key_id(NEW_KEY)}:cd"])
    assert removed == [old] and records.keys_of(kept) == records.Keys(NEW_KEY)
    with pytest.raises(ValueError, match="no key of 32 bytes"):
        records.keys_of({"key": "c2hvcnQ="})


# -- adopted by content (SPEC S6) -----------------------------------------------------------

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r"},
      "data": {"chartVersion": "0.2.0"}}
HOOK = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
    "name": "r-init", "annotations": {"helm.sh/hook": "pre-upgrade"}}}


def _made(*docs: dict[str, object], hooks: tuple[dict[str, object], ...] = ()) -> dict[str, object]:
    """A release as helm records it: its manifest's documents, each under a Source line, and
    its hooks apart."""
    import yaml

    text = "".join(f"---\n# Source: sample/templates/{i}.yaml\n{yaml.safe_dump(d)}"
                   for i, d in enumerate(docs))
    return {"name": "r", "namespace": "ns", "manifest": text,
            "hooks": [{"name": "h", "manifest": yaml.safe_dump(h), "last_run": {}}
                      for h in hooks]}


def test_a_record_of_exactly_what_the_chart_renders_is_alike_in_any_order() -> None:
    assert records.rendered_alike(_made(CM, hooks=(HOOK,)), [HOOK, CM])
    assert records.rendered_alike(_made(), [])


@pytest.mark.parametrize("record, rendered", [
    (_made(CM, {**CM, "metadata": {"name": "victim", "namespace": "kube-system"}}), [CM]),
    (_made(CM), [CM, CM]),  # once, not twice
    (_made({**CM, "data": {"chartVersion": "0.2.0", "extra": "x"}}), [CM]),
    (_made(CM), [CM, HOOK]),  # a hook the record lacks
    (_made(CM, hooks=(HOOK,)), [CM]),  # a hook the chart does not render
    ({"name": "r", "manifest": "a: [", "hooks": []}, []),  # not YAML
    ({"name": "r", "manifest": 7}, [7]),
    ({"name": "r", "manifest": "", "hooks": ["not a hook"]}, []),
])
def test_one_object_more_less_or_other_is_not_alike(record: dict[str, object],
                                                    rendered: list[object]) -> None:
    assert not records.rendered_alike(record, rendered)


def test_how_a_record_differs_names_the_objects_on_each_side() -> None:
    victim = {**CM, "metadata": {"name": "victim", "namespace": "kube-system"}}
    assert records.rendered_unlike(_made(CM, victim), [CM]) == \
        "only in the record: ConfigMap kube-system/victim"
    assert records.rendered_unlike(_made(CM), [CM, HOOK]) == \
        "only in krypton's render: Job r-init"
    many = [{**CM, "metadata": {"name": f"x{i}"}} for i in range(5)]
    assert records.rendered_unlike(_made(*many), []) == \
        "only in the record: ConfigMap x0, ConfigMap x1, ConfigMap x2 ..."
    assert records.rendered_unlike(_made(CM), [CM]) == ""


def test_an_adoption_asks_only_for_what_has_the_form_of_a_seal() -> None:
    good, other = "0123abcd:" + "f" * 32, "89abcdef:" + "0" * 32
    assert records.asked(f"{good}, {other},{good}") == (good, other)
    assert records.asked(f"{good},not-a-seal,{'f' * 32},{good.upper()}") == (good,)
    assert records.asked(None) == records.asked(7) == ()
    many = ",".join(f"{i:08x}:{'a' * 32}" for i in range(100))
    assert len(records.asked(many)) == records.ASKED_MAX


@pytest.mark.parametrize("use, rollback_to, revision", [
    (Use.UPGRADE, 0, 3),  # the deployed one
    (Use.ROLLBACK, 0, 2),  # the newest good one below the newest
    (Use.ROLLBACK, 1, 1),
    (Use.UNINSTALL, 0, None),
])
def test_the_record_helm_acts_on_is_the_one_judged(use: Use, rollback_to: int,
                                                  revision: int | None) -> None:
    history = [Record(1, ReleaseStatus.SUPERSEDED, "a"), Record(2, ReleaseStatus.SUPERSEDED, "b"),
               Record(3, ReleaseStatus.DEPLOYED, "c")]
    found = records.acted_on(history, use, rollback_to)
    assert (found.revision if found else None) == revision
