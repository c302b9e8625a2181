"""Health rules in CEL for the custom resources a chart installs (F8, SPEC F6). Pure.

The rules are the operator admin's, Flux-shaped: one per apiVersion and kind, with a
`current` expression (required) and optional `inProgress` and `failed` ones, each over the
object's top-level fields (``apiVersion``, ``kind``, ``metadata``, ``spec``, ``status``):

    - apiVersion: cert-manager.io/v1
      kind: Certificate
      failed: status.?conditions.orValue([]).exists(c, c.type == 'Ready' && c.status == 'False')
      current: status.?conditions.orValue([]).exists(c, c.type == 'Ready' && c.status == 'True')

An object of that kind is judged in the order inProgress, failed, current: the first that is
true says it (in progress, failed, ready); none true is "not current yet"; an expression that
cannot be evaluated (a field the object lacks, a value that is not a boolean) says why, and
the object is not ready. The kinds krypton has rules of its own for (Deployment, Job, ...)
keep them: a rule for one is refused at start.

Expressions are compiled once, at start: one that does not compile is a settings error
(exit 2). They run in Google's CEL (cel-cpp, through ``cel-expr-python``): no side effects,
no loops but comprehensions, and every evaluation stopped by CEL's iteration budget, so a
rule over an object costs at most that budget, however the object or the rule is made.
The library is imported only when there are rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from krypton.decisions.errors import SettingsError

FIELDS = ("inProgress", "failed", "current")  # the order they are evaluated in
VARIABLES = ("apiVersion", "kind", "metadata", "spec", "status")
MAX_RULES = 256
MAX_EXPRESSION = 4096  # characters of one expression


@dataclass(frozen=True)
class Rule:
    api_version: str
    kind: str
    expressions: tuple[tuple[str, str, Any], ...]  # (field, source, compiled), in FIELDS order

    def judge(self, obj: Mapping[str, Any]) -> str | None:
        """Why `obj` is not ready by this rule, or None when it is current."""
        data = {name: obj.get(name) or {} for name in VARIABLES}
        for name, source, program in self.expressions:
            try:
                value = program.eval(data=data)
                result = value.value()
                failed = value.type().name().upper() == "ERROR"
            except RuntimeError as exc:  # the iteration budget, among others
                result, failed = str(exc), True
            if failed or not isinstance(result, bool):
                what = result if failed else f"{type(result).__name__}, not a boolean"
                return f"health rule {name} not evaluated: {_short(str(what))}"
            if result:
                return None if name == "current" else \
                    ("in progress" if name == "inProgress" else f"failed ({source})")
        return "not current yet"


@dataclass(frozen=True)
class HealthRules:
    """The compiled rules, by apiVersion and kind; empty when none are configured."""

    rules: Mapping[tuple[str, str], Rule] = field(default_factory=dict)

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(kind for _, kind in self.rules)

    def find(self, api_version: str, kind: str) -> Rule | None:
        return self.rules.get((api_version, kind)) if self.rules else None


def _short(text: str) -> str:
    return text if len(text) <= 200 else text[:200] + "..."


def compile_rules(doc: Any, what: str, builtin: frozenset[str]) -> HealthRules:
    """The rules of `doc` (a list of rule mappings, as read from `what`), compiled; raises
    SettingsError naming the rule and field of the first problem. `builtin`: the kinds
    krypton judges itself."""
    if doc is None:
        return HealthRules()
    if not isinstance(doc, list) or len(doc) > MAX_RULES:
        raise SettingsError(f"{what}: a list of at most {MAX_RULES} rules is expected")
    rules: dict[tuple[str, str], Rule] = {}
    env = None
    for i, item in enumerate(doc):
        where = f"{what}: rule {i + 1}"
        if not isinstance(item, dict):
            raise SettingsError(f"{where} is not a mapping")
        unknown = set(item) - {"apiVersion", "kind", *FIELDS}
        if unknown:
            raise SettingsError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        api_version, kind = item.get("apiVersion"), item.get("kind")
        if not (isinstance(api_version, str) and api_version and isinstance(kind, str) and kind):
            raise SettingsError(f"{where}: apiVersion and kind are required")
        where = f"{where} ({api_version} {kind})"
        if kind in builtin:
            raise SettingsError(f"{where}: krypton judges {kind} itself; rules are for the "
                                "chart's custom resources")
        if (api_version, kind) in rules:
            raise SettingsError(f"{where}: a second rule for the same kind")
        if not item.get("current"):
            raise SettingsError(f"{where}: current is required")
        if env is None:
            env = _environment()
        compiled = []
        for name in FIELDS:
            source = item.get(name)
            if source is None:
                continue
            if not isinstance(source, str) or not source.strip() or len(source) > MAX_EXPRESSION:
                raise SettingsError(f"{where}: {name} must be an expression of at most "
                                    f"{MAX_EXPRESSION} characters")
            try:
                compiled.append((name, source, env.compile(source)))
            except Exception as exc:  # noqa: BLE001 - the library's compile errors vary
                raise SettingsError(f"{where}: {name} does not compile: "
                                    f"{_short(str(exc))}") from None
        rules[(api_version, kind)] = Rule(api_version, kind, tuple(compiled))
    return HealthRules(rules)


def _environment() -> Any:
    """CEL with optional field access (``status.?conditions.orValue([])``) and the string
    functions, as the rules Flux users write expect."""
    # 11 MiB of native code: imported only when there are rules
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_optional, ext_strings

    return cel.NewEnv(variables={name: cel.Type.DYN for name in VARIABLES},
                      extensions=[ext_optional.ExtOptional(), ext_strings.ExtStrings()])
