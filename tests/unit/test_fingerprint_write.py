"""The fingerprint annotation write after a helm run (SPEC R7), in the pass's one commit:
retried on a temporary failure as FINGERPRINT_WRITE says, given up after its attempts with
a Warning Event and the reason in the status, said once with FingerprintUpdated when it
succeeds, and not written again when the Tenant already carries it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from krypton.decisions import retry
from krypton.decisions.errors import ClusterUnreachable
from krypton.decisions.settings import Settings
from krypton.runtime.reconcile import status
from krypton.runtime.reconcile.memory import Memory
from krypton.runtime.reconcile.model import Report

TENANT = {"metadata": {"namespace": "ns", "name": "t", "uid": "u1", "resourceVersion": "1"}}
FP = "f" * 64


class _Kube:
    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0
        self.status: dict[str, Any] = {}

    async def patch_tenant(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ClusterUnreachable("connection reset")
        return {"metadata": {**TENANT["metadata"], **patch["metadata"]}}

    async def patch_tenant_status(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.status = patch["status"]
        return {"metadata": TENANT["metadata"], "status": patch["status"]}


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def emit(self, _involved: object, type_: str, reason: str, _message: str) -> None:
        self.events.append((type_, reason))


def _commit(failures: int, tenant: dict[str, Any] = TENANT) -> tuple[Any, _Kube, _Recorder]:
    """The commit of a pass whose helm run asks for the fingerprint annotation."""
    kube, recorder = _Kube(failures), _Recorder()
    rt = SimpleNamespace(name="c1", kube=kube, recorder=recorder, wrote=lambda obj: obj,
                         settings=Settings(), state=SimpleNamespace(phases=None),
                         memory=Memory("c1"))
    p = SimpleNamespace(obj=tenant, changes=[], log=structlog.get_logger())
    report = Report(fingerprint=FP, ran=("Installed", "chart 0.2.0 installed"))
    return status.commit(rt, p, report), kube, recorder  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def quick_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FINGERPRINT_WRITE", retry.Policy(first=0.001, cap=0.004,
                                                                 attempts=5))


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_the_annotation_is_written_after_up_to_four_temporary_failures(failures: int) -> None:
    coro, kube, recorder = _commit(failures)
    assert asyncio.run(coro).reason == ""
    assert kube.calls == failures + 1
    assert recorder.events == [("Normal", "FingerprintUpdated")]


def test_the_fifth_failure_is_given_up_with_a_warning_event_and_the_reason() -> None:
    coro, kube, recorder = _commit(failures=99)
    assert asyncio.run(coro).reason == "FingerprintUpdateFailed"
    assert kube.calls == retry.FINGERPRINT_WRITE.attempts == 5
    # the status written first (its phase said), then the failure, once
    assert recorder.events == [("Normal", "PhaseSet"), ("Warning", "FingerprintUpdateFailed")]
    error = [c for c in kube.status["conditions"] if c["type"] == "ClusterError/c1"]
    assert error[0]["reason"] == "FingerprintUpdateFailed" and \
        "connection reset" in error[0]["message"]


def test_an_annotation_already_there_is_neither_written_nor_said() -> None:
    annotated = {"metadata": {**TENANT["metadata"],
                              "annotations": {"mesh.openkcm.io/fingerprint-c1": FP}}}
    coro, kube, recorder = _commit(0, annotated)
    asyncio.run(coro)
    assert kube.calls == 0 and recorder.events == []
