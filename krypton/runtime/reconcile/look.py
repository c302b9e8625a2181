"""Looking at an applied release on the cluster (SPEC F2, F6): the objects of its
manifest that are gone, and the health of its workload, read once per --resync-period for
an in-sync release and on every pass while its workload is waited for; a workload that is
not ready is followed by the cluster's watches from then on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from krypton.decisions.charts import ownership
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import (
    OwnershipConflict,
    TemporaryError,
)
from krypton.decisions.model import (
    Observation,
    ReleaseStatus,
    TenantKey,
    TenantView,
    release_name,
)
from krypton.decisions.readiness import health
from krypton.decisions.readiness.health import Health
from krypton.decisions.trust import safeyaml
from krypton.decisions.trust.records import Record, decode
from krypton.runtime.reconcile.model import Workload
from krypton.runtime.reconcile.view import ClusterRuntime

READINESS_POLL = 5.0  # seconds between looks at a workload being waited for, not watched



async def look_in_sync(rt: ClusterRuntime, obs: Observation) -> Observation | None:
    """An in-sync release's objects and workload, when a look is due (F2, F6): the
    observation with what was found, None when nothing was looked at or found."""
    key = obs.tenant.key
    missing, found = rt.memory.of(key).gone, None
    if not missing and look_due(rt, key, obs.tenant):
        found = rt.readiness.health(key) if rt.readiness else None
        if found is not None:  # the watches keep its workload current: no reads
            follow(rt, key, None, found)
        else:
            missing, found = await look(rt,
                                        key, release_name(key.name, rt.name),
                                        rt.settings.release_namespace_for(key.name), obs.release.revision)
    if missing:
        # remembered until a helm run restores them: the pass that announces the
        # upgrade and the one that makes it both see them
        rt.memory.of(key).gone = missing
    if not missing and found is None:
        return None
    return dataclasses.replace(obs, missing=missing, health=found)



def look_due(rt: ClusterRuntime, key: TenantKey, t: TenantView) -> bool:
    """Every pass while the release is not Ready on this cluster (its workload is being
    waited for, timed out or degraded); else once per --resync-period per Tenant (the
    first one a period after it is first seen, so that a start does not look at every
    object of the fleet at once)."""
    if t.readiness is None or not t.readiness[0]:
        return True
    now, kept = time.monotonic(), rt.memory.of(key)
    if kept.looked_at is None:
        kept.looked_at = now
    if now - kept.looked_at < rt.settings.resync_period:
        return False
    kept.looked_at = now
    return True



async def look(rt: ClusterRuntime, key: TenantKey, release: str, namespace: str,
               revision: int) -> tuple[tuple[str, ...], Health | None]:
    """The deployed revision's manifest (read from its release record, without helm),
    looked at on the cluster: the objects that are gone (with --drift-detection=repair)
    and the health of its workload. One read per object; a workload that is not ready is
    followed by the watches from then on."""
    driver = rt.settings.helm_driver
    record = await rt.kube.release_record(driver, namespace,
                                          f"sh.helm.release.v1.{release}.v{revision}")
    if record is None:
        return (), None  # the release changed meanwhile: its watch brings the key back
    try:
        manifest = str(decode(record, driver).get("manifest") or "")
    except ValueError as exc:
        rt.log.warning("release manifest not readable; objects not checked",
                       release=release, error=str(exc))
        return (), None
    gone, workload = await look_at_manifest(rt, release, namespace, manifest)
    return gone, judge(rt, key, workload)



async def look_at_manifest(rt: ClusterRuntime, release: str, namespace: str, manifest: str, *,
                           workload_only: bool = False
                            ) -> tuple[tuple[str, ...], Workload | None]:
    rules = rt.settings.health_rules
    if workload_only and not any(kind in manifest for kind in health.workload_kinds(rules)):
        return (), []  # no object of a kind with readiness rules: nothing to parse for
    try:
        docs = safeyaml.load_all(manifest, safeyaml.CHART_CRDS, what=f"manifest of {release}")
    except safeyaml.YamlRejected as exc:
        rt.log.warning("release manifest not readable; objects not checked",
                       release=release, error=str(exc))
        return (), None
    refs = ownership.manifest_objects(docs)
    if workload_only:
        refs = health.workload_refs(refs, rules)
    gone, workload = [], []
    for ref in refs:
        obj = await rt.kube.get_object(ref.api_version, ref.kind, ref.name,
                                       ref.namespace or namespace)
        if obj is None:
            gone.append(str(ref))
        if ref.kind in health.WORKLOAD_KINDS or rules.find(ref.api_version, ref.kind):
            # namespaced kinds, named where they are
            workload.append((dataclasses.replace(ref, namespace=ref.namespace or namespace),
                             obj))
    repair = rt.settings.drift_detection != "off"
    return (tuple(gone) if repair else ()), workload



def judge(rt: ClusterRuntime, key: TenantKey, workload: Workload | None) -> Health | None:
    """The health of the workload objects just read (None: not looked at), which are
    followed from now on if they are not ready."""
    if workload is None:
        return None
    found = health.release_health(workload, rt.settings.health_rules)
    follow(rt, key, workload, found)
    return found



def follow(rt: ClusterRuntime, key: TenantKey, workload: Workload | None, found: Health | None) -> None:
    """A workload that is not ready is followed by the cluster's watches (its objects as
    just read), one that is ready no longer."""
    if rt.readiness is None or found is None:
        return
    if found.ready:
        rt.readiness.unfollow(key)
    elif workload is not None:
        rt.readiness.follow(key, workload)



async def not_ready(rt: ClusterRuntime, key: TenantKey, release: str, namespace: str,
                    manifest: str) -> Health | None:
    """The health of a release helm applied without waiting, from the manifest it
    returned; None when every workload object is ready (or there is none)."""
    try:
        _gone, workload = await look_at_manifest(rt, release, namespace, manifest,
                                                 workload_only=True)
    except TemporaryError as exc:  # the next pass looks again
        return Health((f"workload not looked at yet ({exc})",))
    found = judge(rt, key, workload)
    return None if found is None or found.ready else found



def readiness_requeue(rt: ClusterRuntime, key: TenantKey, since_applied: float | None) -> float:
    """When to look again at a workload being waited for: when it would time out if its
    objects are watched (a change that makes it ready wakes it sooner), else soon."""
    if rt.readiness is None or rt.readiness.health(key) is None:
        return READINESS_POLL
    left = rt.settings.helm_timeout - (since_applied or 0.0)
    return max(READINESS_POLL, left + 1.0)


async def check_ownership(rt: ClusterRuntime, release: str, namespace: str,
                          history: Sequence[Record], *,
                          why: str = "failed and cannot be recovered by uninstalling it"
                           ) -> None:
    """Refuse to uninstall a release whose manifest lists objects that another release
    (or nobody) owns now: helm would delete them (SPEC R17). Objects the manifest marks
    ``helm.sh/resource-policy: keep`` are left by helm and need no check. The manifest is
    read from the `history` krypton judged (SPEC S7)."""
    live = {}
    docs = await rt.helm.manifest(release, namespace, records=history)
    for ref in ownership.manifest_objects(d for d in docs if not ownership.kept(d)):
        annotations = await rt.kube.object_annotations(
            ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
        if annotations is not None:
            live[ref] = annotations
    found = ownership.conflicts(live, release, namespace)
    found += await _rendered_elsewhere(rt, [ref for ref in live if ref not in found],
                                       release, namespace)
    if found:
        raise OwnershipConflict(
            f"release {release} {why} without deleting objects it does not own: "
            f"{'; '.join(found[:5])}"
            + (f" (and {len(found) - 5} more)" if len(found) > 5 else ""))


async def _cluster_objects_of(rt: ClusterRuntime, namespace: str, release: str,
                              revision: int) -> frozenset[ObjectRef]:
    """The objects without a namespace in a release revision's manifest, read from its record
    once per revision (kept in `rt.state.manifest_objects`: a release's records do not change)."""
    known = rt.state.manifest_objects.get((namespace, release))
    if known is not None and known[0] == revision:
        return known[1]
    driver = rt.settings.helm_driver
    record = await rt.kube.release_record(driver, namespace,
                                          f"sh.helm.release.v1.{release}.v{revision}")
    try:
        docs = safeyaml.load_all(str(decode(record or {}, driver).get("manifest") or ""),
                                 safeyaml.CHART_CRDS, what=f"manifest of {release}")
    except (ValueError, safeyaml.YamlRejected):
        return frozenset()
    refs = frozenset(ref for ref in ownership.manifest_objects(docs) if ref.namespace is None)
    rt.state.manifest_objects[(namespace, release)] = (revision, refs)
    return refs


async def _rendered_elsewhere(rt: ClusterRuntime, refs: list[ObjectRef], release: str,
                              namespace: str) -> list[str]:
    """Of this release's cluster-scoped objects `refs`, those the deployed manifest of
    another live release on the cluster also lists (two releases that raced for it before
    the claim of the first Tenant): helm would delete it under that release (SPEC F5b).
    A release left behind by a Tenant that no longer exists does not count."""
    shared = [ref for ref in refs
              if ref.namespace is None and await rt.kube.cluster_scoped(ref.api_version, ref.kind)]
    if not shared:
        return []
    found = []
    for other_ns, other in rt.releases.names():
        if (other_ns, other) == (namespace, release):
            continue
        observed = rt.releases.observe(other_ns, other)
        # live: deployed, and its Tenant still served here (by the UID it is labelled
        # with); a deployed release without a label (made before them, or by hand) counts
        # as live too, to be safe
        if observed.status is not ReleaseStatus.DEPLOYED or (
                observed.owner_uid and not rt.tenant_with_uid(observed.owner_uid)):
            continue
        theirs = await _cluster_objects_of(rt, other_ns, other, observed.revision)
        found += [f"{ref} is also in the manifest of release {other_ns}/{other}, which would "
                  "lose it (uninstall that release first, or upgrade this one with values "
                  "that do not render it)" for ref in shared if ref in theirs]
    return found

