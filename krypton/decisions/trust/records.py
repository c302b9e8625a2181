"""Which Helm release records krypton lets helm act on (SPEC S3). Pure.

Helm keeps a release's history as records (Secrets) in the release's namespace, and acts on
them with krypton's rights: an upgrade deletes what the deployed record's manifest lists and
the new one lacks, a rollback applies the target record's manifest and hooks, an uninstall
deletes the newest record's manifest and runs its hooks. Whoever may write Secrets in that
namespace (a tenant's own admin) may write records, so a record is believed only when krypton
made it:

- every helm run of krypton that leaves a release deployed is *sealed*: an HMAC-SHA256, under
  a key only the operator holds, of what helm acts on in the record (its name, namespace,
  manifest and hooks; not its status or times, which helm rewrites). The seals of the last
  `SEALS_KEPT` contents are kept in the Tenant's status for that cluster;
- before a helm run that reads the release's history, the records are judged
  (:func:`judge`): an upgrade only from a sealed deployed record, a rollback only to a
  sealed revision, and an uninstall of a record krypton did not seal only without its hooks
  and after the objects of its manifest were found to be this release's own (R17);
- a record over helm's own size, or that inflates past `INFLATED_MAX`, is refused before helm
  starts: helm decodes every record of a release at every run.

A record krypton keeps no seal of (a release of an older krypton or of the prototype, a
Tenant CRD that drops the field, a status cleared when the cluster left the fleet) is
adopted by itself only by its content (SPEC S6, :func:`rendered_alike`): when its manifest
and hooks hold exactly the objects krypton's chart renders for that record's chart version
with the values krypton gives the release, helm acting on it does nothing krypton's own
record would not. Anything else is sealed as found only by an administrator's explicit act
(``krypton adopt-records``, :func:`adoptable`): the seals it names in the Tenant's
``mesh.openkcm.io/adopt-records`` annotation (:func:`asked`) are believed by the operator's
next pass, whose commit keeps them; nobody without the key can make one. On a cluster whose
records are guarded at admission (SPEC S4), what krypton made under the guard needs no seal.
"""

from __future__ import annotations

import base64
import enum
import gzip
import hashlib
import hmac
import io
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from krypton.decisions.model import ReleaseStatus
from krypton.decisions.trust import safeyaml

SEALS_KEPT = 4  # contents krypton made, newest first, kept per Tenant x cluster
SEAL_CHARS = 32  # hex characters of the HMAC kept (128 bits)
KEY_ID_CHARS = 8  # hex characters of a key's id, before the seal's ':'
KEY_BYTES = 32
ASKED_MAX = 16  # seals an administrator's adoption names in a Tenant's annotation
_SEAL = re.compile(f"[0-9a-f]{{{KEY_ID_CHARS}}}:[0-9a-f]{{{SEAL_CHARS}}}")
STORED_MAX = 1 << 20  # bytes of a record's data.release as stored (helm's own limit is ~1 MiB)
INFLATED_MAX = 16 << 20  # bytes of a record's JSON once decompressed
GOOD = (ReleaseStatus.DEPLOYED, ReleaseStatus.SUPERSEDED)


ADOPT_COMMAND = ("krypton adopt-records NAMESPACE/NAME --cluster CLUSTER (or --all; --dry-run "
                 "lists what it would adopt)")
NO_SEALS = ("krypton keeps no seal of this release for this cluster (a release of an older "
            "krypton or of the prototype, a Tenant CRD that drops status.clusters.<cluster>."
            "records, a status cleared when the cluster left the fleet), and nothing is adopted "
            "by itself unless its content is exactly what krypton's chart renders for it, which "
            "this record's is not. If the records are krypton's, an administrator adopts them "
            f"as they are: {ADOPT_COMMAND}")
KEY_LOST = ("No record of the release matches any seal the Tenant keeps, as when the Secret "
            "krypton-record-key was replaced. If nobody else wrote the records, an administrator "
            f"adopts them as they are: {ADOPT_COMMAND}. On a cluster whose records are guarded "
            "(--record-guard) what krypton made under the guard needs no seal")


class RecordRefused(ValueError):
    """A record that is not one, or is over a bound."""


def stored(record: Mapping[str, Any], driver: str) -> bytes:
    """A record's ``data.release`` as helm stores it (base64 of gzip of JSON; the Secret
    driver's value is base64 of that once more): the bytes whose :func:`digest` the helm
    worker checks before it hands the record to helm (SPEC S7). RecordRefused when it is not
    one, or is stored over `STORED_MAX`."""
    text = (record.get("data") or {}).get("release")
    if not isinstance(text, str):
        raise RecordRefused("release record without data.release")
    if len(text) > STORED_MAX * 4 // 3 + 4:
        raise RecordRefused(f"release record stored over {STORED_MAX} bytes")
    if driver == "configmap":
        return text.encode()
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise RecordRefused("release record is not base64") from exc


def digest(stored_bytes: bytes) -> str:
    """The sha256 of a record as stored, as the helm worker computes it."""
    return hashlib.sha256(stored_bytes).hexdigest()


def decode(record: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """The release a Helm release record stores: ``data.release`` is base64 of gzip of JSON
    (gzip optional), and the Secret driver base64-encodes that once more. Refused
    (RecordRefused) when it is not one, is stored over `STORED_MAX` or inflates past
    `INFLATED_MAX` (read as it inflates, never whole)."""
    as_stored = stored(record, driver)
    try:
        raw = base64.b64decode(as_stored)
    except ValueError as exc:
        raise RecordRefused("release record is not base64") from exc
    if len(raw) > STORED_MAX:
        raise RecordRefused(f"release record stored over {STORED_MAX} bytes")
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
                raw = unzipped.read(INFLATED_MAX + 1)
        except (OSError, EOFError) as exc:
            raise RecordRefused("release record is not valid gzip") from exc
        if len(raw) > INFLATED_MAX:
            raise RecordRefused(f"release record inflates past {INFLATED_MAX} bytes")
    try:
        release = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RecordRefused("release record is not JSON") from exc
    if not isinstance(release, dict):
        raise RecordRefused("release record is not a JSON object")
    return release


def identity(record: Mapping[str, Any], release: Mapping[str, Any], name: str
             ) -> tuple[int, ReleaseStatus]:
    """The revision and status helm takes from a record of release `name`, as helm takes
    them: from the decoded body (helm selects a release's records by their labels, then
    sorts them by the body's revision and acts on the body's status). A record whose
    labels, object name or body say otherwise is refused (RecordRefused): krypton would
    judge one record and helm act on another."""
    meta = record.get("metadata") or {}
    labels = meta.get("labels") or {}
    revision = release.get("version")
    status = (release.get("info") or {}).get("status") if isinstance(
        release.get("info"), dict) else None
    if not isinstance(revision, int) or isinstance(revision, bool) or revision < 1:
        raise RecordRefused("release record holds no revision")
    if release.get("name") != name:
        raise RecordRefused(f"release record holds release {str(release.get('name'))[:60]!r}")
    if str(labels.get("version")) != str(revision) or labels.get("status") != status:
        raise RecordRefused(f"release record is labelled revision {str(labels.get('version'))[:12]!r} "
                            f"({str(labels.get('status'))[:20]}) but holds revision {revision} "
                            f"({str(status)[:20]})")
    if meta.get("name") != f"sh.helm.release.v1.{name}.v{revision}":
        raise RecordRefused(f"release record named {str(meta.get('name'))[:120]!r} holds "
                            f"revision {revision}")
    return revision, ReleaseStatus.parse(status)


def _hooks(release: Mapping[str, Any]) -> list[Any]:
    """The release's hooks as helm acts on them (``last_run`` is rewritten by every run)."""
    hooks = release.get("hooks") or []
    if not isinstance(hooks, list):
        return [hooks]
    kept = [{k: v for k, v in h.items() if k != "last_run"} if isinstance(h, dict) else h
            for h in hooks]
    return sorted(kept, key=lambda h: json.dumps(h, sort_keys=True))


def content(release: Mapping[str, Any]) -> bytes:
    """What helm acts on in a release: its name, namespace, manifest and hooks, as canonical
    JSON. The same for helm's answer to a run and for the record it stored, and unchanged
    when helm marks the record superseded or copies it in a rollback."""
    return json.dumps({"name": release.get("name"), "namespace": release.get("namespace"),
                       "manifest": release.get("manifest") or "", "hooks": _hooks(release)},
                      sort_keys=True, separators=(",", ":")).encode()  # ASCII: any string


@dataclass(frozen=True)
class Keys:
    """The operator's record keys: the `current` one seals, the `retired` ones (kept after a
    rotation until no seal uses them) still check."""

    current: bytes
    retired: tuple[bytes, ...] = ()


def key_id(key: bytes) -> str:
    """A key's id, which the seals it makes carry: the first hex digits of its sha256."""
    return hashlib.sha256(key).hexdigest()[:KEY_ID_CHARS]


def _digest(key: bytes, release: Mapping[str, Any]) -> str:
    return hmac.new(key, content(release), hashlib.sha256).hexdigest()[:SEAL_CHARS]


def seal(key: bytes, release: Mapping[str, Any]) -> str:
    """The seal of a release's content under `key`, named by the key's id."""
    return f"{key_id(key)}:{_digest(key, release)}"


def seals(keys: Keys, release: Mapping[str, Any]) -> frozenset[str]:
    """Every seal of a release's content that checks under `keys`: each key's, with its id
    and without one (the form of the seals made before keys had ids)."""
    out: set[str] = set()
    for key in (keys.current, *keys.retired):
        digest = _digest(key, release)
        out |= {f"{key_id(key)}:{digest}", digest}
    return frozenset(out)


RETIRED = "retired-"  # a record-key Secret's data key of a retired key: retired-<id>


def keys_of(data: Mapping[str, Any]) -> Keys:
    """The keys a record-key Secret's data holds (base64): ``key``, the current one, and
    each ``retired-<id>``. ValueError saying what is wrong when ``key`` is not one."""
    def decoded(value: Any) -> bytes:
        try:
            return base64.b64decode(str(value), validate=True)
        except ValueError:
            return b""

    current = decoded(data.get("key"))
    if len(current) < KEY_BYTES:
        raise ValueError(f"holds no key of {KEY_BYTES} bytes or more under data.key")
    retired = tuple(k for name, value in sorted(data.items())
                    if name.startswith(RETIRED) and len(k := decoded(value)) >= KEY_BYTES)
    return Keys(current, retired)


def rotated(data: Mapping[str, Any], new: bytes) -> dict[str, str]:
    """A record-key Secret's data after a rotation to `new`: the current key retired (it
    still checks the seals it made), `new` current."""
    keys = keys_of(data)
    out = {k: str(v) for k, v in data.items() if k.startswith(RETIRED)}
    out[f"{RETIRED}{key_id(keys.current)}"] = str(data["key"])
    out["key"] = base64.b64encode(new).decode()
    return out


def pruned(data: Mapping[str, Any], kept: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """A record-key Secret's data without the retired keys no `kept` seal uses any more
    (:func:`key_in_use`), and the ids of those removed."""
    kept = list(kept)
    out, removed = {}, []
    for name, value in data.items():
        if name.startswith(RETIRED) and not key_in_use(name[len(RETIRED):], kept):
            removed.append(name[len(RETIRED):])
        else:
            out[name] = str(value)
    return out, removed


def key_in_use(kid: str, kept: Iterable[str]) -> bool:
    """Whether a retired key of id `kid` may still check one of the `kept` seals: one it
    made, or one made before keys had ids (whose key cannot be told)."""
    return any(s.startswith(f"{kid}:") or ":" not in s for s in kept)


def kept_seals(new: str, old: Iterable[str]) -> list[str]:
    """The seals a Tenant's status keeps after `new` was made: newest first, no repeats."""
    return list(dict.fromkeys(s for s in (new, *old) if s))[:SEALS_KEPT]


@dataclass(frozen=True)
class Record:
    """One record of a release as judged: its revision, status and seal (None: refused,
    `problem` says why)."""

    revision: int
    status: ReleaseStatus
    seal: str | None  # under the current key: what krypton keeps once it acts on it
    problem: str = ""
    created: float = 0.0  # its creationTimestamp (the API server's clock), 0: unknown
    checks: frozenset[str] = frozenset()  # its seals under every key (:func:`seals`)
    name: str = ""  # the object's
    digest: str = ""  # of the record as stored (:func:`digest`)


class Use(enum.Enum):
    """What a helm run does with the release's history."""

    UPGRADE = "upgrade"  # deletes what the deployed record lists and the chart no longer does
    ROLLBACK = "rollback"  # applies a target record; deletes what the newest lists beyond it
    UNINSTALL = "uninstall"  # deletes what the newest record lists, runs its hooks


class Trust(enum.Enum):
    ABSENT = "absent"  # no record is left: helm has no history to act on
    TRUSTED = "trusted"
    UNSEALED = "unsealed"  # act, but without its hooks, on objects found to be its own only
    UNTRUSTED = "untrusted"


@dataclass(frozen=True)
class Verdict:
    trust: Trust
    message: str = ""
    rollback_to: int = 0  # the revision a rollback goes to
    seal: str = ""  # the seal of the revision a rollback goes to
    # the release's records as judged: helm is handed only these (SPEC S7)
    history: tuple[Record, ...] = ()


def judge(records: Sequence[Record], seals: Sequence[str], use: Use, *, release: str,
          rollback_to: int = 0, guarded_since: float = 0.0) -> Verdict:
    """Whether helm may `use` the history of `release`, given its `records` and the seals the
    Tenant's status keeps. `rollback_to` names the revision a rollback wants (0: the newest
    good one below the newest record). On a cluster whose records are guarded at admission
    since `guarded_since` (SPEC S4), a record created after that was written by krypton and
    needs no seal: a seal lost (a status write that did not happen, a new key) freezes
    nothing the guard covers."""
    for r in records:
        if r.problem:
            return Verdict(Trust.UNTRUSTED, f"release record {release}.v{r.revision} is refused: "
                           f"{r.problem}; helm would read it on every run")
    if not records:
        return Verdict(Trust.ABSENT)
    by_revision = {r.revision: r for r in records}
    newest = by_revision[max(by_revision)]

    kept = set(seals)

    def sealed(r: Record) -> bool:
        return r.seal is not None and (r.seal in kept or not kept.isdisjoint(r.checks) or
                                       0 < guarded_since < r.created)

    def untrusted(r: Record, what: str) -> Verdict:
        way_out = NO_SEALS if not seals else KEY_LOST if not any(
            x.seal in kept or not kept.isdisjoint(x.checks) for x in records) else (
            "Remove the records krypton did not write, or roll the release back to a "
            "revision krypton made: a change of the records brings a pass")
        return Verdict(Trust.UNTRUSTED, f"release record {release}.v{r.revision} "
                       f"({r.status.value}) {what} was not written by krypton (its content "
                       "matches none of the seals krypton keeps); helm is not run on it. "
                       + way_out)

    if use is Use.UPGRADE:
        current = acted_on(records, use)
        assert current is not None
        if sealed(current):
            return Verdict(Trust.TRUSTED)
        return untrusted(current, "that the upgrade would start from")
    if use is Use.ROLLBACK:
        target = max((r for r in _good_below(records, newest, rollback_to) if sealed(r)),
                     key=lambda r: r.revision, default=None)
        if target is not None:
            return Verdict(Trust.TRUSTED, rollback_to=target.revision, seal=target.seal or "")
        wanted = acted_on(records, use, rollback_to)
        if wanted is None:
            return Verdict(Trust.UNTRUSTED, f"release {release} has no earlier revision to "
                           "roll back to; helm is not run on it")
        return untrusted(wanted, "that the rollback would go to")
    if sealed(newest):
        return Verdict(Trust.TRUSTED)
    return Verdict(Trust.UNSEALED, f"release record {release}.v{newest.revision} was not "
                   "sealed by krypton: uninstalled without its hooks, deleting only objects "
                   "that are this release's own")


def _good_below(records: Sequence[Record], newest: Record, rollback_to: int) -> list[Record]:
    return [r for r in records if r.status in GOOD and r.revision < newest.revision
            and (not rollback_to or r.revision == rollback_to)]


def acted_on(records: Sequence[Record], use: Use, rollback_to: int = 0) -> Record | None:
    """The record helm would act on for `use` when none is sealed: the deployed record an
    upgrade starts from, the revision a rollback goes to (`rollback_to`, else the newest
    good one below the newest record); None for an uninstall, or when there is none."""
    if not records or use is Use.UNINSTALL:
        return None
    newest = max(records, key=lambda r: r.revision)
    if use is Use.UPGRADE:
        deployed = [r for r in records if r.status is ReleaseStatus.DEPLOYED]
        return newest if newest.status is ReleaseStatus.DEPLOYED or not deployed else \
            max(deployed, key=lambda r: r.revision)
    by_revision = {r.revision: r for r in records}
    good = _good_below(records, newest, rollback_to)
    wanted = by_revision.get(rollback_to) if rollback_to else None
    return wanted if wanted is not None else max(good, key=lambda r: r.revision, default=None)


def _documents(text: Any) -> list[Any]:
    if not isinstance(text, str):
        raise RecordRefused("a manifest that is not text")
    try:
        return [d for d in safeyaml.load_all(text, safeyaml.CHART_CRDS, what="a manifest")
                if d is not None]
    except safeyaml.YamlRejected as exc:
        raise RecordRefused(str(exc)) from exc


def rendered_alike(release: Mapping[str, Any], rendered: Sequence[Any]) -> bool:
    """Whether the record's release (decoded) holds, in its manifest and its hooks, exactly
    the objects `rendered` (what ``helm template`` renders of krypton's chart for it, hooks
    included), each as often (SPEC S6): then whatever helm does from this record, krypton's
    own record would have it do. Its order and its YAML's layout do not count."""
    return not rendered_unlike(release, rendered)


def rendered_unlike(release: Mapping[str, Any], rendered: Sequence[Any]) -> str:
    """How the record's release differs from `rendered` (:func:`rendered_alike`), in a few
    words naming up to three objects on each side; "" when it does not."""
    def canonical(docs: Sequence[Any]) -> Counter[str]:
        return Counter(json.dumps(d, sort_keys=True, default=str) for d in docs)

    def named(docs: Iterable[str]) -> str:
        names = []
        for text in docs:
            doc = json.loads(text)
            doc = doc if isinstance(doc, dict) else {}
            meta = doc.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            where = "/".join(str(meta.get(k))[:253] for k in ("namespace", "name") if meta.get(k))
            names.append(f"{str(doc.get('kind'))[:63]} {where}")
        return ", ".join(sorted(names)[:3]) + (" ..." if len(names) > 3 else "")

    hooks = release.get("hooks") or []
    try:
        found = _documents(release.get("manifest") or "")
        for hook in hooks if isinstance(hooks, list) else [hooks]:
            found += _documents(hook.get("manifest") if isinstance(hook, dict) else None)
    except RecordRefused as exc:
        return f"its manifest cannot be read: {exc}"
    mine, theirs = canonical(found), canonical([d for d in rendered if d is not None])
    if mine == theirs:
        return ""
    only_record, only_rendered = mine - theirs, theirs - mine
    return "; ".join(what for what in (
        only_record and f"only in the record: {named(only_record.elements())}",
        only_rendered and f"only in krypton's render: {named(only_rendered.elements())}")
        if what)


def asked(text: Any) -> tuple[str, ...]:
    """The seals an administrator's adoption names (the Tenant's
    ``mesh.openkcm.io/adopt-records`` annotation: seals separated by commas), at most
    `ASKED_MAX`; anything else in it is not one. A seal is an HMAC under the operator's key:
    whoever may write the annotation without the key can only repeat seals krypton made."""
    if not isinstance(text, str):
        return ()
    found = (s.strip() for s in text[:ASKED_MAX * (KEY_ID_CHARS + SEAL_CHARS + 2)].split(","))
    return tuple(dict.fromkeys(s for s in found if _SEAL.fullmatch(s)))[:ASKED_MAX]


def adoptable(records: Sequence[Record]) -> list[tuple[int, str]]:
    """What an administrator's adoption seals (``krypton adopt-records``): the revisions
    helm may go back to or start from (deployed, superseded), newest first, with their
    seals. Refused (RecordRefused) when a record of the release is refused, or none is
    good."""
    for r in records:
        if r.problem:
            raise RecordRefused(f"revision {r.revision}: {r.problem}")
    good = sorted(((r.revision, r.seal) for r in records if r.status in GOOD and r.seal),
                  reverse=True)
    if not good:
        raise RecordRefused("the release has no deployed or superseded record to adopt")
    return [(revision, seal) for revision, seal in good if seal]
