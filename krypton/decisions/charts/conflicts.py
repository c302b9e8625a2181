"""Helm 4's field conflicts, read from its error text (SPEC H2). Pure.

Helm 4 applies with server-side apply. When another field manager (``kubectl scale``, a
``kubectl patch``, an autoscaler) owns a field that the next apply sets, the API server
refuses it, and helm says so in the API server's words::

    conflict occurred while applying object t1/web apps/v1, Kind=Deployment: Apply failed
    with 1 conflict: conflict with "kubectl-scale" using apps/v1: .spec.replicas

(several fields of one manager come as ``conflicts with "m" using v1:`` and a list of
``- .field`` lines). :func:`parse` turns that into (object, manager, field) triples, so that
an Event can name what was taken over and a condition what blocks the upgrade.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_OBJECT = re.compile(r"conflict occurred while applying object (?P<name>\S+) "
                     r"(?P<gv>\S*), Kind=(?P<kind>\w+)")
_MANAGER = re.compile(r'conflicts? with "(?P<manager>[^"]+)"(?: using \S+?)?(?=:)')
_FIELD = re.compile(r"(?m)(?:^- |^|: )(\.\S+)")  # ": .a.b" after the manager, or "- .a.b" lines


@dataclass(frozen=True)
class Conflict:
    object: str  # "Deployment t1/web"
    manager: str  # "kubectl-scale"
    field: str  # ".spec.replicas"


def parse(message: str) -> list[Conflict]:
    """Every conflict helm's error names; empty when it names none."""
    found: list[Conflict] = []
    # helm 4 says it twice: in a log line (quotes escaped) and on its Error: line
    message = "\n".join(ln for ln in message.splitlines() if not ln.startswith("level="))
    objects = list(_OBJECT.finditer(message))
    for i, obj in enumerate(objects):
        end = objects[i + 1].start() if i + 1 < len(objects) else len(message)
        part = message[obj.end():end]
        what = f"{obj['kind']} {obj['name']}"
        managers = list(_MANAGER.finditer(part))
        for j, manager in enumerate(managers):
            stop = managers[j + 1].start() if j + 1 < len(managers) else len(part)
            for field in _FIELD.findall(part[manager.end():stop]):
                conflict = Conflict(what, manager["manager"], field)
                if conflict not in found:
                    found.append(conflict)
    return found


def describe(conflicts: list[Conflict], limit: int = 8) -> str:
    """``Deployment t1/web .spec.replicas (kubectl-scale); ...`` for a message."""
    shown = "; ".join(f"{c.object} {c.field} ({c.manager})" for c in conflicts[:limit])
    more = f" (and {len(conflicts) - limit} more)" if len(conflicts) > limit else ""
    return shown + more


_LOGFMT = re.compile(r'^level=\w+ msg=(?:"[^"]*"|\S+)(?P<rest>.*)$')
_ERROR_FIELD = re.compile(r'\berror="(?P<error>(?:[^"\\]|\\.)*)"')


def reduce_log_lines(lines: list[str]) -> list[str]:
    """Helm 4's structured log lines (``level=WARN msg="upgrade failed" name=x
    error="..."``) reduced to their error, and dropped when another line already says it."""
    out = []
    for line in lines:
        log = _LOGFMT.match(line)
        if log is None:
            out.append(line)
            continue
        error = _ERROR_FIELD.search(log["rest"])
        if error is None:
            continue
        text = error["error"].replace('\\"', '"')
        if not any(text in other for other in lines if other is not line):
            out.append(text)
    return out


# -- a preview from the live object, for `krypton diff` ------------------------------------

Path = tuple[str, ...]  # fieldsV1 keys: "f:spec", "k:{\"name\":\"web\"}", ...


def _leaves(value: Any, path: Path = ()) -> list[tuple[Path, Any]]:
    """The fields a manifest sets, as fieldsV1 paths with their values: maps by key, lists
    of named items by their name (containers, env, volumes), other lists whole."""
    if isinstance(value, dict) and value:
        out = []
        for key, inner in value.items():
            out += _leaves(inner, (*path, f"f:{key}"))
        return out
    if isinstance(value, list) and value and all(
            isinstance(v, dict) and "name" in v for v in value):
        out = []
        for item in value:
            key = "k:" + json.dumps({"name": item["name"]}, separators=(",", ":"))
            out += _leaves({k: v for k, v in item.items() if k != "name"}, (*path, key))
        return out
    return [(path, value)]


def _owned(fields: Any, path: Path = ()) -> set[Path]:
    """The leaf paths of a managedFields entry's fieldsV1."""
    if not isinstance(fields, dict):
        return set()
    found = set()
    for key, inner in fields.items():
        if key == ".":
            continue
        here = (*path, key)
        below = _owned(inner, here)
        found |= below or {here}
    return found


def _value(obj: Any, path: Path) -> Any:
    for key in path:
        kind, _, name = key.partition(":")
        if kind == "f" and isinstance(obj, dict):
            obj = obj.get(name)
        elif kind == "k" and isinstance(obj, list):
            want = json.loads(name)
            obj = next((i for i in obj if isinstance(i, dict)
                        and all(i.get(k) == v for k, v in want.items())), None)
        else:
            return None
    return obj


def _shown(path: Path) -> str:
    out = ""
    for key in path:
        kind, _, name = key.partition(":")
        if kind == "f":
            out += f".{name}"
        else:
            out += "[" + ",".join(f'{k}="{v}"' for k, v in json.loads(name).items()) + "]"
    return out


def owned_elsewhere(desired: dict[str, Any], live: dict[str, Any] | None,
                    own: str = "helm") -> list[Conflict]:
    """The fields `desired` (a rendered object) sets to a value the live object does not
    have, and that a field manager other than `own` (helm's) owns there: what Helm 4's next
    server-side apply would meet as conflicts."""
    if not live:
        return []
    meta = live.get("metadata") or {}
    namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
    what = f"{live.get('kind')} {namespace}{meta.get('name')}"
    others: list[tuple[str, set[Path]]] = [
        (str(m.get("manager")), _owned(m.get("fieldsV1")))
        for m in meta.get("managedFields") or [] if m.get("manager") != own]
    found = []
    for path, value in _leaves({k: v for k, v in desired.items()
                                if k not in ("apiVersion", "kind", "metadata", "status")}):
        if _value(live, path) == value:
            continue
        for manager, owned in others:
            if any(path[:len(p)] == p for p in owned):
                found.append(Conflict(what, manager, _shown(path)))
    return found
