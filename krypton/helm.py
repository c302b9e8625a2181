"""The only module that imports `pyhelm3`: helm runs per cluster, errors mapped to ours.

Each cluster gets its own kubeconfig file (mode 0600, in the cluster's private directory,
removed on disengage); tokens never appear on a command line. Values go to helm on stdin.
pyhelm3's ``Command`` is used directly: its ``Client`` runs a blocking ``helm version`` in
its constructor and passes tokens as flags.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import yaml
from pyhelm3 import errors as helm_errors
from pyhelm3.command import Command

from . import metrics
from .errors import ChartNotLoaded, HelmFailed, ReleaseLocked, VersionNotFound

logging.getLogger("pyhelm3").setLevel(logging.WARNING)


def _stderr(exc: helm_errors.Error) -> str:
    text = exc.stderr.decode(errors="replace").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    message = lines[-1] if lines else f"helm exited with {exc.returncode}"
    return message.removeprefix("Error: ")[:900]


def _helm_error(exc: helm_errors.Error) -> HelmFailed:
    message = _stderr(exc)
    if "another operation" in message and "in progress" in message:
        return ReleaseLocked(message)
    return HelmFailed(message)


class Helm:
    """helm against one cluster (or none, for pulling charts)."""

    def __init__(self, executable: str, *, kubeconfig: Path | None = None, timeout: float = 180,
                 wait: bool = True) -> None:
        self.timeout = timeout
        self.wait = wait
        self._command = Command(executable=executable, kubeconfig=kubeconfig,
                                default_timeout=f"{int(timeout)}s")

    async def _run(self, operation: str, coro: Any) -> Any:
        metrics.HELM_RUNS.labels(operation).inc()
        start, result = time.monotonic(), "success"
        try:
            # helm enforces --timeout itself; this guards against a hung process.
            return await asyncio.wait_for(coro, self.timeout + 60)
        except TimeoutError as exc:
            result = "error"
            raise HelmFailed(f"helm {operation} did not finish in {self.timeout + 60:.0f}s") from exc
        except helm_errors.Error as exc:
            result = "error"
            raise _helm_error(exc) from exc
        finally:
            metrics.HELM_SECONDS.labels(operation, result).observe(time.monotonic() - start)

    async def install_or_upgrade(self, release: str, chart: str, namespace: str,
                                 values: dict[str, Any], *, operation: str) -> dict[str, Any]:
        """``helm upgrade --install`` of a local chart directory; returns the release JSON."""
        return await self._run(operation, self._command.install_or_upgrade(  # type: ignore[no-any-return]
            release, chart, values, namespace=namespace, create_namespace=False,
            wait=self.wait, timeout=f"{int(self.timeout)}s"))

    async def rollback(self, release: str, namespace: str, revision: int | None = None,
                       *, force: bool = False) -> None:
        """``helm rollback``; `force` recreates objects a failed upgrade left missing."""
        await self._run("rollback", self._command.rollback(
            release, revision, namespace=namespace, wait=self.wait, force=force,
            timeout=f"{int(self.timeout)}s"))

    async def uninstall(self, release: str, namespace: str) -> None:
        try:
            await self._run("uninstall", self._command.uninstall(
                release, namespace=namespace, wait=self.wait, timeout=f"{int(self.timeout)}s"))
        except HelmFailed as exc:
            if "not found" not in str(exc):
                raise

    async def pull(self, name: str, *, repo: str | None, version: str, dest: Path) -> Path:
        """Fetch and unpack a chart; returns the chart directory.

        `name` is a chart name in `repo`, or a full oci:// reference with `repo` None.
        """
        dest.mkdir(parents=True, exist_ok=True)
        metrics.HELM_RUNS.labels("pull").inc()
        try:
            unpacked = await asyncio.wait_for(
                self._command.pull(name, repo=repo, version=version), self.timeout)
        except TimeoutError as exc:
            raise ChartNotLoaded(f"pulling chart {name} {version} timed out") from exc
        except helm_errors.ChartNotFoundError as exc:
            raise VersionNotFound(_stderr(exc)) from exc
        except helm_errors.Error as exc:
            message = _stderr(exc)
            if "not found" in message and "version" in message:
                raise VersionNotFound(message) from exc
            raise ChartNotLoaded(f"cannot load chart {name} {version}: {message}") from exc
        charts = [p for p in unpacked.iterdir() if (p / "Chart.yaml").exists()]
        if len(charts) != 1:
            raise ChartNotLoaded(f"chart archive for {name} {version} has no single chart")
        target = dest / f"{charts[0].name}-{chart_version(charts[0])}"
        if not target.exists():
            charts[0].rename(target)
        return target


def chart_version(chart_dir: Path) -> str:
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text()) or {}
    return str(meta.get("version", ""))
