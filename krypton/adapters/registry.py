"""A client of the OCI distribution API for charts (SPEC R6b): tags, manifests and blobs,
with the registry's basic or token authentication, on the event loop (krypton's HTTP client,
:mod:`krypton.adapters.http`). Every answer is bounded in size and time, and what it fetches
by digest is checked against that digest before anyone sees it.

Credentials are sent only to the registry named by the reference (and to the token service
that registry's own challenge names, over TLS unless the registry itself is plain HTTP);
no message here or in an error ever contains them.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType

import aiohttp

from krypton.adapters import http
from krypton.decisions.charts import oci
from krypton.decisions.errors import ChartNotLoaded, TemporaryError

READ_TIMEOUT = 15.0  # one read from the socket
DEADLINE = 60.0  # one whole response
MAX_TAGS = 1 << 20  # bytes of a whole tag list, all its pages together: 70,000 versions
MAX_PAGES = 50


class NotInRegistry(ChartNotLoaded):
    """The registry has no such repository, tag or blob (HTTP 404)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>)"


def _follow(old: str, new: str) -> bool:
    """A redirect to the same origin; a blob's (registries send blobs to storage, and a blob
    is checked against its digest) also to another host, never from https to http. The
    Authorization header goes only to the same origin: a credential is never carried to
    another host (SPEC S3)."""
    if http.same_origin(old, new):
        return True
    was, now = urllib.parse.urlsplit(old), urllib.parse.urlsplit(new)
    return "/blobs/" in was.path and now.scheme in (was.scheme, "https")


class Registry:
    """One registry host, as the operator or the CLI reaches it."""

    def __init__(self, host: str, *, credentials: Credentials | None = None,
                 ca_file: str = "", plain_http: bool = False,
                 deadline: float = DEADLINE) -> None:
        self.host, self.credentials, self.deadline = host, credentials, deadline
        self.scheme = "http" if plain_http else "https"
        self._tls: ssl.SSLContext | bool = False if plain_http else \
            ssl.create_default_context(cafile=ca_file or None)
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._client: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Registry:
        self._client = http.session(self.deadline, READ_TIMEOUT, proxied=True)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def versions(self, ref: oci.Reference) -> list[str]:
        """The chart versions among the repository's tags, following the API's pagination:
        at most MAX_TAGS bytes of tag lists in all, no page twice (a list that links to
        itself), and of each page only its versions kept."""
        found: list[str] = []
        url = f"{self._base(ref)}/tags/list?n=1000"
        seen, left = set(), MAX_TAGS
        for _ in range(MAX_PAGES):
            if url in seen:
                raise ChartNotLoaded(f"{ref}: the tag list links back to a page already read")
            seen.add(url)
            body, headers = await self._get(ref, url, accept="application/json", limit=left)
            left -= len(body)
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise ChartNotLoaded(f"{ref}: the tag list is not JSON") from exc
            found += oci.versions((doc.get("tags") if isinstance(doc, dict) else None) or [])
            del doc
            link = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', headers.get("Link") or "")
            if not link:
                return found
            url = urllib.parse.urljoin(url, link.group(1))
            if urllib.parse.urlsplit(url).netloc != self.host:
                raise ChartNotLoaded(f"{ref}: the tag list points at another host")
        raise ChartNotLoaded(f"{ref}: the tag list has over {MAX_PAGES} pages")

    async def manifest(self, ref: oci.Reference, reference: str) -> tuple[str, bytes]:
        """(digest, body) of the manifest tagged `reference`, or with that digest (checked)."""
        body, headers = await self._get(ref, f"{self._base(ref)}/manifests/{reference}",
                                  accept=", ".join(oci.MANIFEST_TYPES), limit=oci.MAX_MANIFEST)
        digest = oci.digest_of(body)
        if reference.startswith("sha256:") and digest != reference:
            raise ChartNotLoaded(f"{ref}: the manifest served for {reference} has digest {digest}")
        told = headers.get("Docker-Content-Digest")
        if told and told != digest:
            raise ChartNotLoaded(f"{ref}@{reference}: the registry says digest {told[:80]}, "
                                 f"the manifest is {digest}")
        return digest, body

    async def blob(self, ref: oci.Reference, digest: str, limit: int) -> bytes:
        """The blob with `digest`, checked against it."""
        body, _ = await self._get(ref, f"{self._base(ref)}/blobs/{digest}",
                            accept="application/octet-stream", limit=limit)
        if oci.digest_of(body) != digest:
            raise ChartNotLoaded(f"{ref}: blob {digest} does not match its digest")
        return body

    def _base(self, ref: oci.Reference) -> str:
        return f"{self.scheme}://{self.host}/v2/{ref.repository}"

    async def _get(self, ref: oci.Reference, url: str, *, accept: str,
                   limit: int) -> tuple[bytes, Mapping[str, str]]:
        scope = f"repository:{ref.repository}:pull"
        answer = await self._fetch(url, accept, limit, self._tokens.get(scope))
        if answer.status == 401:
            auth = await self._authorize(ref, answer.headers.get("WWW-Authenticate") or "",
                                         scope)
            answer = await self._fetch(url, accept, limit, auth)
        if answer.refused or not 200 <= answer.status < 300:
            raise _failed(ref, answer)
        return answer.body, answer.headers

    async def _authorize(self, ref: oci.Reference, challenge: str, scope: str) -> str:
        """The Authorization header the registry's challenge asks for."""
        kind, _, params = challenge.partition(" ")
        if kind.lower() == "basic":
            if self.credentials is None:
                raise ChartNotLoaded(f"registry {self.host} asks for credentials and none "
                                     "are configured (--chart-credentials-secret)")
            return _basic(self.credentials)
        if kind.lower() != "bearer":
            raise ChartNotLoaded(f"registry {self.host}: unsupported authentication "
                                 f"{kind[:40]!r}")
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.get("realm", "")
        split = urllib.parse.urlsplit(realm)
        same_host = split.scheme == self.scheme and split.netloc == self.host
        if not split.netloc or (split.scheme != "https" and not same_host):
            # credentials go in clear text only to the plain-HTTP registry itself
            raise ChartNotLoaded(f"registry {self.host}: token service {realm[:80]!r} "
                                 "is not an https URL")
        query = {"service": fields.get("service", ""), "scope": fields.get("scope", scope)}
        url = f"{realm}?{urllib.parse.urlencode(query)}"
        answer = await self._fetch(url, "application/json", 1 << 20,
                                   _basic(self.credentials) if self.credentials else None)
        if answer.refused or not 200 <= answer.status < 300:
            raise _failed(ref, answer, what=f"token service of registry {self.host}")
        try:
            doc = json.loads(answer.body)
            token = doc.get("token") or doc.get("access_token")
        except (ValueError, AttributeError, RecursionError) as exc:
            raise ChartNotLoaded(f"registry {self.host}: the token service's answer is "
                                 "not a token") from exc
        if not isinstance(token, str) or not token:
            raise ChartNotLoaded(f"registry {self.host}: the token service gave no token")
        self._tokens[scope] = f"Bearer {token}"
        return self._tokens[scope]

    async def _fetch(self, url: str, accept: str, limit: int, auth: str | None) -> http.Answer:
        assert self._client is not None, "a Registry is used in `async with`"
        headers = {"Accept": accept, **({"Authorization": auth} if auth else {})}
        what = f"registry {self.host}: an answer"
        try:
            return await http.fetch(self._client, url, headers=headers, limit=limit, what=what,
                                    tls=self._tls, follow=_follow)
        except TemporaryError as exc:  # over its bound, or redirected too often
            raise ChartNotLoaded(f"{what} is over the limit of {limit} bytes"
                                 if exc.reason == "AnswerTooLarge" else exc.message) from exc
        except TimeoutError as exc:
            raise ChartNotLoaded(f"{what} did not arrive within {self.deadline:.0f}s") from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise ChartNotLoaded(f"registry {self.host} unreachable: {exc}") from exc


def _basic(credentials: Credentials) -> str:
    raw = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def _failed(ref: oci.Reference, answer: http.Answer, what: str = "") -> ChartNotLoaded:
    where = what or f"registry {ref.host}"
    if answer.refused:
        return ChartNotLoaded(f"{where}: HTTP {answer.status} for {ref}: {answer.refused}")
    if answer.status in (401, 403):
        return ChartNotLoaded(f"{where} refused the credentials for {ref} "
                              f"(HTTP {answer.status})")
    if answer.status == 404:
        return NotInRegistry(f"{ref}: not found in registry {ref.host} (HTTP 404)")
    return ChartNotLoaded(f"{where}: HTTP {answer.status} for {ref}")


def credentials_from_secret(data: dict[str, str], host: str) -> Credentials | None:
    """Registry credentials from a Secret's decoded data: ``username`` and ``password``
    keys, or a ``.dockerconfigjson`` with an entry for `host`. None if it has neither."""
    if data.get("username") and data.get("password"):
        return Credentials(data["username"], data["password"])
    raw = data.get(".dockerconfigjson")
    if not raw:
        return None
    try:
        auths = json.loads(raw).get("auths") or {}
    except (ValueError, AttributeError, RecursionError):
        return None
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        name = urllib.parse.urlsplit(key if "//" in key else f"//{key}").netloc
        if name != host or not isinstance(entry, dict):
            continue
        if entry.get("username") and entry.get("password"):
            return Credentials(str(entry["username"]), str(entry["password"]))
        if isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return Credentials(user, password) if user and password else None
    return None
