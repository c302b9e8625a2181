"""Chart version pins and ranges (SPEC R6), in the constraint syntax Helm uses. Pure.

A version is either an exact semver (``1.2.3``, ``v1.2.3``) or a range: comparisons
(``>=1.2 <2``), tilde (``~1.2``), caret (``^1.2``), wildcards (``1.2.x``, ``1.*``), hyphen
ranges (``1.0 - 1.4``), with ``,``/space meaning AND and ``||`` meaning OR. A range resolves
to the newest matching version; pre-releases only match when the constraint names one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import semver

from krypton.decisions.errors import VersionInvalid, VersionNotFound

_PARTIAL = re.compile(r"^v?(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-([0-9A-Za-z.-]+))?"
                      r"(?:\+[0-9A-Za-z.-]+)?$")
_OPS = ("<=", ">=", "!=", "=>", "=<", "<", ">", "=", "~>", "~", "^")

Check = Callable[[semver.Version], bool]


MAX_SPEC = 256  # longer constraints or versions are refused before parsing


def parse_version(text: str) -> semver.Version:
    """A full semver (leading ``v`` allowed); raises VersionInvalid."""
    if len(text) > MAX_SPEC:
        raise VersionInvalid(f"version is {len(text)} characters long (at most {MAX_SPEC})")
    try:
        return semver.Version.parse(text[1:] if text.startswith("v") else text)
    except ValueError as exc:
        raise VersionInvalid(f"{text!r} is not a semantic version") from exc


def is_exact(spec: str) -> bool:
    """True when `spec` names one version rather than a range."""
    try:
        parse_version(spec.strip())
        return True
    except VersionInvalid:
        return False


@dataclass(frozen=True)
class _Partial:
    major: int | None
    minor: int | None
    patch: int | None
    pre: str | None

    def floor(self) -> semver.Version:
        return semver.Version(self.major or 0, self.minor or 0, self.patch or 0, self.pre)


def _partial(text: str, spec: str) -> _Partial:
    m = _PARTIAL.match(text)
    if not m:
        raise VersionInvalid(f"{spec!r} is not a valid version or range (at {text!r})")

    def num(part: str | None) -> int | None:
        return None if part is None or part in "xX*" else int(part)

    major, minor, patch = num(m.group(1)), num(m.group(2)), num(m.group(3))
    if major is None:
        minor = patch = None
    elif minor is None:
        patch = None
    return _Partial(major, minor, patch, m.group(4))


def _bump(p: _Partial) -> semver.Version:
    """The smallest version above every version the partial `p` covers."""
    if p.major is None:
        return semver.Version(10**9, 0, 0)
    if p.minor is None:
        return semver.Version(p.major + 1, 0, 0)
    if p.patch is None:
        return semver.Version(p.major, p.minor + 1, 0)
    return semver.Version(p.major, p.minor, p.patch + 1)


def _between(low: semver.Version, high: semver.Version) -> Check:
    return lambda v: low <= v < high


def _clause(term: str, spec: str) -> Check:
    op = next((o for o in _OPS if term.startswith(o)), "")
    p = _partial(term[len(op):].strip(), spec)
    low = p.floor()
    if op in ("", "="):
        if p.patch is not None:
            return lambda v: v == low
        return _between(low, _bump(p))
    if op == "!=":
        if p.patch is not None:
            return lambda v: v != low
        high = _bump(p)
        return lambda v: not (low <= v < high)
    if op == ">":
        if p.patch is None:
            above = _bump(p)
            return lambda v: v >= above
        return lambda v: v > low
    if op in (">=", "=>"):
        return lambda v: v >= low
    if op == "<":
        return lambda v: v < low
    if op in ("<=", "=<"):
        high = _bump(p)
        return (lambda v: v < high) if p.patch is None else (lambda v: v <= low)
    if op in ("~", "~>"):
        if p.minor is None:
            return _between(low, _bump(p))
        return _between(low, semver.Version(p.major or 0, p.minor + 1, 0))
    # caret: compatible with the leftmost non-zero component
    if p.major:
        return _between(low, semver.Version(p.major + 1, 0, 0))
    if p.minor:
        return _between(low, semver.Version(0, p.minor + 1, 0))
    if p.minor is None:
        return _between(low, semver.Version(1, 0, 0))
    if p.patch is None:
        return _between(low, semver.Version(0, 1, 0))
    return _between(low, semver.Version(0, 0, p.patch + 1))


def _normalise(group: str) -> list[str]:
    group = re.sub(r"\s*(<=|>=|!=|=>|=<|~>|<|>|=|~|\^)\s*", r" \1", group.strip())
    group = re.sub(r"\s+-\s+", " - ", group)
    tokens = [t for t in re.split(r"[\s,]+", group) if t]
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if i + 2 < len(tokens) and tokens[i + 1] == "-":
            out.append(f">={tokens[i]}")
            out.append(f"<={tokens[i + 2]}")
            i += 3
            continue
        tok = tokens[i]
        if tok in _OPS and i + 1 < len(tokens):
            tok, i = tok + tokens[i + 1], i + 1
        out.append(tok)
        i += 1
    return out


@dataclass(frozen=True)
class Constraint:
    """A parsed version constraint; `allows` tests one version."""

    spec: str
    groups: tuple[tuple[Check, ...], ...]
    wants_prerelease: bool

    def allows(self, version: semver.Version) -> bool:
        if version.prerelease and not self.wants_prerelease:
            return False
        return any(all(check(version) for check in group) for group in self.groups)


def parse_constraint(spec: str) -> Constraint:
    """Parse a pin or range; raises VersionInvalid with the reason."""
    if not spec or not spec.strip():
        raise VersionInvalid("empty chart version")
    if len(spec) > MAX_SPEC:
        raise VersionInvalid(f"chart version constraint is {len(spec)} characters long "
                             f"(at most {MAX_SPEC})")
    groups = []
    for group in spec.split("||"):
        terms = _normalise(group)
        if not terms:
            raise VersionInvalid(f"{spec!r} has an empty alternative")
        groups.append(tuple(_clause(term, spec) for term in terms))
    return Constraint(spec, tuple(groups), "-" in spec.replace(" - ", " "))


def resolve(spec: str, available: Iterable[str]) -> str:
    """The newest version in `available` that `spec` allows, as spelled in `available`.

    Raises VersionInvalid for a malformed spec and VersionNotFound when nothing matches.
    """
    constraint = parse_constraint(spec)
    found = _newest(available, constraint.allows)
    if not found:
        raise VersionNotFound(f"no version matching {spec!r}")
    return found


def newer_than(version: str, available: Iterable[str]) -> str:
    """The newest version in `available` above `version` (as spelled there), "" when none
    is: the update notice of a chart whose settings do not take it (F8). A pre-release
    counts only when `version` is one itself."""
    try:
        current = parse_version(version)
    except VersionInvalid:
        return ""
    return _newest(available, lambda v: v > current and
                   (not v.prerelease or bool(current.prerelease)))


def _newest(available: Iterable[str], wanted: Callable[[semver.Version], bool]) -> str:
    """The newest version in `available` that is `wanted`, as spelled there ("": none); what
    is not a version is left out."""
    best: tuple[semver.Version, str] | None = None
    for text in available:
        try:
            version = parse_version(text)
        except VersionInvalid:
            continue
        if wanted(version) and (best is None or version > best[0]):
            best = (version, text)
    return "" if best is None else best[1]
