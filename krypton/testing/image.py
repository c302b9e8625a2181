"""The operator image that ``make image`` builds, unpacked for the pod-shaped harness (SPEC T5).

:func:`unpack` reads an OCI archive (``dist/krypton-<version>.oci.tar``): its index names
one manifest, whose config gives the entrypoint, command, environment, user and working
directory, and whose layers (gzip tars) are extracted in order into a root filesystem
directory. :class:`~krypton.testing.pod.PodOperator` then runs that root filesystem, so a
file the image lacks fails the pod tests as it would fail the pod.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Image:
    rootfs: Path
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: dict[str, str]
    user: str
    workdir: str
    digest: str


def archive(version: str | None = None) -> Path:
    """Where ``make image`` writes the archive of the chart's appVersion, or the archive
    ``KRYPTON_IMAGE_ARCHIVE`` names (another build of the image to test)."""
    if os.environ.get("KRYPTON_IMAGE_ARCHIVE"):
        return Path(os.environ["KRYPTON_IMAGE_ARCHIVE"])
    if version is None:
        for line in (ROOT / "chart" / "Chart.yaml").read_text().splitlines():
            if line.startswith("appVersion:"):
                version = line.split(":", 1)[1].strip().strip('"')
    return ROOT / "dist" / f"krypton-{version}.oci.tar"


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    if member is None:
        raise ValueError(f"{name} missing from the image archive")
    return member.read()


def _blob(digest: str) -> str:
    """The archive member holding the blob `digest`."""
    algorithm, value = digest.split(":", 1)
    return f"./blobs/{algorithm}/{value}"


def unpack(path: Path, into: Path) -> Image:
    """The image in the OCI archive `path`, its root filesystem extracted below `into`."""
    rootfs = into / "rootfs"
    rootfs.mkdir(parents=True)
    with tarfile.open(path) as tar:
        index = json.loads(_read(tar, "./index.json"))
        digest = index["manifests"][0]["digest"]
        manifest = json.loads(_read(tar, _blob(digest)))
        config: dict[str, Any] = json.loads(
            _read(tar, _blob(manifest["config"]["digest"])))["config"]
        for layer in manifest["layers"]:
            member = tar.extractfile(_blob(layer["digest"]))
            if member is None:
                raise ValueError(f"layer {layer['digest']} missing from the image archive")
            with tarfile.open(fileobj=member, mode="r|*") as files:
                for entry in files:
                    _apply(files, entry, rootfs)
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    return Image(rootfs, tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()),
                 env, str(config.get("User") or "0"), str(config.get("WorkingDir") or "/"),
                 digest)


def _apply(files: tarfile.TarFile, entry: tarfile.TarInfo, rootfs: Path) -> None:
    """One entry of a layer: a whiteout (``.wh.<name>``) removes what a lower layer put
    there, an opaque whiteout (``.wh..wh..opq``) empties its directory; anything else is
    extracted (modes and owners kept, nothing outside `rootfs`)."""
    path = PurePosixPath(entry.name)
    if path.name == ".wh..wh..opq":
        directory = inside(rootfs, "/" + str(path.parent))
        for child in directory.iterdir() if directory.is_dir() else ():
            _remove(child)
        return
    if path.name.startswith(".wh."):
        _remove(inside(rootfs, "/" + str(path.parent / path.name[len(".wh."):])))
        return
    files.extract(entry, rootfs, filter="tar")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def inside(rootfs: Path, path: str) -> Path:
    """`path` as the image sees it, on this machine: symbolic links are followed within the
    root filesystem (``/var/run`` -> ``/run`` must not lead to the machine's own ``/run``)."""
    current = rootfs
    parts = list(PurePosixPath(path).parts[1:])
    hops = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != rootfs else rootfs
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise ValueError(f"{path}: too many symbolic links in the image")
            target = PurePosixPath(str(candidate.readlink()))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            if target.is_absolute():
                current = rootfs
            continue
        current = candidate
    return current
