"""Who may see what on the fleet page (SPEC O16, ``--web-auth=kubernetes``): a bearer token
is who the home cluster says it is (TokenReview), and a Tenant is shown only where that
identity may ``get`` Tenants in its namespace on the home cluster (SubjectAccessReview).
Answers are kept briefly and boundedly, and only a few questions are asked at once, so that
a page of many namespaces, or a stream of made-up tokens, costs the home cluster little.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from krypton.decisions.model import GROUP, PLURAL

TTL = 30.0  # seconds an answer of the home cluster is believed
SIZE = 1024  # answers kept at most (tokens, and identity x namespace)
AT_ONCE = 4  # questions asked of the home cluster at once
EVERY_NAMESPACE = ""
# the rollout's controls (F9) as verbs of krypton's own on a resource of its own, which RBAC
# grants like any other: `apiGroups: [mesh.openkcm.io], resources: [rollouts], verbs: [...]`
ROLLOUTS = "rollouts"
CONTROLS = ("approve", "pause", "resume", "abort")

V = TypeVar("V")


class Reviewer(Protocol):
    """The home cluster's answers (:class:`krypton.adapters.kube.Kube` gives them)."""

    async def review_token(self, token: str) -> Mapping[str, Any] | None: ...

    async def may(self, user: Mapping[str, Any], verb: str, group: str, resource: str,
                  namespace: str) -> bool: ...


@dataclass(frozen=True)
class Identity:
    """A person (or program) as the home cluster named them."""

    name: str
    user: Mapping[str, Any]  # the TokenReview's userInfo, as asked with again
    key: str  # what answers about them are kept under


class Expiring(Generic[V]):
    """At most `size` answers, each for `ttl` seconds; the oldest goes first."""

    def __init__(self, size: int, ttl: float, clock: Callable[[], float]) -> None:
        self.size, self.ttl, self.clock = size, ttl, clock
        self._kept: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: str) -> tuple[bool, V | None]:
        kept = self._kept.get(key)
        if kept is None or kept[0] <= self.clock():
            self._kept.pop(key, None)
            return False, None
        return True, kept[1]

    def put(self, key: str, value: V) -> None:
        self._kept.pop(key, None)
        self._kept[key] = (self.clock() + self.ttl, value)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)


def bearer(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ("" without one)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Access:
    """The page's doorkeeper, asking the home cluster that `reviewer` gives (None while the
    operator has not reached it: :class:`Unanswered`)."""

    def __init__(self, reviewer: Callable[[], Reviewer | None], *, ttl: float = TTL,
                 size: int = SIZE, at_once: int = AT_ONCE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._reviewer = reviewer
        self._tokens: Expiring[Identity | None] = Expiring(size, ttl, clock)
        self._allowed: Expiring[bool] = Expiring(size, ttl, clock)
        self._asking = asyncio.Semaphore(at_once)
        self.questions = 0  # asked of the home cluster, for the tests and the bench

    def kept(self) -> int:
        return len(self._tokens) + len(self._allowed)

    def _home(self) -> Reviewer:
        reviewer = self._reviewer()
        if reviewer is None:
            raise Unanswered("the operator has not reached its home cluster yet")
        return reviewer

    async def identity(self, authorization: str) -> Identity | None:
        """Who the request's Authorization header says, as the home cluster knows them; None
        without a token or for one the home cluster does not take."""
        token = bearer(authorization)
        if not token:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        known, who = self._tokens.get(key)
        if known:
            return who
        async with self._asking:
            self.questions += 1
            user = await self._home().review_token(token)
        who = None if user is None else Identity(
            str(user["username"]), user,
            hashlib.sha256(json.dumps(user, sort_keys=True).encode()).hexdigest())
        self._tokens.put(key, who)
        return who

    async def may(self, who: Identity, verb: str, resource: str, namespace: str) -> bool:
        """Whether `who` may `verb` krypton's `resource` in `namespace` on the home cluster."""
        key = f"{who.key}/{verb}/{resource}/{namespace}"
        known, allowed = self._allowed.get(key)
        if known:
            return bool(allowed)
        async with self._asking:
            self.questions += 1
            allowed = await self._home().may(who.user, verb, GROUP, resource, namespace)
        self._allowed.put(key, allowed)
        return allowed

    async def _may_get(self, who: Identity, namespace: str) -> bool:
        return await self.may(who, "get", PLURAL, namespace)

    async def namespaces(self, who: Identity, namespaces: Iterable[str]) -> set[str]:
        """Those of `namespaces` whose Tenants `who` may see: all of them when they may get
        Tenants in every namespace, else each one asked."""
        wanted = set(namespaces)
        if not wanted or await self._may_get(who, EVERY_NAMESPACE):
            return wanted
        ordered = sorted(wanted)
        answers = await asyncio.gather(*(self._may_get(who, ns) for ns in ordered))
        return {ns for ns, allowed in zip(ordered, answers, strict=True) if allowed}


class Unanswered(Exception):
    """The home cluster could not be asked; the page answers 503, nothing is kept."""
