"""A real node for a test-bed control plane: containerd, a kubelet and a CNI bridge (SPEC T8).

:class:`Node` runs, for one :class:`~krypton.testing.ControlPlane`, the Debian containerd
(runc, cgroupfs) and the kubelet that ``hack/testbin.sh`` builds at the control plane's
Kubernetes version, so that pods really run: images are unpacked, processes start as their
``securityContext`` says, probes and hooks run, memory limits hold. Everything it makes is
its own and goes when it stops:

* a work directory holding containerd's root, state and socket, the kubelet's root, the pod
  logs and the CNI configuration and address store;
* a bridge ``kr<id>`` with a /24 of 10.123.0.0/16 that no interface of the machine is in,
  for the pods (the CNI bridge plugin; podman's own networks are in 10.88 and 10.89);
* iptables rules marked ``krypton-node-<id>``: pods reach the loopback API server through
  the ``kubernetes`` Service address (a DNAT to 127.0.0.1 with ``route_localnet`` on the
  bridge), and forwarded traffic from the bridge to anywhere else is dropped, so nothing a
  pod runs reaches beyond this machine;
* a cgroup tree ``/krypton-<id>`` for the kubelet's pods, in every cgroup v1 controller;
* the kernel settings the kubelet and the bridge plugin change (they are written back), and
  the iptables chains the kubelet makes in the machine's tables (``KUBE-FIREWALL``,
  ``KUBE-KUBELET-CANARY``, ``KUBE-IPTABLES-HINT``) when they were not there before.

Those settings and chains are the machine's: one node runs at a time on it, whichever test
process starts it (the others wait, :func:`~krypton.testing.host.hold_kernel_settings`).

Images are never pulled: every image a pod runs is imported from an OCI archive built here
(:meth:`Node.import_image`); the pod sandbox's pause image is
:func:`~krypton.testing.testimages.testpod_image`, built
from the test bed's own Go program. The kubelet serves on the bridge, to clients of the
control plane's CA only.

Needs root, containerd and runc (``hack/runtime.sh`` installs them) and the CNI plugins in
``/usr/lib/cni``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Protocol

import yaml

from .host import free_port, hold_kernel_settings, terminate
from .testimages import PAUSE_IMAGE, testpod_image

CNI_BIN = Path("/usr/lib/cni")
NO_REGISTRY = "http://127.0.0.1:9"  # the discard port: nothing listens there
API_SERVICE_IP = "10.0.0.1"  # the first address of the control plane's service range
# kernel settings that the kubelet (protectKernelDefaults: false) or the bridge plugin
# (ip_forward) write; read before and written back after
SYSCTLS = ("net/ipv4/ip_forward", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
           "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")


def run(*argv: str | Path, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`argv` run to its end, its output captured as text (`kwargs`: env, stdin, ...)."""
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=check,
                          **kwargs)


# -- the node --------------------------------------------------------------------------------


def free_subnet() -> str:
    """A /24 of 10.123.0.0/16 that no address of this machine is in."""
    taken = run("ip", "-4", "-o", "addr", "show", check=False).stdout
    for _ in range(100):
        subnet = f"10.123.{secrets.randbelow(254) + 1}.0/24"
        if f" {subnet.rsplit('.', 1)[0]}." not in taken:
            return subnet
    raise RuntimeError("no free /24 in 10.123.0.0/16 for a node's pods")


class ControlPlaneLike(Protocol):
    """What a node needs of its control plane (:class:`krypton.testing.ControlPlane`)."""

    name: str
    bin_dir: Path
    workdir: Path
    kubeconfig: Path
    api_port: int


class Node:
    """containerd + kubelet + a CNI bridge for `cp` (see the module doc). :meth:`stop` is
    idempotent and removes everything :meth:`start` made."""

    def __init__(self, cp: ControlPlaneLike, *, name: str | None = None) -> None:
        self.cp = cp
        self.name = name or f"{cp.name}-node"
        self.id = secrets.token_hex(3)
        self.workdir = Path(cp.workdir) / "node"
        self.socket = self.workdir / "containerd.sock"
        self.bridge = f"kr{self.id}"
        self.subnet = free_subnet()
        self.ip = self.subnet.replace(".0/24", ".1")  # the bridge's: the node's address
        self.cgroup_root = f"/krypton-{self.id}"
        self.comment = f"krypton-node-{self.id}"
        self.kubelet_port, self.healthz_port = free_port(), free_port()
        self._held: IO[bytes] | None = None  # the machine's kernel settings, while it runs
        self._sysctls: dict[str, str] = {}
        self._chains_before: set[tuple[str, str, str]] = set()
        self._rules: list[list[str]] = []
        self._netns: set[str] = set()  # the pods' network namespaces (bind mounts)
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Node:
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._held = hold_kernel_settings()
            for key in SYSCTLS:
                with contextlib.suppress(OSError):
                    self._sysctls[key] = (Path("/proc/sys") / key).read_text().strip()
            self._chains_before = chains()
            self._network()
            self._make_cgroups()
            self._containerd = self._spawn("containerd", [
                "containerd", "--config", str(containerd_config(self.workdir, self.socket))])
            self._wait(lambda: run("ctr", "--address", str(self.socket), "version",
                                    check=False).returncode == 0, self._containerd, "containerd")
            self.import_image(testpod_image(self.workdir))
            self._kubelet = self._spawn("kubelet", [
                str(self.cp.bin_dir / "kubelet"), "--config", str(self._kubelet_config()),
                "--kubeconfig", str(self.cp.kubeconfig), "--hostname-override", self.name,
                "--node-ip", self.ip, "--root-dir", str(self.workdir / "kubelet"),
                "--v", "1"])
            self._wait(self._node_ready, self._kubelet, f"node {self.name} Ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove every pod (so their networks and mounts go), stop the kubelet and
        containerd and the shims they left, and undo the network, cgroups and sysctls."""
        if self._kubelet is not None:
            terminate(self._kubelet, 15.0)
            self._kubelet = None
        if self._containerd is not None:
            self._remove_sandboxes()
            terminate(self._containerd, 15.0)
            self._containerd = None
        self._kill_shims()
        self._unmount()
        for rule in reversed(self._rules):
            run("iptables", "-w", *["-D" if a == "-I" else a for a in rule], check=False)
        self._rules.clear()
        remove_chains(chains() - self._chains_before)
        run("ip", "link", "delete", self.bridge, check=False)
        self._remove_cgroups()
        for key, value in self._sysctls.items():
            with contextlib.suppress(OSError):
                if (Path("/proc/sys") / key).read_text().strip() != value:
                    (Path("/proc/sys") / key).write_text(value)
        if self._held is not None:
            self._held.close()
            self._held = None

    def import_image(self, archive: Path, *, base_name: str | None = None) -> None:
        """Import the OCI archive into containerd's ``k8s.io`` namespace (no registry)."""
        argv = ["ctr", "--address", str(self.socket), "-n", "k8s.io", "images", "import",
                "--no-unpack"]
        if base_name:
            argv += ["--base-name", base_name]
        run(*argv, str(archive))

    def ctr(self, *args: str) -> str:
        """``ctr`` against this node's containerd, namespace ``k8s.io``."""
        return run("ctr", "--address", str(self.socket), "-n", "k8s.io", *args).stdout

    def log(self, what: str = "kubelet", lines: int = 40) -> str:
        text = (self.workdir / f"{what}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- set-up --------------------------------------------------------------------------

    def _network(self) -> None:
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-krypton.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"krypton-{self.id}",
            "plugins": [{"type": "bridge", "bridge": self.bridge, "isGateway": True,
                         "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": self.subnet}]],
                                  "routes": [{"dst": "0.0.0.0/0"}],
                                  "dataDir": str(self.workdir / "cni-ipam")}}]}))
        # the bridge exists before any pod, so that route_localnet can be set on it
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.ip}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1")
        mark = ["-m", "comment", "--comment", self.comment]
        for rule in (
            ["-t", "nat", "-I", "PREROUTING", "-i", self.bridge, "-d", API_SERVICE_IP, "-p",
             "tcp", "--dport", "443", *mark, "-j", "DNAT", "--to-destination",
             f"127.0.0.1:{self.cp.api_port}"],
            ["-I", "FORWARD", "-i", self.bridge, "!", "-o", self.bridge, *mark, "-j", "DROP"],
        ):
            run("iptables", "-w", *rule)
            self._rules.append(rule)

    def _make_cgroups(self) -> None:
        """The kubelet's cgroup root, in every cgroup v1 hierarchy (the kubelet wants it to
        exist); a cpuset starts with the CPUs and memory nodes of its parent."""
        for controller in Path("/sys/fs/cgroup").iterdir():
            if controller.is_symlink() or not controller.is_dir() or controller.name == "unified":
                continue
            top = controller / self.cgroup_root.lstrip("/")
            top.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):
                if (controller / name).exists():
                    (top / name).write_text((controller / name).read_text())

    def _kubelet_config(self) -> Path:
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # on the bed's bridge (the API server reaches it there for logs and exec), and
            # only for a client certificate of the control plane's CA
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(Path(self.cp.workdir) / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": "",
            "maxPods": 40,
            # the imported images are the only ones there are: never collect them
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%"},
            "serializeImagePulls": False,
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
        }))
        return path

    def _spawn(self, what: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{what}.log").open("ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait(self, ready: Any, proc: subprocess.Popen[bytes], what: str,
              timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: the process exited ({proc.returncode})\n"
                                   f"{self.log('kubelet' if proc is self._kubelet else 'containerd')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s")
            time.sleep(0.2)

    def _node_ready(self) -> bool:
        done = run(str(self.cp.bin_dir / "kubectl"), "--kubeconfig", str(self.cp.kubeconfig),
                    "get", "node", self.name, "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return done.stdout.strip() == "True"

    # -- tear-down -----------------------------------------------------------------------

    def _remove_sandboxes(self) -> None:
        """Every task deleted (killed first) and every container removed, through containerd
        (the kubelet is gone): the shims unmount the root filesystems as they go. The pods'
        network namespaces are mounts of containerd 1.6 in /var/run/netns, outside the work
        directory: each goes with its veth."""
        containers = self._ctr("containers", "ls", "-q").split()
        for container in containers:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                spec = json.loads(self._ctr("containers", "info", container))["Spec"]
                self._netns |= {n["path"] for n in spec["linux"]["namespaces"]
                                if n["type"] == "network" and n.get("path")}
        for task in self._ctr("tasks", "ls", "-q").split():
            self._ctr("tasks", "delete", "--force", task)
        if containers:
            self._ctr("containers", "delete", *containers)
        for path in self._netns:
            run("umount", path, check=False)
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _ctr(self, *args: str) -> str:
        return run("ctr", "--address", str(self.socket), "-n", "k8s.io", *args,
                    check=False).stdout

    def _processes(self) -> dict[int, list[bytes]]:
        """This node's processes still running: whatever names its work directory on its
        command line (containerd, the kubelet, the runc shims, which outlive containerd)."""
        mine, found = str(self.workdir).encode(), {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if any(mine in arg for arg in argv):
                        found[int(entry.name)] = argv
        return found

    def _kill_shims(self) -> None:
        deadline = time.monotonic() + 10
        while (shims := [pid for pid, argv in self._processes().items()
                         if argv[0].endswith(b"containerd-shim-runc-v2")]):
            if time.monotonic() > deadline:
                break
            for pid in shims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def _unmount(self) -> None:
        """Mounts left below the work directory (volumes, root filesystems, network
        namespaces), deepest first."""
        below = str(self.workdir)
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for target in sorted({m for m in mounts if m.startswith(below)}, key=len, reverse=True):
            run("umount", "-l", target, check=False)

    def _remove_cgroups(self) -> None:
        for controller in Path("/sys/fs/cgroup").iterdir():
            top = controller / self.cgroup_root.lstrip("/")
            if not top.is_dir() or top.is_symlink():
                continue
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()),
                                    key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def leftovers(self) -> list[str]:
        """What of this node is still on the machine (empty after :meth:`stop`)."""
        found = [f"process {pid} {argv[0].decode(errors='replace')}"
                 for pid, argv in self._processes().items()]
        if Path(f"/sys/class/net/{self.bridge}").exists():
            found.append(f"bridge {self.bridge}")
        for table in ("filter", "nat"):
            rules = run("iptables", "-w", "-t", table, "-S", check=False).stdout
            found += [f"{table}: {r}" for r in rules.splitlines() if self.comment in r]
        found += [f"{binary} -t {table} chain {chain}"
                  for binary, table, chain in sorted(chains() - self._chains_before)]
        found += [f"netns {path}" for path in sorted(self._netns) if os.path.exists(path)]
        found += [f"cgroup {c}" for c in Path("/sys/fs/cgroup").glob(f"*/{self.cgroup_root[1:]}")]
        below = str(self.workdir)
        found += [f"mount {line.split()[4]}" for line in
                  Path("/proc/self/mountinfo").read_text().splitlines()
                  if line.split()[4].startswith(below)]
        for key, value in self._sysctls.items():
            if (Path("/proc/sys") / key).read_text().strip() != value:
                found.append(f"sysctl {key}")
        return found


def chains(prefix: str = "KUBE-") -> set[tuple[str, str, str]]:
    """The chains named `prefix`... in the machine's iptables and ip6tables, as (program,
    table, chain)."""
    found = set()
    for program in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            listed = run(program, "-w", "-t", table, "-S", check=False).stdout
            found |= {(program, table, line.split()[1]) for line in listed.splitlines()
                      if line.startswith(f"-N {prefix}")}
    return found


def remove_chains(which: set[tuple[str, str, str]]) -> None:
    """Remove the chains `which` (as :func:`chains` names them) and every rule that jumps to
    them."""
    for program, table in {(p, t) for p, t, _ in which}:
        mine = {c for p, t, c in which if (p, t) == (program, table)}
        for rule in run(program, "-w", "-t", table, "-S", check=False).stdout.splitlines():
            words = shlex.split(rule)
            if words[0] == "-A" and "-j" in words and words[words.index("-j") + 1] in mine:
                run(program, "-w", "-t", table, "-D", *words[1:], check=False)
        for verb in ("-F", "-X"):
            for chain in sorted(mine):
                run(program, "-w", "-t", table, verb, chain, check=False)


DISABLED_PLUGINS = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]


def _toml_table(name: str, table: dict[str, Any]) -> str:
    """A TOML table of plain values and nested tables (enough for containerd's config)."""
    lines, nested = [f"[{name}]"], []
    for key, value in table.items():
        if isinstance(value, dict):
            nested.append(_toml_table(f"{name}.{key}", value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines + nested)


def containerd_config(w: Path, socket: Path) -> Path:
    """containerd's configuration for a node working in `w`, serving on `socket`: runc
    with cgroupfs, the CNI bridge, and no registry to pull from."""
    cri = {
        "sandbox_image": PAUSE_IMAGE,
        "restrict_oom_score_adj": True,  # the VM lacks CAP_SYS_RESOURCE
        "enable_selinux": False,
        "stream_server_address": "127.0.0.1",
        "containerd": {"snapshotter": "overlayfs", "default_runtime_name": "runc",
                       "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2",
                                             "options": {"SystemdCgroup": False}}}},
        "cni": {"bin_dir": str(CNI_BIN), "conf_dir": str(w / "cni")},
        # every registry is a closed port on loopback: an image that was not imported
        # fails to pull here, it is never fetched from anywhere
        "registry": {"config_path": str(_no_registries(w))},
    }
    text = "\n".join([
        "version = 2",
        f'root = "{w / "containerd-root"}"',
        f'state = "{w / "containerd-state"}"',
        f'disabled_plugins = {json.dumps(DISABLED_PLUGINS)}',
        "[grpc]", f'address = "{socket}"',
        "[ttrpc]", f'address = "{socket}.ttrpc"',
        "[metrics]", 'address = ""',
        '[plugins."io.containerd.internal.v1.opt"]', f'path = "{w / "containerd-opt"}"',
        _toml_table('plugins."io.containerd.grpc.v1.cri"', cri)])
    path = w / "containerd.toml"
    path.write_text(text + "\n")
    return path

def _no_registries(w: Path) -> Path:
    hosts = w / "registries"
    (hosts / "_default").mkdir(parents=True, exist_ok=True)
    (hosts / "_default" / "hosts.toml").write_text(
        f'server = "{NO_REGISTRY}"\n[host."{NO_REGISTRY}"]\ncapabilities = ["pull", "resolve"]\n')
    return hosts
