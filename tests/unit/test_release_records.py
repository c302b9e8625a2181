"""Helm's release record format, decoded without helm (decisions/releases.decode_release).
The encoding is helm's storage format: base64 of gzip of the release JSON, base64-encoded
once more by the Secret driver (the Kubernetes data encoding)."""

from __future__ import annotations

import base64
import gzip
import json

import pytest

from krypton.decisions.releases import RELEASE_MAX_BYTES, decode_release

RELEASE = {"name": "tenant-a-c1", "version": 2, "manifest": "---\nkind: ConfigMap\n"}


def _stored(payload: bytes, driver: str) -> dict[str, object]:
    text = base64.b64encode(payload).decode()
    if driver == "secret":
        text = base64.b64encode(text.encode()).decode()
    return {"data": {"release": text}}


@pytest.mark.parametrize("driver", ["configmap", "secret"])
@pytest.mark.parametrize("zipped", [True, False])
def test_a_record_decodes_to_the_release(driver: str, zipped: bool) -> None:
    raw = json.dumps(RELEASE).encode()
    assert decode_release(_stored(gzip.compress(raw) if zipped else raw, driver), driver) == \
        RELEASE


@pytest.mark.parametrize("record", [
    {}, {"data": {}}, {"data": {"release": 7}},
    _stored(b"not json", "configmap"), _stored(b"[1, 2]", "configmap"),
])
def test_what_is_not_a_release_is_a_value_error(record: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        decode_release(record, "configmap")


def test_a_gzip_bomb_is_bounded() -> None:
    bomb = gzip.compress(b"{" + b" " * (RELEASE_MAX_BYTES + 10) + b"}")
    with pytest.raises(ValueError, match="size limit"):
        decode_release(_stored(bomb, "configmap"), "configmap")


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
    """The release records are not kept (issue 31.2): a list hands every record to the
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
