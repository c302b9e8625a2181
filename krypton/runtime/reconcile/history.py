"""A release's history, read and judged right before a helm run that acts on it (SPEC S3, S4):
every record of the release (helm decodes them all at every run) within its bounds, and the
records helm would act on sealed by krypton (:mod:`krypton.decisions.trust.records`). Also where a
helm run's result is sealed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from krypton.adapters import metrics
from krypton.adapters.kube import Kube, now_rfc3339
from krypton.decisions import crd
from krypton.decisions.errors import KryptonError, ReleaseRecordUntrusted
from krypton.decisions.model import ADOPTED_ANNOTATION, ReleaseStatus, epoch_seconds
from krypton.decisions.trust import records
from krypton.decisions.trust.records import Record, Trust, Use, Verdict
from krypton.runtime.reconcile import look
from krypton.runtime.reconcile.memory import KEPT, Judged
from krypton.runtime.reconcile.model import Pass
from krypton.runtime.reconcile.view import ClusterRuntime

PAGE = 4  # records per list page: a page of records stored at their bound stays a few MiB


async def read(kube: Kube, driver: str, namespace: str, release: str, keys: records.Keys
               ) -> list[Record]:
    """Every record of `release` as helm selects them (by their labels), each decoded
    within its bounds, its revision and status read from its body as helm reads them
    (:func:`records.identity`) and sealed under `keys`. A record that is refused has no seal
    and says why. The operator's passes and ``krypton adopt-records`` read alike."""
    found = await kube.list_release_records(
        driver, namespace, f"owner=helm,name={release}", page_size=PAGE)
    out = []
    for obj in found:
        try:
            body = records.decode(obj, driver)
            revision, status = records.identity(obj, body, release)
            meta = obj.get("metadata") or {}
            out.append(Record(revision, status, records.seal(keys.current, body),
                              created=epoch_seconds(meta.get("creationTimestamp")) or 0.0,
                              checks=records.seals(keys, body), name=str(meta.get("name")),
                              digest=records.digest(records.stored(obj, driver))))
        except records.RecordRefused as exc:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            version = str(labels.get("version") or "")
            out.append(Record(int(version) if version.isdigit() and len(version) < 10 else 0,
                              ReleaseStatus.parse(labels.get("status")), None, str(exc)))
    return out


async def judge(rt: ClusterRuntime, p: Pass, use: Use, *, rollback_to: int = 0) -> Verdict:
    """The verdict on the pass's release for `use`, with the history it judged (the records
    helm is then handed, and no other: SPEC S7); ReleaseRecordUntrusted when helm must not
    act on it. A record is krypton's by a seal the Tenant's status keeps, by the guard's time
    (looked at now), by an administrator's adoption, or by its content, in that order."""
    found = await read(rt.kube, rt.settings.helm_driver, p.namespace, p.release,
                       rt.record_keys)
    try:
        verdict = await _judged(rt, p, use, found, rollback_to)
    except ReleaseRecordUntrusted as exc:
        _remember(rt, p, found, Trust.UNTRUSTED.value, str(exc))
        raise
    _remember(rt, p, found, verdict.trust.value, verdict.message)
    return dataclasses.replace(verdict, history=tuple(found))


def _remember(rt: ClusterRuntime, p: Pass, found: list[Record], trust: str,
              message: str) -> None:
    """The judged history, kept for the fleet page (SPEC O16): each record with whether the
    Tenant's status keeps a seal of it (the guard's time or an adoption may vouch for one
    without: the verdict says)."""
    kept = set(p.obs.tenant.record_seals)

    def whose(r: Record) -> str:
        if r.problem:
            return f"refused: {r.problem}"
        return "sealed by krypton" if r.checks & kept or r.seal in kept else \
            "no seal of krypton's"
    newest = sorted(found, key=lambda r: r.revision)[-KEPT:]
    rt.memory.of(p.key).judged = Judged(now_rfc3339(), trust, message[:1024], tuple(
        (r.revision, r.status.value, whose(r)) for r in newest))


async def _judged(rt: ClusterRuntime, p: Pass, use: Use, found: list[Record],
                  rollback_to: int) -> Verdict:
    verdict = records.judge(found, p.obs.tenant.record_seals, use, release=p.release,
                            rollback_to=rollback_to)
    if verdict.trust is not Trust.TRUSTED and (since := await rt.guarded_since()) and \
            not await _adopted(rt, p.namespace):
        # the guard's time, looked at now (SPEC S6); a namespace krypton adopted was not
        # guarded before it labelled it: its records are judged by their seals alone
        verdict = records.judge(found, p.obs.tenant.record_seals, use, release=p.release,
                                rollback_to=rollback_to, guarded_since=since)
    if verdict.trust is Trust.UNTRUSTED and p.obs.tenant.adopted_seals:
        verdict = _asked(p, found, use, rollback_to) or verdict
    if verdict.trust is not Trust.UNTRUSTED:
        return verdict
    adopted, why = await _adopted_by_content(rt, p, found, use, rollback_to)
    if adopted is not None:
        return adopted
    message = f"{verdict.message.rstrip('.')}. Not adopted by its content: {why}." if why \
        else verdict.message
    outdated = rt.health.crd_outdated
    if outdated and not p.obs.tenant.record_seals:
        # the cause is the CRD, not a forger: it drops every seal krypton writes
        raise ReleaseRecordUntrusted(
            f"the Tenant CRD on this cluster is outdated ({outdated}) and drops the seals "
            f"krypton keeps of this release's records; fix: {crd.FIX}. {message}")
    raise ReleaseRecordUntrusted(message)


def _asked(p: Pass, found: list[Record], use: Use, rollback_to: int) -> Verdict | None:
    """The verdict on records an administrator adopted as they are (``krypton
    adopt-records``: their seals in the Tenant's annotation), carried out by this pass: the
    seal of the record helm acts on goes into its commit, with an Event. None when the
    record helm would act on is not among them."""
    verdict = records.judge(found, [*p.obs.tenant.record_seals, *p.obs.tenant.adopted_seals],
                            use, release=p.release, rollback_to=rollback_to)
    record = records.acted_on(found, use, verdict.rollback_to or rollback_to)
    if verdict.trust is not Trust.TRUSTED or record is None or record.seal is None:
        return None
    p.events.append(("Normal", "ReleaseRecordAdopted",
                     f"release record {p.release}.v{record.revision} adopted as krypton's by "
                     "an administrator (krypton adopt-records)"))
    return dataclasses.replace(verdict, seal=verdict.seal or record.seal)


async def _adopted_by_content(rt: ClusterRuntime, p: Pass, found: list[Record], use: Use,
                              rollback_to: int) -> tuple[Verdict | None, str]:
    """The verdict for a record krypton keeps no seal of, adopted by its content (SPEC S6):
    read again, its manifest and hooks are exactly what krypton's chart renders for the
    record's chart version with the values krypton gives this release (``helm template``,
    which does not touch the cluster). Its seal then goes into the pass's commit, with an
    Event ReleaseRecordAdopted. Else None, and why not ("" when there is no such record)."""
    record = records.acted_on(found, use, rollback_to)
    if record is None or record.seal is None or any(r.problem for r in found):
        return None, ""
    # judged once per content and target: a refused release is not rendered at every pass
    judged = (record.seal, p.chart.fingerprint)
    memory = rt.memory.of(p.key)
    if memory.not_adopted is not None and memory.not_adopted[0] == judged:
        return None, memory.not_adopted[1]
    driver = rt.settings.helm_driver
    obj = await rt.kube.release_record(driver, p.namespace,
                                       f"sh.helm.release.v1.{p.release}.v{record.revision}")
    try:
        body = records.decode(obj or {}, driver)
        records.identity(obj or {}, body, p.release)
    except records.RecordRefused as exc:
        return None, f"revision {record.revision} read again: {exc}"
    chart = body.get("chart")
    meta = chart.get("metadata") if isinstance(chart, dict) else None
    version = str(meta.get("version") or "")[:64] if isinstance(meta, dict) else ""
    if records.seal(rt.record_keys.current, body) != record.seal or \
            body.get("namespace") != p.namespace or not version:
        return None, f"revision {record.revision} changed since it was read, or names no chart"
    try:
        path = p.chart.path if version == p.chart.version else (await rt.chart.fetch(version)).path
        rendered = await rt.helm.template(path, p.release, p.namespace, p.chart.values)
    except KryptonError as exc:
        p.log.info("release record not rendered for adoption", revision=record.revision,
                   error=str(exc))
        return None, f"chart {version} of revision {record.revision} not rendered: {exc}"
    verdict = records.judge(found, [record.seal, *p.obs.tenant.record_seals], use,
                            release=p.release, rollback_to=rollback_to)
    unlike = records.rendered_unlike(body, rendered)
    if unlike or verdict.trust is not Trust.TRUSTED:
        why = (f"revision {record.revision} is not what chart {version} renders with the "
               f"values krypton gives this release ({unlike or 'another record is not'})")
        memory.not_adopted = (judged, why)
        return None, why
    metrics.RECORDS_ADOPTED.labels(rt.name).inc()
    p.events.append(("Normal", "ReleaseRecordAdopted",
                     f"release record {p.release}.v{record.revision} adopted by its content: "
                     f"its manifest and hooks are exactly what chart {version} renders with "
                     "the values krypton gives this release"))
    return dataclasses.replace(verdict, seal=verdict.seal or record.seal), ""


async def _adopted(rt: ClusterRuntime, namespace: str) -> bool:
    """Whether krypton adopted `namespace` (--adopt-namespaces) rather than created it; in
    the one release namespace (--release-namespace=watch) the guard names it outright."""
    if rt.settings.shared_release_namespace:
        return False
    found = await rt.kube.get_namespace(namespace)
    annotations = ((found or {}).get("metadata") or {}).get("annotations") or {}
    return found is None or ADOPTED_ANNOTATION in annotations


async def rollback(rt: ClusterRuntime, p: Pass, *, to: int = 0
                   ) -> tuple[dict[str, Any], Verdict] | None:
    """The one way krypton rolls a release back (a stale lock's recovery, a halted
    rollout's revert, the metric gate's): the history judged for it, the objects the
    rollback would delete found to be this release's own (R17), then helm's rollback to
    the revision the verdict names (`to`, or the newest good one krypton made). None when
    the release has no record left to roll back on."""
    verdict = await judge(rt, p, Use.ROLLBACK, rollback_to=to)
    if verdict.trust is Trust.ABSENT:
        return None
    await look.check_ownership(rt, p.release, p.namespace, verdict.history,
                               why="is not rolled back")
    return await rt.helm.rollback(p.release, p.namespace, verdict.rollback_to,
                                  records=verdict.history), verdict


async def as_read(rt: ClusterRuntime, p: Pass) -> tuple[Record, ...]:
    """The release's records as they are, for a helm run that acts on none of them (an
    install over an uninstalled release's history) but that helm reads."""
    return tuple(await read(rt.kube, rt.settings.helm_driver, p.namespace, p.release,
                            rt.record_keys))


def sealed(rt: ClusterRuntime, p: Pass, result: dict[str, Any], *also: str) -> list[str]:
    """The seals the Tenant's status keeps after a helm run that left `result` (helm's
    answer: the release it made), `also` the seals of the revisions this pass went back to."""
    new = records.seal(rt.record_keys.current, result)
    return records.kept_seals(new, [*also, *p.obs.tenant.record_seals])
