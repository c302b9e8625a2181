"""Rollout control (SPEC F9): a person's approve, pause, resume and abort, given as
annotations of the rollout ConfigMap (written by `krypton rollout`), applied to the state of
a progressing rollout. Pure."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

from krypton.decisions.rollouts.rollout import (
    FORMAT,
    HALTED,
    PAST,
    PROGRESSING,
    ClusterObservation,
    RolloutState,
)
from krypton.decisions.trust.printable import escape

# Rollout control (F9): annotations on the rollout ConfigMap, written by `krypton rollout` or
# by anyone who may write it (GitOps, chat-ops); each names the target it is meant for.
APPROVE = "mesh.openkcm.io/rollout-approve"  # "<wave>@<target>": that wave may open
PAUSE = "mesh.openkcm.io/rollout-pause"  # "<target>": no helm run of it starts meanwhile
ABORT = "mesh.openkcm.io/rollout-abort"  # "<target>": it ends, halted
BY = "mesh.openkcm.io/rollout-by"  # who wrote the last of them (recorded as given)


Said = tuple[str, str, str]  # an Event: type, reason, message


def control(state: RolloutState, annotations: Mapping[str, Any],
            observed: Mapping[str, ClusterObservation], now: float
            ) -> tuple[RolloutState, list[Said]]:
    """The rollout control annotations of the rollout ConfigMap (F9) applied to a progressing
    rollout: an abort of its target ends it halted (the failed releases of its reached waves
    go back with --rollout-auto-revert); a pause of its target holds it until the annotation
    goes; an approval of its target and of the wave waiting lets that wave open. An
    annotation naming another target (an earlier rollout's) does nothing. Returns the state
    and the Events to say."""
    if state.phase != PROGRESSING:
        return state, []
    by = escape(str(annotations.get(BY) or "someone"))[:64]
    wave = f"wave {state.wave + 1}/{len(state.waves)}"
    if annotations.get(ABORT) == state.target:
        failed = tuple(c for c in sorted(state.reached())
                       if c in observed and observed[c].reachable and observed[c].failed)
        message = f"aborted by {by} in {wave}" + (
            f"; failed releases on {', '.join(failed)}" if failed else "")
        return dataclasses.replace(state, phase=HALTED, aborted=by, paused_at=None,
                                   awaiting=False, failed=failed, message=message), []
    said: list[Said] = []
    paused = annotations.get(PAUSE) == state.target
    if paused and not state.paused:
        state = dataclasses.replace(state, paused_at=now, message=f"paused by {by} in {wave}")
        said.append(("Normal", "RolloutPaused", f"{state.message}: no helm run of the "
                     f"rollout to {state.version} starts until it is resumed"))
    elif not paused and state.paused_at is not None:
        # the wave's deadline does not count the pause
        state = dataclasses.replace(state, paused_at=None,
                                    wave_started=state.wave_started + now - state.paused_at,
                                    message=f"resumed in {wave}")
        said.append(("Normal", "RolloutResumed", f"resumed by {by} in {wave}"))
    given = str(annotations.get(APPROVE) or "")
    number, _, target = given.partition("@")
    # kept as a digest: an annotation may be 256 KiB, the state is written on every change
    digest = hashlib.sha256(given.encode()).hexdigest()[:16]
    if state.awaiting and given and digest != state.ignored and \
            (target != state.target or number != str(state.wave + 1)):
        state = dataclasses.replace(state, ignored=digest)
        said.append(("Warning", "RolloutApprovalIgnored",
                     f"{APPROVE}={escape(given[:120])} approves nothing: {wave} of the "
                     f"rollout to {state.version} waits for {state.wave + 1}@{state.target}"))
    elif state.awaiting and state.approved < state.wave and target == state.target and \
            number == str(state.wave + 1):
        approval = {"wave": state.wave + 1, "by": by, "at": now}
        state = dataclasses.replace(state, approved=state.wave,
                                    approvals=(state.approvals + (approval,))[-2 * PAST:])
        said.append(("Normal", "RolloutApproved", f"{wave} ({', '.join(state.waves[state.wave])}) "
                     f"of the rollout to {state.version} approved by {by}"))
    return state, said


def command(state: RolloutState | None, action: str, by: str
            ) -> tuple[dict[str, str | None] | None, str]:
    """What `krypton rollout ACTION` writes on the rollout ConfigMap (the annotations to set,
    None to remove; None when nothing is to be written) and what it says. A rollout that is
    not running, or a state written by an operator of another format, changes nothing."""
    if state is None:
        return None, "no progressive rollout has run (no state in krypton-rollout); nothing changed"
    if state.format != FORMAT:
        return None, (f"the rollout state is of format {state.format}, written by an operator "
                      f"{'without' if state.format < FORMAT else 'newer than this'} rollout "
                      f"control (this command speaks format {FORMAT}); upgrade the "
                      f"{'operator' if state.format < FORMAT else 'command'} first; nothing "
                      "changed")
    if state.phase != PROGRESSING:
        return None, (f"the rollout to {state.version} is not running ({state.phase}: "
                      f"{state.message}); nothing changed")
    wave = f"wave {state.wave + 1}/{len(state.waves)}"
    if action == "approve":
        if not state.awaiting:
            return None, (f"the rollout to {state.version} waits for no approval ({state.message}"
                          "); nothing changed")
        return ({APPROVE: f"{state.wave + 1}@{state.target}", BY: by},
                f"approved {wave} ({', '.join(state.waves[state.wave])}) of the rollout to "
                f"{state.version}")
    if action == "pause":
        if state.paused:
            return None, f"the rollout to {state.version} is paused already; nothing changed"
        return {PAUSE: state.target, BY: by}, f"pausing the rollout to {state.version} in {wave}"
    if action == "resume":
        if not state.paused:
            return None, f"the rollout to {state.version} is not paused; nothing changed"
        return {PAUSE: None, BY: by}, f"resuming the rollout to {state.version} in {wave}"
    if action == "abort":
        return ({ABORT: state.target, PAUSE: None, BY: by},
                f"aborting the rollout to {state.version} in {wave}")
    raise ValueError(action)


def history_lines(state: RolloutState | None, when: Any) -> list[str]:
    """`krypton rollout history`: the rollouts kept, oldest first, then the current one;
    `when(t)` formats a time."""
    if state is None:
        return ["no progressive rollout has run"]
    lines = []
    for entry in (*state.past, {**state.summary(), "current": True}):
        end = f", ended {when(entry['ended'])}" if entry.get("ended") else ""
        moved = f"{entry.get('from')} -> {entry.get('version')}" if entry.get("from") \
            else f"initial {entry.get('version')}"
        lines.append(f"{moved}: {entry.get('outcome')}{' (current)' if entry.get('current') else ''}"
                     f", started {when(entry.get('started') or 0)}{end}")
        for i, wave in enumerate(entry.get("waves") or (), 1):
            lines.append(f"  wave {i}: {', '.join(map(str, wave))}")
        for a in entry.get("approvals") or ():
            lines.append(f"  approved wave {a.get('wave')} by {a.get('by')} at {when(a.get('at') or 0)}")
        if entry.get("failed"):
            lines.append(f"  failed: {', '.join(map(str, entry['failed']))}; rolled back "
                         f"{entry.get('reverted', 0)}, could not {entry.get('revert_failures', 0)}")
        lines.append(f"  {entry.get('message')}")
    return [escape(line) for line in lines]
