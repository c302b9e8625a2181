"""The test bed's images, built here and imported, never pulled (SPEC T8): an OCI archive of
a few files, and ``krypton.test/testpod:1``, the static ``testpod`` program built from its Go
source (the pod sandbox's pause image and the test charts' workload)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

TESTPOD_SOURCE = Path(__file__).resolve().parent / "testpod"
PAUSE_IMAGE = "krypton.test/testpod:1"


def oci_archive(path: Path, *, name: str, files: dict[str, tuple[bytes, int]],
                entrypoint: list[str], cmd: list[str], user: str = "65532:65532",
                base: Path | None = None, compress: bool = True) -> Path:
    """Write an OCI image archive of one layer holding `files` (path -> (content, mode)),
    after the whole of the tar archive `base` when given, named `name` (``repository:tag``)
    for ``ctr images import``; the layer is gzipped unless `compress` is false."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if base is not None:
            with tarfile.open(base) as below:
                for info in below:
                    tar.addfile(info, below.extractfile(info) if info.isreg() else None)
        for member, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(member.lstrip("/"))
            info.size, info.mode = len(content), mode
            tar.addfile(info, io.BytesIO(content))
    raw = layer.getvalue()
    packed = gzip.compress(raw, mtime=0) if compress else raw
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "User": user, "WorkingDir": "/",
                   "Env": ["PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
    }).encode()
    blobs = {"config": config, "layer": packed}
    digests = {k: f"sha256:{hashlib.sha256(v).hexdigest()}" for k, v in blobs.items()}
    layer_type = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digests["config"], "size": len(config)},
        "layers": [{"mediaType": layer_type,
                    "digest": digests["layer"], "size": len(packed)}],
    }).encode()
    blobs["manifest"] = manifest
    digests["manifest"] = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digests["manifest"], "size": len(manifest),
        "annotations": {"io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}).encode()
    with tarfile.open(path, "w") as tar:
        entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
        entries |= {f"blobs/sha256/{digests[k].split(':')[1]}": v for k, v in blobs.items()}
        for member, content in entries.items():
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return path


def testpod_binary(into: Path) -> Path:
    """The static ``testpod`` program, built from its Go source into `into`."""
    binary = into / "testpod"
    subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."],
                   cwd=TESTPOD_SOURCE, check=True, capture_output=True,
                   env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"})
    return binary


def testpod_image(into: Path) -> Path:
    """The test bed's one image, ``krypton.test/testpod:1``: the static ``testpod`` program
    (``pause``, ``serve``, ``exit N``) built from its Go source, as ``/testpod``, run as
    user 65532. It is the pod sandbox's pause image and the test charts' workload."""
    binary = testpod_binary(into)
    return oci_archive(into / "testpod.oci.tar", name=PAUSE_IMAGE,
                       files={"/testpod": (binary.read_bytes(), 0o755)},
                       entrypoint=["/testpod"], cmd=["pause"])
