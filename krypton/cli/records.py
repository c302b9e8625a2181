"""What an administrator asks of the operator on a Tenant's release, through the Tenant's
annotations and nothing else: ``krypton retry`` (a new attempt, R18) and ``krypton
adopt-records`` (release records adopted as they are, S6); and ``krypton
rotate-record-key``, the key that seals the records rotated or pruned (S4)."""

from __future__ import annotations

import os
from typing import Any

from krypton.adapters.kube import Kube, now_rfc3339
from krypton.app.home import RECORD_KEY_SECRET, record_keys
from krypton.cli.fleet import fleet_view, tenants_of
from krypton.decisions import conditions, crd
from krypton.decisions.errors import NotFound, SettingsError, TemporaryError
from krypton.decisions.model import ADOPT_ANNOTATION, RETRY_ANNOTATION, TenantKey, release_name
from krypton.decisions.settings import Settings
from krypton.decisions.trust import records
from krypton.runtime.reconcile import history


async def adopt_records(settings: Settings, ref: str | None, only: str | None, *,
                        dry_run: bool = False) -> list[str]:
    """Ask the operator to adopt release records as they are (SPEC S6): those of Tenant `ref`
    ("namespace/name"), or with `ref` None those of every Tenant whose release krypton
    refused for its records (ReleaseRecordUntrusted), on every discovered cluster or on
    `only`. An administrator's explicit act for what is not adopted by its content. The
    seals of each release's deployed and superseded revisions, as read now, go into the
    Tenant's ADOPT_ANNOTATION; the operator's next pass believes them and its commit keeps
    them, with an Event. `dry_run` lists what would be asked and what krypton said of it,
    writing nothing. One line per release; NotFound when `ref` is on no cluster."""
    wanted = None
    if ref is not None:
        namespace, _, name = ref.partition("/")
        if not namespace or not name:
            raise SettingsError(f"invalid Tenant {ref!r}: expected NAMESPACE/NAME")
        wanted = TenantKey(namespace, name)
    lines = []
    async with fleet_view(settings, "krypton-adopt-") as (_, home, clusters):
        found_keys = await record_keys(home, settings.namespace)
        if found_keys is None:
            raise NotFound(f"Secret {settings.namespace}/{RECORD_KEY_SECRET} not found: the "
                           "operator makes it at its first start")
        for c in clusters:
            if c.kube is None or (only and c.name != only):
                continue
            if wanted is not None:
                tenant = await c.kube.get_tenant(wanted)
                tenants = [] if tenant is None else [tenant]
            else:
                tenants = [t for t in await c.kube.list_tenants(settings.watch_namespace or None)
                           if _untrusted(t, c.name) is not None]
            for tenant in tenants:
                lines.append(await _adopt(settings, c.name, c.kube, tenant, found_keys[0],
                                          dry_run=dry_run))
    if wanted is not None and not lines:
        where = f"cluster {only}" if only else "any discovered cluster"
        raise NotFound(f"Tenant {wanted} not found on {where}")
    if not lines:
        where = f"cluster {only}" if only else "any discovered cluster"
        lines.append(f"no release is refused for its records on {where}")
    return lines


def _untrusted(tenant: dict[str, Any], cluster: str) -> str | None:
    """What krypton said of the Tenant's release on `cluster` when it refused it for its
    records (ReleaseRecordUntrusted), else None."""
    for c in (tenant.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == conditions.cluster_type(
                conditions.ERROR, cluster) and c.get("status") == "True" and \
                c.get("reason") == "ReleaseRecordUntrusted":
            return str(c.get("message") or "")
    return None


async def _adopt(settings: Settings, cluster: str, kube: Kube, tenant: dict[str, Any],
                 keys: records.Keys, *, dry_run: bool) -> str:
    """One release's adoption asked for (or, `dry_run`, said), as a line."""
    meta = tenant.get("metadata") or {}
    key = TenantKey(str(meta.get("namespace")), str(meta.get("name")))
    release, where = release_name(key.name, cluster), settings.release_namespace_for(key.name)
    said = _untrusted(tenant, cluster)
    said = f"; krypton said: {said}" if said else ""
    try:
        found = records.adoptable(await history.read(
            kube, settings.helm_driver, where, release, keys))
    except records.RecordRefused as exc:
        return f"{cluster}: {key}: nothing adopted of release {release}: {exc}{said}"
    revisions = ", ".join(str(r) for r, _ in found)
    if dry_run:
        return f"{cluster}: {key}: would adopt revisions {revisions} of release {release}{said}"
    asked = records.asked((meta.get("annotations") or {}).get(ADOPT_ANNOTATION))
    seals = list(dict.fromkeys([s for _, s in found] + list(asked)))[:records.ASKED_MAX]
    await kube.patch_tenant(key, {"metadata": {"annotations": {
        ADOPT_ANNOTATION: ",".join(seals)}}})
    return (f"{cluster}: {key}: adoption of revisions {revisions} of release {release} in "
            f"{where} asked for ({ADOPT_ANNOTATION}); the operator's next pass carries it out")


async def rotate_record_key(settings: Settings, *, prune: bool) -> list[str]:
    """Rotate the key that seals release records (SPEC S4): a new current key, the old one
    retired, still checking the seals it made. With `prune`, instead drop the retired keys no
    Tenant's seals use any more, on every discovered cluster (refused when one cannot be
    read: a seal there may still need its key). The Secret is replaced at the version read."""
    async with fleet_view(settings, "krypton-keys-") as (_, home, clusters):
        found = await record_keys(home, settings.namespace)
        if found is None:
            raise NotFound(f"Secret {settings.namespace}/{RECORD_KEY_SECRET} not found: the "
                           "operator makes it at its first start")
        keys, secret = found
        data = secret.get("data") or {}
        if not prune:
            new = os.urandom(records.KEY_BYTES)
            data = records.rotated(data, new)
            lines = [f"new key {records.key_id(new)}; key {records.key_id(keys.current)} "
                     "retired, still checking the seals it made",
                     "restart the operator to seal with the new key (kubectl rollout restart); "
                     "drop retired keys with --prune once no seal uses them"]
        else:
            kept: list[str] = []
            for c in clusters:
                if c.kube is None:
                    raise TemporaryError(f"cluster {c.name} cannot be reached ({c.error}): no "
                                         "key removed, a seal there may still need one")
                for t in await tenants_of(c.kube, settings):
                    for entry in ((t.get("status") or {}).get("clusters") or {}).values():
                        found_seals = crd.seals_of(entry) if isinstance(entry, dict) else None
                        kept += [x for x in found_seals or [] if isinstance(x, str)]
            data, removed = records.pruned(data, kept)
            if not removed:
                return [f"no retired key to remove ({len(keys.retired)} still checking seals "
                        "in use)"]
            lines = [f"retired key {kid} removed: no seal uses it" for kid in removed]
        body = {"metadata": {"name": RECORD_KEY_SECRET, "namespace": settings.namespace,
                             "labels": (secret.get("metadata") or {}).get("labels") or {},
                             "resourceVersion": secret["metadata"]["resourceVersion"]},
                "type": "Opaque", "data": data}
        await home.replace_secret(settings.namespace, RECORD_KEY_SECRET, body)
        return lines


async def retry(settings: Settings, ref: str, only: str | None) -> list[str]:
    """Ask for a new attempt of Tenant `ref` ("namespace/name") on every discovered cluster
    that has it, or on `only`: the retry annotation gets a new value (R18). One line per
    cluster; NotFound when no cluster has the Tenant."""
    namespace, _, name = ref.partition("/")
    if not namespace or not name:
        raise SettingsError(f"invalid Tenant {ref!r}: expected NAMESPACE/NAME")
    key, token = TenantKey(namespace, name), now_rfc3339()
    lines = []
    async with fleet_view(settings, "krypton-retry-") as (_, _home, clusters):
        for c in clusters:
            if c.kube is None or (only and c.name != only):
                continue
            try:
                await c.kube.patch_tenant(key, {"metadata": {"annotations": {
                    RETRY_ANNOTATION: token}}})
            except NotFound:
                continue
            lines.append(f"{c.name}: retry of {key} asked for ({RETRY_ANNOTATION}={token})")
    if not lines:
        where = f"cluster {only}" if only else "any discovered cluster"
        raise NotFound(f"Tenant {key} not found on {where}")
    return lines
