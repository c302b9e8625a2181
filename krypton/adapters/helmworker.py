"""The helm worker engine (SPEC P5): Helm's library in a process of krypton's own per
cluster (``krypton-helmworker``, built from helmworker/), started when the cluster has helm
work and stopped when it has had none for a while or the cluster goes.

Requests and answers are JSON lines (protocol 2, helmworker/protocol.go); several requests
of one cluster run at once (``--max-concurrent-helm`` still bounds them across the fleet).
Every request that reads a release's history carries the records krypton judged, and the
worker hands helm those and no others (SPEC S7): a record changed since fails the request
(ReleaseRecordChanged). The worker reads each answer of its cluster within 64 MiB, counted
after decompression (AnswerTooLarge, a strike against the cluster's budget).
An answer line longer than `ANSWER_LIMIT`, a worker above `MEMORY_LIMIT` of memory, or a
cancelled request that does not end within `STOP_GRACE` costs that cluster's worker only:
it is killed, its requests fail with the reason, and the next start waits a growing delay.
An error comes with its kind, told by the worker from helm's errors as values (`_KINDS`);
the words are kept for the message and for what a conflict names.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from krypton.adapters.helm import documents, failure, helm_environment, timed
from krypton.adapters.helmworkerprocess import IDLE, HelmWorkerPool, HelmWorkerProcess
from krypton.decisions.errors import (
    HelmFailed,
    ReleaseLocked,
    ReleaseRecordChanged,
)
from krypton.decisions.memory import HelmMemory
from krypton.decisions.trust.records import Record


def _judged(records: Sequence[Record]) -> list[dict[str, Any]]:
    return [{"name": r.name, "revision": r.revision, "status": r.status.value,
             "digest": r.digest} for r in records]


# an error's kind, as the worker tells it (helmworker/kinds.go), to the error krypton raises;
# a conflict's words name the fields or the object and its owner, so they are read for it
_KINDS: dict[str, Callable[[str], HelmFailed]] = {
    "recordChanged": ReleaseRecordChanged,
    "busy": ReleaseLocked,
    "conflict": failure,
    "answerTooLarge": lambda message: HelmFailed(message, reason="AnswerTooLarge"),
}


class HelmWorkerEngine:
    """helm against one cluster through its worker: the :class:`~krypton.adapters.helm.
    HelmEngine` of ``--helm-engine=worker``, with the same calls, answers and errors as the
    helm binary's. Without a kubeconfig it only renders (``krypton plan``, ``diff``)."""

    def __init__(self, worker: str, *, kubeconfig: Path | None = None,
                 timeout: float = 180, wait: bool = True, driver: str = "",
                 history_max: int = 10, cache_dir: Path | None = None, cluster: str = "",
                 on_exit: Callable[[str, str], Awaitable[None]] | None = None,
                 idle: float = IDLE, pool: HelmWorkerPool | None = None,
                 memory: HelmMemory | None = None,
                 on_refused: Callable[[HelmFailed], None] | None = None,
                 **bounds: int) -> None:
        env = helm_environment(os.environ, driver, cache_dir, memory)
        self.timeout, self.wait, self.history_max = timeout, wait, history_max
        self.on_refused = on_refused  # an answer of the cluster past its bound: a strike
        self.process = HelmWorkerProcess(worker, kubeconfig, env, cluster=cluster, idle=idle,
                                     on_exit=on_exit, pool=pool, memory=memory, **bounds)

    async def _run(self, operation: str, coro: Any) -> Any:
        return await timed(operation, coro, self.timeout)

    async def _ask(self, request: dict[str, Any], *, gone_is_done: bool = False
                   ) -> dict[str, Any]:
        answer = await self.process.ask(request)
        if not answer.get("error"):
            return answer
        kind, message = str(answer.get("kind") or ""), str(answer["error"])
        if gone_is_done and kind == "notFound":
            return {}
        if kind == "answerTooLarge":
            message = f"cluster {self.process.cluster}: {message}"
        error = _KINDS.get(kind, HelmFailed)(message)
        if kind == "answerTooLarge" and self.on_refused is not None:
            self.on_refused(error)
        raise error

    async def install_or_upgrade(self, release: str, chart: str, namespace: str,
                                 values: dict[str, Any], *, operation: str,
                                 skip_crds: bool = False,
                                 labels: Mapping[str, str] | None = None,
                                 force_conflicts: bool = False,
                                 take_ownership: bool = False,
                                 records: Sequence[Record] = ()) -> dict[str, Any]:
        answer = await self._run(operation, self._ask({
            "op": "upgrade", "release": release, "namespace": namespace, "chart": str(chart),
            "values": values, "timeout": int(self.timeout), "wait": self.wait,
            "historyMax": self.history_max, "labels": dict(labels or {}),
            "skipCRDs": skip_crds, "forceConflicts": force_conflicts,
            "takeOwnership": take_ownership,
            # an upgrade is planned on records krypton has just read (SPEC S4): the worker
            # does not read them a second time to choose between install and upgrade
            "found": operation != "install", "records": _judged(records)}))
        return dict(answer.get("release") or {})

    async def rollback(self, release: str, namespace: str, revision: int,
                       *, force: bool = False, records: Sequence[Record] = ()) -> dict[str, Any]:
        answer = await self._run("rollback", self._ask({
            "op": "rollback", "release": release, "namespace": namespace,
            "revision": revision, "timeout": int(self.timeout), "wait": self.wait,
            "historyMax": self.history_max, "force": force, "records": _judged(records)}))
        return dict(answer.get("release") or {})

    async def template(self, chart: str, release: str, namespace: str,
                       values: dict[str, Any]) -> list[Any]:
        answer = await self._run("template", self._ask({
            "op": "render", "release": release, "namespace": namespace, "chart": str(chart),
            "values": values}))
        return documents(str(answer.get("manifest") or ""),
                         f"chart {chart} renders documents that are not valid YAML")

    async def manifest(self, release: str, namespace: str,
                       records: Sequence[Record] = ()) -> list[Any]:
        answer = await self._run("get", self._ask({
            "op": "manifest", "release": release, "namespace": namespace,
            "records": _judged(records)}))
        return documents(str(answer.get("manifest") or ""),
                         f"manifest of {release} is not valid YAML")

    async def uninstall(self, release: str, namespace: str, *, hooks: bool = True,
                        records: Sequence[Record] = ()) -> None:
        await self._run("uninstall", self._ask({
            "op": "uninstall", "release": release, "namespace": namespace,
            "timeout": int(self.timeout), "noHooks": not hooks,
            "records": _judged(records)}, gone_is_done=True))

    def interrupted(self, namespace: str, release: str) -> str:
        return self.process.interrupted.get((namespace, release), "")

    async def unlock(self, release: str, namespace: str, revision: int, why: str,
                     records: Sequence[Record]) -> None:
        """Revision `revision` marked failed if it is still pending, with `why` (SPEC S7):
        krypton's own run of it ended with its worker, so no helm is at work on it."""
        await self._run("unlock", self._ask({
            "op": "unlock", "release": release, "namespace": namespace, "revision": revision,
            "why": why, "records": _judged(records)}))
        self.process.interrupted.pop((namespace, release), None)

    async def close(self) -> None:
        self.process.interrupted.clear()
        await self.process.close()

