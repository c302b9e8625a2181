"""D10: a cluster's token from its provider's exec plugin, run for real: bounded in time and
size, cached for most of its life, and a failing plugin not run again before its time."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from krypton.adapters import execcredentials
from krypton.adapters.execcredentials import ExecCredentials
from krypton.decisions.clusters.execplugins import CredentialPluginFailed, PluginAccess, Provider
from krypton.testing.operator import wait_for

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def plugin(tmp_path: Path, body: str) -> Path:
    """A plugin script; each run appends a line to runs.log."""
    script = tmp_path / "plugin"
    script.write_text(f"#!/bin/sh\necho run >> {tmp_path}/runs.log\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def runs(tmp_path: Path) -> int:
    log = tmp_path / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def creds(script: Path, *, timeout: float = 5.0) -> ExecCredentials:
    provider = Provider("p", str(script), provide_cluster_info=True)
    return ExecCredentials(PluginAccess("https://10.0.0.1:6443", CA, provider), "c1",
                           timeout=timeout)


def token_answer(token: str, seconds: int) -> str:
    return ("printf '%s' \"$(python3 -c \"import datetime,json;print(json.dumps({'apiVersion':"
            "'client.authentication.k8s.io/v1','kind':'ExecCredential','status':{'token':"
            f"'{token}','expirationTimestamp':(datetime.datetime.now(datetime.UTC)+"
            f"datetime.timedelta(seconds={seconds})).strftime('%Y-%m-%dT%H:%M:%SZ')}}}}))\")\"")


def test_a_token_is_used_until_most_of_its_life_is_over(tmp_path: Path) -> None:
    c = creds(plugin(tmp_path, token_answer("first", 3600)))

    async def twice() -> list[str]:
        return [await c.token(), await c.token()]

    assert asyncio.run(twice()) == ["first", "first"]
    assert runs(tmp_path) == 1  # cached
    c._renew_at = 0.0  # as when four fifths of its life are over
    assert asyncio.run(c.token()) == "first" and runs(tmp_path) == 2


def test_the_plugin_is_told_the_cluster(tmp_path: Path) -> None:
    script = plugin(tmp_path, f'printf "%s" "$KUBERNETES_EXEC_INFO" > {tmp_path}/info.json\n'
                    + token_answer("t", 600))
    asyncio.run(creds(script).token())
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["spec"]["cluster"]["server"] == "https://10.0.0.1:6443"
    assert info["spec"]["interactive"] is False


@pytest.mark.parametrize(("body", "problem"), [
    ("sleep 30", "no answer within 1s"),
    ("echo garbage", "not JSON"),
    ("exit 3", "exited with status 3"),
    ("head -c 100000 /dev/zero", "its answer is over 65536 bytes"),
])
def test_a_failing_plugin_says_why_and_is_not_run_again_before_its_time(
        tmp_path: Path, body: str, problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c = creds(plugin(tmp_path, body), timeout=1.0)
    with pytest.raises(CredentialPluginFailed, match=problem):
        asyncio.run(c.token())
    with pytest.raises(CredentialPluginFailed, match="runs again in"):
        asyncio.run(c.token())  # within the backoff: the last error, no new run
    assert runs(tmp_path) == 1


def test_the_token_is_sent_as_a_bearer(tmp_path: Path) -> None:
    c = creds(plugin(tmp_path, token_answer("tok", 600)))
    assert asyncio.run(c.authorization()) == "Bearer tok"
    assert execcredentials.TIMEOUT == 30.0


def test_a_refused_token_is_renewed_but_not_per_request(tmp_path: Path) -> None:
    c = creds(plugin(tmp_path, token_answer("tok", 3600)))
    c.cluster = "refusals"  # counted apart from the other tests' runs
    assert asyncio.run(c.token()) == "tok" and runs(tmp_path) == 1
    c.rejected()  # at once: kept (a server refusing every token gets no run per request)
    assert asyncio.run(c.token()) == "tok" and runs(tmp_path) == 1
    c._obtained -= execcredentials.REJECTED_AFTER  # as when it came 10 s ago
    c.rejected()
    assert asyncio.run(c.token()) == "tok" and runs(tmp_path) == 2
    def counted(why: str) -> float | None:
        return REGISTRY.get_sample_value("krypton_credential_plugin_runs_total",
                                         {"cluster": "refusals", "result": "ok", "why": why})
    assert (counted("first"), counted("refused")) == (1.0, 1.0)


def test_a_plugin_that_leaves_a_child_on_its_pipe_is_cut_off_with_it(tmp_path: Path) -> None:
    c = creds(plugin(tmp_path, f"sleep 3600 & echo $! > {tmp_path}/child\nexit 0"), timeout=1.0)
    with pytest.raises(CredentialPluginFailed, match="no answer within 1s"):
        asyncio.run(c.token())
    child = int((tmp_path / "child").read_text())
    state = Path(f"/proc/{child}/stat")

    def gone() -> bool:  # SIGKILL lands at once; reaping by init takes a moment
        try:
            return state.read_text().split()[2] == "Z"
        except OSError:
            return True
    wait_for(gone, 5, what="the plugin's child killed")
