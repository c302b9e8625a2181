"""Readiness of releases that helm applied without waiting, followed by watches (SPEC F6).

helm returns once a release's objects are applied and its hooks ran; its slot is free at
once. The release's workload objects (the kinds with readiness rules, `health.WORKLOAD_KINDS`,
and those of the admin's CEL rules) are then followed here, per cluster:

- one watch per kind, over all namespaces, started when an object of that kind is first
  followed and stopped `LINGER` seconds after the last one is let go. It starts at the
  collection's current resourceVersion: nothing is listed, only changes arrive;
- of each followed object, the latest copy is kept, cut to what the rules read;
- when a release's workload becomes ready (or stops being ready) its Tenant key is handed
  to `wake`, and the pass that follows judges it with :meth:`Readiness.health`, read from
  these copies instead of from the cluster.

Whenever changes may have been missed (a watch just accepted after its start, a failure or
a 410), the followed objects of that kind are read again before the kind counts as watched.
While a kind is not watched (starting, failing, forbidden by the cluster's RBAC),
:meth:`Readiness.health` answers None and the reconciler reads the objects itself, every
few seconds: slower, never wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog

from krypton.adapters.budget import Budget
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.errors import HOSTILE_ANSWERS, Forbidden, KryptonError
from krypton.decisions.model import TenantKey
from krypton.decisions.readiness.celhealth import HealthRules
from krypton.decisions.readiness.health import NO_RULES, WORKLOAD_KINDS, Health, release_health

LINGER = 60.0  # seconds a kind's watch stays open after nothing of it is followed
Obj = dict[str, Any]
ObjKey = tuple[str, str, str, str]  # api version, kind, namespace, name
Kind = tuple[str, str]  # api version, kind

_log = structlog.get_logger("krypton.readiness")


def slim(obj: Obj) -> Obj:
    """What the readiness rules read of an object, nothing more (a followed Deployment's pod
    template is not kept). A kind judged by a CEL rule keeps its labels, annotations and
    spec: the rule may read them."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    builtin = obj.get("kind") in WORKLOAD_KINDS
    kept = ("name", "namespace", "generation", "resourceVersion") + \
        (() if builtin else ("labels", "annotations"))
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in kept if k in meta},
            "spec": {k: spec[k] for k in ("replicas", "updateStrategy", "type") if k in spec}
            if builtin else spec,
            "status": obj.get("status") or {}}


def object_key(ref: ObjectRef) -> ObjKey:
    return ref.api_version, ref.kind, ref.namespace or "", ref.name


def _newer(new: Obj | None, old: Obj | None) -> bool:
    """Whether `new` is a later state than `old` of the same object. A read and the watch
    can cross; resourceVersions are compared as numbers where they are (etcd's are)."""
    if new is None or old is None:
        return True
    a = str((new.get("metadata") or {}).get("resourceVersion") or "")
    b = str((old.get("metadata") or {}).get("resourceVersion") or "")
    return not (a.isdigit() and b.isdigit()) or int(a) >= int(b)


class _KindWatch:
    """The watch of one kind on one cluster, and whether it can be trusted right now."""

    def __init__(self, owner: Readiness, kind: Kind) -> None:
        self.owner, self.kind = owner, kind
        self.live = False  # watching, and every followed object read since it started
        self.denied = False
        self.epoch = 0  # counts starts and failures: a reread counts only within its own
        self.task = asyncio.get_running_loop().create_task(
            self._run(), name=f"readiness-{owner.kube.name}-{kind[1]}")
        self.stop_at: asyncio.TimerHandle | None = None

    async def _run(self) -> None:
        kube, (api_version, kind) = self.owner.kube, self.kind
        path = None
        while path is None:
            try:
                path = await kube.collection_path(api_version, kind)
            except KryptonError as exc:
                self._failed(exc)
                await asyncio.sleep(5.0)
                continue
            if path is None:
                return  # not served: its objects cannot exist; the reconciler reads them
        informer = Informer(kube, f"readiness {kind}", path, self._event, from_now=True,
                            transform=slim, on_error=self._failed, on_healthy=self._resumed,
                            budget=self.owner.budget)
        await informer.run()

    def _event(self, type_: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        self.owner.changed((*self.kind, str(meta.get("namespace") or ""), str(meta.get("name"))),
                           None if type_ == "DELETED" else obj)

    def _failed(self, exc: Exception) -> None:
        self.live = False
        self.epoch += 1
        if isinstance(exc, KryptonError) and exc.reason in HOSTILE_ANSWERS:
            self.owner.refused(exc)
        if isinstance(exc, Forbidden) and not self.denied:
            self.denied = True
            _log.info("readiness watch not permitted; workloads are polled", kind=self.kind[1],
                      cluster=self.owner.kube.name, error=str(exc))

    def _resumed(self) -> None:
        self.denied = False
        self.epoch += 1
        self.owner.spawn(self._reread(self.epoch))

    async def _reread(self, epoch: int) -> None:
        """Read every followed object of this kind again; then the copies are current,
        unless the watch failed or started again meanwhile (changes may have been missed
        after the read: the next start rereads)."""
        try:
            await self.owner.reread(self.kind)
        except KryptonError as exc:
            if epoch == self.epoch:
                self._failed(exc)
            return
        if epoch == self.epoch:
            self.live = True

    def linger(self) -> None:
        if self.stop_at is None:
            self.stop_at = asyncio.get_running_loop().call_later(LINGER, self.owner.unused,
                                                                 self.kind)

    def keep(self) -> None:
        if self.stop_at is not None:
            self.stop_at.cancel()
            self.stop_at = None

    def stop(self) -> None:
        self.keep()
        self.task.cancel()


class Followed(Protocol):
    """Who follows what: each Tenant's followed objects and their last readiness are kept
    in its own memory (:class:`~krypton.runtime.reconcile.memory.Memory`), with an index of
    the followers of each object derived from those memories."""

    def peek(self, key: TenantKey) -> Any: ...  # its memory: .followed, .ready

    def follow(self, key: TenantKey, refs: tuple[ObjectRef, ...]) -> None: ...

    def followers(self, k: ObjKey) -> tuple[TenantKey, ...]: ...

    def followed_objects(self) -> frozenset[ObjKey]: ...

    def following(self) -> int: ...


class Readiness:
    """The watches and copies that follow one cluster's workloads (see the module's
    description); who follows what is kept in the Tenants' memories (`memory`)."""

    def __init__(self, kube: Kube, wake: Callable[[TenantKey], None], memory: Followed,
                 rules: HealthRules = NO_RULES, budget: Budget | None = None,
                 refused: Callable[[KryptonError], None] = lambda _exc: None) -> None:
        self.kube, self.wake, self.memory, self.rules = kube, wake, memory, rules
        # the cluster's budget (SPEC S5): its watches wait for its turn, and an answer past a
        # bound they meet is a strike (`refused`)
        self.budget, self.refused = budget or Budget(), refused
        self._objects: dict[ObjKey, Obj | None] = {}  # None: looked for and not found
        self._watches: dict[Kind, _KindWatch] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __contains__(self, key: TenantKey) -> bool:
        return bool(self._refs(key))

    def follow(self, key: TenantKey, looked: Iterable[tuple[ObjectRef, Obj | None]]) -> None:
        """Follow the workload objects of `key`'s release from now on, each with the copy just
        read (None: not found); replaces what was followed for `key` before. Every ref names
        its namespace."""
        looked = list(looked)
        before = self._refs(key)
        self.memory.follow(key, tuple(ref for ref, _ in looked))
        for ref, obj in looked:
            k = object_key(ref)
            self._store(k, None if obj is None else slim(obj))
            watch = self._watches.get(k[:2])
            if watch is None:
                watch = self._watches[k[:2]] = _KindWatch(self, k[:2])
            watch.keep()
        self._let_go(before)
        if looked:
            self.memory.peek(key).ready = self._judge(key).ready

    def health(self, key: TenantKey) -> Health | None:
        """The health of `key`'s followed workload from the watched copies; None when it is
        not followed or a kind of it is not watched right now (then read the objects)."""
        refs = self._refs(key)
        if not refs or not all(self._watches[object_key(r)[:2]].live for r in refs):
            return None
        return self._judge(key)

    def unfollow(self, key: TenantKey) -> None:
        before = self._refs(key)
        self.memory.follow(key, ())
        self._let_go(before)

    def sweep(self) -> None:
        """What no Tenant's memory follows any more (its Tenant went, and its memory with
        what it followed) is let go: the copies, and the watches of kinds nothing is followed of."""
        followed = self.memory.followed_objects()
        for k in [k for k in self._objects if k not in followed]:
            del self._objects[k]
        kinds = {k[:2] for k in followed}
        for kind, watch in self._watches.items():
            if kind not in kinds:
                watch.linger()

    def followed(self) -> int:
        return self.memory.following()

    async def close(self) -> None:
        for watch in self._watches.values():
            watch.stop()
        tasks = [w.task for w in self._watches.values()] + list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watches.clear()

    # -- for the watches -------------------------------------------------------------------

    def changed(self, k: ObjKey, obj: Obj | None) -> None:
        """A watch saw `obj` (None: deleted); wake the releases whose readiness it turns."""
        followers = self.memory.followers(k)
        if not followers or not self._store(k, obj):
            return
        for key in followers:
            ready, kept = self._judge(key).ready, self.memory.peek(key)
            if ready != kept.ready:
                kept.ready = ready
                self.wake(key)

    async def reread(self, kind: Kind) -> None:
        for k in [k for k in self.memory.followed_objects() if k[:2] == kind]:
            obj = await self.kube.get_object(*k[:2], k[3], k[2])
            if self.memory.followers(k):
                self.changed(k, None if obj is None else slim(obj))

    def unused(self, kind: Kind) -> None:
        """`LINGER` seconds after the last object of `kind` was let go: stop its watch,
        unless something of that kind is followed again."""
        watch = self._watches.get(kind)
        if watch is None:
            return
        watch.stop_at = None
        if not any(k[:2] == kind for k in self.memory.followed_objects()):
            watch.stop()
            del self._watches[kind]

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the copies ------------------------------------------------------------------------

    def _store(self, k: ObjKey, obj: Obj | None) -> bool:
        if k in self._objects and not _newer(obj, self._objects[k]):
            return False
        self._objects[k] = obj
        return True

    def _refs(self, key: TenantKey) -> tuple[ObjectRef, ...]:
        kept = self.memory.peek(key)
        return () if kept is None else kept.followed

    def _judge(self, key: TenantKey) -> Health:
        return release_health(((ref, self._objects.get(object_key(ref)))
                               for ref in self._refs(key)), self.rules)

    def _let_go(self, refs: Iterable[ObjectRef]) -> None:
        """Of `refs`, what nothing follows now: its copy goes, and the watch of its kind
        lingers when nothing of that kind is followed."""
        gone = [k for k in map(object_key, refs) if not self.memory.followers(k)]
        if not gone:
            return
        kinds = {k[:2] for k in self.memory.followed_objects()}
        for k in gone:
            self._objects.pop(k, None)
            if k[:2] not in kinds and k[:2] in self._watches:
                self._watches[k[:2]].linger()
