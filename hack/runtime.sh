#!/usr/bin/env bash
# A container runtime for the image's smoke test (tests/integration/test_image.py): podman,
# with runc (this machine's hybrid cgroups are refused by crun). Best effort: where they
# cannot be installed, the test is skipped and says why.
set -uo pipefail
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
command -v gpg >/dev/null || missing+=(gnupg)  # signed charts (tests/integration/test_oci.py)
if [ "${#missing[@]}" -gt 0 ]; then
  printf 'runtime: installing %s\n' "${missing[*]}" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >/dev/null 2>&1 || printf 'runtime: could not install %s; the image smoke test will be skipped\n' \
    "${missing[*]}" >&2
fi
exit 0
