"""Resolving the central chart: version ranges, fetching once per process (SPEC R6).

For an http(s) repository the version is resolved against the repository's ``index.yaml``
(fetched without running helm, cached for `index_ttl`), then the chart is pulled once per
resolved version with ``helm pull`` and kept unpacked for every install. For ``oci://`` the
reference is pulled by helm (which resolves ranges itself) once per process.
Concurrent callers share one fetch.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import ChartNotLoaded, KryptonError, VersionInvalid, VersionNotFound
from .helm import Helm, chart_version
from .versions import is_exact, parse_constraint, resolve


@dataclass(frozen=True)
class ResolvedChart:
    repo: str
    name: str
    version: str
    path: str


class ChartSource:
    """The central chart, resolved and unpacked on demand, cached per process."""

    def __init__(self, repo: str, name: str, version: str, *, helm: Helm, cache_dir: Path,
                 index_ttl: float = 300.0, failure_ttl: float = 10.0) -> None:
        self.repo, self.name, self.spec = repo.rstrip("/"), name, version
        self.helm, self.cache_dir = helm, cache_dir
        self.index_ttl, self.failure_ttl = index_ttl, failure_ttl
        self._lock = asyncio.Lock()
        self._resolved: ResolvedChart | None = None
        self._resolved_at = 0.0
        self._failure: KryptonError | None = None
        self._failed_at = 0.0
        self._pulled: dict[str, Path] = {}
        self.fetches = 0  # repository round trips, for tests and benchmarks

    @property
    def cached(self) -> ResolvedChart | None:
        """The last resolved chart, without any I/O."""
        return self._resolved

    @property
    def is_oci(self) -> bool:
        return self.repo.startswith("oci://")

    async def get(self) -> ResolvedChart:
        """The chart to install now; raises VersionInvalid, VersionNotFound or ChartNotLoaded."""
        parse_constraint(self.spec)  # VersionInvalid before any network
        now = time.monotonic()
        if self._fresh(now):
            assert self._resolved is not None
            return self._resolved
        if self._failure is not None and now - self._failed_at < self.failure_ttl:
            raise self._failure
        async with self._lock:
            now = time.monotonic()
            if self._fresh(now):
                assert self._resolved is not None
                return self._resolved
            if self._failure is not None and now - self._failed_at < self.failure_ttl:
                raise self._failure
            try:
                self._resolved = await self._load()
                self._resolved_at, self._failure = time.monotonic(), None
                return self._resolved
            except (ChartNotLoaded, VersionNotFound, VersionInvalid) as exc:
                self._failure, self._failed_at = exc, time.monotonic()
                raise

    def _fresh(self, now: float) -> bool:
        if self._resolved is None:
            return False
        # A pin (or an OCI reference) never changes; a range is re-resolved after index_ttl.
        return is_exact(self.spec) or self.is_oci or now - self._resolved_at < self.index_ttl

    async def _load(self) -> ResolvedChart:
        if self.is_oci:
            path = await self._pull(f"{self.repo}/{self.name}", None, self.spec)
            return ResolvedChart(self.repo, self.name, chart_version(path), str(path))
        versions = await asyncio.to_thread(self._index_versions)
        version = resolve(self.spec, versions)
        path = self._pulled.get(version) or await self._pull(self.name, self.repo, version)
        self._pulled[version] = path
        return ResolvedChart(self.repo, self.name, version, str(path))

    async def fetch(self, version: str) -> ResolvedChart:
        """A specific version of the chart (for reverts), pulled once and kept."""
        if self.is_oci:
            path = await self._pull(f"{self.repo}/{self.name}", None, version)
        else:
            path = self._pulled.get(version) or await self._pull(self.name, self.repo, version)
            self._pulled[version] = path
        return ResolvedChart(self.repo, self.name, version, str(path))

    async def _pull(self, ref: str, repo: str | None, version: str) -> Path:
        self.fetches += 1
        return await self.helm.pull(ref, repo=repo, version=version, dest=self.cache_dir)

    def _index_versions(self) -> list[str]:
        self.fetches += 1
        url = f"{self.repo}/index.yaml"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - http(s) only
                index = yaml.safe_load(resp.read())
        except urllib.error.HTTPError as exc:
            raise ChartNotLoaded(f"chart repository {self.repo}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ChartNotLoaded(f"chart repository {self.repo} unreachable: {reason}") from exc
        except yaml.YAMLError as exc:
            raise ChartNotLoaded(f"chart repository {self.repo}: index.yaml is invalid") from exc
        entries = (index or {}).get("entries") or {}
        if self.name not in entries:
            raise ChartNotLoaded(f"chart {self.name!r} is not in repository {self.repo}")
        return [str(e.get("version")) for e in entries[self.name] if e.get("version")]
