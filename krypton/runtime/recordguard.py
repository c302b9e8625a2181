"""The guard of krypton's release records on one engaged cluster (SPEC S4): installed (or
found, where an admin installed it), then known to be in force, or the reason it is not.

The manifests and the rules are :mod:`krypton.decisions.guard`'s. "In force" is asked of the
API server, not inferred from the objects: a dry-run create of the guard's probe must be
refused by the guard itself. A cluster without the guard stays engaged and is reported
unguarded; what that leaves open is in the docs' security model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from krypton.adapters.kube import Kube
from krypton.decisions import guard
from krypton.decisions.errors import Forbidden, KryptonError
from krypton.decisions.model import epoch_seconds
from krypton.decisions.settings import Settings

SETTLE = 15.0  # seconds a new or changed policy gets to come into force on the API server
PROBE_EVERY = 0.5
CHECK_EVERY = 600.0  # seconds between checks of an engaged cluster's guard


@dataclass(frozen=True)
class GuardState:
    """Whether the cluster's release records are guarded, and what was found: how, or why
    not."""

    guarded: bool
    message: str
    user: str = ""
    since: float = 0.0  # when it came into force (API server's clock); 0: not known
    held: str = ""  # the objects it holds by (guard.held), for whom `since` holds


def _probe_namespace(settings: Settings) -> str:
    return settings.watch_namespace or "default"


async def _ensure(kube: Kube, what: str, collection: str, want: dict[str, Any],
                  install: bool) -> tuple[str, dict[str, Any] | None]:
    """The object `want` as the cluster holds it, written when absent or different and
    `install`: "" and the object found as wanted (None: written), else why it is not."""
    name = want["metadata"]["name"]
    found = await kube.cluster_object(what, collection, name)
    where = "absent" if found is None else guard.differs(want["spec"], found.get("spec"))
    if not where:
        return "", found
    if not install:
        said = where if found is None else f"not as krypton would make it ({where})"
        return f"{what} {name} is {said}", found
    version = None if found is None else str((found.get("metadata") or {}).get(
        "resourceVersion") or "")
    await kube.write_cluster_object(what, collection, want, version)
    return "", None


async def _in_force(kube: Kube, settings: Settings, *, changed: float | None) -> str:
    """"" once the API server refuses the guard's probe with the guard's own message, else
    why the guard is not in force. The API server takes a moment to enforce a policy made or
    changed: one changed less than SETTLE seconds before the probe (`changed` by the
    server's clock, as the accepted probe tells it; None: krypton just wrote it) is asked
    again until then, never for longer than SETTLE seconds."""
    namespace = _probe_namespace(settings)
    deadline = time.monotonic() + SETTLE
    while True:
        try:
            accepted = await kube.dry_run_create(
                namespace, guard.probe(namespace, settings.watch_namespace))
        except Forbidden as exc:
            if guard.probe_refused(str(exc), settings.watch_namespace):
                return ""
            return f"krypton's guard probe was refused by something else: {exc}"
        now = epoch_seconds((accepted.get("metadata") or {}).get("creationTimestamp"))
        settling = changed is None or now is None or now < changed + SETTLE
        if not settling or time.monotonic() >= deadline:
            return ("the API server accepted krypton's guard probe: the policy is not in force "
                    "(is the ValidatingAdmissionPolicy admission plugin turned off?)")
        await asyncio.sleep(PROBE_EVERY)


async def ensure(kube: Kube, settings: Settings, user: str = "") -> GuardState:
    """Install (--record-guard=install) or find (check) the guard of this cluster's records
    for the user krypton acts as (`user`, asked of the cluster when ""), and say whether it
    is in force. Never raises for what the cluster answers: a guard that cannot be had is a
    state, reported, not a failure of the engagement."""
    mode = settings.record_guard
    if mode == "off":
        return GuardState(False, "the guard is turned off (--record-guard=off)")
    try:
        user = user or await kube.user()
    except KryptonError as exc:
        return GuardState(False, f"krypton cannot learn the user it acts as here: {exc}")
    policy, binding = guard.manifests(user, watch_namespace=settings.watch_namespace,
                                      release_namespace=settings.shared_release_namespace)
    install = mode == "install"
    try:
        looked = [await _ensure(kube, "validatingadmissionpolicy", guard.POLICIES, policy,
                                install),
                  await _ensure(kube, "validatingadmissionpolicybinding", guard.BINDINGS,
                                binding, install)]
        missing = "; ".join(why for why, _found in looked if why)
        if missing:
            return GuardState(False, f"{missing}; an admin installs it with `krypton guard "
                              f"--print --user {user} | kubectl apply -f -`", user)
        found = [o for _why, o in looked if o is not None]
        why = await _in_force(kube, settings, changed=guard.changed_at(*found)
                              if len(found) == len(looked) else None)
    except Forbidden as exc:
        return GuardState(False, f"krypton may not {'install' if install else 'read'} the "
                          f"guard here ({exc}); an admin installs it with `krypton guard "
                          "--print`", user)
    except KryptonError as exc:
        return GuardState(False, f"the guard could not be checked: {exc}", user)
    if why:
        return GuardState(False, why, user)
    try:
        since, held = await _since(kube, settings, policy["metadata"]["name"], install)
    except KryptonError:
        since, held = 0.0, ""  # in force since an unknown time: the seals judge alone
    return GuardState(True, f"ValidatingAdmissionPolicy {policy['metadata']['name']} lets only "
                      f"{user} write the release records", user, since, held)


async def _server_time(kube: Kube, settings: Settings) -> float:
    """The API server's clock, to the second: the creation time it gives a dry-run object."""
    namespace = _probe_namespace(settings)
    stamped = await kube.dry_run_create(namespace, guard.stamp(namespace))
    return epoch_seconds((stamped.get("metadata") or {}).get("creationTimestamp")) or 0.0


def carried(was: GuardState, now: GuardState) -> GuardState:
    """`now`, keeping the earlier time `was` knew for the same objects (where krypton may
    not record the time on the binding, it knows it from its first look)."""
    if now.guarded and was.guarded and was.since and now.held == was.held and \
            0 < was.since < now.since:
        return dataclasses.replace(now, since=was.since)
    return now


async def _since(kube: Kube, settings: Settings, name: str, install: bool
                 ) -> tuple[float, str]:
    """When the guard, in force now, came into force, and the objects that holds for: as
    recorded on its binding for these very objects, else now by the API server's clock
    (recorded there when krypton may)."""
    policy = await kube.cluster_object("validatingadmissionpolicy", guard.POLICIES, name)
    binding = await kube.cluster_object("validatingadmissionpolicybinding", guard.BINDINGS,
                                        name)
    if policy is None or binding is None:
        return 0.0, ""
    key = guard.held(policy, binding)
    since = guard.since(binding, key)
    if since:
        return since, key
    since = await _server_time(kube, settings)
    # records are stamped to the second: the ones krypton makes from now on must be
    # stamped after `since`, so its passes start once the server's clock has passed it
    deadline = time.monotonic() + 3.0
    while since and time.monotonic() < deadline and await _server_time(kube, settings) <= since:
        await asyncio.sleep(0.2)
    if since and install:
        await kube.patch_cluster_object("validatingadmissionpolicybinding", guard.BINDINGS,
                                        name, guard.since_annotation(since, key))
    return since, key
