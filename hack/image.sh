#!/usr/bin/env bash
# make image: the operator image, as an OCI archive in dist/, built from package registries
# only: Debian bookworm packages (mmdebstrap), the Python wheels of image/requirements.lock
# (PyPI, checked against their sha256), helm built from its Go module by the test bed, and
# krypton's helm worker built from helmworker/ on the same Helm module.
# No registry of images is needed, and none is used.
#
# Reproducible: every input is pinned (image/debian.lock names each Debian package's version,
# image/requirements.lock each wheel's hash, hack/testbin.sh the helm module), every time stamp
# is the commit's (SOURCE_DATE_EPOCH), and the archive is packed in a fixed order, so the same
# commit gives the same image digest. A Debian version the mirror no longer has fails the
# build with the way out (make image-lock).
#
# Writes dist/krypton-<version>.oci.tar (tag <version>, the chart's appVersion),
# dist/krypton-<version>.spdx.json (the packages inside) and dist/krypton-<version>.digest.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MIRROR="${KRYPTON_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "${ROOT}/chart/Chart.yaml")"
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "${ROOT}" log -1 --format=%ct 2>/dev/null || echo 0)}"
export TZ=UTC LC_ALL=C.UTF-8

say() { printf 'image: %s\n' "$*" >&2; }
WORK=""
trap '[ -z "${WORK}" ] || rm -rf "${WORK}"' EXIT

tools() {
  local missing=()
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  command -v umoci >/dev/null || missing+=(umoci)
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# helm: the test bed's build (hack/testbin.sh: the pinned module, static, stripped, without
# the build machine's paths), so the image runs the helm the suite tested.
helm_binary() {
  if [ -n "${HELM:-}" ]; then printf '%s\n' "${HELM}"; return; fi
  printf '%s/helm\n' "$(bash "${ROOT}/hack/testbin.sh" | tail -n1)"
}

# run by mmdebstrap with the root filesystem's directory as $1
# shellcheck disable=SC2016
CLEAN_HOOK='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*'

# the helm worker: hack/helmworker.sh's build (static, stripped, -trimpath) on the same Helm
helmworker_binary() {
  if [ -n "${HELMWORKER:-}" ]; then printf '%s\n' "${HELMWORKER}"; return; fi
  local out="${WORK}/helmworker"
  bash "${ROOT}/hack/helmworker.sh" "${out}" >&2
  printf '%s/krypton-helmworker\n' "${out}"
}

debian_rootfs() {  # $1: directory to fill
  local includes
  includes="$(grep -v '^#' "${ROOT}/image/debian.lock" | paste -sd, -)"
  if ! mmdebstrap --quiet --variant=essential --include="${includes}" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/lintian/*' \
      --customize-hook="${CLEAN_HOOK}" \
      "${SUITE}" "$1" "${MIRROR}"; then
    say "mmdebstrap failed: a version in image/debian.lock may be gone from the mirror" \
        "(a Debian point release); run 'make image-lock' and commit the new lock"
    exit 1
  fi
}

# make image-lock: the Debian package set (with versions) a root filesystem of the base
# packages gets today, and the wheels (with hashes) pip resolves for krypton today.
lock() {
  tools
  WORK="$(mktemp -d /tmp/krypton-image-lock.XXXXXX)"
  local work="${WORK}"
  mmdebstrap --quiet --variant=essential --include="python3-minimal,libpython3.11-stdlib,ca-certificates,libstdc++6" \
    --aptopt='APT::Install-Recommends "false"' "${SUITE}" "${work}/rootfs" "${MIRROR}"
  {
    echo "# Debian ${SUITE} packages of the image, pinned (make image-lock writes this file)"
    # shellcheck disable=SC2016 # dpkg-query's format, not the shell's
    chroot "${work}/rootfs" dpkg-query -W -f='${Package}=${Version}\n' | sort
  } > "${ROOT}/image/debian.lock"
  "${PYTHON}" -m pip install --quiet --dry-run --ignore-installed --report "${work}/report.json" \
    --only-binary :all: --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp \
    --target "${work}/target" "${ROOT}"
  "${PYTHON}" "${ROOT}/hack/image_meta.py" lock "${work}/report.json" > "${ROOT}/image/requirements.lock"
  say "wrote image/debian.lock and image/requirements.lock"
}

main() {
  tools
  local out layout helm
  WORK="$(mktemp -d /tmp/krypton-image.XXXXXX)"
  local work="${WORK}"
  out="${ROOT}/dist"
  mkdir -p "${out}"
  helm="$(helm_binary)"

  say "Debian ${SUITE} root filesystem"
  debian_rootfs "${work}/rootfs"
  local rootfs="${work}/rootfs" lib="${work}/rootfs/opt/krypton/lib"

  say "Python wheels (hash-checked) and krypton"
  "${PYTHON}" -m pip install --quiet --no-deps --no-compile --require-hashes --only-binary :all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp \
    --target "${lib}" -r "${ROOT}/image/requirements.lock"
  # krypton itself: its tracked files, as they are in the work tree (not its test bed)
  (cd "${ROOT}" && git ls-files -z krypton | grep -zv '^krypton/testing/' | \
    xargs -0 cp --parents --no-preserve=mode,ownership -t "${lib}")
  rm -rf "${lib:?}/bin"  # scripts naming the build machine's Python
  # compiled once here (the root filesystem is read-only in the pod), checked by hash
  chroot "${rootfs}" /usr/bin/python3 -m compileall -q -j 1 \
    --invalidation-mode checked-hash /opt/krypton/lib >/dev/null

  install -D -m 0755 "${helm}" "${rootfs}/usr/local/bin/helm"
  local rootfs_worker="${work}/krypton-helmworker"
  cp "$(helmworker_binary)" "${rootfs_worker}"
  install -D -m 0755 "${rootfs_worker}" "${rootfs}/usr/local/bin/krypton-helmworker"
  # what the operator and the CLI import at start must be there, and CEL's native library
  # load (--health-check-expr)
  chroot "${rootfs}" /usr/bin/python3 -c 'import sys; sys.path.insert(0, "/opt/krypton/lib")
import krypton.cli.main, krypton.app.operator, krypton.runtime.clusterworker, krypton.cli.status, krypton.cli.records
from krypton.decisions.readiness.celhealth import compile_rules
rule = {"apiVersion": "v1", "kind": "K", "current": "status.ok"}
assert compile_rules([rule], "image", frozenset()).find("v1", "K").judge({"status": {"ok": True}}) is None'

  cat > "${rootfs}/usr/local/bin/krypton" <<'EOF'
#!/usr/bin/python3 -sE
import sys
sys.path.insert(0, "/opt/krypton/lib")
from krypton.cli.main import main
sys.exit(main())
EOF
  chmod 0755 "${rootfs}/usr/local/bin/krypton"
  echo 'krypton:x:65532:65532:krypton:/tmp:/usr/sbin/nologin' >> "${rootfs}/etc/passwd"
  echo 'krypton:x:65532:' >> "${rootfs}/etc/group"
  rm -f "${rootfs}/etc/machine-id" "${rootfs}/var/lib/dbus/machine-id"
  : > "${rootfs}/etc/machine-id"
  find "${rootfs}" -newermt "@${SOURCE_DATE_EPOCH}" -print0 | \
    xargs -0r touch --no-dereference --date="@${SOURCE_DATE_EPOCH}"

  say "packing the OCI image"
  layout="${work}/layout"
  umoci init --layout "${layout}"
  umoci new --image "${layout}:${VERSION}"
  umoci unpack --image "${layout}:${VERSION}" "${work}/bundle" >/dev/null
  rm -rf "${work}/bundle/rootfs"
  mv "${rootfs}" "${work}/bundle/rootfs"
  local created
  created="$(date -u -d "@${SOURCE_DATE_EPOCH}" +%Y-%m-%dT%H:%M:%SZ)"
  umoci repack --image "${layout}:${VERSION}" --history.created "${created}" \
    --history.created_by "make image" "${work}/bundle"
  umoci config --image "${layout}:${VERSION}" --created "${created}" \
    --history.created "${created}" --history.created_by "make image" \
    --config.user 65532:65532 --config.workingdir /tmp \
    --config.entrypoint /usr/local/bin/krypton --config.cmd run \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.env HOME=/tmp \
    --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
    --config.label "org.opencontainers.image.title=krypton" \
    --config.label "org.opencontainers.image.version=${VERSION}" \
    --config.label "org.opencontainers.image.revision=$(git -C "${ROOT}" rev-parse HEAD 2>/dev/null || echo unknown)"
  umoci gc --layout "${layout}"
  find "${layout}" -print0 | xargs -0r touch --no-dereference --date="@${SOURCE_DATE_EPOCH}"
  local archive="${out}/krypton-${VERSION}.oci.tar"
  tar --sort=name --mtime="@${SOURCE_DATE_EPOCH}" --owner=0 --group=0 --numeric-owner \
    --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "${layout}" -cf "${archive}" .

  local digest
  digest="$("${PYTHON}" "${ROOT}/hack/image_meta.py" digest "${layout}")"
  printf '%s\n' "${digest}" > "${out}/krypton-${VERSION}.digest"
  "${PYTHON}" "${ROOT}/hack/image_meta.py" sbom "${work}/bundle/rootfs" "${ROOT}/image/requirements.lock" \
    "$("${helm}" version --template '{{.Version}}')" "${VERSION}" "${digest}" \
    "${rootfs_worker}" > "${out}/krypton-${VERSION}.spdx.json"
  say "${archive}: ${digest}, $(du -sm "${work}/bundle/rootfs" | cut -f1) MB unpacked," \
      "$(du -m "${archive}" | cut -f1) MB archived"
  printf '%s\n' "${archive}"
}

if [ "${1:-}" = lock ]; then lock; else main; fi
