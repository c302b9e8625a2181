#!/usr/bin/env bash
# Builds the tool binaries of the krypton test bed (SPEC T2) from their Go modules:
# helm, kube-apiserver, kube-controller-manager, kubectl and etcd, at pinned versions,
# into a cache outside the work tree. Idempotent: a binary that is already there is kept.
# Prints the cache directory on its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
dir="${KRYPTON_TESTBIN:-${HOME}/.cache/krypton/testbin/${key}}"
work="${dir}/.src"
mkdir -p "${dir}" "${work}"

say() { printf 'testbin: %s\n' "$*" >&2; }
have() { [ -x "${dir}/$1" ] && "${dir}/$1" "${@:2}" >/dev/null 2>&1; }

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

build_helm() {
  if have helm version; then say "helm ${HELM_VERSION}: cached"; return; fi
  say "helm ${HELM_VERSION}: building"
  GOBIN="${dir}" go install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
}

build_etcd() {
  if have etcd --version; then say "etcd ${ETCD_VERSION}: cached"; return; fi
  say "etcd ${ETCD_VERSION}: building"
  local mod="${work}/etcd"
  mkdir -p "${mod}"
  cat >"${mod}/go.mod" <<GOMOD
module krypton.local/testbin/etcd

go 1.24

require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}
GOMOD
  (cd "${mod}" && go mod download go.etcd.io/etcd/server/v3 \
    && go build -mod=mod -ldflags "-s -w" -o "${dir}/etcd" go.etcd.io/etcd/server/v3)
}

build_kubernetes() {
  local missing=()
  for b in kube-apiserver kube-controller-manager kubectl; do
    local probe=(--version)
    [ "$b" = kubectl ] && probe=(version --client)
    if have "$b" "${probe[@]}"; then say "$b ${K8S_VERSION}: cached"; else missing+=("$b"); fi
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  say "${missing[*]} ${K8S_VERSION}: building (several minutes on a cold cache)"
  local mod="${work}/kubernetes" minor="${K8S_VERSION#v1.}" gomod
  minor="${minor%%.*}"
  mkdir -p "${mod}"
  gomod=$(cd "${mod}" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
    | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
  {
    printf 'module krypton.local/testbin/kubernetes\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\n' "${K8S_VERSION}"
    # k8s.io/kubernetes points its staging modules at ./staging; pin each to its release tag.
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "${gomod}" | awk '{print $1}' | sort -u \
      | while read -r m; do printf 'replace %s => %s v0.%s.%s\n' "$m" "$m" "${minor}" "${K8S_VERSION##*.}"; done
  } >"${mod}/go.mod"
  local pkgs=() ld
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  ld="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION}"
  ld+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
  ld+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${minor}"
  (cd "${mod}" && go build -mod=mod -ldflags "${ld}" -o "${dir}/" "${pkgs[@]}")
}

build_helm
build_etcd
build_kubernetes
say "all tools ready in ${dir}"
echo "${dir}"
