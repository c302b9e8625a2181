"""The operator as its chart's Deployment runs it, without a container engine (SPEC T5).

:class:`PodOperator` renders the operator chart with ``helm template`` (with the values under
test), applies everything but the Deployment (ServiceAccount, RBAC, ConfigMaps, CRDs) to a
:class:`~krypton.testing.ControlPlane` with its admin credentials, and starts the
Deployment's container as a process whose view matches a pod's:

* exactly the container's ``args`` after the image's entrypoint (``krypton``), and its
  ``env``, with ``fieldRef`` values filled in as the downward API would
  (``metadata.name``, ``metadata.namespace``) and ``KUBERNETES_SERVICE_HOST``/``_PORT``
  naming the API server;
* a private mount namespace (``unshare --mount``) in which the service-account files
  (``token``, ``ca.crt``, ``namespace``) appear at ``/var/run/secrets/kubernetes.io/
  serviceaccount``, each ConfigMap volume at its ``mountPath`` and each ``emptyDir`` as a
  fresh directory; paths that do not exist on the machine are created inside an overlay
  that only this process sees, so nothing outside the harness's own directory is written;
* the working directory and ``HOME`` of the image (``/`` and ``/tmp``) and, by default,
  the user and group of the pod's ``securityContext`` (``runAsUser``/``runAsGroup``).

The token is a real one from the TokenRequest API, bound to a Secret and short-lived; a test
rotates it with :meth:`PodOperator.rotate_token` (a new token is written into the mounted
file, as the kubelet does, and the old one is revoked by deleting the Secret it was bound to).

Requires root (for the mount namespace), as on the machines this test bed runs on; the
process is still stopped like any :class:`OperatorProcess` (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

import krypton
from krypton.decisions.charts.fingerprint import deep_merge

from .controlplane import ControlPlane
from .image import Image, inside
from .operator import OperatorProcess

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
KEEP = "/run/krypton-pod-keep"  # where program paths a volume would hide are parked
CHART = Path(__file__).resolve().parents[2] / "chart"
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "HOME": "/tmp"}
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def render_chart(helm: str | Path, chart: str | Path, *, release: str, namespace: str,
                 values: dict[str, Any], include_crds: bool = True) -> list[dict[str, Any]]:
    """The objects ``helm template`` renders for these values."""
    argv = [str(helm), "template", release, str(chart), "--namespace", namespace,
            "--values", "-"]
    if include_crds:
        argv.append("--include-crds")
    done = subprocess.run(argv, input=yaml.safe_dump(values), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


class PodOperator(OperatorProcess):
    """The operator chart's Deployment as a process on this machine (see the module doc)."""

    def __init__(self, cluster: ControlPlane, *, bin_dir: str | Path, values: dict[str, Any],
                 release: str = "krypton", namespace: str = "krypton-system",
                 chart: str | Path = CHART, token_ttl: int = 600,
                 run_as_chart_user: bool = True, image: Image | None = None) -> None:
        self.cluster = cluster
        self.image = image
        self.bin_dir = Path(bin_dir)
        self.release, self.namespace = release, namespace
        self.token_ttl = token_ttl
        self.run_as_chart_user = run_as_chart_user
        super().__init__([], helm_dir=self.bin_dir)
        # The values under test, with what a pod would not need: listen on loopback only
        # (this process shares the machine's network) on ports of its own, JSON logs.
        values = deep_merge(values, {
            "metrics": {"host": "127.0.0.1", "port": self.metrics_port},
            "health": {"host": "127.0.0.1", "port": self.health_port},
            "web": {"host": "127.0.0.1", "port": self.web_port},
            "log": {"format": "json"}})
        self.objects = render_chart(self.bin_dir / "helm", chart, release=release,
                                    namespace=namespace, values=values)
        deployment = next(o for o in self.objects if o["kind"] == "Deployment")
        self.pod_spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
        self.container: dict[str, Any] = self.pod_spec["containers"][0]
        self.service_account: str = self.pod_spec["serviceAccountName"]
        self.pod_name = f"{deployment['metadata']['name']}-{uuid.uuid4().hex[:10]}"
        self.root = Path(tempfile.mkdtemp(prefix="krypton-pod-"))
        self.sa_dir = self.root / "serviceaccount"
        self.token = ""  # the token in the mounted file now
        self._bound: dict[str, str] = {}  # token -> the Secret it is bound to
        self._installed = False

    # -- what the chart installs ---------------------------------------------------------

    @property
    def username(self) -> str:
        """The API user the operator acts as."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def install(self) -> None:
        """Apply what ``helm install`` of the chart would create, except the Deployment."""
        objects = [o for o in self.objects if o["kind"] != "Deployment"]
        namespaces = {self.namespace} | {o["metadata"].get("namespace") for o in objects
                                         if o["metadata"].get("namespace")}
        self._kubectl_apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                             for n in sorted(namespaces)])
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        if crds:
            self._kubectl_apply(crds)
            self._kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          *[f"crd/{c['metadata']['name']}" for c in crds])
        self._kubectl_apply([o for o in objects if o["kind"] != "CustomResourceDefinition"])
        self._installed = True

    # -- the pod -------------------------------------------------------------------------

    def start(self) -> PodOperator:
        if not self._installed:
            self.install()
        self.sa_dir.mkdir(mode=0o755, exist_ok=True)
        (self.sa_dir / "ca.crt").write_bytes(self.cluster.ca_pem)
        (self.sa_dir / "namespace").write_text(self.namespace)
        self.rotate_token()
        self.env = self._pod_env()
        script = self._setup_script() if self.image is None else self._image_script(self.image)
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                "pod"]
        with self.log_path.open("ab") as out:
            self.popen = subprocess.Popen(argv, env=self.env, cwd="/", stdout=out,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        self.pid_file.write_text(str(self.popen.pid))
        return self

    def rotate_token(self, *, revoke_previous: bool = True) -> str:
        """Write a fresh token into the mounted file (atomically, as the kubelet does) and
        revoke the previous one unless told not to (the kubelet lets it expire; a test
        revokes it with :meth:`revoke_token` once the clients moved on). Returns it."""
        previous = self.token
        secret = f"{self.service_account}-token-{uuid.uuid4().hex[:8]}"
        self._kubectl("create", "secret", "generic", secret, "-n", self.namespace)
        token = self._kubectl(
            "create", "token", self.service_account, "-n", self.namespace,
            f"--duration={self.token_ttl}s", "--bound-object-kind=Secret",
            f"--bound-object-name={secret}").strip()
        self._bound[token] = secret
        fresh = self.sa_dir / ".token.new"
        fresh.write_text(token)
        fresh.chmod(0o644)
        fresh.replace(self.sa_dir / "token")
        self.token = token
        if previous and revoke_previous:
            self.revoke_token(previous)
        return token

    def revoke_token(self, token: str) -> None:
        """Make `token` invalid at once: the Secret it is bound to is deleted."""
        self._kubectl("delete", "secret", self._bound.pop(token), "-n", self.namespace,
                      "--wait=true")

    def stop(self, grace: float = 5.0) -> int | None:
        code = super().stop(grace)
        shutil.rmtree(self.root, ignore_errors=True)
        return code

    def _pod_env(self) -> dict[str, str]:
        host, _, port = self.cluster.server.removeprefix("https://").rpartition(":")
        if self.image is not None:
            env = dict(self.image.env)
        else:
            env = dict(IMAGE_ENV)
            env["PATH"] = f"{self.bin_dir}:{Path(sys.executable).parent}:{IMAGE_PATH}"
        env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"] = host, port
        fields = {"metadata.name": self.pod_name, "metadata.namespace": self.namespace}
        for item in self.container.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            else:
                env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    def _mounts(self) -> list[tuple[Path, str, bool]]:
        """(source directory, mountPath, read-only) of every volume, the SA files first."""
        mounts = [(self.sa_dir, SA_DIR, True)]
        volumes = {v["name"]: v for v in self.pod_spec.get("volumes") or []}
        maps = {o["metadata"]["name"]: o for o in self.objects if o["kind"] == "ConfigMap"}
        for mount in self.container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            source = self.root / "volumes" / mount["name"]
            source.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                for key, text in (maps[volume["configMap"]["name"]].get("data") or {}).items():
                    (source / key).write_text(text)
            elif "emptyDir" not in volume:
                raise ValueError(f"volume {mount['name']}: only configMap and emptyDir are "
                                 "supported by the pod-shaped harness")
            mounts.append((source, mount["mountPath"], bool(mount.get("readOnly"))))
        return mounts

    def _setup_script(self) -> str:
        """Shell run inside the new mount namespace: mounts, then exec the container."""
        lines = ["set -eu"]
        overlays: set[str] = set()
        user = self._user()
        argv = [str(Path(sys.executable).parent / "krypton"), *self.container.get("args", [])]
        if user is not None:
            lines += self._traversable_for(user, overlays)
            argv = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups",
                    "--inh-caps=-all", "--", *argv]
        # Everything this script reads lives below self.root: a volume mounted over one of
        # its ancestors (an emptyDir at /tmp) goes last, or it would hide the rest.
        mounts = sorted(self._mounts(), key=lambda m: self.root.is_relative_to(m[1]))
        for source, target, _read_only in mounts:
            lines += self._make_mountpoint(target, overlays)
            if user is not None:
                os.chown(source, *user)
            source.chmod(0o755)
        # The program itself (Python, the virtualenv, krypton's source, helm) lives where
        # the image has it; here it may sit below a volume's mount path (a checkout in /tmp).
        # Such paths are parked in a private spot first and put back on top of the volume.
        kept = self._covered_program_paths([target for _s, target, _r in mounts])
        for i, path in enumerate(kept):
            lines += self._make_mountpoint(f"{KEEP}/{i}", overlays)
            lines.append(f"mount --bind {q(path)} {q(f'{KEEP}/{i}')}")
        for source, target, read_only in mounts:
            lines.append(f"mount --bind {q(source)} {q(target)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q(target)}")
        for i, path in enumerate(kept):
            lines += [f"mkdir -p {q(path)}", f"mount --bind {q(f'{KEEP}/{i}')} {q(path)}",
                      f"umount {q(f'{KEEP}/{i}')}"]
        lines.append("exec " + " ".join(q(a) for a in argv))
        return "\n".join(lines)

    def _image_script(self, image: Image) -> str:
        """Shell run inside the new mount namespace for the image: its root filesystem with
        the volumes and the service-account files mounted into it, /dev and /proc, read-only
        where the container's securityContext says so; then the image's entrypoint with the
        container's args, as the container's user, in the image's working directory."""
        rootfs = image.rootfs
        lines = ["set -eu", f"mount --bind {q(rootfs)} {q(rootfs)}"]
        user = self._user() or _ids(image.user)
        for source, target, read_only in self._mounts():
            where = inside(rootfs, target)
            where.mkdir(parents=True, exist_ok=True)  # in this harness's copy of the image
            os.chown(source, *user)
            source.chmod(0o755)
            lines.append(f"mount --bind {q(source)} {q(where)}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q(where)}")
        lines += [f"mount --rbind /dev {q(inside(rootfs, '/dev'))}",
                  f"mount -t proc proc {q(inside(rootfs, '/proc'))}"]
        ctx = self.container.get("securityContext") or {}
        if ctx.get("readOnlyRootFilesystem"):
            lines.append(f"mount -o remount,bind,ro {q(rootfs)}")
        argv = [*image.entrypoint, *self.container.get("args", list(image.cmd))]
        inner = f"cd {q(image.workdir)} && exec " + " ".join(q(a) for a in argv)
        chroot = shutil.which("chroot", path=IMAGE_PATH) or "chroot"  # the machine's, by path:
        lines.append(f"exec {q(chroot)} --userspec={user[0]}:{user[1]} --groups={user[1]} "
                     f"{q(rootfs)} /bin/sh -c {q(inner)}")  # the environment is the image's
        return "\n".join(lines)

    def _covered_program_paths(self, targets: list[str]) -> list[Path]:
        """The directories the operator runs from that a volume would hide (outermost only)."""
        program = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(),
                   Path(krypton.__file__).resolve().parents[1], self.bin_dir.resolve()}
        covered = sorted(p for p in program if any(p.is_relative_to(t) for t in targets))
        return [p for p in covered if not any(p != o and p.is_relative_to(o) for o in covered)]

    def _make_mountpoint(self, target: str, overlays: set[str]) -> list[str]:
        """Commands that make `target` exist in the private view: an overlay over its
        nearest existing ancestor takes the new directories (the machine is not touched)."""
        if os.path.isdir(target):
            return []
        ancestor = Path(target).parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        return self._overlay(str(ancestor.resolve()), overlays) + [f"mkdir -p {q(target)}"]

    def _overlay(self, directory: str, overlays: set[str]) -> list[str]:
        if directory in overlays:
            return []
        overlays.add(directory)
        work = self.root / "overlay" / directory.strip("/").replace("/", "_")
        (work / "upper").mkdir(parents=True, exist_ok=True)
        (work / "work").mkdir(exist_ok=True)
        return [f"mount -t overlay overlay -o lowerdir={directory},upperdir={work / 'upper'},"
                f"workdir={work / 'work'} {q(directory)}"]

    def _user(self) -> tuple[int, int] | None:
        if not self.run_as_chart_user:
            return None
        ctx = {**(self.pod_spec.get("securityContext") or {}),
               **(self.container.get("securityContext") or {})}
        if ctx.get("runAsUser") is None:
            return None
        return int(ctx["runAsUser"]), int(ctx.get("runAsGroup", ctx["runAsUser"]))

    def _traversable_for(self, user: tuple[int, int], overlays: set[str]) -> list[str]:
        """The image has Python, krypton and helm where its user can reach them; here they
        may sit below directories only root may enter (such as /root). Those directories get
        o+x in an overlay that only the pod sees."""
        needed = [Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix),
                  self.bin_dir]
        closed: list[str] = []
        for path in needed:
            for directory in reversed(path.parents):
                mode = directory.stat().st_mode
                if not mode & stat.S_IXOTH and str(directory) not in closed:
                    closed.append(str(directory))
        if not closed:
            return []
        lines = self._overlay(closed[0], overlays)
        outside = [d for d in closed if not d.startswith(closed[0])]
        if outside:
            raise RuntimeError(f"cannot make {outside} reachable for uid {user[0]}; "
                               "pass run_as_chart_user=False")
        return lines + [f"chmod o+x {q(d)}" for d in closed]

    # -- kubectl with the admin credentials ----------------------------------------------

    def _kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([str(self.bin_dir / "kubectl"), "--kubeconfig",
                               str(self.cluster.kubeconfig), *args], input=stdin,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} failed: {done.stderr.strip()}")
        return done.stdout

    def _kubectl_apply(self, objects: list[dict[str, Any]]) -> None:
        if objects:
            self._kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def _ids(user: str) -> tuple[int, int]:
    """An image's numeric USER (``uid`` or ``uid:gid``)."""
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def q(value: object) -> str:
    return shlex.quote(str(value))

