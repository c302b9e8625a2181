"""The helm worker (SPEC P5) against a real API server: one process per cluster serving its
helm work as the helm binary does, and what its life costs when it goes wrong."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tenacity import AsyncRetrying, RetryError, retry_if_result, stop_after_delay, wait_fixed

from krypton.adapters import helmworkerprocess
from krypton.adapters.helm import Helm
from krypton.adapters.helmworker import HelmWorkerEngine
from krypton.app.config import resolve_helm
from krypton.decisions.errors import HelmFailed, HelmWorkerFailed
from krypton.decisions.memory import HelmMemory
from krypton.decisions.trust import records as trust

from .conftest import Cluster, unique

CHARTS = Path(__file__).resolve().parents[1] / "charts"
SAMPLE, HANG = str(CHARTS / "sample"), str(CHARTS / "hang")


def worker_helm(cluster: Cluster, tmp: Path, **kw: Any) -> HelmWorkerEngine:
    options: dict[str, Any] = {"timeout": 60, "wait": False, **kw}
    return HelmWorkerEngine(resolve_helm("krypton-helmworker"), kubeconfig=cluster.cp.kubeconfig,
                      cache_dir=tmp / "kube-cache", cluster="remote", **options)


def reporter() -> tuple[list[tuple[str, str]], Callable[[str, str], Awaitable[None]]]:
    """What a worker's end says, kept: (reason, message) pairs, and the callback keeping them."""
    said: list[tuple[str, str]] = []

    async def ended(reason: str, message: str) -> None:
        said.append((reason, message))

    return said, ended


async def until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """`predicate`'s first truthy answer (awaited when it is a coroutine), asked every 0.1 s
    until `timeout`: an observable condition, polled."""
    async def asked() -> Any:
        value = predicate()
        return await value if asyncio.iscoroutine(value) else value
    polled = AsyncRetrying(retry=retry_if_result(lambda value: not value),
                           stop=stop_after_delay(timeout), wait=wait_fixed(0.1))
    try:
        return await polled(asked)
    except RetryError:
        raise TimeoutError(f"no {what} in {timeout}s") from None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has ended too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False


def records(cluster: Cluster, ns: str, release: str) -> list[dict[str, str]]:
    secrets = cluster.core.list_namespaced_secret(
        ns, label_selector=f"owner=helm,name={release}").items
    return sorted((s.metadata.labels for s in secrets), key=lambda labels: int(labels["version"]))


def judged(cluster: Cluster, ns: str, release: str) -> tuple[trust.Record, ...]:
    """The release's records as krypton reads them before a helm run (SPEC S7)."""
    out = []
    for secret in cluster.core.list_namespaced_secret(
            ns, label_selector=f"owner=helm,name={release}").items:
        obj = cluster.core.api_client.sanitize_for_serialization(secret)
        revision, status = trust.identity(obj, trust.decode(obj, "secret"), release)
        out.append(trust.Record(revision, status, None, name=secret.metadata.name,
                                digest=trust.digest(trust.stored(obj, "secret"))))
    return tuple(out)


def test_one_worker_serves_a_release_from_install_to_uninstall_as_helm_does(
        remote: object, helm_bin: str, tmp_path: Path) -> None:
    """Every operation krypton asks of helm, in one process: the same records, labels,
    field manager, manifests and renders as the helm binary's; gone once idle."""
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)
    binary = Helm(helm_bin, kubeconfig=cluster.cp.kubeconfig, timeout=60, wait=False)

    async def main() -> tuple[int, list[Any]]:
        helm = worker_helm(cluster, tmp_path, idle=1.0)
        installed = await helm.install_or_upgrade("r", SAMPLE, ns, {}, operation="install",
                                                  labels={"mesh.openkcm.io/writer": "test"})
        assert (installed["version"], installed["info"]["status"]) == (1, "deployed")
        assert "chart" not in installed and "config" not in installed
        upgraded = await helm.install_or_upgrade("r", SAMPLE, ns, {"data": {"greeting": "hi"}},
                                                 operation="upgrade",
                                                 records=judged(cluster, ns, "r"))
        assert (upgraded["version"], upgraded["info"]["status"]) == (2, "deployed")
        assert await helm.manifest("r", ns, judged(cluster, ns, "r")) == \
            await binary.manifest("r", ns)
        assert await helm.template(SAMPLE, "r", ns, {"data": {"greeting": "hi"}}) == \
            await binary.template(SAMPLE, "r", ns, {"data": {"greeting": "hi"}})
        back = await helm.rollback("r", ns, 1, records=judged(cluster, ns, "r"))
        assert (back["version"], back["info"]["status"]) == (3, "deployed")
        pid = helm.process.pid
        assert pid is not None and helm.process.starts == 1
        managers = subprocess.run(
            [str(Path(helm_bin).parent / "kubectl"), "--kubeconfig", str(cluster.cp.kubeconfig),
             "get", "configmaps", "-n", ns, "-o",
             "jsonpath={.items[*].metadata.managedFields[*].manager}"],
            capture_output=True, text=True, check=True).stdout.split()
        labels = records(cluster, ns, "r")
        await helm.uninstall("r", ns, records=judged(cluster, ns, "r"))
        await helm.uninstall("r", ns)  # gone already: not an error, as with the binary
        await until(lambda: helm.process.pid is None and not alive(pid), "stop when idle")
        assert helm.process.starts == 1
        await helm.close()
        return pid, [managers, labels]

    _pid, (managers, labels) = asyncio.run(main())
    assert set(managers) == {"helm"}, managers
    assert [(r["version"], r["status"]) for r in labels] == \
        [("1", "superseded"), ("2", "superseded"), ("3", "deployed")]
    assert labels[0]["mesh.openkcm.io/writer"] == "test"
    assert not records(cluster, ns, "r")
    cluster.core.delete_namespace(ns)


def test_a_worker_that_dies_fails_its_requests_and_starts_again_after_a_delay(
        remote: object, tmp_path: Path) -> None:
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)
    said, ended = reporter()

    async def main() -> None:
        helm = worker_helm(cluster, tmp_path, wait=True, on_exit=ended)
        hanging = asyncio.create_task(helm.install_or_upgrade("h", HANG, ns, {},
                                                              operation="install"))
        await until(lambda: records(cluster, ns, "h"), "pending install")
        assert helm.process.pid is not None
        os.kill(helm.process.pid, signal.SIGKILL)
        with pytest.raises(HelmWorkerFailed, match="ended"):
            await hanging
        assert [reason for reason, _ in said] == ["HelmWorkerFailed"]
        # at once: refused without a new process (no start in a loop)
        with pytest.raises(HelmWorkerFailed, match="started again in"):
            await helm.install_or_upgrade("s", SAMPLE, ns, {}, operation="install")
        assert helm.process.starts == 1
        refused = 0

        async def attempt() -> dict[str, Any] | None:
            nonlocal refused
            try:
                return await helm.install_or_upgrade("s", SAMPLE, ns, {}, operation="install")
            except HelmWorkerFailed as exc:
                assert "started again in" in str(exc), exc
                refused += 1
                return None

        # asked every 0.1 s until the delay has passed: refused meanwhile, without a start
        done = await until(attempt, "a new worker after the delay")
        assert done["info"]["status"] == "deployed" and helm.process.starts == 2
        assert refused >= 1
        await helm.close()

    asyncio.run(main())
    assert len(said) == 1
    cluster.core.delete_namespace(ns)


def test_a_cancelled_request_ends_inside_the_worker_which_then_retires(
        remote: object, tmp_path: Path) -> None:
    """Cancelled (a shutdown, a deadline), helm's library answers at once; the process that
    ran it takes no new request (the library may still be at work, as in a helm binary
    that exits there) and exits by itself, and nothing is reported: it did not fail."""
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)
    said, ended = reporter()

    async def main() -> None:
        helm = worker_helm(cluster, tmp_path, wait=True, on_exit=ended)
        hanging = asyncio.create_task(helm.install_or_upgrade("h", HANG, ns, {},
                                                              operation="install"))
        await until(lambda: records(cluster, ns, "h"), "pending install")
        pid = helm.process.pid
        assert pid is not None
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        await until(lambda: not alive(pid), "the retired worker's exit")
        assert helm.process.pid is None
        done = await helm.install_or_upgrade("s", SAMPLE, ns, {}, operation="install")
        assert done["info"]["status"] == "deployed" and helm.process.starts == 2
        await helm.close()

    asyncio.run(main())
    assert said == []
    cluster.core.delete_namespace(ns)


@pytest.mark.parametrize("bound", ["answer", "memory"])
def test_a_worker_past_its_bounds_costs_that_worker_only(
        remote: object, tmp_path: Path, bound: str) -> None:
    """An answer longer than krypton reads, or a worker above its memory bound: that worker
    is killed and said to be, its request fails, and another cluster's worker (here a second
    one of the same server) is untouched."""
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)
    said, ended = reporter()

    limits = {"answer": {"answer_limit": 256}, "memory": {"memory_limit": 1 << 20}}[bound]

    async def main() -> None:
        bounded = worker_helm(cluster, tmp_path, wait=True, on_exit=ended, **limits)
        other = worker_helm(cluster, tmp_path / "other")
        chart = SAMPLE if bound == "answer" else HANG
        with pytest.raises(HelmWorkerFailed):
            await bounded.install_or_upgrade("b", chart, ns, {}, operation="install")
        done = await other.install_or_upgrade("o", SAMPLE, ns, {}, operation="install")
        assert done["info"]["status"] == "deployed"
        await bounded.close()
        await other.close()

    asyncio.run(main())
    reason, message = said[0]
    assert len(said) == 1
    if bound == "answer":
        assert reason == "HelmWorkerFailed" and "does not take" in message, message
    else:
        assert reason == "HelmWorkerOutOfMemory" and "more than 1 MiB" in message, message
    cluster.core.delete_namespace(ns)


def test_a_worker_that_does_not_speak_the_protocol_is_refused(helm_bin: str) -> None:
    """A program that is not a helm worker (here helm itself) is refused at start, said,
    and not started again at once."""
    said, ended = reporter()

    async def main() -> str:
        process = helmworkerprocess.HelmWorkerProcess(helm_bin, None, dict(os.environ), cluster="c",
                                           on_exit=ended)
        with pytest.raises(HelmWorkerFailed) as first:
            await process.ask({"op": "status"})
        with pytest.raises(HelmWorkerFailed, match="started again in"):
            await process.ask({"op": "status"})
        return str(first.value)

    message = asyncio.run(main())
    assert "is not protocol 2's" in message and [r for r, _ in said] == ["HelmWorkerFailed"]


def test_the_fleet_keeps_few_workers_and_never_stops_one_at_work(
        remote: object, tmp_path: Path) -> None:
    """With room for one worker, a cluster's first request stops another cluster's idle
    worker (here two names of one server), and none that is at work."""
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)
    pool = helmworkerprocess.HelmWorkerPool(1)

    async def main() -> None:
        a = worker_helm(cluster, tmp_path / "a", pool=pool, wait=True)
        b = worker_helm(cluster, tmp_path / "b", pool=pool)
        await a.install_or_upgrade("a", SAMPLE, ns, {}, operation="install")
        first = a.process.pid
        assert first is not None
        await b.install_or_upgrade("b", SAMPLE, ns, {}, operation="install")
        assert a.process.pid is None and b.process.pid is not None
        await until(lambda: not alive(first), "the idle worker's exit")
        hanging = asyncio.create_task(a.install_or_upgrade("h", HANG, ns, {},
                                                           operation="install"))
        await until(lambda: records(cluster, ns, "h"), "pending install")
        assert b.process.pid is None  # idle: made room for a's
        busy = a.process.pid
        await b.install_or_upgrade("b", SAMPLE, ns, {}, operation="upgrade",
                                   records=judged(cluster, ns, "b"))
        assert a.process.pid == busy and alive(busy)  # at work: kept
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        await a.close()
        await b.close()

    asyncio.run(main())
    cluster.core.delete_namespace(ns)


def test_a_worker_serving_many_releases_is_not_held_back_where_helm_was_not(
        remote: object, tmp_path: Path) -> None:
    """A helm process starts with full client-side rate buckets and never empties them; a
    worker keeps its clients for hours. Past a helm process's hundred releases, none of its
    requests waits in client-go's rate limiter (the discovery client's 5 a second held each
    upgrade 0.6 s there)."""
    cluster = Cluster("remote", remote)  # type: ignore[arg-type]
    ns = unique("hw")
    cluster.ensure_namespace(ns)

    async def main() -> int:
        helm = worker_helm(cluster, tmp_path)
        for i in range(150):
            await helm.install_or_upgrade("many", SAMPLE, ns, {"data": {"i": str(i)}},
                                          operation="upgrade",
                                          records=judged(cluster, ns, "many"))
        stats = await helm.process.ask({"op": "stats"})
        await helm.close()
        return int(stats.get("throttled") or 0)

    assert asyncio.run(main()) == 0
    cluster.core.delete_namespace(ns)


class _Bomb(BaseHTTPRequestHandler):
    """An API server that knows its version and answers every other read with a gzip body
    inflating to 2 GiB."""

    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/version"):
            body, extra = b'{"major": "1", "minor": "34", "gitVersion": "v1.34.4"}', {}
        else:
            body, extra = self.member * 32, {"Content-Encoding": "gzip"}
        self.send_response(200)
        for name, value in {"Content-Type": "application/json", **extra}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def _bomb(tmp_path: Path) -> tuple[ThreadingHTTPServer, Path]:
    """A _Bomb server on loopback and a kubeconfig of it (shut the server down after)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bomb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: "
        f"{{server: 'http://127.0.0.1:{server.server_port}'}}}}]\ncontexts: [{{name: c, "
        "context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n")
    return server, kubeconfig


@pytest.mark.parametrize(("share_mib", "reason"), [(320, "AnswerTooLarge"),
                                                     (120, "HelmWorkerOutOfMemory")])
def test_a_worker_reads_within_its_bound_and_is_held_to_its_share(
        tmp_path: Path, share_mib: int, reason: str) -> None:
    """SPEC S7: a gzip bomb answering helm's list of a release's records is refused at 64
    MiB, decompressed, within a share that holds one such read (the worker stays); a share
    too small for it is held by the kernel: the worker ends "out of memory", said as
    HelmWorkerOutOfMemory, and never grows past it."""
    server, kubeconfig = _bomb(tmp_path)
    share = share_mib << 20
    memory = HelmMemory(pod=share + (256 << 20), source="test", concurrency=1, asked=1,
                        share=share)
    said, ended = reporter()

    async def main() -> tuple[BaseException, int]:
        helm = HelmWorkerEngine(resolve_helm("krypton-helmworker"), kubeconfig=kubeconfig,
                          timeout=60, wait=False, cluster="bomb", on_exit=ended, memory=memory)
        with pytest.raises(HelmFailed) as failed:
            await helm.install_or_upgrade("r", SAMPLE, "n", {}, operation="upgrade")
        pid = helm.process.pid  # the worker, if it stays: its peak resident memory
        peak = _peak_rss(pid) if pid is not None else 0
        await helm.close()
        return failed.value, peak

    try:
        failure, peak = asyncio.run(main())
    finally:
        server.shutdown()
    assert getattr(failure, "reason", "") == reason, failure
    if reason == "AnswerTooLarge":  # the worker stays, and read within its share
        assert "cluster bomb: " in str(failure) and "is over 67108864 bytes" in str(failure)
        assert said == [] and 0 < peak <= share, f"peak {peak >> 20} MiB"
    else:  # its share was too small for the read: the kernel ended it there
        assert [r for r, _ in said] == ["HelmWorkerOutOfMemory"], said
        assert "out of memory" in said[0][1] and f"its share: {share_mib} MiB" in said[0][1]


def _peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.helm3lane  # the binary of each Helm major
def test_a_helm_process_is_held_to_its_share(helm_bin: str, tmp_path: Path) -> None:
    """SPEC S7, --helm-engine=cli: the helm binary reads its cluster's answers unbounded (a
    2 GiB gzip bomb took it to 4.5 GiB); held to its share by the kernel, it ends there, and
    the run fails saying so, not with helm's goroutines."""
    server, kubeconfig = _bomb(tmp_path)
    memory = HelmMemory(pod=512 << 20, source="test", concurrency=1, asked=1, share=256 << 20)
    helm = Helm(helm_bin, kubeconfig=kubeconfig, timeout=60, wait=False,
                cache_dir=tmp_path / "cache", memory=memory)
    try:
        with pytest.raises(HelmFailed) as failed:
            asyncio.run(helm.install_or_upgrade("r", SAMPLE, "n", {}, operation="upgrade"))
    finally:
        server.shutdown()
    assert str(failed.value).startswith("helm ended: fatal error: ") and \
        "out of memory" in str(failed.value), failed.value
