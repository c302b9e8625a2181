"""``make demo``: krypton on two local clusters, from nothing (SPEC O11).

Starts a home and a remote control plane, each with two simulated nodes (kwok), and a local
chart repository serving the ``workload`` test chart (a Deployment of two pods, a Service and a
post-install hook Job), registers the remote cluster with ``krypton register-cluster``, runs
the operator in the background (the home cluster engages itself as ``self-cluster``), applies
the sample Tenants of ``examples/``, waits for them (krypton follows their pods), shows the
pods, prints ``krypton status``, ``krypton plan`` (a new version, then a changed value) and
``krypton diff``, follows initech's resumption with ``krypton status --watch``, and leaves
the clusters up for exploring with kubectl until Enter or Ctrl-C (when run from a
terminal; otherwise, or with ``DEMO_HOLD=0``, it tears down at once).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config

from . import ChartRepository, ControlPlane, testbin
from .operator import OperatorProcess, wait_for
from .watching import Watching, row

ROOT = Path(__file__).resolve().parents[2]


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def _cli_env(tools: Path) -> dict[str, str]:
    """The CLI's environment: the test bed's tools (helm) first on PATH."""
    return {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}


def krypton(tools: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "krypton", *args], capture_output=True,
                          text=True, env=_cli_env(tools), timeout=120)


def _succeeds(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True).returncode == 0


def _watch_resume(tools: Path, kubectl: str, home: ControlPlane, flags: list[str]) -> str:
    """The frames `krypton status --watch` printed from before initech's pause annotation
    was removed until it was Ready on home."""
    watching = Watching("--wide", *flags, env=_cli_env(tools))
    try:
        watching.wait_frame(lambda f: row(f, "initech", "self-cluster")[3:4] == ["Suspended"],
                            "initech Suspended in krypton status --watch", timeout=60)
        subprocess.run([kubectl, "--kubeconfig", str(home.kubeconfig), "annotate", "tenant",
                        "initech", "mesh.openkcm.io/paused-"], check=True, capture_output=True)
        watching.wait_frame(lambda f: row(f, "initech", "self-cluster")[3:4] == ["Ready"],
                            "initech Ready in krypton status --watch", timeout=120)
    finally:
        code = watching.stop()
    frames = watching.frames()
    return "\n\n".join([*frames[:1], "...", *frames[-1:]] if len(frames) > 2 else frames) + \
        f"\n(Ctrl-C; krypton status --watch exited with {code})"


def workdir() -> Path:
    """$KRYPTON_DEMO_DIR (made empty first), else a new directory per run, so that two demos
    never share one."""
    chosen = os.environ.get("KRYPTON_DEMO_DIR")
    if not chosen:
        return Path(tempfile.mkdtemp(prefix="krypton-demo-"))
    path = Path(chosen)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@dataclass
class Demo:
    """What the demo started, stopped in the reverse order."""

    tools: Path
    work: Path
    home: ControlPlane | None = None
    remote: ControlPlane | None = None
    repo: ChartRepository | None = None
    op: OperatorProcess | None = None

    @property
    def common(self) -> list[str]:
        assert self.home is not None
        return ["--watch-kubeconfig", str(self.home.kubeconfig), "--namespace", "krypton-system"]

    def start(self) -> bool:
        """The two clusters, the chart repository, the remote registered and the operator
        running; False when the registration failed."""
        tools, work = self.tools, self.work
        step("starting two local control planes (etcd + kube-apiserver), each with two "
             "simulated nodes (kube-scheduler + kwok)")
        self.home = home = ControlPlane("home", tools, auth="cert", controller_manager=True,
                                        nodes=2, workdir=work / "home").start()
        self.remote = remote = ControlPlane("remote", tools, auth="token", nodes=2,
                                            workdir=work / "remote").start()
        print(f"home   {home.server}  kubeconfig {home.kubeconfig}  (client certificate)")
        print(f"remote {remote.server}  kubeconfig {remote.kubeconfig}  (bearer token)")

        step("serving the workload chart (1.0.0, 1.1.0) from a local chart repository")
        self.repo = ChartRepository(tools / "helm", work / "charts")
        for version in ("1.0.0", "1.1.0"):
            self.repo.publish(ROOT / "tests" / "charts" / "workload", version)
        self.repo.start()
        print(f"chart repository {self.repo.url}")

        core = client.CoreV1Api(config.new_client_from_config(str(home.kubeconfig)))
        core.create_namespace({"metadata": {"name": "krypton-system"}})  # type: ignore[arg-type]
        step("krypton register-cluster remote --kubeconfig remote.kubeconfig")
        reg = krypton(tools, "register-cluster", "remote", "--kubeconfig", str(remote.kubeconfig),
                      *self.common)
        print(reg.stdout.strip() or reg.stderr.strip())
        if reg.returncode != 0:
            return False
        step("starting the operator in the background (home engages itself as self-cluster)")
        self.op = OperatorProcess([*self.common, *self.chart, "--helm-timeout", "60s"],
                                  helm_dir=tools, env={"KUBECONFIG": str(home.kubeconfig)},
                                  log_path=work / "operator.log", pid_file=work / "operator.pid")
        self.op.start().wait_ready()
        print(f"operator PID {self.op.pid}, log {work / 'operator.log'}, "
              f"metrics http://127.0.0.1:{self.op.metrics_port}/metrics, "
              f"fleet page http://127.0.0.1:{self.op.web_port}/")
        return True

    @property
    def chart(self) -> list[str]:
        assert self.repo is not None
        return ["--chart-repo", self.repo.url, "--chart-name", "workload", "--chart-version", "~1.0"]

    def tour(self) -> None:
        """The sample Tenants applied and Ready, their pods, then krypton's commands."""
        tools, kubectl = self.tools, str(self.tools / "kubectl")
        home, remote, repo = self.home, self.remote, self.repo
        assert home is not None and remote is not None and repo is not None
        common, chart = self.common, self.chart
        step("applying sample Tenants: acme and globex on remote, globex and initech on home")
        for cp, files in ((remote, ("tenant-acme.yaml", "tenant-globex.yaml")),
                          (home, ("tenant-globex.yaml", "tenant-initech.yaml"))):
            for name in files:
                argv = [kubectl, "--kubeconfig", str(cp.kubeconfig), "apply", "-f",
                        str(ROOT / "examples" / name)]
                wait_for(functools.partial(_succeeds, argv), 60, what=f"apply {name}")
        for cp, name in ((remote, "acme"), (remote, "globex"), (home, "globex")):
            subprocess.run([kubectl, "--kubeconfig", str(cp.kubeconfig), "wait",
                            "--for=condition=Ready", f"tenant/{name}", "--timeout=120s"],
                           check=True, capture_output=True)
        print("acme and globex are Ready; initech is paused (Suspended)")

        step("the pods of acme on remote (scheduled onto simulated nodes, Ready)")
        print(subprocess.run([kubectl, "--kubeconfig", str(remote.kubeconfig), "-n", "acme",
                              "get", "pods", "-o", "wide"], capture_output=True, text=True,
                             check=True).stdout)

        step("krypton status")
        print(krypton(tools, "status", *common, *chart).stdout)
        step("krypton plan (with --chart-version 1.1.0: what an upgrade would do)")
        print(krypton(tools, "plan", *common, "--chart-repo", repo.url, "--chart-name",
                      "workload", "--chart-version", "1.1.0").stdout)
        values = self.work / "values.yaml"
        values.write_text("replicas: 3\n")
        changed = [*common, *chart, "--chart-values-file", str(values)]
        step("krypton plan with a changed central value (values.yaml: replicas: 3)")
        print(krypton(tools, "plan", *changed).stdout)
        step("krypton diff with that value: what the next reconcile would apply")
        print(krypton(tools, "diff", *changed).stdout)
        step("krypton status --watch --wide while initech is resumed on home")
        print(_watch_resume(tools, kubectl, home, [*common, *chart]))

    def explore(self) -> None:
        """How to look further; held until Enter when run from a terminal."""
        kubectl = str(self.tools / "kubectl")
        assert self.home is not None and self.remote is not None and self.op is not None
        step("explore")
        print(f"""  export KUBECONFIG={self.remote.kubeconfig}   # or {self.home.kubeconfig}
  {kubectl} get tenants -A
  {kubectl} get tenant acme -o yaml
  {kubectl} get events -n default
  {kubectl} -n acme get deployment,pods,jobs -o wide
  {kubectl} get nodes
  {kubectl} annotate tenant acme mesh.openkcm.io/paused=true
  {shlex.join([sys.executable, '-m', 'krypton', 'status', '--watch', '--wide', *self.common,
               *self.chart])}
  curl -s http://127.0.0.1:{self.op.metrics_port}/metrics | grep krypton_
  open http://127.0.0.1:{self.op.web_port}/ in a browser: the fleet page""")
        if os.environ.get("DEMO_HOLD", "1" if sys.stdin.isatty() else "0") == "1":
            try:
                input("\nPress Enter (or Ctrl-C) to stop the demo and tear everything down. ")
            except (KeyboardInterrupt, EOFError):
                pass

    def stop(self, ok: bool) -> None:
        step("tearing down")
        if self.op is not None:
            print(f"operator exited with {self.op.stop()}")
        if self.repo is not None:
            self.repo.stop()
        for plane in (self.remote, self.home):
            if plane is not None:
                plane.stop()
        if ok:
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print(f"the demo failed; its files (the operator log among them) are kept in "
                  f"{self.work}")


def main() -> int:
    demo = Demo(testbin(), workdir())
    print(f"demo directory {demo.work}", flush=True)
    ok = False
    try:
        if not demo.start():
            return 1
        demo.tour()
        demo.explore()
        ok = True
        return 0
    finally:
        demo.stop(ok)


if __name__ == "__main__":
    sys.exit(main())
