"""The only module that imports `pyhelm3`: helm runs per cluster, errors mapped to ours.

Each cluster gets its own kubeconfig file (mode 0600, in the cluster's private directory,
removed on disengage) and its own client-go cache there; tokens never appear on a command
line. Values go to helm on stdin.
pyhelm3's ``Command`` is used directly: its ``Client`` runs a blocking ``helm version`` in
its constructor and passes tokens as flags.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import re
import resource
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog
import yaml
from pyhelm3 import errors as helm_errors
from pyhelm3.command import CHART_NOT_FOUND, Command, SafeLoader

from krypton.adapters import chartarchive, metrics
from krypton.decisions.charts import conflicts
from krypton.decisions.errors import (
    ChartNotLoaded,
    ChartVerificationFailed,
    FieldConflict,
    HelmFailed,
    OwnershipConflict,
    ReleaseLocked,
    VersionNotFound,
)
from krypton.decisions.memory import HelmMemory
from krypton.decisions.trust.records import Record

logging.getLogger("pyhelm3").setLevel(logging.WARNING)
_log = structlog.get_logger("krypton.helm")


MESSAGE_LIMIT = 900  # characters of helm's error kept for a condition or an Event
_NOISE = re.compile(r"^(WARNING: |[IWE]\d{4} \d\d:\d\d:\d\d)")  # helm's warnings, client-go's log


def _stderr(exc: helm_errors.Error) -> str:
    """helm's error as one line: every line of it, not only the last (helm 4 names the
    resource that was not ready, or the hook that failed, before "context deadline
    exceeded"), without warnings and log lines, bounded in length (SPEC F5, item 5)."""
    text = exc.stderr.decode(errors="replace").strip()
    fatal = next((ln for ln in text.splitlines() if ln.startswith("fatal error: ")), "")
    if fatal:  # the Go runtime ended helm (its memory share, held by the kernel: hold_to)
        return f"helm ended: {fatal[:200]}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not _NOISE.match(ln)] or lines
    lines = conflicts.reduce_log_lines(lines) or lines
    if not lines:
        return f"helm exited with {exc.returncode}"
    message = "; ".join(ln.removeprefix("Error: ") for ln in lines)
    if len(message) > MESSAGE_LIMIT:
        message = f"{message[:MESSAGE_LIMIT - 1]}…"
    return message


_FOREIGN = re.compile(r'(?P<kind>\w+) "(?P<name>[^"]+)" in namespace "(?P<ns>[^"]*)" exists and '
                      r'cannot be imported into the current release')
_OWNER = re.compile(r'key "meta\.helm\.sh/release-(?P<field>name|namespace)" must equal "[^"]*": '
                    r'current value is "(?P<value>[^"]*)"')


def _foreign_owner(message: str) -> str:
    """"release <namespace>/<name>" from helm's ownership error, as far as it says."""
    found = {m["field"]: m["value"] for m in _OWNER.finditer(message)}
    if "name" in found and "namespace" in found:
        return f"release {found['namespace']}/{found['name']}"
    if "name" in found:
        return f"release {found['name']}"
    if "namespace" in found:
        return f"a release in namespace {found['namespace']}"
    return "no Helm release"


def _helm_error(exc: helm_errors.Error) -> HelmFailed:
    message = _stderr(exc)
    if "another operation" in message and "in progress" in message:
        return ReleaseLocked(message)
    fields = conflicts.parse(exc.stderr.decode(errors="replace"))
    if fields:
        return FieldConflict(f"{len(fields)} field(s) of the apply are owned by other field "
                             f"managers: {conflicts.describe(fields)}", tuple(
                                 (c.object, c.manager, c.field) for c in fields))
    found = _FOREIGN.search(message)
    if found:
        where = f" in namespace {found['ns']}" if found["ns"] else ""
        return OwnershipConflict(f"{found['kind']} {found['name']}{where} is owned by "
                                 f"{_foreign_owner(message)}: {message}")
    return HelmFailed(message)


def failure(message: str) -> HelmFailed:
    """helm's error `message`, as the helm worker answers it, told apart exactly as the
    helm binary's stderr is."""
    return _helm_error(helm_errors.Error(1, b"", f"Error: {message}".encode()))


def documents(text: str, invalid: str) -> list[Any]:
    """The YAML documents of a manifest as helm prints it (HelmFailed(`invalid`) if it is not
    YAML), read as pyhelm3 reads helm's."""
    try:
        return [d for d in yaml.load_all(text, Loader=SafeLoader) if d is not None]
    except yaml.YAMLError as exc:
        raise HelmFailed(invalid) from exc


STOP_GRACE = 5.0  # seconds a cancelled helm gets after SIGTERM, before SIGKILL


def watch_children_with_pidfds() -> bool:
    """Hear of helm's exit through a pidfd on the event loop, not through a thread per
    helm process blocked in waitpid (Python 3.11's default child watcher): one thread
    started and joined per helm run was a measured part of the operator's CPU per release.
    Python 3.12 and later choose this by themselves; where the kernel or a seccomp profile
    refuses pidfd_open, the default stays. Called on the running loop; returns whether
    pidfds are used."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
    return True


# Arguments for the helm run started in this context only (``--labels``), which pyhelm3's
# argument building has no parameter for.
_EXTRA_ARGS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "helm_extra_args", default=())


class _Command(Command):
    """pyhelm3's argument building, with helm started directly (no shell in between) and
    stopped within bounds when the caller gives up: SIGTERM, at most `STOP_GRACE` seconds,
    then SIGKILL. pyhelm3's own ``run`` starts ``sh -c helm ...`` and, when cancelled, waits
    for helm without a limit: shutdown then takes as long as helm's own ``--timeout``.

    Only the options krypton uses are supported: the per-cluster kubeconfig file (never a
    token on the command line).

    ``helm upgrade`` gets ``--disable-openapi-validation`` (pyhelm3's own switch for it adds
    the flag's characters one by one). What it turns off is helm fetching and parsing the
    API server's OpenAPI v3 document for every group version of the manifest, twice per
    upgrade, only to learn that the server validates fields itself: about half of the CPU
    of a helm upgrade on the bench chart. Validation is not lost: Helm 4 still sends every
    write with ``fieldValidation=Strict`` (an unknown field fails the run), Helm 3 still gets
    the server's warnings, exactly as with the flag off (measured: docs, Benchmarks, "Throughput").
    """

    EXTRA = {"upgrade": ("--disable-openapi-validation",)}
    driver = ""  # helm's storage driver (HELM_DRIVER); "" leaves helm's default
    cache_dir: Path | None = None  # client-go's cache of this cluster's answers (KUBECACHEDIR)
    memory: HelmMemory | None = None  # each helm process's share of the pod (SPEC S7)

    async def run(self, command: list[Any], input: bytes | None = None) -> bytes:  # noqa: A002
        argv = [self._executable, *command, *self.EXTRA.get(str(command[0]), ()),
                *_EXTRA_ARGS.get()]
        if self._kubeconfig:
            argv += ["--kubeconfig", self._kubeconfig]
        proc = await asyncio.create_subprocess_exec(
            *(str(a) for a in argv),
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=helm_environment(os.environ, self.driver, self.cache_dir, self.memory))
        hold_to(proc.pid, self.memory)
        try:
            stdout, stderr = await proc.communicate(input)
        except asyncio.CancelledError:
            await stop_process(proc, STOP_GRACE)
            raise
        if proc.returncode == 0:
            return stdout
        text = stderr.decode(errors="replace").lower()
        error = helm_errors.ChartNotFoundError if CHART_NOT_FOUND.search(text) else \
            helm_errors.Error
        raise error(proc.returncode, stdout, stderr)


GO_PROCESSORS = ("GOMAXPROCS", "1")  # helm's, unless the operator's environment names its own


def hold_to(pid: int, memory: HelmMemory | None) -> None:
    """Hold the helm process `pid` to its share of the pod's memory (SPEC S7): its data
    segment (RLIMIT_DATA, which counts the anonymous memory Go's heap is made of) may not
    grow past it, so an allocation past it fails and the Go runtime ends the process ("out
    of memory"), whatever it was reading. Set from here, a moment after the exec, on a child
    of this process's own user: no privilege, and no code run between fork and exec."""
    if memory is None:
        return
    try:
        resource.prlimit(pid, resource.RLIMIT_DATA, (memory.share, memory.share))
    except (ProcessLookupError, PermissionError):
        pass  # it has already ended


def helm_environment(environ: Mapping[str, str], driver: str = "",
                     cache_dir: Path | None = None,
                     memory: HelmMemory | None = None) -> dict[str, str]:
    """The environment helm runs in, built for each run and given to helm only (nothing is
    written into the operator's own environment, which other children, such as a
    credential plugin, inherit): the operator's, with ``GOMAXPROCS=1`` where it names none
    (its own value then passes through), ``HELM_DRIVER`` set to `driver`, and
    ``KUBECACHEDIR`` set to `cache_dir`.

    helm is a Go program that spends most of its run waiting for the API server. With more
    than one processor, Go's runtime fills the idle ones with garbage-collection marking and
    with threads spinning for work: CPU a short command does not need. With one, a helm
    upgrade of the bench chart took 23 % less CPU run alone and 7-12 % less four at a time,
    at the same peak memory and in the same time (docs, Benchmarks, "Throughput");
    several helm processes still run side by side (``--max-concurrent-helm``).

    client-go inside helm keeps what an API server answers to discovery under
    ``KUBECACHEDIR`` (by default ``$HOME/.kube/cache``, one directory for every cluster,
    keyed by the server's URL alone, kept for ever), and serves an answer its server marked
    fresh without asking again. Each cluster's helm gets a directory of its own instead, in
    the cluster's private directory: what one cluster answered is never served to another
    cluster's helm that shares its URL (servers behind one address, told apart by a gateway
    from the name or the credential), and it goes when the cluster does (SPEC S3, S5)."""
    env = dict(environ)
    env.setdefault(*GO_PROCESSORS)
    if memory is not None:  # Go's collector works harder well before its hard limit
        env["GOMEMLIMIT"] = f"{memory.soft >> 20}MiB"
    if driver:
        env["HELM_DRIVER"] = driver
    if cache_dir is not None:
        env["KUBECACHEDIR"] = str(cache_dir)
    return env


async def stop_process(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM, up to `grace` seconds to exit, then SIGKILL; returns once it is gone."""
    try:
        proc.terminate()
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
            return
        except TimeoutError:
            proc.kill()
        await proc.wait()
    except ProcessLookupError:
        pass  # it had already exited


class HelmEngine(Protocol):
    """helm against one cluster, as the runtime, ``krypton plan`` and ``krypton diff`` use it
    (SPEC P5, S7): the helm binary (:class:`Helm`) or krypton's helm worker
    (:class:`~krypton.adapters.helmworker.HelmWorkerEngine`), two implementations of one port with
    the same answers and errors. Each call that reads the release's history takes `records`:
    that history as krypton judged it right before."""

    timeout: float

    async def install_or_upgrade(self, release: str, chart: str, namespace: str,
                                 values: dict[str, Any], *, operation: str,
                                 skip_crds: bool = False,
                                 labels: Mapping[str, str] | None = None,
                                 force_conflicts: bool = False, take_ownership: bool = False,
                                 records: Sequence[Record] = ()) -> dict[str, Any]: ...

    async def rollback(self, release: str, namespace: str, revision: int, *,
                       force: bool = False, records: Sequence[Record] = ()
                       ) -> dict[str, Any]: ...

    async def template(self, chart: str, release: str, namespace: str,
                       values: dict[str, Any]) -> list[Any]: ...

    async def manifest(self, release: str, namespace: str,
                       records: Sequence[Record] = ()) -> list[Any]: ...

    async def uninstall(self, release: str, namespace: str, *, hooks: bool = True,
                        records: Sequence[Record] = ()) -> None: ...

    def interrupted(self, namespace: str, release: str) -> str: ...

    async def unlock(self, release: str, namespace: str, revision: int, why: str,
                     records: Sequence[Record]) -> None: ...

    async def close(self) -> None: ...


async def timed(operation: str, coro: Any, timeout: float) -> Any:
    """`coro`, one helm run of either engine: counted and timed by operation and result
    (metrics), and bounded at helm's own `timeout` plus 60 s, against a run that hangs. A
    failure of the helm binary (pyhelm3's error) becomes krypton's, told apart from its
    words; the worker's errors come told apart by their kind."""
    metrics.HELM_RUNS.labels(operation).inc()
    start, result = time.monotonic(), "success"
    try:
        async with asyncio.timeout(timeout + 60):
            return await coro
    except TimeoutError as exc:
        result = "error"
        raise HelmFailed(f"helm {operation} did not finish in {timeout + 60:.0f}s") from exc
    except HelmFailed:
        result = "error"
        raise
    except helm_errors.Error as exc:
        result = "error"
        # the whole of it, for who runs at debug level; conditions and Events get _stderr
        _log.debug("helm failed", operation=operation,
                   stderr=exc.stderr.decode(errors="replace")[:20000])
        raise _helm_error(exc) from exc
    finally:
        metrics.HELM_SECONDS.labels(operation, result).observe(time.monotonic() - start)


class Helm:
    """helm against one cluster (or none, for pulling charts), a helm binary per run: the
    :class:`HelmEngine` of ``--helm-engine=binary``, and of Helm 3.

    The binary reads the release's records itself and cannot be held to the `records`
    krypton judged: on a cluster whose records are not guarded, a rewrite between krypton's
    look and helm's read reaches it (docs, Security model)."""

    def __init__(self, executable: str, *, kubeconfig: Path | None = None, timeout: float = 180,
                 wait: bool = True, driver: str = "", history_max: int = 10,
                 cache_dir: Path | None = None, memory: HelmMemory | None = None) -> None:
        self.timeout = timeout
        self.wait = wait
        # --history-max of upgrades and rollbacks: the records helm keeps, reads at every run
        self._command = _Command(executable=executable, kubeconfig=kubeconfig,
                                default_timeout=f"{int(timeout)}s",
                                history_max_revisions=history_max)
        self._command.driver = driver
        self._command.cache_dir = cache_dir
        self._command.memory = memory

    async def close(self) -> None:
        """Nothing to stop: each helm process ends with its run."""

    def interrupted(self, namespace: str, release: str) -> str:
        """Why krypton's own helm run of the release ended before helm did, leaving its
        record pending ("" when none did). A helm process stopped by krypton is sent SIGTERM
        and marks its record failed itself; one killed outright is not known here, and its
        pending record is recovered once it is older than --helm-timeout."""
        return ""

    async def unlock(self, release: str, namespace: str, revision: int, why: str,
                     records: Sequence[Record]) -> None:
        """Mark revision `revision` failed if it is pending (the worker's engine only)."""

    async def _run(self, operation: str, coro: Any) -> Any:
        return await timed(operation, coro, self.timeout)

    async def install_or_upgrade(self, release: str, chart: str, namespace: str,
                                 values: dict[str, Any], *, operation: str,
                                 skip_crds: bool = False,
                                 labels: Mapping[str, str] | None = None,
                                 force_conflicts: bool = False,
                                 take_ownership: bool = False,
                                 records: Sequence[Record] = ()) -> dict[str, Any]:
        """``helm upgrade --install`` of a local chart directory; returns the release JSON.

        ``--reset-values`` always: helm would otherwise keep the previous release's values
        when `values` is empty, and the deployed values would differ from the fingerprinted
        ones (a release made by another tool keeps its own values under an empty config).
        `labels` go on the release record (``--labels``; helm merges them with the
        previous revision's). `force_conflicts` (Helm 4) takes over fields other field
        managers own."""
        extra: tuple[str, ...] = (
            "--labels", ",".join(f"{k}={v}" for k, v in sorted(labels.items()))) \
            if labels else ()
        if force_conflicts:
            extra += ("--force-conflicts",)
        if take_ownership:  # objects another (gone) release owned become this release's
            extra += ("--take-ownership",)
        token = _EXTRA_ARGS.set(extra)
        try:
            return await self._run(operation, self._command.install_or_upgrade(  # type: ignore[no-any-return]
                release, chart, values, namespace=namespace, create_namespace=False,
                reset_values=True, skip_crds=skip_crds, wait=self.wait,
                timeout=f"{int(self.timeout)}s"))
        finally:
            _EXTRA_ARGS.reset(token)

    async def rollback(self, release: str, namespace: str, revision: int,
                       *, force: bool = False, records: Sequence[Record] = ()) -> dict[str, Any]:
        """``helm rollback`` to `revision`; `force` recreates objects a failed upgrade left
        missing. Returns the release the rollback made (``helm status``)."""
        await self._run("rollback", self._command.rollback(
            release, revision, namespace=namespace, wait=self.wait, force=force,
            timeout=f"{int(self.timeout)}s"))
        status = await self._run("status", self._command.status(release, namespace=namespace))
        return dict(status or {})

    async def template(self, chart: str, release: str, namespace: str,
                       values: dict[str, Any]) -> list[Any]:
        """The documents ``helm template`` renders for `release` in `namespace` (the chart's
        ``crds/`` left out, as helm installs those only when absent)."""
        docs = await self._run("template", self._command.template(
            release, chart, values, namespace=namespace))
        try:
            return [d for d in docs if d is not None]
        except yaml.YAMLError as exc:
            raise HelmFailed(f"chart {chart} renders documents that are not valid YAML") from exc

    async def manifest(self, release: str, namespace: str,
                       records: Sequence[Record] = ()) -> list[Any]:
        """The documents of the release's latest manifest (``helm get manifest``)."""
        docs = await self._run("get", self._command.get_resources(release, namespace=namespace))
        try:
            return [d for d in docs if d is not None]
        except yaml.YAMLError as exc:
            raise HelmFailed(f"manifest of {release} is not valid YAML") from exc

    async def uninstall(self, release: str, namespace: str, *, hooks: bool = True,
                        records: Sequence[Record] = ()) -> None:
        """``helm uninstall --wait`` whatever --helm-wait says: the release is gone only once
        its objects are (a CRD it owned may take a while), and what waits for it (a Tenant
        refused that CRD, the namespace's deletion) must not find them still there. Without
        `hooks`, the record's delete hooks are not run (a record krypton did not seal)."""
        try:
            await self._run("uninstall", self._command.uninstall(
                release, namespace=namespace, wait=True, no_hooks=not hooks,
                timeout=f"{int(self.timeout)}s"))
        except HelmFailed as exc:
            if "not found" not in str(exc):
                raise

    async def pull(self, name: str, *, repo: str, version: str, dest: Path,
                   expect_name: str, keyring: str = "", ca_file: str = "") -> Path:
        """Fetch chart `name` at exactly `version` from the http(s) repository `repo` and
        unpack it; returns the chart directory under `dest`.

        With `keyring`, helm checks the chart's provenance file (``--verify``) against it
        and a chart that does not verify raises ChartVerificationFailed. The unpacked chart
        must be `expect_name` at `version` (see :func:`adopt`). helm's scratch directory is
        removed whatever happens.
        """
        dest.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix="pull-", dir=dest))
        metrics.HELM_RUNS.labels("pull").inc()
        argv = ["pull", name, "--repo", repo, "--version", version,
                "--destination", str(scratch), "--untar"]
        if keyring:
            argv += ["--verify", "--keyring", keyring]
        if ca_file:
            argv += ["--ca-file", ca_file]
        try:
            command = _Command(executable=self._command._executable)  # noqa: SLF001
            try:
                async with asyncio.timeout(self.timeout):
                    await command.run(argv)
            except TimeoutError as exc:
                raise ChartNotLoaded(f"pulling chart {name} {version} timed out") from exc
            except helm_errors.ChartNotFoundError as exc:
                raise VersionNotFound(_stderr(exc)) from exc
            except helm_errors.Error as exc:
                message = _stderr(exc)
                if "not found" in message and "version" in message:
                    raise VersionNotFound(message) from exc
                if keyring and PROVENANCE_FAILED.search(message):
                    raise ChartVerificationFailed(
                        f"chart {name} {version} from {repo} failed provenance verification "
                        f"with the keyring: {message}") from exc
                raise ChartNotLoaded(f"cannot load chart {name} {version}: {message}") from exc
            return chartarchive.adopt(scratch, dest, f"{name} {version}", expect_name, version)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


# helm pull --verify's failures: no .prov file, a key not in the keyring, a bad signature or
# a digest that does not match the archive
PROVENANCE_FAILED = re.compile(r"prov|verif|openpgp|signature|signed|keyring|sha256 sum",
                               re.IGNORECASE)
