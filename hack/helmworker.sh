#!/usr/bin/env bash
# Builds krypton-helmworker (SPEC P5) from helmworker/ into $1 (default .venv/bin, beside the
# krypton command, where the operator looks when it is not on PATH): static, stripped,
# without the build machine's paths, on the Helm module the test bed pins (hack/testbin.sh's
# HELM_VERSION; a go.mod naming another fails the build). Go's build cache makes a build of
# unchanged sources a few seconds. With `check`, also go vet, gofmt and go test.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="${ROOT}/helmworker"
# shellcheck disable=SC2016
want="$(sed -n 's/^HELM_VERSION="\${HELM_VERSION:-\(v[^}]*\)}"$/\1/p' "${ROOT}/hack/testbin.sh")"
have="$(sed -n 's/^[[:space:]]*helm.sh\/helm\/v4 \(v[^ ]*\)$/\1/p' "${SRC}/go.mod")"
if [ "${want}" != "${have}" ]; then
  echo "helmworker: go.mod requires helm ${have:-nothing}, the test bed pins ${want}" >&2
  exit 1
fi
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
out=""
if [ "${1:-}" != check ]; then
  mkdir -p "${1:-${ROOT}/.venv/bin}"
  out="$(cd "${1:-${ROOT}/.venv/bin}" && pwd)"
fi
cd "${SRC}"
if [ "${1:-}" = check ]; then
  unformatted="$(gofmt -l .)"
  if [ -n "${unformatted}" ]; then echo "helmworker: not gofmt'd: ${unformatted}" >&2; exit 1; fi
  go vet ./...
  go test -count=1 ./...
  exit 0
fi
go build -trimpath -ldflags "-s -w" -o "${out}/krypton-helmworker" .
