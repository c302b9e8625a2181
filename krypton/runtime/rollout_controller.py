"""Drives the progressive rollout (SPEC F1): observes the workers, evaluates the pure state
machine of rollout.py, keeps the state in a ConfigMap on the watch cluster (so that a
restarted operator resumes instead of restarting the rollout), opens waves, reports a halt
(Event, log, metric) and, with --rollout-auto-revert, rolls the failed releases back.

Under --sharding (F4) the controller runs on the one replica that holds the leader Lease and
sees every cluster through what its owner publishes on the cluster's Lease (`Published`);
every replica, that one included, follows the state as written (`RolloutFollower`): its gate,
and the Tenants it wakes when a wave opens or the phase changes."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from krypton.adapters import metrics
from krypton.adapters.charts import ChartSource, ResolvedChart
from krypton.adapters.events import EventRecorder
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import core_path
from krypton.adapters.prometheus import Prometheus, ServerAuth
from krypton.decisions.charts.fingerprint import fingerprint
from krypton.decisions.errors import AlreadyExists, Conflict, Fenced, KryptonError, NotFound, TemporaryError
from krypton.decisions.model import RolloutGate
from krypton.decisions.rollouts import gates
from krypton.decisions.rollouts.rollout import (
    CONFIGMAP,
    HALTED,
    PROGRESSING,
    ClusterObservation,
    Policy,
    RolloutState,
    ended,
    engaging,
    evaluate,
    gate_for,
    include,
    publication,
    revert_outcome,
    soaking,
    start,
    to_wake,
    with_readings,
)
from krypton.decisions.rollouts.rolloutcontrol import command, control
from krypton.runtime.pause import pause

log = structlog.get_logger("krypton.rollout")
ENGAGE_GRACE = 30.0  # how long a new rollout waits for every discovered cluster to engage


def _report(state: RolloutState) -> None:
    metrics.ROLLOUT_WAVE.set(min(state.wave + 1, len(state.waves)))
    metrics.ROLLOUT_HALTED.set(1 if state.phase == HALTED else 0)
    metrics.ROLLOUT_AWAITING.set(1 if state.awaiting and state.phase == PROGRESSING else 0)
    metrics.ROLLOUT_PAUSED.set(1 if state.paused and state.phase == PROGRESSING else 0)
    if state.budget_unit:
        metrics.ROLLOUT_FAILURE_BUDGET.labels("used", state.budget_unit).set(state.budget_used)
        metrics.ROLLOUT_FAILURE_BUDGET.labels("allowed", state.budget_unit).set(state.budget)


class _Gated:
    """A rollout state as last read or written, and the gate it sets for each cluster."""

    def __init__(self, policy: Policy, chart: ChartSource, central_values: dict[str, Any],
                 workers: Callable[[], dict[str, Any]], interval: float,
                 told: Callable[[], None]) -> None:
        self.policy, self.chart, self.central_values = policy, chart, central_values
        self.workers, self.interval = workers, interval
        self.told = told  # the state changed: said to the fleet page (SPEC O16)
        self.state: RolloutState | None = None
        self.current_target: str | None = None
        self._loaded = False

    def gate(self, cluster: str) -> RolloutGate:
        return gate_for(self.state if self._loaded else None, self.current_target, cluster,
                        self.policy)

    async def _resolve(self) -> tuple[ResolvedChart, str]:
        """The central chart and the target it makes with the central values."""
        chart = await self.chart.get()
        self.current_target = fingerprint(chart.repo, chart.name, chart.fingerprinted,
                                          self.central_values)
        return chart, self.current_target

    async def _every_interval(self, stopping: asyncio.Event,
                              step: Callable[[], Awaitable[None]], failed: str) -> None:
        while not stopping.is_set():
            try:
                await step()
            except KryptonError as exc:
                log.warning(failed, error=str(exc))
            await pause(stopping, self.interval)

    def _wake(self, old: RolloutState | None, new: RolloutState) -> None:
        """Look at the Tenants again whose gate the new state opened or changed."""
        self.told()
        workers = self.workers()
        newly, everyone = to_wake(old, new)
        for name in workers if everyone else newly:
            if name in workers:
                workers[name].requeue_all()


GATE_GAUGE = {gates.PASSED: 1.0, gates.FAILED: 0.0, gates.UNANSWERED: -1.0}


class MetricGate:
    """The rollout's metric gate (F7): its query, evaluated per cluster against the server
    with the credentials of --rollout-gate-credentials-secret (read at each evaluation)."""

    def __init__(self, server: Prometheus, query: str, interval: float,
                 auth: Callable[[], Awaitable[ServerAuth | None]]) -> None:
        self.server, self.query, self.interval, self.auth = server, query, interval, auth

    async def read(self, clusters: tuple[str, ...]) -> dict[str, gates.Reading]:
        try:
            auth = await self.auth()
        except KryptonError as exc:
            return {c: gates.Reading(gates.UNANSWERED, exc.message[:200]) for c in clusters}
        # side by side: a server that does not answer costs one timeout, not one per cluster
        readings = await asyncio.gather(*(
            self.server.read(gates.query_for(self.query, c), auth)
            for c in clusters))
        return dict(zip(clusters, readings, strict=True))


class RolloutController(_Gated):
    def __init__(self, home: Kube, namespace: str, policy: Policy, chart: ChartSource,
                 central_values: dict[str, Any], events: EventRecorder,
                 workers: Callable[[], dict[str, Any]], interval: float = 2.0,
                 fence: Callable[[], bool] = lambda: True,
                 metric_gate: MetricGate | None = None,
                 told: Callable[[], None] = lambda: None) -> None:
        super().__init__(policy, chart, central_values, workers, interval, told)
        self.home, self.namespace, self.events = home, namespace, events
        self.fence = fence
        self.metric_gate = metric_gate
        self._gate_read_at = 0.0
        self._version: str | None = None  # resourceVersion of the ConfigMap as last read/written
        self._waiting_since: float | None = None
        self._down_since: dict[str, float] = {}  # clusters seen unreachable, since when
        self._annotations: dict[str, Any] = {}  # the ConfigMap's, as last read: control (F9)
        self._reread = False  # someone else wrote the ConfigMap: read it at the next step
        # the ConfigMap watched: a control annotation written by a person is read at once
        self.informer = Informer(home, "rollout-control", core_path("configmaps", namespace),
                                 self._changed, field_selector=f"metadata.name={CONFIGMAP}")

    def _changed(self, _type: str, obj: dict[str, Any]) -> None:
        """Someone else wrote the rollout ConfigMap (its version is not the one krypton
        last read or wrote): it is read again at the next step."""
        if (obj.get("metadata") or {}).get("resourceVersion") != self._version:
            self._reread = True

    def unload(self) -> None:
        """Leadership lost: read the state again when leading next (another leader wrote)."""
        self._loaded = False
        self._waiting_since = None
        self._down_since = {}

    async def run(self, stopping: asyncio.Event) -> None:
        self.informer.start()
        try:
            await self._every_interval(stopping, self.step, "rollout step failed")
        finally:
            await self.informer.stop()

    async def step(self) -> None:
        before = self.current_target, self._loaded
        if not self._loaded:
            self.state = await self._load()
            self._loaded = True
        elif self._reread:  # a control annotation, most likely: the state itself is ours
            self._reread = False
            self.state = await self._load()
        chart, target = await self._resolve()
        workers = self.workers()
        if (target, self._loaded) != before:
            # The gate said RolloutPending until now (no state read, or no target): a Tenant
            # held back meanwhile is looked at again, even when the state read after a
            # restart is the one this step keeps (nothing to wake by a change of state).
            for worker in workers.values():
                worker.requeue_all()
        now = time.time()
        old = self.state
        state = old
        if state is None or state.target != target:
            engaged = sorted(n for n, w in workers.items() if w.engaged)
            waiting = [n for n, w in workers.items() if not w.engaged]
            if self._waiting_since is None:
                self._waiting_since = now
            if not engaged or (waiting and now - self._waiting_since < ENGAGE_GRACE):
                return  # plan the waves once every discovered cluster had its chance
            self._waiting_since = None
            state = start(target, chart.version, engaged, self.policy, now, previous=old)
            log.info("rollout started", version=chart.version, waves=[list(w) for w in state.waves])
        state = include(state, sorted(n for n, w in workers.items() if w.engaged), self.policy)
        observed = {n: w.rollout_observation() for n, w in workers.items()}
        state = await self._read_gate(state, now)
        # a cluster that may still engage (after a start or a handover) is waited for, not
        # skipped: the first look after a restart must not find the whole wave unreachable
        settling, self._down_since = engaging({c for w in state.waves for c in w}, observed,
                                              self._down_since, now, ENGAGE_GRACE)
        state, said = control(state, self._annotations, observed, now)
        for type_, reason, message in said:
            log.info("rollout control", reason=reason, detail=message)
            await self.events.emit(self._involved(), type_, reason, message)
        state = await self._said(old, evaluate(state, observed, self.policy, now, settling))
        state = ended(revert_outcome(state, observed), now)
        await self._said_reverted(old, state)
        _report(state)
        if old is None or state.to_json() != old.to_json():
            await self._save(state)  # the gate follows only what was written
            self.state = state
            self._wake(old, state)
            if old is None or old.phase != state.phase or old.wave != state.wave:
                log.info("rollout", phase=state.phase, wave=state.wave + 1, detail=state.message)

    async def _said(self, old: RolloutState | None, state: RolloutState) -> RolloutState:
        """An approval waited for, or a halt, said once; a halt with --rollout-auto-revert
        hands the failed releases back."""
        if state.awaiting and state.phase == PROGRESSING and not (
                old is not None and old.awaiting and old.target == state.target
                and old.wave == state.wave):
            log.info("rollout awaiting approval", detail=state.message)
            await self.events.emit(self._involved(), "Normal", "RolloutAwaitingApproval",
                                   state.message)
        if state.phase == HALTED and not state.reverted and (old is None or old.phase != HALTED
                                                             or old.target != state.target):
            log.error("rollout halted", detail=state.message)
            await self.events.emit(self._involved(), "Warning", "RolloutHalted", state.message)
            if self.policy.auto_revert:
                # The failed clusters' workers roll their failed releases back through their
                # work queues (the gate says so once this state is written; the phase change
                # requeues every Tenant); each release reports its own outcome.
                state = dataclasses.replace(state, reverted=True, message=state.message
                                            + "; rolling the failed releases back")
        return state

    async def _said_reverted(self, old: RolloutState | None, state: RolloutState) -> None:
        """The failed releases' rollback, said once when every one of them reported."""
        if state.revert_reported and not (old and old.revert_reported
                                          and old.target == state.target):
            summary = (f"on {', '.join(state.failed)}: {state.reverted_releases} failed "
                       f"release(s) rolled back")
            if state.revert_failures:
                log.error("rollout revert incomplete", detail=state.message)
                await self.events.emit(self._involved(), "Warning", "RolloutRevertFailed",
                                       f"{summary}, {state.revert_failures} could not be "
                                       "(see the Tenants' RolloutRevertFailed Events)")
            else:
                log.info("rollout reverted", detail=state.message)
                await self.events.emit(self._involved(), "Normal", "RolloutReverted", summary)

    async def _read_gate(self, state: RolloutState, now: float) -> RolloutState:
        """The metric gate's evaluations (F7) for the clusters of a soaking wave, every
        --rollout-gate-interval, recorded in the state (and exported)."""
        clusters = soaking(state)
        if self.metric_gate is None or not clusters or \
                now - self._gate_read_at < self.metric_gate.interval:
            return state
        self._gate_read_at = now
        readings = await self.metric_gate.read(clusters)
        for cluster, reading in readings.items():
            say = log.debug if reading.result == gates.PASSED else log.warning
            say("rollout gate evaluated", cluster=cluster, result=reading.result,
                value=reading.value)
            metrics.ROLLOUT_GATE.labels(cluster).set(GATE_GAUGE[reading.result])
            metrics.ROLLOUT_GATE_EVALUATIONS.labels(cluster, reading.result).inc()
        return with_readings(state, readings, now)

    def _involved(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": CONFIGMAP,
                "namespace": self.namespace}

    async def _load(self) -> RolloutState | None:
        cm = await self.home.get_configmap(self.namespace, CONFIGMAP)
        if cm is None:
            self._version, self._annotations = None, {}
            return None
        self._version = cm["metadata"]["resourceVersion"]
        self._annotations = dict(cm["metadata"].get("annotations") or {})
        state = RolloutState.from_configmap(cm)
        if state is None:
            return None
        log.info("rollout state loaded", phase=state.phase, wave=state.wave + 1,
                 version=state.version)
        return state

    async def _save(self, state: RolloutState) -> None:
        """Write the state over exactly the version last read or written (create it when
        there was none). Another writer in between (a second leader, a person) makes the
        write fail: the state is read again on the next step instead of overwritten."""
        body: dict[str, Any] = {
            "metadata": {"name": CONFIGMAP, "namespace": self.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "krypton"},
                         "annotations": self._annotations},
            "data": {"state.json": state.to_json(), "phase": state.phase,
                     "version": state.version, "message": state.message}}
        if not self.fence():
            raise Fenced("leadership not held: the rollout state is not written",
                         reason="NotLeader")
        try:
            if self._version is None:
                cm = await self.home.create_configmap(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = self._version
                cm = await self.home.replace_configmap(self.namespace, CONFIGMAP, body)
        except (Conflict, AlreadyExists, NotFound) as exc:
            self._loaded = False
            raise TemporaryError(f"rollout state changed by another writer; reading it again: "
                                 f"{exc}", reason="RolloutStateConflict") from exc
        self._version = cm["metadata"]["resourceVersion"]


class Published:
    """A cluster as the replica serving it published it on the cluster's Lease (--sharding):
    what the controller on the leader sees of a cluster it does not serve itself."""

    def __init__(self, observation: ClusterObservation) -> None:
        self.observation = observation

    @property
    def engaged(self) -> bool:
        return self.observation.reachable

    def rollout_observation(self) -> ClusterObservation:
        return self.observation

    def requeue_all(self) -> None:
        """Nothing here: the replica serving the cluster wakes its Tenants when it reads the
        new state (RolloutFollower)."""


class RolloutFollower(_Gated):
    """Every replica under --sharding: the gate follows the rollout ConfigMap written by the
    controller on the leader (watched, so a new wave reaches every replica at once), and each
    cluster this replica serves publishes its observation through `publish(cluster, text)`
    every interval (a write only when it changed)."""

    def __init__(self, home: Kube, namespace: str, policy: Policy, chart: ChartSource,
                 central_values: dict[str, Any], workers: Callable[[], dict[str, Any]],
                 publish: Callable[[str, str], Awaitable[None]], interval: float = 2.0,
                 told: Callable[[], None] = lambda: None) -> None:
        super().__init__(policy, chart, central_values, workers, interval, told)
        self.publish = publish
        self.informer = Informer(home, "rollout-state", core_path("configmaps", namespace),
                                 self._event, field_selector=f"metadata.name={CONFIGMAP}")

    def _event(self, type_: str, obj: dict[str, Any]) -> None:
        old = self.state
        try:
            state = None if type_ == "DELETED" else RolloutState.from_configmap(obj)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("rollout state unreadable", error=str(exc))
            return
        self.state = state
        if state is None:
            return
        _report(state)
        if old is None or state.to_json() != old.to_json():
            self._wake(old, state)

    async def run(self, stopping: asyncio.Event) -> None:
        self.informer.start()
        try:
            await self._every_interval(stopping, self._step,
                                       "rollout observations not published")
        finally:
            await self.informer.stop()

    async def _step(self) -> None:
        before = self.current_target, self._loaded
        _, target = await self._resolve()
        self._loaded = self.informer.synced.is_set()
        if (target, self._loaded) != before:  # the gate may have opened or changed anywhere
            for worker in self.workers().values():
                worker.requeue_all()
        for name, worker in list(self.workers().items()):
            await self.publish(name, publication(target, worker.rollout_observation()))


async def ask(home: Kube, namespace: str, action: str, by: str, *,
              seen: str | None = None) -> tuple[bool, str]:
    """A person's rollout control (F9), as ``krypton rollout`` and the fleet page ask it:
    the control annotation written on the rollout ConfigMap over the version read (a state
    written meanwhile is judged again, three times at most). With `seen` (the target the
    asker saw), nothing is written once the rollout moved on to another. Whether it wrote,
    and what it says."""
    attempts = 3
    while True:
        cm = await home.get_configmap(namespace, CONFIGMAP)
        state = RolloutState.from_configmap(cm)
        if seen is not None and state is not None and state.target != seen:
            return False, f"the rollout moved on to {state.version} meanwhile; nothing changed"
        annotations, said = command(state, action, by)
        if annotations is None or cm is None:
            return False, said
        try:
            await home.patch_configmap(namespace, CONFIGMAP, {"metadata": {
                "resourceVersion": cm["metadata"]["resourceVersion"],
                "annotations": annotations}})
            return True, said
        except Conflict:  # the operator wrote the state meanwhile: judge it again
            attempts -= 1
            if not attempts:
                raise
