"""Progressive rollout of a fleet-wide change (SPEC F1): the pure part.

A *target* is the central chart reference at its resolved version with the central values;
when it changes, clusters move to it in waves: the canary clusters first, then the others
(sorted by name) at most `max_parallel` at a time. A wave is done when every Tenant of its
clusters is Ready on the new fingerprint, or failed within the wave's failure budget, and it
has stayed so for `soak` seconds. The rollout halts when a wave has more failures than its
budget (`max_failures`: a count, or a share of the wave, in releases or in clusters), or when
the wave misses its deadline; clusters not reached yet stay on the old version. Unreachable
clusters are
reported and skipped; they catch up once the rollout is complete. A new target supersedes
any previous rollout, halted or not.

`evaluate` is a pure function from (state, per-cluster observations, now) to the new state;
the controller in rollout_controller.py does the I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from krypton.decisions import windows
from krypton.decisions.model import RolloutGate
from krypton.decisions.readiness.health import UNHEALTHY
from krypton.decisions.rollouts import gates
from krypton.decisions.rollouts.gates import GatePolicy
from krypton.decisions.settings import Settings

PROGRESSING, HALTED, COMPLETE = "Progressing", "Halted", "Complete"
CONFIGMAP = "krypton-rollout"  # holds the state as state.json, in the discovery namespace
FORMAT = 2  # of the state: 2 with rollout control (F9); a state without one is of format 1
APPROVALS = ("none", "every-wave", "after-canaries")  # --rollout-approval
PAST = 5  # rollouts kept in the history besides the current one


@dataclass(frozen=True)
class Policy:
    canaries: tuple[str, ...] = ()
    max_parallel: int = 0  # 0: one wave with every non-canary cluster
    max_failures: str = "0"  # a count ("2") or a share of the wave ("25%")
    failure_unit: str = "releases"  # or "clusters": those with a failed or degraded release
    wave_deadline: float = 600.0
    soak: float = 0.0
    auto_revert: bool = False
    gate: GatePolicy = GatePolicy()
    approval: str = "none"  # one of APPROVALS: which waves wait for a person (F9)

    @property
    def enabled(self) -> bool:
        return bool(self.canaries) or self.max_parallel > 0

    @classmethod
    def from_settings(cls, s: Settings) -> Policy:
        return cls(canaries=tuple(c.strip() for c in s.rollout_canary_clusters.split(",")
                                  if c.strip()),
                   max_parallel=s.rollout_max_parallel_clusters,
                   max_failures=s.rollout_max_failures, failure_unit=s.rollout_failure_unit,
                   wave_deadline=s.rollout_wave_deadline,
                   soak=s.rollout_wave_soak, auto_revert=s.rollout_auto_revert,
                   gate=GatePolicy(s.rollout_gate_query, s.rollout_gate_failures,
                                   s.rollout_wave_deadline),
                   approval=s.rollout_approval)


    def budget(self, size: int) -> int:
        """The failures a wave of `size` (releases or clusters) may have: the count, or the
        share of `size` rounded down (25% of 4 clusters is 1)."""
        if self.max_failures.endswith("%"):
            return int(float(self.max_failures[:-1]) * size // 100)
        return int(self.max_failures)


@dataclass(frozen=True)
class ClusterObservation:
    reachable: bool
    tenants: int  # Tenants this cluster serves
    done: int  # of them Ready on the target
    failed: int  # of them whose install/upgrade to the target failed
    to_revert: int = 0  # failed ones with a revision to go back to, not rolled back yet
    reverted: int = 0  # failed ones rolled back (--rollout-auto-revert)
    revert_failed: int = 0  # failed ones whose rollback failed
    window: str = ""  # its maintenance window ("": always open)


def observe_cluster(cluster: str, tenants: list[dict[str, Any]],
                    target: str | None) -> ClusterObservation:
    """How the Tenants that `cluster` serves stand on the `target` fingerprint (None: not
    resolved yet), from their status: Ready on it, failed on it (a failed helm run, or a
    workload that never became ready or degraded after it was applied: SPEC F6), and of the
    failed ones, how far their revert got."""
    done = failed = to_revert = reverted = revert_failed = 0
    for t in tenants:
        status = t.get("status") or {}
        mine = (status.get("clusters") or {}).get(cluster) or {}
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        ready = conds.get(f"ClusterReady/{cluster}") or {}
        if target is not None and mine.get("failedFingerprint") == target:
            failed += 1
            if mine.get("revertedFingerprint") == target:
                reverted += 1
            elif (conds.get(f"ClusterError/{cluster}") or {}).get("reason") == "RevertFailed":
                revert_failed += 1
            elif isinstance(mine.get("revision"), int):
                to_revert += 1
        elif target is not None and mine.get("fingerprint") == target:
            if ready.get("status") == "True":
                done += 1
            elif ready.get("reason") in UNHEALTHY:
                failed += 1
    return ClusterObservation(True, len(tenants), done, failed, to_revert, reverted,
                              revert_failed)


@dataclass(frozen=True)
class RolloutState:
    target: str
    version: str
    waves: tuple[tuple[str, ...], ...]
    wave: int = 0  # index of the wave in progress (== len(waves) when complete)
    phase: str = PROGRESSING
    wave_started: float = 0.0
    wave_healthy_since: float | None = None
    skipped: tuple[str, ...] = ()  # unreachable when their wave ran
    failed: tuple[str, ...] = ()  # clusters with failed releases in the halted wave
    reverted: bool = False  # the failed releases were handed to their workers to roll back
    revert_reported: bool = False  # every one of them was rolled back or failed to
    reverted_releases: int = 0
    revert_failures: int = 0
    message: str = ""
    history: tuple[str, ...] = field(default_factory=tuple)
    previous_version: str = ""  # the version the rollout moves away from ("" at first)
    # the metric gate (F7) of the wave in progress: per cluster, its last evaluation
    # (gates.record); gate_failed: the rollout halted on it (its healthy releases revert too)
    gates: dict[str, dict[str, Any]] = field(default_factory=dict)
    gate_failed: bool = False
    # the failure budget of the wave in progress (or the one that halted): used, allowed
    budget_used: int = 0
    budget: int = 0
    budget_unit: str = ""
    # rollout control (F9): the wave in progress waits for a person's approval; the waves
    # approved so far (index of the last, -1: none) and by whom; paused since when; aborted
    # by whom; when it started and ended; and the rollouts before it (`summary`)
    format: int = FORMAT
    awaiting: bool = False
    approved: int = -1
    approvals: tuple[dict[str, Any], ...] = ()
    paused_at: float | None = None
    aborted: str = ""
    started: float = 0.0
    ended: float | None = None
    past: tuple[dict[str, Any], ...] = ()
    ignored: str = ""  # digest of the last approval annotation that approved nothing (said once)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_configmap(cls, cm: Mapping[str, Any] | None) -> RolloutState | None:
        """The state kept in the rollout ConfigMap; None without one, without state, or with
        one that is not a state: anyone who may write ConfigMaps in the namespace can write
        it, and a garbage state is no state (the rollout is planned again)."""
        data = (cm or {}).get("data") or {}
        if not isinstance(data, Mapping) or not isinstance(data.get("state.json"), str):
            return None
        try:
            return cls.from_json(data["state.json"])
        except (ValueError, TypeError, AttributeError, RecursionError):
            return None

    @classmethod
    def from_json(cls, text: str) -> RolloutState:
        raw: dict[str, Any] = json.loads(text)
        raw["waves"] = tuple(tuple(w) for w in raw.get("waves") or ())
        for key in ("skipped", "failed", "history"):
            raw[key] = tuple(raw.get(key) or ())
        recorded = raw.get("gates")
        recorded = recorded if isinstance(recorded, dict) else {}
        raw["gates"] = {c: g for c, g in ((str(c), gates.cleaned(g)) for c, g in recorded.items())
                        if g is not None}
        raw["previous_version"] = str(raw.get("previous_version") or "")[:64]
        raw["gate_failed"] = raw.get("gate_failed") is True
        raw["format"] = raw.get("format") if isinstance(raw.get("format"), int) else 1
        for key in ("approvals", "past"):
            raw[key] = tuple(e for e in raw.get(key) or () if isinstance(e, dict))[-2 * PAST:]
        return cls(**raw)

    def reached(self) -> set[str]:
        """Clusters whose wave has started (they may move to the target)."""
        if self.phase == COMPLETE:
            return {c for w in self.waves for c in w}
        opened = self.phase == PROGRESSING and not self.awaiting
        upto = self.waves[: self.wave + 1] if opened else self.waves[: self.wave]
        return {c for w in upto for c in w}

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def summary(self) -> dict[str, Any]:
        """What the history keeps of this rollout once another supersedes it."""
        return {"version": self.version, "from": self.previous_version,
                "target": self.target[:23], "started": self.started, "ended": self.ended,
                "outcome": "Aborted" if self.aborted else self.phase,
                "waves": [list(w) for w in self.waves], "approvals": list(self.approvals),
                "failed": list(self.failed), "reverted": self.reverted_releases,
                "revert_failures": self.revert_failures, "message": self.message[:300]}


def plan_waves(clusters: list[str], policy: Policy) -> tuple[tuple[str, ...], ...]:
    canaries = tuple(c for c in policy.canaries if c in clusters)
    rest = sorted(c for c in clusters if c not in canaries)
    waves: list[tuple[str, ...]] = [canaries] if canaries else []
    size = policy.max_parallel or len(rest) or 1
    waves += [tuple(rest[i:i + size]) for i in range(0, len(rest), size)]
    return tuple(waves)


def start(target: str, version: str, clusters: list[str], policy: Policy, now: float,
          previous: RolloutState | None = None) -> RolloutState:
    note = f"{previous.version} -> {version}" if previous else f"initial {version}"
    history = ((previous.history if previous else ()) + (note,))[-10:]
    past = ((previous.past + (previous.summary(),)) if previous else ())[-PAST:]
    return RolloutState(target=target, version=version, waves=plan_waves(clusters, policy),
                        wave_started=now, message=f"rolling out {note}", history=history,
                        previous_version=previous.version if previous else "",
                        started=now, past=past)


def needs_approval(state: RolloutState, index: int, policy: Policy) -> bool:
    """Does wave `index` of the rollout wait for a person before it opens (F9)? Every wave
    with --rollout-approval=every-wave; the first after the canaries' with after-canaries."""
    if policy.approval == "every-wave":
        return True
    return policy.approval == "after-canaries" and index == 1 and bool(policy.canaries) and \
        set(state.waves[0]) <= set(policy.canaries)


def ended(state: RolloutState, now: float) -> RolloutState:
    """The state with its end time, once it is complete or halted."""
    if state.phase == PROGRESSING or state.ended is not None:
        return state
    return dataclasses.replace(state, ended=now)


def allowed(state: RolloutState | None, cluster: str) -> tuple[bool, str]:
    """May `cluster` move its Tenants to the target now? (False, reason) when not."""
    if state is None or state.phase == COMPLETE:
        return True, ""
    if state.phase == HALTED:
        return False, "RolloutHalted"
    if state.paused:
        return False, "RolloutPaused"
    if cluster in state.reached():
        return True, ""
    if state.awaiting and cluster in state.waves[state.wave]:
        return False, "RolloutAwaitingApproval"
    return False, "RolloutPending"  # a later wave, or engaged late and queued by `include`


def gate_for(state: RolloutState | None, target: str | None, cluster: str,
             policy: Policy) -> RolloutGate:
    """The gate for `cluster` while the fleet's target is `target` (None: not resolved):
    open without a progressive rollout; closed (RolloutPending) while the rollout of the
    target is not planned yet; else what the state says. The operator and ``krypton plan``
    both ask this."""
    if not policy.enabled:
        return RolloutGate()
    if state is None or target is None or state.target != target:
        return RolloutGate(open=False, reason="RolloutPending")
    return gate(state, cluster, policy)


def gate(state: RolloutState | None, cluster: str, policy: Policy) -> RolloutGate:
    """The rollout's word to one cluster's reconciles: `allowed`, plus whether the
    releases that failed there are to be rolled back."""
    may, reason = allowed(state, cluster)
    revert = (policy.auto_revert and state is not None and state.phase == HALTED
              and state.reverted and cluster in state.failed)
    healthy = state.previous_version if revert and state is not None and state.gate_failed \
        else ""
    return RolloutGate(may, reason, revert, revert_healthy_to=healthy)


def to_wake(old: RolloutState | None, new: RolloutState) -> tuple[set[str], bool]:
    """Whose Tenants are looked at again when the written state moves from `old` to `new`:
    the clusters newly reached by a wave, and (True) every cluster on a phase change, so
    that each held-back Tenant reports the new phase."""
    newly = new.reached() - (old.reached() if old is not None and old.target == new.target
                             else set())
    return newly, old is not None and (old.phase != new.phase or old.paused != new.paused
                                       or old.awaiting != new.awaiting)


def publication(target: str | None, observation: ClusterObservation) -> str:
    """What the replica serving a cluster publishes of it under --sharding (F4), for the
    replica that runs the rollout: the observation and the target it was made against."""
    return json.dumps({"target": target, **dataclasses.asdict(observation)}, sort_keys=True)


def read_publication(text: str | None, target: str | None) -> ClusterObservation:
    """A cluster as its owner published it, judged against the rollout's `target`: nothing
    published (or unreadable) is an unreachable cluster; a publication made against another
    target (its owner has not resolved the new chart yet) counts no release as done or
    failed."""
    unreachable = ClusterObservation(False, 0, 0, 0)
    try:
        raw = json.loads(text or "")
        fields = {f.name for f in dataclasses.fields(ClusterObservation)}
        seen = ClusterObservation(**{k: v for k, v in raw.items() if k in fields})
    except (ValueError, TypeError, AttributeError, RecursionError):
        return unreachable
    if not isinstance(seen.reachable, bool) or not isinstance(seen.window, str) or not all(
            isinstance(getattr(seen, f), int) for f in fields - {"reachable", "window"}):
        return unreachable
    if target is None or raw.get("target") != target:
        return ClusterObservation(seen.reachable, seen.tenants, 0, 0)
    return seen


def revert_outcome(state: RolloutState, observed: dict[str, ClusterObservation]) -> RolloutState:
    """Once every release handed over for a rollback (on the reachable failed clusters) was
    rolled back or failed to, the halted state records the real outcome, once."""
    if state.phase != HALTED or not state.reverted or state.revert_reported:
        return state
    seen = [observed[c] for c in state.failed if c in observed and observed[c].reachable]
    # after a failed metric gate, a release still Ready on the target is yet to go back
    # (when there is a version to go back to: a first rollout has none)
    back_to = state.gate_failed and bool(state.previous_version)
    if any(o.to_revert or (back_to and o.done) for o in seen):
        return state
    done, bad = sum(o.reverted for o in seen), sum(o.revert_failed for o in seen)
    note = f"rolled back {done} failed release(s)" + (
        f"; {bad} could not be rolled back" if bad else "")
    return dataclasses.replace(state, revert_reported=True, reverted_releases=done,
                               revert_failures=bad, message=f"{state.message}; {note}")


def include(state: RolloutState, clusters: list[str], policy: Policy) -> RolloutState:
    """Append clusters that engaged after the waves were planned, as further waves."""
    known = {c for w in state.waves for c in w}
    late = sorted(c for c in clusters if c not in known)
    if not late or state.phase != PROGRESSING:
        return state
    size = policy.max_parallel or len(late)
    extra = tuple(tuple(late[i:i + size]) for i in range(0, len(late), size))
    return dataclasses.replace(state, waves=state.waves + extra)


def engaging(clusters: Iterable[str], observed: Mapping[str, ClusterObservation],
             since: Mapping[str, float], now: float, grace: float
             ) -> tuple[frozenset[str], dict[str, float]]:
    """Of `clusters`, those not reachable for less than `grace` seconds: they may still engage
    (the operator just started, or the cluster just changed replicas), so their wave waits
    for them instead of skipping them. `since` holds when each was first seen unreachable;
    the second value is its update."""
    down = {c: since.get(c, now) for c in clusters
            if not (c in observed and observed[c].reachable)}
    return frozenset(c for c, t in down.items() if now - t < grace), down


def _open_time(window: str, start: float, now: float) -> float:
    """How much of [start, now] a cluster with `window` could be changed in: all of it
    without a window, only the window's open time with one (F8)."""
    try:
        parsed = windows.parse(window)
    except windows.WindowInvalid:
        parsed = None  # not engaged with it: such a cluster does not report one
    return now - start if parsed is None else parsed.open_seconds(start, now)


def evaluate(state: RolloutState, observed: dict[str, ClusterObservation], policy: Policy,
             now: float, settling: frozenset[str] = frozenset()) -> RolloutState:
    """The next state of a progressing rollout; halted and complete states stay as they are.
    A wave with a cluster in `settling` (see `engaging`) is not judged yet."""
    if state.phase != PROGRESSING or state.paused:
        return state
    while state.wave < len(state.waves):
        wave = state.waves[state.wave]
        if needs_approval(state, state.wave, policy) and state.approved < state.wave:
            return dataclasses.replace(
                state, awaiting=True, wave_healthy_since=None,
                message=f"wave {state.wave + 1}/{len(state.waves)} ({', '.join(wave)}) waits "
                        "for approval: krypton rollout approve")
        if state.awaiting:  # approved: the wave opens now, and its deadline counts from now
            state = dataclasses.replace(state, awaiting=False, wave_started=now)
        reachable = [c for c in wave if observed.get(c, ClusterObservation(False, 0, 0, 0)).reachable]
        skipped = tuple(sorted(set(state.skipped) | (set(wave) - set(reachable))))
        failed = tuple(c for c in reachable if observed[c].failed)
        releases = sum(observed[c].failed for c in reachable)
        if policy.failure_unit == "clusters":
            failures, size = len(failed), len(reachable)
        else:
            failures, size = releases, sum(observed[c].tenants for c in reachable)
        state = dataclasses.replace(state, budget_used=failures, budget=policy.budget(size),
                                    budget_unit=policy.failure_unit)
        if failures > state.budget:
            return dataclasses.replace(
                state, phase=HALTED, skipped=skipped, failed=failed,
                message=f"halted in wave {state.wave + 1}: {releases} failed release(s) on "
                        f"{', '.join(failed)}: {failures} failed {policy.failure_unit}, more "
                        f"than the {state.budget} allowed ({policy.max_failures} of {size})")
        waiting = sorted(settling.intersection(wave))
        if waiting:
            return dataclasses.replace(state, message=f"wave {state.wave + 1}/"
                                       f"{len(state.waves)}: waiting for {', '.join(waiting)} "
                                       "to engage")
        # every release Ready on the target, or failed within the budget (just checked)
        complete = all(observed[c].done + observed[c].failed >= observed[c].tenants
                       for c in reachable)
        if not complete:
            late = [c for c in reachable
                    if observed[c].done + observed[c].failed < observed[c].tenants
                    and _open_time(observed[c].window, state.wave_started, now)
                    > policy.wave_deadline]
            if late:
                return dataclasses.replace(
                    state, phase=HALTED, skipped=skipped, failed=tuple(late),
                    message=f"halted in wave {state.wave + 1}: deadline of "
                            f"{policy.wave_deadline:.0f}s passed ({', '.join(late)} not done)")
            return dataclasses.replace(state, skipped=skipped, wave_healthy_since=None,
                                       message=f"wave {state.wave + 1}/{len(state.waves)}: "
                                               f"{', '.join(wave)}")
        if (held := _soaking(state, tuple(reachable), skipped, policy, now)) is not None:
            return held
        state = dataclasses.replace(state, wave=state.wave + 1, wave_started=now,
                                    wave_healthy_since=None, skipped=skipped, gates={})
    return dataclasses.replace(state, phase=COMPLETE,
                               message=f"complete: {state.version} on every reachable cluster"
                               + (f" (skipped: {', '.join(state.skipped)})" if state.skipped else ""))


def _soaking(state: RolloutState, reachable: tuple[str, ...], skipped: tuple[str, ...],
             policy: Policy, now: float) -> RolloutState | None:
    """The state of a wave that is done and soaks, or failed its metric gate (F7); None
    once it has soaked and passed its gate: the next wave opens."""
    healthy_since = state.wave_healthy_since if state.wave_healthy_since is not None else now
    soaked = now - healthy_since >= policy.soak
    if policy.gate.enabled:
        gate_failed = gates.failing(state.gates, reachable, policy.gate, now)
        if gate_failed:
            return dataclasses.replace(
                state, phase=HALTED, skipped=skipped, gate_failed=True,
                failed=tuple(c for c, _ in gate_failed),
                message=f"halted in wave {state.wave + 1}: {gate_failed[0][1]}")
        if why := gates.waiting_for(state.gates, reachable, soaked):
            return dataclasses.replace(state, skipped=skipped, wave_healthy_since=healthy_since,
                                       message=f"wave {state.wave + 1}/{len(state.waves)} "
                                               f"done, soaking; {why}")
    elif not soaked:
        return dataclasses.replace(state, skipped=skipped, wave_healthy_since=healthy_since,
                                   message=f"wave {state.wave + 1}/{len(state.waves)} done, "
                                           f"soaking")
    return None


def soaking(state: RolloutState | None) -> tuple[str, ...]:
    """The clusters whose gate is to be evaluated now: those of a progressing wave that is
    done and soaking (its releases Ready on the target)."""
    if state is None or state.phase != PROGRESSING or state.wave_healthy_since is None or \
            state.wave >= len(state.waves):
        return ()
    return tuple(c for c in state.waves[state.wave] if c not in state.skipped)


def with_readings(state: RolloutState, readings: Mapping[str, gates.Reading],
                  now: float) -> RolloutState:
    """The state with the gate evaluations of `readings` recorded (gates.record)."""
    recorded = dict(state.gates)
    for cluster, reading in readings.items():
        recorded[cluster] = gates.record(recorded.get(cluster), reading, now)
    return dataclasses.replace(state, gates=recorded)
