"""Bounded YAML loading for input krypton does not control (SPEC D4, F3, R6; issue: alias bombs).

``yaml.safe_load`` happily builds a 400-byte "billion laughs" document: the aliases share
nodes while loading, but anything that walks the result (the fingerprint's canonical JSON,
helm's values file) expands it to gigabytes. Here a document is composed first (the node
graph, with aliases still shared), its *expanded* size and depth are counted without
expanding it, and only a document within the limits is constructed. Input over the byte
limit is refused before parsing.

Every refusal is a :class:`YamlRejected` with a message that names the limit, never the
content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

try:  # libyaml's parser is ~10x faster; fall back to the pure-Python one where it is absent
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


class YamlRejected(ValueError):
    """The document is not valid YAML or exceeds a limit."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_nodes: int  # scalars + collections after alias expansion
    max_depth: int = 64


KUBECONFIG = Limits(max_bytes=1 << 20, max_nodes=20_000)
VALUES = Limits(max_bytes=1 << 20, max_nodes=100_000)
CHART_INDEX = Limits(max_bytes=32 << 20, max_nodes=5_000_000, max_depth=16)
CHART_METADATA = Limits(max_bytes=1 << 20, max_nodes=20_000)
CHART_CRDS = Limits(max_bytes=8 << 20, max_nodes=2_000_000)  # one file of a chart's crds/


def load(text: str | bytes, limits: Limits, *, what: str = "document") -> Any:
    """Parse one YAML document within `limits`; raises YamlRejected."""
    size = len(text.encode("utf-8", "replace") if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise YamlRejected(f"{what} is {size} bytes, over the limit of {limits.max_bytes}")
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise YamlRejected(f"{what} is not valid YAML{_where(exc)}") from exc
        if node is None:
            return None
        _check_size(node, limits, what)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise YamlRejected(f"{what} is not valid YAML{_where(exc)}") from exc
    except RecursionError as exc:
        raise YamlRejected(f"{what} is nested too deeply") from exc
    finally:
        loader.dispose()


def load_all(text: str | bytes, limits: Limits, *, what: str = "document") -> list[Any]:
    """Every document of a YAML stream, the stream within `limits` as a whole (size) and each
    document within them (nodes, depth); raises YamlRejected."""
    size = len(text.encode("utf-8", "replace") if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise YamlRejected(f"{what} is {size} bytes, over the limit of {limits.max_bytes}")
    loader = _Loader(text)
    out = []
    try:
        try:
            while loader.check_node():
                node = loader.get_node()
                if node is None:
                    continue
                _check_size(node, limits, what)
                out.append(loader.construct_document(node))
        except yaml.YAMLError as exc:
            raise YamlRejected(f"{what} is not valid YAML{_where(exc)}") from exc
    except RecursionError as exc:
        raise YamlRejected(f"{what} is nested too deeply") from exc
    finally:
        loader.dispose()
    return out


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _check_size(root: yaml.Node, limits: Limits, what: str) -> None:
    """Count the nodes the document expands to (aliases counted at every use), iteratively.

    A node's expanded size is memoised by identity, so a shared subtree is walked once
    however often it is referenced: the cost is linear in the composed graph.
    """
    sizes: dict[int, int] = {}
    # (node, depth, children-done) frames of an explicit post-order walk
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        ident = id(node)
        if done:
            on_path.discard(ident)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > limits.max_nodes:
                raise YamlRejected(f"{what} expands to more than {limits.max_nodes} nodes "
                                   "(YAML aliases are counted at every use)")
            sizes[ident] = total
            continue
        if ident in sizes:
            continue
        if ident in on_path:
            raise YamlRejected(f"{what} contains a recursive alias")
        if depth > limits.max_depth:
            raise YamlRejected(f"{what} is nested deeper than {limits.max_depth} levels")
        on_path.add(ident)
        stack.append((node, depth, True))
        for child in _children(node):
            if id(child) not in sizes:
                stack.append((child, depth + 1, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_values(text: str | bytes, *, what: str) -> dict[str, Any]:
    """Helm values: a mapping (or nothing), within the VALUES limits; raises YamlRejected."""
    data = load(text, VALUES, what=what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlRejected(f"{what} is not a YAML mapping")
    return data
