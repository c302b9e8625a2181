"""The informer: a cache of one collection of a cluster, kept by list and watch on the event
loop (client-go's reflector, small), and the forms cached objects take."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.budget import Budget
from krypton.adapters.kube import Kube, without_managed_fields
from krypton.adapters.kubeapi import (
    METADATA_ONLY,
    METADATA_ONLY_WATCH,
    SHORT_WATCH,
    TRANSPORT_ERRORS,
    EventHandler,
    Obj,
    cost,
    transport_error,
)
from krypton.decisions import retry
from krypton.decisions.errors import (
    APIError,
    ClusterUnreachable,
    Gone,
    TemporaryError,
)

log = structlog.get_logger()

# Strings up to this length are shared between cached objects (names, reasons, versions,
# condition messages, fingerprints), and mappings and lists down to this depth are walked
# (a Tenant's own fields are 4 deep; deeper values, such as a chart's values, stay as they are).
SHARED_STRING_LENGTH = 128
SHARED_DEPTH = 6


def shared_strings(obj: Obj) -> Obj:
    """The object without managedFields, with its keys and short strings interned (for the
    Tenants each engaged cluster keeps in memory).

    A decoded object holds its own copy of every key and value; 400 Tenants repeat the same
    keys, condition types, reasons, versions and messages hundreds of times. Interned, each
    is kept once (Python frees an interned string once nothing refers to it). Measured on
    the Tenants of a bench run: 2951 instead of 7004 bytes each, for 11 us more per decoded
    Tenant (docs, Benchmarks, "The operator's own cost"). The walk stops at `SHARED_DEPTH`,
    so a deeply nested object, which anyone who may write a Tenant can make, costs no deeper
    recursion than a flat one."""
    return _shared(without_managed_fields(obj), SHARED_DEPTH)


def _shared(value: Any, depth: int) -> Any:
    if type(value) is str:
        return sys.intern(value) if len(value) <= SHARED_STRING_LENGTH else value
    if depth == 0:
        return value
    if type(value) is dict:
        return {sys.intern(k) if type(k) is str else k: _shared(v, depth - 1)
                for k, v in value.items()}
    if type(value) is list:
        return [_shared(v, depth - 1) for v in value]
    return value


def release_record_metadata(obj: Obj) -> Obj:
    """What krypton reads of a Helm release record: its name, namespace, version, labels
    (release name, revision, status, modification time) and creation time."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels",
                                              "creationTimestamp") if k in meta}}


class Informer:
    """A cache of one collection, owned by the event loop (client-go's reflector, small).

    List in pages, then watch from the list's resourceVersion with bookmarks. A watch that
    ends or breaks resumes from the last resourceVersion it saw (nothing replayed); only 410
    Gone (that version was compacted away), an answer krypton cannot read and a store over
    its bound (TooManyObjects) list again, from scratch. Over the cluster's `budget`, lists
    and watches wait for its turn (SPEC S5). A watch that delivers nothing, not even a
    bookmark, for `stall_timeout` seconds is dropped and resumed. The store holds plain dicts keyed by
    (namespace, name), each passed through `transform` (by default without managedFields);
    `handler(type, obj)` is called on the loop for every ADDED/MODIFIED/
    DELETED (list items arrive as ADDED or MODIFIED, vanished ones as DELETED after a relist).

    `on_error(exc)` hears every failure (krypton errors); `on_healthy()` hears every list
    that succeeded and the first watch accepted after a failure.

    With `on_list` nothing is stored either: every list (the first and each relist) hands all
    its items to `on_list(items)`, whose caller keeps what it needs of them in a form of its
    own and works out what changed; watch events go to the handler as usual.

    With `from_now` nothing is listed and nothing stored: the watch starts at the
    collection's current resourceVersion and the handler hears changes only, from then on;
    `on_healthy()` then hears every watch accepted after a start, a 410 or a failure (the
    moments when changes may have been missed: the caller reads what it follows again).
    """

    def __init__(self, kube: Kube, what: str, path: str, handler: EventHandler, *,
                 label_selector: str | None = None, field_selector: str | None = None,
                 metadata_only: bool = False, watch_timeout: int = 290,
                 stall_timeout: float = 150.0,
                 on_error: Callable[[Exception], None] | None = None,
                 on_healthy: Callable[[], None] | None = None,
                 transform: Callable[[Obj], Obj] = without_managed_fields,
                 from_now: bool = False,
                 on_list: Callable[[list[Obj]], None] | None = None,
                 budget: Budget | None = None) -> None:
        self.kube, self.what, self.path, self.handler = kube, what, path, handler
        self.from_now = from_now
        self.on_list = on_list
        # the cluster's budget (SPEC S5): over it, lists and watches wait for its turn
        self.budget = budget or Budget()
        self.rv = ""  # the last resourceVersion seen: where a watch resumes, "" = list
        self.failing = False  # the last list or watch failed
        self._resumed = False  # from_now: a watch starts where changes may have been missed
        # what is kept of each object (the store of every engaged cluster lives in memory)
        self.transform = transform
        self.label_selector, self.field_selector = label_selector, field_selector
        # Ask the API server for PartialObjectMetadata: names, labels, versions, no payload.
        self.metadata_only = metadata_only
        self.watch_timeout = watch_timeout
        self.stall_timeout = stall_timeout
        self.on_error = on_error
        self.on_healthy = on_healthy
        self.store: dict[tuple[str, str], Obj] = {}
        self._sizes: dict[tuple[str, str], int] = {}  # bytes each stored object came in
        self._stored = 0  # their sum, at most the cluster's store limit
        self.synced = asyncio.Event()
        self.lists = 0  # successful lists: 1 after the first sync, +1 per relist
        self._task: asyncio.Task[None] | None = None
        self._relist = False  # asked to list again from scratch
        self._resp: Any = None  # the watch connection followed, if any

    def relist(self) -> None:
        """List again from scratch, at once: the watch followed ends. For a collection whose
        objects the API server now decodes otherwise (a new CRD schema), the store keeps
        them as the old one gave them until they change again."""
        self._relist = True
        if self._resp is not None:
            self._resp.close()

    def start(self) -> Informer:
        """Run as a task of its own (the caller stops it); see :meth:`run` for task groups."""
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"informer-{self.kube.name}-{self.what}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        failures, gone = 0, 0
        while True:
            opened = time.monotonic()
            if self._relist:
                self._relist, self.rv = False, ""
            try:
                await self.budget.turn()
                if not self.rv:
                    self.rv = await self._list()
                    self.failing = False
                opened = time.monotonic()
                await self._watch(self.failing)
                self.failing = False
                if self._relist or time.monotonic() - opened >= SHORT_WATCH:
                    failures = gone = 0
                    continue
                # A watch the server ended at once (a proxy closing every connection): not an
                # error, but resuming at once would spin; wait as after a failure.
                failures += 1
                await asyncio.sleep(retry.WATCH.delay(failures))
                continue
            except Gone:
                metrics.WATCH_RELISTS.labels(self.kube.name, self.what).inc()
                self.rv = ""
                # a 410 after a watch that lasted is the history moving on: list at once;
                # one at every watch (a server that says it whatever is asked) backs off
                gone = 0 if time.monotonic() - opened >= SHORT_WATCH else gone + 1
                if gone:
                    await asyncio.sleep(retry.WATCH.delay(gone))
                continue
            except TemporaryError as exc:
                if self._relist:
                    continue  # the watch ended by relist(), not by the server
                error = exc
                if exc.reason == "TooManyObjects":
                    self.rv = ""  # what is kept is over the bound: a real list starts over
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                # an answer that is not a Kubernetes collection or watch event
                error = TemporaryError(f"watch {self.what}: malformed answer "
                                       f"({type(exc).__name__})", reason="BadResponse")
                self.rv = ""
            self.failing = True
            if self.on_error:
                self.on_error(error)
            failures += 1
            await asyncio.sleep(retry.WATCH.delay(failures))

    async def _list(self) -> str:
        if self.from_now:
            rv = await self.kube.collection_version(f"list {self.what}", self.path)
            self._resumed = True
            self.synced.set()
            return rv
        body = await self.kube.list_all(
            f"list {self.what}", self.path, label_selector=self.label_selector,
            field_selector=self.field_selector,
            accept=METADATA_ONLY if self.metadata_only else "application/json")
        if self.on_list is not None:
            self.on_list([self.transform(item) for item in body["items"]])
            return self._listed(body)
        seen: dict[tuple[str, str], Obj] = {}
        for item in map(self.transform, body["items"]):
            meta = item["metadata"]
            seen[(meta.get("namespace", ""), meta["name"])] = item
        each = int(body.get("size") or 0) // max(len(seen), 1)
        self._sizes = dict.fromkeys(seen, each)
        self._stored = each * len(seen)
        for key in list(self.store):
            if key not in seen:
                self.handler("DELETED", self.store.pop(key))
        for key, item in seen.items():
            old = self.store.get(key)
            self.store[key] = item
            if old != item:  # a new version, or the same as another schema decodes it
                self.handler("ADDED" if old is None else "MODIFIED", item)
        return self._listed(body)

    def _listed(self, body: Obj) -> str:
        self.lists += 1
        self.synced.set()
        if self.on_healthy:
            self.on_healthy()
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, after_failure: bool) -> None:
        """Follow one watch connection from `self.rv`, which follows every event seen: a
        watch that breaks resumes where it was, replaying nothing."""
        what = f"watch {self.what}"
        server_timeout = self.watch_timeout + random.randint(0, self.watch_timeout // 10)
        resp = await self.kube.watch(
            what, self.path, resource_version=self.rv, label_selector=self.label_selector,
            field_selector=self.field_selector,
            accept=METADATA_ONLY_WATCH if self.metadata_only else "application/json",
            server_timeout=server_timeout)
        self._resp = resp
        if (after_failure or self._resumed) and self.on_healthy:
            self._resumed = False
            self.on_healthy()
        try:
            while not self._relist:
                try:
                    async with asyncio.timeout(self.stall_timeout):
                        line = await resp.readline(self.kube.limits.watch_line)
                except TimeoutError:
                    raise ClusterUnreachable(f"{what}: stalled, nothing received for "
                                             f"{self.stall_timeout:.0f}s") from None
                except TRANSPORT_ERRORS as exc:
                    raise transport_error(exc, what) from exc
                if not line:
                    return  # the server ended the watch: resume from here
                self._apply(json.loads(line), len(line))
        finally:
            self._resp = None
            resp.close()

    def _apply(self, event: Obj, size: int = 0) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind not in ("ERROR", "BOOKMARK"):
            obj = self.transform(obj)
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(f"watch {self.what}: {obj.get('message')}")
            raise APIError(f"watch {self.what}: {obj.get('message')}")
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or self.rv)
        if kind == "BOOKMARK":
            self.rv = version
            return
        if not self.from_now and self.on_list is None:
            key = (meta.get("namespace", ""), meta["name"])
            self._stored -= self._sizes.pop(key, 0)
            if kind == "DELETED":
                self.store.pop(key, None)
            else:
                size = cost(size, 1)
                if self._stored + size > self.kube.limits.store:
                    # a cluster that keeps sending new objects costs its own worker, not
                    # the process's memory (SPEC S3): the watch ends and a list starts over
                    raise TemporaryError(f"watch {self.what}: the objects kept would pass "
                                         f"{self.kube.limits.store} bytes",
                                         reason="TooManyObjects")
                self._sizes[key] = size
                self._stored += size
                self.store[key] = obj
        self.handler(str(kind), obj)
        self.rv = version
