"""Helpers of hack/image.sh: the Python lock file from pip's resolution report, the image's
manifest digest from its OCI layout, and an SPDX 2.3 bill of materials of what the image
holds (Debian packages, Python distributions, helm, the helm worker and its Go modules,
krypton)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path


def lock(report: str) -> None:
    print("# The image's Python distributions, with the sha256 of each wheel (make image-lock)")
    for item in sorted(json.loads(Path(report).read_text())["install"],
                       key=lambda i: i["metadata"]["name"].lower()):
        if item.get("is_direct"):
            continue  # krypton itself, built from the work tree
        meta, info = item["metadata"], item["download_info"]
        sha = info["archive_info"]["hashes"]["sha256"]
        print(f"{meta['name']}=={meta['version']} --hash=sha256:{sha}")


def digest(layout: str) -> None:
    index = json.loads((Path(layout) / "index.json").read_text())
    print(index["manifests"][0]["digest"])


def _debian(rootfs: Path) -> list[tuple[str, str]]:
    found, name = [], ""
    for line in (rootfs / "var/lib/dpkg/status").read_text().splitlines():
        if line.startswith("Package: "):
            name = line.split(": ", 1)[1]
        elif line.startswith("Version: ") and name:
            found.append((name, line.split(": ", 1)[1]))
            name = ""
    return sorted(found)


def _go_modules(binary: str) -> list[tuple[str, str]]:
    """The Go modules built into `binary`, from its build information (`go version -m`)."""
    out = subprocess.run(["go", "version", "-m", binary], capture_output=True, text=True,
                         check=True).stdout
    rows = (line.split("\t") for line in out.splitlines())
    return [(f[2], f[3]) for f in rows if len(f) >= 4 and f[1] == "dep"]


def sbom(rootfs: str, pylock: str, helm: str, version: str, image_digest: str,
         worker: str = "") -> None:
    created = dt.datetime.fromtimestamp(int(os.environ.get("SOURCE_DATE_EPOCH", "0")), dt.UTC)
    packages = [{"SPDXID": "SPDXRef-krypton", "name": "krypton", "versionInfo": version,
                 "downloadLocation": "NOASSERTION", "primaryPackagePurpose": "CONTAINER",
                 "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER",
                                   "referenceType": "purl",
                                   "referenceLocator": f"pkg:oci/krypton@{image_digest}"}]}]

    def add(kind: str, name: str, ver: str, purl: str) -> None:
        packages.append({"SPDXID": f"SPDXRef-{kind}-{len(packages)}", "name": name,
                         "versionInfo": ver, "downloadLocation": "NOASSERTION",
                         "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER",
                                           "referenceType": "purl", "referenceLocator": purl}]})

    for name, ver in _debian(Path(rootfs)):
        add("deb", name, ver, f"pkg:deb/debian/{name}@{ver}?distro=bookworm")
    for line in Path(pylock).read_text().splitlines():
        if line and not line.startswith("#"):
            name, ver = line.split(" ", 1)[0].split("==")
            add("pypi", name, ver, f"pkg:pypi/{name.lower()}@{ver}")
    add("golang", "helm", helm, f"pkg:golang/helm.sh/helm/{helm.split('.')[0]}@{helm}")
    if worker:  # the helm worker and the Go modules built into it
        add("golang", "krypton-helmworker", version,
            f"pkg:golang/krypton.local/helmworker@{version}")
        for module, ver in _go_modules(worker):
            add("golang", module, ver, f"pkg:golang/{module}@{ver}")
    document = {
        "spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"krypton-{version}",
        "documentNamespace": f"https://openkcm.io/spdx/krypton-{version}-{image_digest}",
        "creationInfo": {"created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "creators": ["Tool: krypton hack/image.sh"]},
        "packages": packages,
        "relationships": [{"spdxElementId": "SPDXRef-krypton", "relationshipType": "CONTAINS",
                           "relatedSpdxElement": p["SPDXID"]} for p in packages[1:]],
    }
    print(json.dumps(document, indent=1, sort_keys=True))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"lock": lock, "digest": digest, "sbom": sbom}[command](*args)
