"""Engages and disengages one worker per cluster to match the discovered Secrets (D1-D5).

The fleet is reconciled as a set: compute the desired clusters, stop what is redundant or
changed *first*, then start what is missing. A Secret whose kubeconfig is rejected gets a
Warning Event and no worker until its content changes (retrying the same bytes cannot
succeed); an engaged cluster that cannot be reached is retried by its worker with backoff.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import yaml

from . import kubeconfig
from .discovery import ClusterSpec, desired_clusters
from .errors import KubeconfigRejected
from .events import EventRecorder, involved_secret
from .fingerprint import deep_merge
from .settings import Settings
from .worker import Shared, Worker

log = structlog.get_logger("krypton.fleet")
SELF_CLUSTER = "self-cluster"


@dataclass
class Engaged:
    spec: ClusterSpec
    worker: Worker | None
    task: asyncio.Task[None] | None


class Fleet:
    def __init__(self, settings: Settings, shared: Shared, home_events: EventRecorder) -> None:
        self.settings = settings
        self.shared = shared
        self.home_events = home_events
        self.clusters: dict[str, Engaged] = {}
        self.on_change: Callable[[], None] | None = None

    @property
    def workers(self) -> dict[str, Worker]:
        return {n: e.worker for n, e in self.clusters.items() if e.worker is not None}

    async def report(self, cluster: str, type_: str, reason: str, message: str) -> None:
        engaged = self.clusters.get(cluster)
        if engaged is None:
            return
        spec = engaged.spec
        await self.home_events.emit(involved_secret(spec.namespace, spec.name, spec.uid), type_,
                                    reason, message)

    async def sync(self, secrets: list[dict[str, Any]]) -> None:
        desired = desired_clusters(secrets, self.settings.kubeconfig_key)
        for name in list(self.clusters):
            if name not in desired or desired[name].digest != self.clusters[name].spec.digest:
                await self._disengage(name)
        for name, spec in desired.items():
            if name not in self.clusters:
                await self._engage(spec)

    async def _engage(self, spec: ClusterSpec) -> None:
        self.clusters[spec.name] = Engaged(spec, None, None)
        try:
            kc = kubeconfig.parse(spec.kubeconfig, trust=self.settings.trust_kubeconfig_secrets,
                                  allow_in_cluster=spec.name == SELF_CLUSTER)
            values = _cluster_values(spec)
        except KubeconfigRejected as exc:
            message = str(exc)
            if spec.kubeconfig is None:
                message = f"data key {self.settings.kubeconfig_key!r}: {message}"
            log.warning("kubeconfig rejected", cluster=spec.name, reason=exc.reason,
                        error=message)
            await self.report(spec.name, "Warning", exc.reason, message)
            return
        for warning in kc.warnings:
            log.warning("credentials expiring soon", cluster=spec.name, detail=warning)
            await self.report(spec.name, "Warning", "CredentialsExpiringSoon", warning)
        worker = Worker(spec.name, kc, deep_merge(self.settings.chart_values, values), self.shared)
        task = asyncio.create_task(worker.run(), name=f"worker-{spec.name}")
        task.add_done_callback(functools.partial(self._worker_done, spec.name))
        self.clusters[spec.name] = Engaged(spec, worker, task)
        log.info("cluster engaging", cluster=spec.name)

    def _worker_done(self, name: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("worker ended unexpectedly", cluster=name, error=repr(task.exception()))

    async def _disengage(self, name: str, grace: float = 0.0) -> None:
        engaged = self.clusters.pop(name)
        if engaged.worker is not None and engaged.task is not None:
            await engaged.worker.stop(grace)
            engaged.task.cancel()
            await asyncio.gather(engaged.task, return_exceptions=True)
        log.info("cluster removed", cluster=name)

    async def shutdown(self, grace: float) -> None:
        """Stop every worker; running reconciles get up to `grace` seconds to finish."""
        await asyncio.gather(*(e.worker.stop(grace) for e in self.clusters.values()
                               if e.worker is not None))
        for name in list(self.clusters):
            await self._disengage(name)


def _cluster_values(spec: ClusterSpec) -> dict[str, Any]:
    if not spec.values:
        return {}
    try:
        values = yaml.safe_load(spec.values)
    except yaml.YAMLError as exc:
        raise KubeconfigRejected("values.yaml in the Secret is not valid YAML",
                                 reason="ValuesInvalid") from exc
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise KubeconfigRejected("values.yaml in the Secret is not a YAML mapping",
                                 reason="ValuesInvalid")
    return values
