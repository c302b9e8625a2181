"""A release's history, read and judged right before a helm run that acts on it (issue 46):
every record of the release (helm decodes them all at every run) within its bounds, and the
records helm would act on sealed by krypton (:mod:`krypton.decisions.records`). Also where a
helm run's result is sealed.
"""

from __future__ import annotations

from typing import Any

from krypton.decisions import records
from krypton.decisions.errors import ReleaseRecordUntrusted
from krypton.decisions.model import ReleaseStatus
from krypton.decisions.records import Record, Trust, Use, Verdict
from krypton.runtime.reconcile.model import Pass
from krypton.runtime.reconcile.view import ClusterRuntime

PAGE = 4  # records per list page: a page of records stored at their bound stays a few MiB


async def read(rt: ClusterRuntime, namespace: str, release: str) -> list[Record]:
    """Every record of `release`, each decoded within its bounds and sealed with this
    operator's key (a record that is refused has no seal and says why)."""
    driver = rt.settings.helm_driver
    found = await rt.kube.list_release_records(
        driver, namespace, f"owner=helm,name={release}", page_size=PAGE)
    out = []
    for obj in found:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        version = str(labels.get("version") or "")
        if not version.isdigit() or len(version) > 9:
            continue  # not a revision helm would read as one
        status = ReleaseStatus.parse(labels.get("status"))
        try:
            out.append(Record(int(version), status,
                              records.seal(rt.record_key, records.decode(obj, driver))))
        except records.RecordRefused as exc:
            out.append(Record(int(version), status, None, str(exc)))
    return out


async def judge(rt: ClusterRuntime, p: Pass, use: Use, *, rollback_to: int = 0) -> Verdict:
    """The verdict on the pass's release for `use`; ReleaseRecordUntrusted when helm must not
    act on it. A record adopted (no seal kept yet) is said once, in an Event."""
    found = await read(rt, p.namespace, p.release)
    verdict = records.judge(found, p.obs.tenant.record_seals, use, release=p.release,
                            rollback_to=rollback_to)
    if verdict.trust is Trust.UNTRUSTED:
        raise ReleaseRecordUntrusted(verdict.message)
    if verdict.trust is Trust.ADOPT:
        p.log.info("release record adopted", seal=verdict.seal)
    return verdict


def adopted(verdict: Verdict) -> list[tuple[str, str, str]]:
    """The Event that says a record was adopted, if one was."""
    if verdict.trust is not Trust.ADOPT:
        return []
    return [("Normal", "ReleaseRecordAdopted",
             "the release's deployed record was made before krypton sealed its records (an "
             "older krypton or the prototype): taken as krypton's, once")]


def sealed(rt: ClusterRuntime, p: Pass, result: dict[str, Any], *also: str) -> list[str]:
    """The seals the Tenant's status keeps after a helm run that left `result` (helm's
    answer: the release it made), `also` the seals of records this pass adopted or went to."""
    new = records.seal(rt.record_key, result)
    return records.kept_seals(new, [*also, *p.obs.tenant.record_seals])
