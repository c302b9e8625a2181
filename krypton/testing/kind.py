"""kind on this machine (SPEC T9): a kind node image built without a registry, and
``hack/e2e-kind.sh`` — the script users run with Docker — run with podman as kind's provider.

The node image (:func:`node_image`) is Debian bookworm from ``mmdebstrap`` (systemd,
containerd, runc, the CNI plugins, iptables) with the kubelet, kubeadm and kubectl that
``hack/testbin.sh kind`` builds, and in ``/kind/images`` an OCI archive of every image kubeadm's
control plane runs, each built here from the same tools: kube-apiserver, kube-controller-manager,
kube-scheduler, etcd, CoreDNS, kube-proxy (on Debian's iptables) and pause (the test bed's own
program). A unit imports them into containerd at boot, before kind runs kubeadm; every registry
of the node is a closed port, so nothing is pulled. Pods are on a bridge of the node's own
(``kindnode/10-pods.conflist``), enough for the single-node clusters of the script. The image is
kept in podman's store under a name that digests its inputs, and built again when one changes.

:func:`main` (``make e2e-kind``) sets up what the script needs and cleans it away after:
podman's settings for this machine (runc, cgroupfs, explicit ulimits) in a file of its own; a
podman network for the clusters in a free /24 of 10.123.0.0/16, whose forwarded traffic to
anywhere but itself is dropped; the test chart served on the network's gateway; and the kernel
settings the kubelets change, written back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .chartrepo import ChartRepository
from .host import free_port
from .node import SYSCTLS, chains, free_subnet, remove_chains, run
from .testimages import oci_archive, testpod_binary

HERE = Path(__file__).resolve().parent
FILES = HERE / "kindnode"
ROOT = HERE.parents[1]
CHARTS = ROOT / "tests" / "charts"
MIRROR = os.environ.get("KRYPTON_DEBIAN_MIRROR", "http://deb.debian.org/debian")
IMAGE_REPOSITORY = "localhost/krypton/kind-node"
# what kind and kubeadm run on a node: systemd, the runtime, and the programs kubeadm's
# preflight checks look for
NODE_PACKAGES = ("systemd", "systemd-sysv", "dbus", "containerd", "runc",
                 "containernetworking-plugins", "iptables", "conntrack", "ebtables", "ethtool",
                 "socat", "iproute2", "mount", "util-linux", "kmod", "procps", "ca-certificates")
PROXY_PACKAGES = ("iptables", "conntrack")  # kube-proxy's image: its binary on these
# image name (after the registry) -> (the binary from the test bed, where it goes, as root)
CONTROL_PLANE = {
    "kube-apiserver": ("kube-apiserver", "/usr/local/bin/kube-apiserver"),
    "kube-controller-manager": ("kube-controller-manager", "/usr/local/bin/kube-controller-manager"),
    "kube-scheduler": ("kube-scheduler", "/usr/local/bin/kube-scheduler"),
    "kube-proxy": ("kube-proxy", "/usr/local/bin/kube-proxy"),
    "etcd": ("etcd", "/usr/local/bin/etcd"),
    "coredns": ("coredns", "/coredns"),
}
NODE_FILES = {  # file of kindnode/ -> (where in the node, mode)
    "entrypoint": ("/usr/local/bin/entrypoint", 0o755),
    "kubelet.service": ("/etc/systemd/system/kubelet.service", 0o644),
    "kubelet.slice": ("/etc/systemd/system/kubelet.slice", 0o644),
    "krypton-images.service": ("/etc/systemd/system/krypton-images.service", 0o644),
    "containerd.toml": ("/etc/containerd/config.toml", 0o644),
    "hosts.toml": ("/etc/containerd/certs.d/_default/hosts.toml", 0o644),
    "10-pods.conflist": ("/etc/cni/net.d/10-pods.conflist", 0o644),
    "default-cni.yaml": ("/kind/manifests/default-cni.yaml", 0o644),
}
ENABLED = ("kubelet.service", "krypton-images.service")
# a node has no login console (a getty on it would also take systemd's boot messages, which
# kind reads), and no package or file system upkeep of its own
MASKED = ("console-getty.service", "getty@tty1.service", "apt-daily.timer",
          "apt-daily-upgrade.timer", "dpkg-db-backup.timer", "e2scrub_all.timer")


def say(line: str) -> None:
    print(line, flush=True)


# -- the node image --------------------------------------------------------------------------


def kube_version(tools: Path) -> str:
    return run(tools / "kubeadm", "version", "-o", "short").stdout.strip()


def image_name(tools: Path) -> str:
    """The node image's name: the Kubernetes version and a digest of what it is made of
    (the package lists, the units, kindnode/ and the tools' builds)."""
    digest = hashlib.sha256(repr((NODE_PACKAGES, PROXY_PACKAGES, CONTROL_PLANE, NODE_FILES,
                                  ENABLED, MASKED)).encode())
    for path in sorted(FILES.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    for name in ("kubelet", "kubeadm", "kubectl", *(b for b, _ in CONTROL_PLANE.values())):
        stat = (tools / name).stat()
        digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return f"{IMAGE_REPOSITORY}:{kube_version(tools)}-{digest.hexdigest()[:12]}"


def node_image(tools: Path) -> str:
    """The kind node image for the test bed's tools, built unless podman has it already."""
    name = image_name(tools)
    if subprocess.run(["podman", "image", "exists", name]).returncode == 0:
        return name
    say(f"building the kind node image {name}")
    with tempfile.TemporaryDirectory(prefix="krypton-kind-node-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        rootfs = work / "rootfs"
        _debian(rootfs, NODE_PACKAGES, variant="minbase")
        _debian(work / "proxy.tar", PROXY_PACKAGES, variant="essential")
        _images(tools, work, rootfs / "kind" / "images")
        _node_files(tools, rootfs)
        _import(rootfs, name)
    for old in run("podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                    IMAGE_REPOSITORY).stdout.split():
        if old != name:
            subprocess.run(["podman", "rmi", old], capture_output=True)
    return name


def _debian(into: Path, packages: tuple[str, ...], *, variant: str) -> None:
    run("mmdebstrap", "--quiet", f"--variant={variant}", f"--include={','.join(packages)}",
         "--aptopt=APT::Install-Recommends \"false\"",
         "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
         "--dpkgopt=path-exclude=/usr/share/locale/*",
         '--customize-hook=rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*',
         "bookworm", into, MIRROR)


def _images(tools: Path, work: Path, into: Path) -> None:
    """One OCI archive per image kubeadm names for this Kubernetes version."""
    into.mkdir(parents=True)
    listed = run(tools / "kubeadm", "config", "images", "list", "--kubernetes-version",
                  kube_version(tools)).stdout.split()
    for ref in listed:
        image = ref.rsplit(":", 1)[0].rsplit("/", 1)[1]
        archive = into / f"{image}.tar"
        if image == "pause":  # the sandbox: the test bed's own program, as in the real node
            oci_archive(archive, name=ref, entrypoint=["/testpod"], cmd=["pause"],
                        files={"/testpod": (testpod_binary(work).read_bytes(), 0o755)})
            continue
        binary, path = CONTROL_PLANE[image]
        oci_archive(archive, name=ref, entrypoint=[path], cmd=[], user="0:0", compress=False,
                    files={path: ((tools / binary).read_bytes(), 0o755)},
                    base=work / "proxy.tar" if image == "kube-proxy" else None)


def _node_files(tools: Path, rootfs: Path) -> None:
    def put(path: str, content: bytes, mode: int) -> None:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)

    for name in ("kubelet", "kubeadm", "kubectl"):
        put(f"/usr/bin/{name}", (tools / name).read_bytes(), 0o755)
    for source, (path, mode) in NODE_FILES.items():
        put(path, (FILES / source).read_bytes(), mode)
    put("/kind/version", f"{kube_version(tools)}\n".encode(), 0o644)
    wants = rootfs / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ENABLED:
        (wants / unit).unlink(missing_ok=True)
        (wants / unit).symlink_to(f"/etc/systemd/system/{unit}")
    for unit in MASKED:
        (rootfs / "etc/systemd/system" / unit).unlink(missing_ok=True)
        (rootfs / "etc/systemd/system" / unit).symlink_to("/dev/null")
    (rootfs / "etc/machine-id").unlink(missing_ok=True)  # each node makes its own


def _import(rootfs: Path, name: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."],
                           stdout=subprocess.PIPE)
    try:
        run("podman", "import",
             "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
             "--change", "STOPSIGNAL SIGRTMIN+3", "-", name, stdin=tar.stdout)
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()


# -- the end to end ---------------------------------------------------------------------------

# podman on this machine: runc (crun is not installed), cgroupfs (no systemd as PID 1), limits
# given outright (the defaults ask for more open files than the VM allows), events to a file
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
NETWORK = "krypton-kind"
KIND_LABEL = "io.x-k8s.kind.cluster"  # on kind's node containers
NODES = ("home-control-plane", "remote-control-plane")  # the script's; label keys of their /var


class Bed:
    """What hack/e2e-kind.sh needs of this machine around kind, and its removal."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.conf = work / "containers.conf"
        self.subnet = free_subnet()
        self.gateway = self.subnet.replace(".0/24", ".1")
        self.bridge = ""
        self.comment = f"krypton-kind-{os.getpid()}"
        # the global kernel settings a node's kubelet writes, and ip_forward (netavark's)
        self._sysctls = {key: (Path("/proc/sys") / key).read_text().strip() for key in SYSCTLS}
        self._chains = chains("NETAVARK") | chains()
        self._modules = not Path("/lib/modules").exists()
        self._rule: list[str] = []

    def env(self) -> dict[str, str]:
        # kind writes the clusters' contexts into $KUBECONFIG: a file of the lane's own
        return {"CONTAINERS_CONF": str(self.conf), "KIND_EXPERIMENTAL_PROVIDER": "podman",
                "KIND_EXPERIMENTAL_PODMAN_NETWORK": NETWORK,
                "KUBECONFIG": str(self.work / "kubeconfig")}

    def __enter__(self) -> Bed:
        self.conf.write_text(CONTAINERS_CONF)
        if self._modules:  # kind's podman provider mounts it into every node
            Path("/lib/modules").mkdir()
        run("podman", "network", "create", "--subnet", self.subnet, "--gateway", self.gateway,
             "--label", self.comment, NETWORK, env={**os.environ, **self.env()})
        self.bridge = run("podman", "network", "inspect", NETWORK, "--format",
                           "{{.NetworkInterface}}", env={**os.environ, **self.env()}).stdout.strip()
        # nothing the clusters forward leaves their network (mangle: before netavark's
        # own FORWARD rules, which accept it)
        self._rule = ["-t", "mangle", "-I", "FORWARD", "-i", self.bridge, "!", "-o", self.bridge,
                      "-m", "comment", "--comment", self.comment, "-j", "DROP"]
        run("iptables", "-w", *self._rule)
        return self

    def __exit__(self, *exc: object) -> None:
        env = {**os.environ, **self.env()}
        for kind in ("container", "volume"):  # what the script did not delete (it failed)
            listed = self._podman_ls(kind)
            if listed:
                subprocess.run(["podman", kind, "rm", "-f", *listed], env=env,
                               capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", NETWORK], env=env, capture_output=True)
        if self._rule:
            subprocess.run(["iptables", "-w", *["-D" if a == "-I" else a for a in self._rule]],
                           capture_output=True)
        remove_chains((chains("NETAVARK") | chains()) - self._chains)
        if self.bridge:
            subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        for key, value in self._sysctls.items():
            if (Path("/proc/sys") / key).read_text().strip() != value:
                (Path("/proc/sys") / key).write_text(value)
        if self._modules:
            with contextlib.suppress(OSError):
                Path("/lib/modules").rmdir()

    def _podman_ls(self, kind: str) -> list[str]:
        """kind's node containers, or their volumes (each labelled with its node's name)."""
        labels, every = ([KIND_LABEL], ["--all"]) if kind == "container" else (list(NODES), [])
        return [name for label in labels for name in subprocess.run(
            ["podman", kind, "ls", "-q", *every, "--filter", f"label={label}"],
            env={**os.environ, **self.env()}, capture_output=True, text=True).stdout.split()]

    def leftovers(self) -> list[str]:
        env = {**os.environ, **self.env()}
        found = [f"{kind} {name}" for kind in ("container", "volume")
                 for name in self._podman_ls(kind)]
        if subprocess.run(["podman", "network", "exists", NETWORK], env=env).returncode == 0:
            found.append(f"network {NETWORK}")
        if self.bridge and Path(f"/sys/class/net/{self.bridge}").exists():
            found.append(f"bridge {self.bridge}")
        found += [f"{p} -t {t} chain {c}"
                  for p, t, c in sorted((chains("NETAVARK") | chains()) - self._chains)]
        rules = run("iptables", "-w", "-t", "mangle", "-S").stdout
        found += [f"rule {r}" for r in rules.splitlines() if self.comment in r]
        found += [f"sysctl {key}" for key, value in self._sysctls.items()
                  if (Path("/proc/sys") / key).read_text().strip() != value]
        if self._modules and Path("/lib/modules").exists():
            found.append("/lib/modules")
        return found

    def wait_for_gateway(self, script: subprocess.Popen[bytes]) -> bool:
        """Until the network's bridge has its address (netavark makes it with the first
        node), or the script has ended."""
        while script.poll() is None:
            with socket.socket() as probe:
                try:
                    probe.bind((self.gateway, 0))
                    return True
                except OSError:
                    pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                script.wait(0.5)
        return False


def main() -> int:
    tools = Path(os.environ.get("KRYPTON_TESTBIN_DIR") or run(
        "bash", ROOT / "hack" / "testbin.sh", "kind").stdout.strip().splitlines()[-1])
    image = node_image(tools)
    say(f"kind node image {image}")
    with tempfile.TemporaryDirectory(prefix="krypton-kind-") as tmp:
        bed, repo, code = Bed(Path(tmp)), None, 1
        try:
            with bed:
                port = free_port()
                script = subprocess.Popen(["bash", str(ROOT / "hack" / "e2e-kind.sh")], env={
                    **os.environ, **bed.env(), "PATH": f"{tools}:{os.environ['PATH']}",
                    "KIND_NODE_IMAGE": image, "CHART_REPO": f"http://{bed.gateway}:{port}",
                    "CHART_NAME": "sample", "CHART_VERSION": "0.1.0"})
                # the chart repository listens on the clusters' network only, which netavark
                # brings up with the first node
                if bed.wait_for_gateway(script):
                    repo = ChartRepository(tools / "helm", host=bed.gateway, port=port)
                    repo.publish(CHARTS / "sample", "0.1.0")
                    repo.start()
                code = script.wait()
        finally:
            if repo is not None:
                repo.close()
        left = bed.leftovers()
    if left:
        say(f"left on the machine: {left}")
        return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main())
