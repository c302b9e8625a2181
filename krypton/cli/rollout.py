"""``krypton rollout`` (SPEC F9): approve, pause, resume or abort the progressive rollout
by an annotation on its ConfigMap, which the operator reads at its next evaluation, or read
its history."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from krypton.app.home import watch_cluster
from krypton.decisions.errors import Conflict
from krypton.decisions.rollouts.rollout import CONFIGMAP, FORMAT, PROGRESSING, RolloutState
from krypton.decisions.rollouts.rolloutcontrol import ABORT, APPROVE, BY, PAUSE
from krypton.decisions.settings import Settings
from krypton.decisions.trust.printable import escape

COMMANDS = ("approve", "pause", "resume", "abort", "history")


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


async def rollout_control(settings: Settings, action: str, by: str) -> tuple[bool, list[str]]:
    """``krypton rollout ACTION`` (F9): the control annotation written on the rollout
    ConfigMap over the version read (a rollout that moved meanwhile makes the write fail,
    and nothing changes), or the history. Returns whether it wrote, and what it says."""
    with tempfile.TemporaryDirectory(prefix="krypton-rollout-") as tmp:
        home = await watch_cluster(settings, Path(tmp), trust_secret=False)
        try:
            attempts = 3
            while True:
                cm = await home.get_configmap(settings.namespace, CONFIGMAP)
                state = RolloutState.from_configmap(cm)
                if action == "history":
                    return True, history_lines(state, _when)
                annotations, said = command(state, action, by)
                if annotations is None or cm is None:
                    return False, [said]
                try:
                    await home.patch_configmap(settings.namespace, CONFIGMAP, {"metadata": {
                        "resourceVersion": cm["metadata"]["resourceVersion"],
                        "annotations": annotations}})
                    return True, [said]
                except Conflict:  # the operator wrote the state meanwhile: judge it again
                    attempts -= 1
                    if not attempts:
                        raise
        finally:
            await home.close()


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "-"
