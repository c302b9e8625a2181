"""``krypton rollout`` (SPEC F9): approve, pause, resume or abort the progressive rollout
by an annotation on its ConfigMap, which the operator reads at its next evaluation, or read
its history."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from krypton.app.home import watch_cluster
from krypton.decisions.rollouts.rollout import CONFIGMAP, RolloutState
from krypton.decisions.rollouts.rolloutcontrol import history_lines
from krypton.decisions.settings import Settings
from krypton.runtime.rollout_controller import ask

COMMANDS = ("approve", "pause", "resume", "abort", "history")


async def rollout_control(settings: Settings, action: str, by: str) -> tuple[bool, list[str]]:
    """``krypton rollout ACTION`` (F9): the control annotation written on the rollout
    ConfigMap over the version read (a rollout that moved meanwhile makes the write fail,
    and nothing changes), or the history. Returns whether it wrote, and what it says."""
    with tempfile.TemporaryDirectory(prefix="krypton-rollout-") as tmp:
        home = await watch_cluster(settings, Path(tmp), trust_secret=False)
        try:
            if action == "history":
                cm = await home.get_configmap(settings.namespace, CONFIGMAP)
                return True, history_lines(RolloutState.from_configmap(cm), _when)
            wrote, said = await ask(home, settings.namespace, action, by)
            return wrote, [said]
        finally:
            await home.close()


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "-"
