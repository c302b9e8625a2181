"""The guard of krypton's release records on one engaged cluster (SPEC S4, S6): installed (or
found, where an admin installed it), then known to be in force, or the reason it is not; and
kept (:class:`Keeper`): followed while the cluster is engaged, and looked at again when a
record is trusted by it.

The manifests and the rules are :mod:`krypton.decisions.trust.guard`'s. "In force" is asked of the
API server, not inferred from the objects: a dry-run create of the guard's probe must be
refused by the guard itself. A cluster without the guard stays engaged and is reported
unguarded; what that leaves open is in the docs' security model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from krypton.adapters.budget import Budget
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.decisions.errors import Forbidden, KryptonError
from krypton.decisions.model import epoch_seconds
from krypton.decisions.settings import Settings
from krypton.decisions.trust import guard

SETTLE = 15.0  # seconds a new or changed policy gets to come into force on the API server
PROBE_EVERY = 0.5
CHECK_EVERY = 600.0  # seconds between probes of an engaged cluster's guard
LOOK_AFTER = 1.0  # seconds from a change of the guard seen by its watches to the look at it
WATCHED = (("validatingadmissionpolicy", guard.POLICIES),
           ("validatingadmissionpolicybinding", guard.BINDINGS))


@dataclass(frozen=True)
class GuardState:
    """Whether the cluster's release records are guarded, and what was found: how, or why
    not."""

    guarded: bool
    message: str
    user: str = ""
    since: float = 0.0  # when it came into force (API server's clock); 0: not known
    held: str = ""  # the objects it holds by (guard.held), for whom `since` holds


class GuardJudge(Protocol):
    """What the guard's watcher needs of its cluster's health
    (:class:`~krypton.runtime.clusterhealth.ClusterHealth`): what it has judged of the guard,
    its judgement of a new finding, and the cluster's budget."""

    guard: GuardState
    guard_known: bool
    budget: Budget

    def judge_guard(self, state: GuardState) -> None: ...


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


async def ensure(kube: Kube, settings: Settings, user: str = "", *, anew: bool = False
                 ) -> GuardState:
    """Install (--record-guard=install) or find (check) the guard of this cluster's records
    for the user krypton acts as (`user`, asked of the cluster when ""), and say whether it
    is in force. `anew`: krypton found it not in force since its time was recorded (the
    same objects, an API server that stopped enforcing them), so it holds from now on
    only. Never raises for what the cluster answers: a guard that cannot be had is a
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
        since, held = await _since(kube, settings, policy["metadata"]["name"], install, anew)
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


async def _guard_objects(kube: Kube, name: str) -> tuple[dict[str, Any] | None, ...]:
    return tuple([await kube.cluster_object(what, collection, name)
                  for what, collection in WATCHED])


async def holds(kube: Kube, settings: Settings, key: str) -> bool:
    """Whether the guard's policy and binding are still the very objects `key` names
    (:func:`guard.held`): neither deleted, made again nor changed since."""
    policy, binding = await _guard_objects(kube, guard.policy_name(settings.watch_namespace))
    return policy is not None and binding is not None and guard.held(policy, binding) == key


async def _since(kube: Kube, settings: Settings, name: str, install: bool, anew: bool
                 ) -> tuple[float, str]:
    """When the guard, in force now, came into force, and the objects that holds for: as
    recorded on its binding for these very objects (unless `anew`), else now by the API
    server's clock (recorded there when krypton may)."""
    policy, binding = await _guard_objects(kube, name)
    if policy is None or binding is None:
        return 0.0, ""
    key = guard.held(policy, binding)
    since = 0.0 if anew else guard.since(binding, key)
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


class Keeper:
    """The guard of one engaged cluster's records, believed only while it holds (SPEC S6).

    Judged when the cluster engages, then followed: its policy and binding are watched, and
    a delete or a change of either (another uid or generation) makes the cluster unguarded
    at once and brings a new look within LOOK_AFTER seconds (installed again, or said); it
    is probed anew every CHECK_EVERY seconds (an API server that stopped enforcing it).
    Where the watches are not allowed, the periodic probe and the look at use remain.

    A record is trusted by the guard's time only if the guard held from before the record
    was made until helm runs on it: :meth:`since_now` looks at the objects again at that
    moment, and a guard that came back after a gap holds from its return only.
    """

    def __init__(self, kube: Kube, settings: Settings, health: GuardJudge) -> None:
        self.kube, self.settings, self.health = kube, settings, health
        self.name = guard.policy_name(settings.watch_namespace)
        self.log = structlog.get_logger("krypton.worker").bind(cluster=kube.name)
        self._wake = asyncio.Event()
        self._watches: dict[str, asyncio.Task[None]] = {}

    async def run(self, looked: asyncio.Event) -> None:
        """Judge the guard now (`looked` set then), then keep it, until cancelled."""
        async with asyncio.TaskGroup() as group:
            woken = False
            while True:
                if not (woken and await self._still_held()):
                    state = self.health.guard
                    self.health.judge_guard(await ensure(
                        self.kube, self.settings, state.user,
                        anew=self.health.guard_known and not state.guarded))
                looked.set()
                if self.settings.record_guard == "off":
                    return
                if not self._watches:
                    for which, (what, collection) in enumerate(WATCHED):
                        self._watches[what] = group.create_task(
                            self._informer(which, what, collection).run(),
                            name=f"{self.kube.name}-{what}")
                woken = await self._woken()

    def _informer(self, which: int, what: str, collection: str) -> Informer:
        def changed(kind: str, obj: dict[str, Any]) -> None:
            self._changed(which, what, kind, obj)

        def failed(exc: Exception) -> None:
            # the probe and the look at use still stand; a watch krypton may not make (a
            # ClusterRole of before the watch, an admin's own) is not asked again
            if isinstance(exc, Forbidden):
                self.log.info("guard not watched: forbidden", what=what, error=str(exc))
                self._watches[what].cancel()
            else:
                self.log.info("guard watch failed, retrying", what=what, error=str(exc))

        return Informer(self.kube, what, collection, changed,
                        field_selector=f"metadata.name={self.name}", metadata_only=True,
                        on_error=failed, budget=self.health.budget)

    async def _woken(self) -> bool:
        """Wait for a change of the guard (True) or the next probe (False)."""
        try:
            async with asyncio.timeout(CHECK_EVERY * random.uniform(1.0, 1.2)):
                await self._wake.wait()
        except TimeoutError:
            return False
        self._wake.clear()
        await asyncio.sleep(LOOK_AFTER)  # the changes that come together, looked at once
        return True

    async def _still_held(self) -> bool:
        """Whether the guard in force is still held by the same objects (the changes seen
        were of its metadata, or krypton's own reinstall); no look without a key."""
        state = self.health.guard
        if not (state.guarded and state.held):
            return False
        try:
            return await holds(self.kube, self.settings, state.held)
        except KryptonError:
            return False

    def _changed(self, which: int, what: str, kind: str, obj: dict[str, Any]) -> None:
        state = self.health.guard
        if state.guarded and state.held and kind != "DELETED" and \
                guard.keeps(state.held, which, obj):
            return
        if state.guarded:
            self._lost(f"{what} {self.name} was {'deleted' if kind == 'DELETED' else 'changed'}")
        self._wake.set()

    def _lost(self, why: str) -> None:
        self.health.judge_guard(GuardState(False, f"{why}; krypton looks at it again",
                                           self.health.guard.user))

    async def since_now(self) -> float:
        """Since when the records have been guarded without a break, at this moment: the
        time of the guard in force, once its policy and binding are found to be still the
        objects it was judged by; 0 when they are not (the cluster unguarded at once) or
        no guard is in force. Raises what the look meets: trust is not given in doubt."""
        state = self.health.guard
        if not (state.guarded and state.since and state.held):
            return 0.0
        if await holds(self.kube, self.settings, state.held):
            return state.since
        if self.health.guard is state:
            self._lost(f"the guard's policy or binding {self.name} is no longer the one "
                       "found in force")
            self._wake.set()
        return 0.0
