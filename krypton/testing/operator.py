"""Running the real operator as a background process in tests, the e2e, the demo and the
benchmarks, and small helpers around it.

`OperatorProcess` starts ``python -m krypton run`` with the given flags, writes its PID to a
file, captures its log, scrapes its Prometheus metrics and stops it like ``make stop``
(SIGTERM, about 5 s, then SIGKILL).
"""

from __future__ import annotations

import atexit
import base64
import compileall
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client

from krypton.decisions.clusters.sharding import CLUSTER_ANNOTATION, CLUSTER_LABEL
from krypton.decisions.model import epoch_seconds

from .host import free_port, terminate

LABEL = "sigs.k8s.io/multicluster-runtime-kubeconfig"
T = TypeVar("T")


def cluster_holders(api: Any, namespace: str, group: str) -> dict[str, str]:
    """Under --sharding: cluster -> the holder of its Lease ("" when released), read with the
    kubernetes client `api` from the Leases of sharding group `group` in `namespace`."""
    leases = client.CoordinationV1Api(api).list_namespaced_lease(
        namespace, label_selector=f"{CLUSTER_LABEL}={group}").items
    return {(lease.metadata.annotations or {}).get(CLUSTER_ANNOTATION, ""):  # type: ignore[union-attr]
            lease.spec.holder_identity or "" for lease in leases}  # type: ignore[union-attr]


def logged_at(entry: dict[str, Any]) -> float:
    """When a JSON log line of the operator was written, in seconds since the epoch."""
    when = epoch_seconds(entry.get("timestamp"))
    if when is None:
        raise ValueError(f"log line without a timestamp: {entry}")
    return when


def wait_for(predicate: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25,
             what: str = "condition") -> T:
    """Poll `predicate` until it returns something truthy; raise TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling through transient errors
            last = exc
        if last and not isinstance(last, Exception):
            return last  # type: ignore[no-any-return]
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def kubeconfig_secret(name: str, kubeconfig: str | bytes, *, namespace: str = "default",
                      label: str = LABEL, values: str | None = None) -> dict[str, Any]:
    """A labelled kubeconfig Secret body as the operator discovers it."""
    raw = kubeconfig.encode() if isinstance(kubeconfig, str) else kubeconfig
    data = {"kubeconfig": base64.b64encode(raw).decode()}
    if values is not None:
        data["values.yaml"] = base64.b64encode(values.encode()).decode()
    return {"metadata": {"name": name, "namespace": namespace, "labels": {label: "true"}},
            "type": "Opaque", "data": data}


STARTED: list[OperatorProcess] = []  # every operator this process started (for log scans)
_WORKDIRS: list[Path] = []  # their log directories, removed when this process ends


@atexit.register
def _remove_workdirs() -> None:
    """The operators' logs outlive the tests (a session's last look scans them all), not the
    test process, unless KRYPTON_KEEP_CONTROLPLANE=1 keeps them for a post-mortem."""
    if os.environ.get("KRYPTON_KEEP_CONTROLPLANE") != "1":
        for path in _WORKDIRS:
            shutil.rmtree(path, ignore_errors=True)


def descendants(pid: int) -> list[int]:
    """PIDs of every process below `pid` (children, their children, ...)."""
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        return []  # gone
    return out + [d for child in out for d in descendants(child)]


def cmdline(pid: int) -> list[str]:
    """A process's argument vector, [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


PACKAGE = Path(__file__).resolve().parents[1]
IMAGE_LOCK = PACKAGE.parent / "image" / "requirements.lock"


def image_python(program: str) -> list[str]:
    """``python -c program`` for which the packages of this environment that the image does
    not have cannot be imported (:func:`not_in_image`), with krypton's modules compiled as
    the image has them (:func:`compile_like_image`)."""
    compile_like_image()
    block = "import sys; sys.modules.update(dict.fromkeys(sys.argv.pop(1).split(',')));"
    return [sys.executable, "-c", block + program, ",".join(not_in_image())]


@functools.cache
def compile_like_image(package: Path = PACKAGE) -> None:
    """Writes the bytecode of `package`'s modules (krypton's), as the image's build does. A
    process started from the work tree where the environment says not to write bytecode
    (``PYTHONDONTWRITEBYTECODE``, as on the development machine) would otherwise compile
    every one of them at each start: about 0.08 s of CPU and 1.5 MiB that the image's
    operator never spends. Stale or missing files only; the dependencies' bytecode was
    written when they were installed."""
    compileall.compile_dir(str(package), quiet=1)


@functools.cache
def not_in_image() -> list[str]:
    """The top-level modules of the packages installed here that the operator's image does
    not have (its ``image/requirements.lock``): the development tools, and what they bring
    (rich, Pygments, colorama, bcrypt), which some libraries use when they find them. Empty
    when the lock is not at hand."""
    try:
        lock = IMAGE_LOCK.read_text()
    except OSError:
        return []
    pinned = {canonical(line.split("==", 1)[0]) for line in lock.splitlines()
              if "==" in line and not line.lstrip().startswith("#")} | {"krypton"}
    return sorted(module for module, dists in installed_modules().items()
                  if not module.startswith("_") and module.isidentifier()
                  and not any(canonical(d) in pinned for d in dists))


def installed_modules() -> dict[str, set[str]]:
    """The top-level modules of this environment's site-packages, each with the
    distributions that install it (from their ``*.dist-info/RECORD``)."""
    found: dict[str, set[str]] = {}
    for info in Path(sysconfig.get_paths()["purelib"]).glob("*.dist-info"):
        try:
            record = (info / "RECORD").read_text()
        except OSError:
            continue
        dist = info.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        for line in record.splitlines():
            top = line.split(",", 1)[0].split("/", 1)[0].removesuffix(".py")
            found.setdefault(top, set()).add(dist)
    return found


def canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower().strip()


class OperatorProcess:
    """``python -m krypton run`` in the background. With `image_imports`, the packages of
    this environment that the image does not have cannot be imported by it (see
    :func:`not_in_image`): what the benchmarks measure is what the image would run."""

    def __init__(self, args: Sequence[str], *, helm_dir: str | Path,
                 env: dict[str, str] | None = None, log_path: Path | None = None,
                 pid_file: Path | None = None, image_imports: bool = False) -> None:
        self.image_imports = image_imports
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.web_port = free_port()
        self.args = [
            "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
            "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
            "--log-format", "json",
            *args,
        ]
        tmp = Path(tempfile.mkdtemp(prefix="krypton-op-"))
        _WORKDIRS.append(tmp)
        # its work directory goes with its logs: one the suite kills is removed all the same
        self.env = {**os.environ, "TMPDIR": str(tmp)}
        # the fleet page's own port, by its environment variable: an older krypton, which
        # has no page, runs with it all the same (tests/integration/test_migration.py)
        self.env["KRYPTON_WEB_ADDRESS"] = f"127.0.0.1:{self.web_port}"
        self.env["PATH"] = f"{helm_dir}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.update(env or {})
        self.log_path = log_path or tmp / "operator.log"
        self.pid_file = pid_file or tmp / "operator.pid"
        self.metrics_path = self.log_path.with_name("metrics.txt")
        self.popen: subprocess.Popen[bytes] | None = None
        STARTED.append(self)

    def start(self) -> OperatorProcess:
        with self.log_path.open("ab") as out:
            command = [sys.executable, "-m", "krypton"]
            if self.image_imports:
                command = image_python("from krypton.cli.main import main; sys.exit(main())")
            self.popen = subprocess.Popen(
                [*command, "run", *self.args], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.pid_file.write_text(str(self.popen.pid))
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"operator exited:\n{self.log_tail()}")
            return self.readyz().startswith("ok")
        wait_for(ready, timeout, what="operator /readyz")

    def readyz(self) -> str:
        """The body of /readyz ("ok" plus one line per cluster that is not serving)."""
        return self._get(f"http://127.0.0.1:{self.health_port}/readyz")

    def _get(self, url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def metrics_text(self) -> str:
        return self._get(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            metric, _, label_text = head.partition("{")
            if metric != name:
                continue
            if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
                total += float(value)
        return total

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_entries(self) -> list[dict[str, Any]]:
        """Every JSON log line, parsed."""
        out = []
        for line in self.log_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def log_events(self, event: str, **fields: str) -> list[dict[str, Any]]:
        """The JSON log lines whose ``event`` is `event` and whose fields include `fields`."""
        return [e for e in self.log_entries() if e.get("event") == event and
                all(e.get(k) == v for k, v in fields.items())]

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit status.

        The last metrics are kept next to the log (`metrics_path`), for tests that look at
        everything the operator ever published (the credential scan)."""
        if self.popen is None:
            return None
        if self.alive():
            try:
                self.metrics_path.write_text(self.metrics_text())
            except OSError:
                pass
        code = terminate(self.popen, grace)
        self.pid_file.unlink(missing_ok=True)
        return code

    def kill(self, *, group: bool = False) -> None:
        """SIGKILL (crash tests); with `group`, also the helm processes it started, as when
        a pod's container is killed."""
        if self.popen is not None and self.popen.poll() is None:
            if group:
                os.killpg(self.popen.pid, signal.SIGKILL)
            else:
                self.popen.kill()
            self.popen.wait(5)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
