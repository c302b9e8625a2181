"""Resolving the central chart: version ranges, fetching once per process (SPEC R6).

For an http(s) repository the version is resolved against the repository's ``index.yaml``
(fetched without running helm, cached for `index_ttl`), then the chart is pulled once per
resolved version with ``helm pull`` and kept unpacked for every install. For ``oci://`` the
reference is pulled by helm (which resolves ranges itself) once per process.
Concurrent callers share one fetch.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from krypton.adapters.helm import Helm, chart_version
from krypton.decisions import chartcrds, retry, safeyaml
from krypton.decisions.errors import ChartNotLoaded, KryptonError, VersionInvalid, VersionNotFound
from krypton.decisions.ownership import ObjectRef
from krypton.decisions.versions import is_exact, parse_constraint, resolve

T = TypeVar("T")
INDEX_DEADLINE = 60.0  # the whole index.yaml download, however slowly it trickles in
INDEX_READ_TIMEOUT = 15.0  # one read from the socket
FAILURE_BACKOFF_MAX = 300.0


@dataclass(frozen=True)
class ResolvedChart:
    repo: str
    name: str
    version: str
    path: str


SHARED_CACHE = 256  # fingerprints whose shared objects are remembered

class ChartSource:
    """The central chart, resolved and unpacked on demand, cached per process."""

    def __init__(self, repo: str, name: str, version: str, *, helm: Helm, cache_dir: Path,
                 index_ttl: float = 300.0, failure_ttl: float = 10.0,
                 index_deadline: float = INDEX_DEADLINE) -> None:
        # The flag as typed is part of every fingerprint (the original operator hashed it so:
        # normalising it would upgrade a migrated fleet once); requests use it without a
        # trailing slash.
        self.repo, self.name, self.spec = repo, name, version
        self.url = repo.rstrip("/")
        self.helm, self.cache_dir = helm, cache_dir
        self.index_ttl, self.failure_ttl = index_ttl, failure_ttl
        self.index_deadline = index_deadline
        self._failures = 0  # consecutive failed loads: the cached failure lives longer each time
        self._lock = asyncio.Lock()
        self._resolved: ResolvedChart | None = None
        self._resolved_at = 0.0
        self._failure: KryptonError | None = None
        self._failed_at = 0.0
        self._pulled: dict[str, Path] = {}
        self._shared: dict[str, tuple[ObjectRef, ...]] = {}
        self._shared_locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0  # repository round trips, for tests and benchmarks

    async def shared_objects(self, fingerprint: str,
                             render: Callable[[], Awaitable[tuple[ObjectRef, ...]]]
                             ) -> tuple[ObjectRef, ...]:
        """The objects every release of the chart at `fingerprint` claims alike (see
        ``ownership.shared_candidates``), found by `render` once per fingerprint for all
        clusters that share it."""
        lock = self._shared_locks.setdefault(fingerprint, asyncio.Lock())
        async with lock:
            if fingerprint not in self._shared:
                if len(self._shared) >= SHARED_CACHE:
                    self._shared.pop(next(iter(self._shared)))
                self._shared[fingerprint] = await render()
        self._shared_locks.pop(fingerprint, None)
        return self._shared[fingerprint]

    @property
    def cached(self) -> ResolvedChart | None:
        """The last resolved chart, without any I/O."""
        return self._resolved

    @property
    def is_oci(self) -> bool:
        return self.url.startswith("oci://")

    async def get(self) -> ResolvedChart:
        """The chart to install now; raises VersionInvalid, VersionNotFound or ChartNotLoaded."""
        parse_constraint(self.spec)  # VersionInvalid before any network
        cached = self._cached()
        if cached is not None:
            return cached
        async with self._lock:
            cached = self._cached()  # another caller may have loaded it meanwhile
            if cached is not None:
                return cached
            try:
                self._resolved = await self._load()
                self._resolved_at, self._failure, self._failures = time.monotonic(), None, 0
                return self._resolved
            except (ChartNotLoaded, VersionNotFound, VersionInvalid) as exc:
                self._failure, self._failed_at = exc, time.monotonic()
                self._failures += 1
                raise

    def _cached(self) -> ResolvedChart | None:
        """The resolved chart while fresh; the last failure (raised) while it is cached, for
        failure_ttl doubling per consecutive failure, at most 5 minutes; else None."""
        now = time.monotonic()
        if self._fresh(now):
            return self._resolved
        backoff = retry.Policy(first=self.failure_ttl, cap=FAILURE_BACKOFF_MAX)
        if self._failure is not None and now - self._failed_at < backoff.delay(self._failures):
            raise self._failure
        return None

    def _fresh(self, now: float) -> bool:
        if self._resolved is None:
            return False
        # A pin (or an OCI reference) never changes; a range is re-resolved after index_ttl.
        return is_exact(self.spec) or self.is_oci or now - self._resolved_at < self.index_ttl

    async def _load(self) -> ResolvedChart:
        if self.is_oci:
            path = await self._pull(f"{self.url}/{self.name}", None, self.spec)
            return ResolvedChart(self.repo, self.name, chart_version(path), str(path))
        versions = await _in_daemon_thread(self._index_versions)
        version = resolve(self.spec, versions)
        path = self._pulled.get(version) or await self._pull(self.name, self.url, version)
        self._pulled[version] = path
        return ResolvedChart(self.repo, self.name, version, str(path))

    async def fetch(self, version: str) -> ResolvedChart:
        """A specific version of the chart (for reverts), pulled once and kept."""
        if self.is_oci:
            path = await self._pull(f"{self.url}/{self.name}", None, version)
        else:
            path = self._pulled.get(version) or await self._pull(self.name, self.url, version)
            self._pulled[version] = path
        return ResolvedChart(self.repo, self.name, version, str(path))

    async def _pull(self, ref: str, repo: str | None, version: str) -> Path:
        self.fetches += 1
        # An http(s) repository promised exactly `version`; for OCI helm resolves the tag.
        return await self.helm.pull(ref, repo=repo, version=version, dest=self.cache_dir,
                                    expect_name=self.name,
                                    expect_version=None if self.is_oci else version)

    def _index_versions(self) -> list[str]:
        """The versions of the chart in the repository's index.yaml.

        The download is bounded in size (safeyaml.CHART_INDEX) and in total time, so a huge,
        endless or trickling response fails with ChartNotLoaded instead of hanging a pass.
        """
        self.fetches += 1
        url = f"{self.url}/index.yaml"
        limit = safeyaml.CHART_INDEX.max_bytes
        deadline = time.monotonic() + self.index_deadline
        chunks: list[bytes] = []
        size = 0
        try:
            with urllib.request.urlopen(url, timeout=INDEX_READ_TIMEOUT) as resp:  # noqa: S310
                declared = resp.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > limit:
                    raise ChartNotLoaded(f"chart repository {self.url}: index.yaml is "
                                         f"{declared} bytes, over the limit of {limit}")
                while True:
                    chunk = resp.read1(1 << 16)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        raise ChartNotLoaded(f"chart repository {self.url}: index.yaml is "
                                             f"over the limit of {limit} bytes")
                    if time.monotonic() > deadline:
                        raise ChartNotLoaded(f"chart repository {self.url}: index.yaml did "
                                             f"not arrive within {self.index_deadline:.0f}s")
                    chunks.append(chunk)
        except urllib.error.HTTPError as exc:
            raise ChartNotLoaded(f"chart repository {self.url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ChartNotLoaded(f"chart repository {self.url} unreachable: {reason}") from exc
        try:
            index = safeyaml.load(b"".join(chunks), safeyaml.CHART_INDEX, what="index.yaml")
        except safeyaml.YamlRejected as exc:
            raise ChartNotLoaded(f"chart repository {self.url}: {exc}") from exc
        return index_versions(index, self.name, self.url)


def index_versions(index: Any, name: str, repo: str) -> list[str]:
    """The version strings of chart `name` in a parsed index; ChartNotLoaded if malformed."""
    where = f"chart repository {repo}: index.yaml"
    if not isinstance(index, dict):
        raise ChartNotLoaded(f"{where} is not a YAML mapping")
    entries = index.get("entries")
    entries = {} if entries is None else entries
    if not isinstance(entries, dict):
        raise ChartNotLoaded(f"{where} entries is not a mapping")
    if name not in entries:
        raise ChartNotLoaded(f"chart {name!r} is not in repository {repo}")
    listed = entries[name]
    if not isinstance(listed, list):
        raise ChartNotLoaded(f"{where} entries.{name} is not a list")
    return [str(e["version"]) for e in listed
            if isinstance(e, dict) and isinstance(e.get("version"), (str, int, float))]


async def _in_daemon_thread(fn: Callable[[], T]) -> T:
    """Run blocking `fn` in a daemon thread: unlike the loop's executor, a thread stuck in a
    slow download never holds up the process's exit (SIGTERM works during a fetch)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = exc
        try:
            loop.call_soon_threadsafe(deliver, result, error)
        except RuntimeError:  # the loop is gone: nobody is waiting any more
            pass

    threading.Thread(target=run, daemon=True, name="chart-index").start()
    return await future


def read_chart_crds(chart_dir: str | Path) -> list[dict[str, Any]]:
    """The CRDs of an unpacked chart's ``crds/`` directory and of its unpacked subcharts'
    (``charts/*/crds/``), as ``chartcrds.chart_crds`` keeps them; raises ChartNotLoaded for
    a file that is not valid YAML or over the limits."""
    root = Path(chart_dir)
    files = sorted(p for d in [root / "crds", *sorted(root.glob("charts/*/crds"))]
                   if d.is_dir() for p in d.rglob("*")
                   if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))
    docs: list[Any] = []
    for path in files:
        try:
            docs += safeyaml.load_all(path.read_bytes(), safeyaml.CHART_CRDS,
                                      what=f"chart file {path.relative_to(root)}")
        except safeyaml.YamlRejected as exc:
            raise ChartNotLoaded(str(exc)) from exc
    return chartcrds.chart_crds(docs)
