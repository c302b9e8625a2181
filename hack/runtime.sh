#!/usr/bin/env bash
# Container runtimes of the test bed: podman with runc for the image's smoke test
# (tests/integration/test_image.py; this machine's hybrid cgroups are refused by crun), and
# containerd, the CNI plugins and iptables for the real node (krypton/testing/node.py, SPEC T8);
# skopeo for hack/e2e-kind.sh and mmdebstrap for its node image (krypton/testing/kind.py, T9);
# Debian's chromium for the fleet page's browser tests (tests/browser, O16), driven by
# Playwright for Python with its executable path (Playwright's own browser download is not used).
# Best effort: where podman cannot be installed its test is skipped and says why; the
# real-node tests fail and name what is missing.
set -uo pipefail
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
command -v gpg >/dev/null || missing+=(gnupg)  # signed charts (tests/integration/test_oci.py)
command -v containerd >/dev/null || missing+=(containerd)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v chromium >/dev/null || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
  printf 'runtime: installing %s\n' "${missing[*]}" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >/dev/null 2>&1 || printf 'runtime: could not install %s\n' \
    "${missing[*]}" >&2
fi
exit 0
