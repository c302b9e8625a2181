"""The fingerprint annotation write after a helm run (SPEC R7): retried on a temporary
failure as FINGERPRINT_WRITE says, given up after its attempts with a Warning Event, and
said once with FingerprintUpdated when it succeeds."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

from krypton.decisions import retry
from krypton.decisions.errors import ClusterUnreachable, TemporaryError
from krypton.runtime.reconcile import status

TENANT = {"metadata": {"namespace": "ns", "name": "t", "uid": "u1", "resourceVersion": "1"}}
FP = "f" * 64


class _Kube:
    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def patch_tenant(self, _key: object, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ClusterUnreachable("connection reset")
        return {"metadata": {**TENANT["metadata"], **patch["metadata"]}}


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def emit(self, _involved: object, type_: str, reason: str, _message: str) -> None:
        self.events.append((type_, reason))


def _write(failures: int) -> tuple[Any, _Kube, _Recorder]:
    kube, recorder = _Kube(failures), _Recorder()
    rt = SimpleNamespace(name="c1", kube=kube, recorder=recorder, wrote=lambda obj: obj)
    coro = status.set_fingerprint(rt, TENANT, FP, structlog.get_logger())  # type: ignore[arg-type]
    return coro, kube, recorder


@pytest.fixture(autouse=True)
def quick_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry, "FINGERPRINT_WRITE", retry.Policy(first=0.001, cap=0.004,
                                                                 attempts=5))


@pytest.mark.parametrize("failures", [0, 1, 4])
def test_the_annotation_is_written_after_up_to_four_temporary_failures(failures: int) -> None:
    coro, kube, recorder = _write(failures)
    obj = asyncio.run(coro)
    assert obj["metadata"]["annotations"] == {"mesh.openkcm.io/fingerprint-c1": FP}
    assert kube.calls == failures + 1
    assert recorder.events == [("Normal", "FingerprintUpdated")]


def test_the_fifth_failure_is_given_up_with_a_warning_event() -> None:
    coro, kube, recorder = _write(failures=99)
    with pytest.raises(TemporaryError):
        asyncio.run(coro)
    assert kube.calls == retry.FINGERPRINT_WRITE.attempts == 5
    assert recorder.events == [("Warning", "FingerprintUpdateFailed")]
