"""Kubernetes Events with aggregation (SPEC R12).

The first Event for an (object, type, reason, message) is created; repeats bump its
``count`` and ``lastTimestamp`` instead of creating new objects. Events are best effort:
a failed write is logged, never raised.
"""

from __future__ import annotations

import socket
from collections import OrderedDict
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.kube import Kube, now_micro, now_rfc3339
from krypton.decisions.errors import KryptonError
from krypton.decisions.model import REPORTING_CONTROLLER
from krypton.decisions.trust import redact

log = structlog.get_logger("krypton.events")

Involved = dict[str, Any]


def reporting_instance() -> str:
    import os
    return os.environ.get("POD_NAME") or socket.gethostname()


class EventRecorder:
    """Writes Events on one cluster, aggregating repeats."""

    def __init__(self, kube: Kube, *, max_cached: int = 4096) -> None:
        self.kube = kube
        self.instance = reporting_instance()
        self._seen: OrderedDict[tuple[str, ...], tuple[str, str, int]] = OrderedDict()
        self._max = max_cached
        self.written = 0

    async def emit(self, involved: Involved, type_: str, reason: str, message: str) -> None:
        namespace = involved.get("namespace") or "default"
        message = redact.scrub(message)
        key = (str(involved.get("uid") or involved.get("name")), type_, reason, message)
        now = now_rfc3339()
        try:
            if key in self._seen:
                ns, name, count = self._seen[key]
                self._seen.move_to_end(key)
                await self.kube.patch_event(ns, name, {"count": count + 1, "lastTimestamp": now})
                self._seen[key] = (ns, name, count + 1)
            else:
                body = {
                    "metadata": {"generateName": f"{involved.get('name', 'krypton')}.",
                                 "namespace": namespace},
                    "involvedObject": involved,
                    "type": type_,
                    "reason": reason,
                    "message": message[:1024],
                    "firstTimestamp": now,
                    "lastTimestamp": now,
                    "eventTime": now_micro(),
                    "count": 1,
                    "action": reason,
                    "source": {"component": "krypton"},
                    "reportingComponent": REPORTING_CONTROLLER,
                    "reportingInstance": self.instance,
                }
                created = await self.kube.create_event(namespace, body)
                self._seen[key] = (namespace, created["metadata"]["name"], 1)
                if len(self._seen) > self._max:
                    self._seen.popitem(last=False)
            self.written += 1
            metrics.API_WRITES.labels(self.kube.name, "event").inc()
        except KryptonError as exc:
            self._seen.pop(key, None)
            log.warning("event write failed", cluster=self.kube.name, reason=reason,
                        error=str(exc))


def involved_tenant(obj: dict[str, Any]) -> Involved:
    meta = obj["metadata"]
    return {"apiVersion": obj.get("apiVersion", "mesh.openkcm.io/v1alpha1"), "kind": "Tenant",
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion")}


def involved_secret(namespace: str, name: str, uid: str | None = None) -> Involved:
    return {"apiVersion": "v1", "kind": "Secret", "name": name, "namespace": namespace,
            "uid": uid}


def involved_lease(lease: dict[str, Any]) -> Involved:
    meta = lease.get("metadata") or {}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": meta.get("name"),
            "namespace": meta.get("namespace"), "uid": meta.get("uid")}
