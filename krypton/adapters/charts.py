"""Resolving the central chart: version ranges, fetching once per process (SPEC R6).

For an http(s) repository the version is resolved against the repository's ``index.yaml``
(fetched without running helm, cached for `index_ttl`), then the chart is pulled once per
resolved version with ``helm pull`` (``--verify`` against a keyring when asked) and kept
unpacked for every install. For ``oci://`` krypton speaks the registry API itself (SPEC
R6b): a range is resolved against the repository's tags like one against an index, the
version's tag gives the manifest digest (checked against ``--chart-digest``, its cosign
signature checked against ``--chart-cosign-key``), and the chart archive is fetched by that
digest, so what is installed is exactly what was checked. A range, and an OCI tag, are
looked at again after `index_ttl`. Concurrent callers share one fetch; a failure is cached
on a growing schedule.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from krypton.adapters import http
from krypton.adapters.chartarchive import unpack_archive
from krypton.adapters.helm import Helm
from krypton.adapters.registry import (
    Credentials,
    NotInRegistry,
    Registry,
    credentials_from_secret,
)
from krypton.decisions import retry
from krypton.decisions.charts import chartcrds, oci
from krypton.decisions.charts.ownership import ObjectRef
from krypton.decisions.charts.versions import is_exact, newer_than, parse_constraint, resolve
from krypton.decisions.errors import (
    ChartNotLoaded,
    ChartVerificationFailed,
    KryptonError,
    TemporaryError,
    VersionInvalid,
    VersionNotFound,
)
from krypton.decisions.trust import safeyaml

INDEX_DEADLINE = 60.0  # the whole index.yaml download, however slowly it trickles in
INDEX_READ_TIMEOUT = 15.0  # one read from the socket
FAILURE_BACKOFF_MAX = 300.0


@dataclass(frozen=True)
class ResolvedChart:
    repo: str
    name: str
    version: str
    path: str
    digest: str = ""  # an OCI chart's manifest digest
    pinned: bool = False  # the digest is --chart-digest's: part of the fingerprint
    newer: str = ""  # the newest version in the repository above this one (the update notice)

    @property
    def fingerprinted(self) -> str:
        """The version as the fingerprint takes it: with the digest under a pin, so that
        moving the pin is a change to roll out (SPEC R6b)."""
        return f"{self.version}@{self.digest}" if self.pinned else self.version


@dataclass(frozen=True)
class Access:
    """How the chart is fetched and checked, beyond its repository, name and version."""

    digest: str = ""  # --chart-digest: the OCI manifest the version's tag must name
    keyring: str = ""  # --chart-keyring: helm provenance check of http(s) charts
    cosign_key: Any = None  # --chart-cosign-key, loaded: cosign check of OCI charts
    ca_file: str = ""  # --chart-ca-file
    plain_http: bool = False  # --chart-plain-http (OCI only)
    # the registry's credentials, read when a fetch needs them (--chart-credentials-secret)
    credentials: Callable[[str], Awaitable[Credentials | None]] | None = None


SHARED_CACHE = 256  # fingerprints whose shared objects are remembered

class ChartSource:
    """The central chart, resolved and unpacked on demand, cached per process."""

    def __init__(self, repo: str, name: str, version: str, *, helm: Helm, cache_dir: Path,
                 index_ttl: float = 300.0, failure_ttl: float = 10.0,
                 index_deadline: float = INDEX_DEADLINE, access: Access = Access()) -> None:
        # The flag as typed is part of every fingerprint (the original operator hashed it so:
        # normalising it would upgrade a migrated fleet once); requests use it without a
        # trailing slash.
        self.repo, self.name, self.spec = repo, name, version
        self.url = repo.rstrip("/")
        self.helm, self.cache_dir = helm, cache_dir
        self.index_ttl, self.failure_ttl = index_ttl, failure_ttl
        self.index_deadline = index_deadline
        self.access = access
        self._spec_error: str | None = None  # why --chart-version is invalid; None: not parsed
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
        self._constraint()  # VersionInvalid before any network
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

    def _constraint(self) -> None:
        """Raises VersionInvalid when --chart-version is not a version or range; parsed
        once (the flag does not change while the process runs), not on every pass."""
        if self._spec_error is None:
            try:
                parse_constraint(self.spec)
                self._spec_error = ""
            except VersionInvalid as exc:
                self._spec_error = str(exc)
        if self._spec_error:
            raise VersionInvalid(self._spec_error)

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
        # A range, an OCI tag (which can be pushed again with other content) and the update
        # notice of any chart are looked at again after index_ttl.
        return self._resolved is not None and now - self._resolved_at < self.index_ttl

    async def _load(self) -> ResolvedChart:
        if self.is_oci:
            return await self._load_oci(None)
        try:
            versions = await self._index_versions()
            version = resolve(self.spec, versions)
        except (ChartNotLoaded, VersionNotFound):
            if self._resolved is not None and is_exact(self.spec):
                return self._resolved  # a pin does not move: only its notice waits
            raise
        return dataclasses.replace(await self.fetch(version),
                                   newer=newer_than(version, versions))

    async def fetch(self, version: str) -> ResolvedChart:
        """A specific version of the chart (for reverts), pulled once and kept."""
        if self.is_oci:
            return await self._load_oci(version)
        path = self._pulled.get(version)
        if path is None:
            self.fetches += 1
            # the repository promised exactly `version`
            path = await self.helm.pull(self.name, repo=self.url, version=version,
                                        dest=self.cache_dir, expect_name=self.name,
                                        keyring=self.access.keyring,
                                        ca_file=self.access.ca_file)
            self._pulled[version] = path
        return ResolvedChart(self.repo, self.name, version, str(path))

    async def _load_oci(self, version: str | None) -> ResolvedChart:
        """The chart from its registry: `version`, or the newest tag the spec matches."""
        ref = oci.reference(self.url, self.name)
        credentials = (await self.access.credentials(ref.host)
                       if self.access.credentials is not None else None)
        async with Registry(ref.host, credentials=credentials, ca_file=self.access.ca_file,
                            plain_http=self.access.plain_http,
                            deadline=self.index_deadline) as registry:
            version, digest, archive, newer = await self._from_registry(registry, ref, version)
        pinned = bool(self.access.digest) and version == self.spec  # checked against the pin
        path = self._pulled.get(digest)
        if path is None:
            if archive is None:  # unpacked before: _pulled only grows
                raise ChartNotLoaded(f"{ref}: chart {digest} is gone from the cache")
            # named after the digest: a tag pushed again with other content is another chart
            path = await asyncio.to_thread(unpack_archive, archive, self.cache_dir,
                                           f"{ref}:{oci.tag(version)}", self.name,
                                           "@" + digest.removeprefix("sha256:")[:12])
            self._pulled[digest] = path
        return ResolvedChart(self.repo, self.name, version, str(path), digest, pinned, newer)

    async def _from_registry(self, registry: Registry, ref: oci.Reference,
                       version: str | None) -> tuple[str, str, bytes | None, str]:
        """(version, manifest digest, chart archive or None when already unpacked, the
        newer version of the update notice), each checked: the digest against the pin, the
        signature against the cosign key."""
        self.fetches += 1
        newer = ""
        if version is None:
            try:
                tags = await registry.versions(ref)
            except ChartNotLoaded:
                if not is_exact(self.spec):
                    raise
                tags = []  # a pin needs no tag list; only its update notice does
            version = self.spec if is_exact(self.spec) else resolve(self.spec, tags)
            newer = newer_than(version, tags)
        where = f"{ref}:{oci.tag(version)}"
        try:
            digest, body = await registry.manifest(ref, oci.tag(version))
        except NotInRegistry as exc:
            raise VersionNotFound(f"chart {self.name} version {version} is not in "
                                  f"{self.url}") from exc
        if self.access.digest and version == self.spec and digest != self.access.digest:
            raise ChartVerificationFailed(f"{where} is now {digest}, not the pinned "
                                          f"--chart-digest {self.access.digest}")
        if self.access.cosign_key is not None:
            await self._check_signature(registry, ref, where, digest)
        if digest in self._pulled:
            return version, digest, None, newer
        layer, _size = oci.chart_layer(oci.manifest(body, where), where)
        return version, digest, await registry.blob(ref, layer, oci.MAX_CHART), newer

    async def _check_signature(self, registry: Registry, ref: oci.Reference, where: str,
                         digest: str) -> None:
        """ChartVerificationFailed unless a cosign signature of `digest` verifies."""
        tag = oci.signature_tag(digest)
        try:
            _, body = await registry.manifest(ref, tag)
        except NotInRegistry as exc:
            raise ChartVerificationFailed(f"{where} ({digest}) has no cosign signature") from exc
        doc = oci.manifest(body, f"{ref}:{tag}")
        payloads = [(await registry.blob(ref, d, oci.MAX_MANIFEST), signature)
                    for d, signature in oci.signed_layers(doc)[:16]]
        try:
            oci.verified(self.access.cosign_key, digest, payloads)
        except ChartVerificationFailed as exc:
            raise ChartVerificationFailed(f"{where}: {exc}") from exc

    async def _index_versions(self) -> list[str]:
        """The versions of the chart in the repository's index.yaml.

        The download is bounded in size (safeyaml.CHART_INDEX) and in total time, so a huge,
        endless or trickling response fails with ChartNotLoaded instead of hanging a pass.
        A redirect is followed to the same origin, or to another host over https.
        """
        self.fetches += 1
        url, where = f"{self.url}/index.yaml", f"chart repository {self.url}"
        limit = safeyaml.CHART_INDEX.max_bytes
        tls: ssl.SSLContext | bool = ssl.create_default_context(cafile=self.access.ca_file) \
            if self.access.ca_file and url.startswith("https://") else True
        try:
            async with http.session(self.index_deadline, INDEX_READ_TIMEOUT,
                                    proxied=True) as client:
                answer = await http.fetch(client, url, limit=limit, what=f"{where}: index.yaml",
                                          tls=tls, follow=_elsewhere_over_https)
        except TemporaryError as exc:
            raise ChartNotLoaded(f"{where}: index.yaml is over the limit of {limit} bytes"
                                 if exc.reason == "AnswerTooLarge" else exc.message) from exc
        except TimeoutError as exc:
            raise ChartNotLoaded(f"{where}: index.yaml did not arrive within "
                                 f"{self.index_deadline:.0f}s") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise ChartNotLoaded(f"{where} unreachable: {exc}") from exc
        if answer.refused or not 200 <= answer.status < 300:
            raise ChartNotLoaded(f"{where}: HTTP {answer.status}"
                                 + (f": {answer.refused}" if answer.refused else ""))
        try:
            index = safeyaml.load(answer.body, safeyaml.CHART_INDEX, what="index.yaml")
        except safeyaml.YamlRejected as exc:
            raise ChartNotLoaded(f"{where}: {exc}") from exc
        return index_versions(index, self.name, self.url)


def _elsewhere_over_https(old: str, new: str) -> bool:
    """A chart repository's redirect (to a CDN, say) is followed, but never from https to
    plain HTTP: no credential goes with the index."""
    return http.same_origin(old, new) or new.startswith("https://")


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


def chart_access(settings: Any, read_secret: Callable[[str, str], Awaitable[Any]] | None
                 ) -> Access:
    """The Access of the chart flags (SPEC R6b). `read_secret(namespace, name)` reads the
    --chart-credentials-secret from the watch cluster when a fetch needs it, so a rotated
    credential is taken at the next fetch; None where no cluster is at hand. Raises
    SettingsError for a cosign key that cannot be read."""
    from krypton.decisions.clusters.discovery import secret_strings
    from krypton.decisions.errors import SettingsError
    from krypton.decisions.trust import redact

    key = None
    if settings.chart_verify and settings.chart_cosign_key:
        try:
            pem = Path(settings.chart_cosign_key).read_bytes()
        except OSError as exc:
            raise SettingsError(f"invalid --chart-cosign-key: cannot read "
                                f"{settings.chart_cosign_key}: {exc.strerror}") from exc
        key = oci.load_public_key(pem, "--chart-cosign-key")
    name, namespace = settings.chart_credentials_secret, settings.namespace

    async def credentials(host: str) -> Credentials | None:
        if not name or read_secret is None:
            return None
        secret = await read_secret(namespace, name)
        if secret is None:
            raise ChartNotLoaded(f"registry credentials Secret {namespace}/{name} not found")
        found = credentials_from_secret(secret_strings(secret), host)
        if found is None:
            raise ChartNotLoaded(f"registry credentials Secret {namespace}/{name} has no "
                                 f"username and password (or .dockerconfigjson entry) for {host}")
        redact.register(found.password, base64.b64encode(
            f"{found.username}:{found.password}".encode()).decode())
        return found

    return Access(digest=settings.chart_digest,
                  keyring=settings.chart_keyring if settings.chart_verify else "",
                  cosign_key=key, ca_file=settings.chart_ca_file,
                  plain_http=settings.chart_plain_http, credentials=credentials)
