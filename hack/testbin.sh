#!/usr/bin/env bash
# Builds the tool binaries of the krypton test bed (SPEC T2, H1) from their Go modules:
# helm (Helm 4, the default), helm3 (Helm 3, for the Helm 3 lane and migration tests),
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok (simulated
# nodes, with the stage definitions its module ships), kubelet (the real node, SPEC T8), the
# CNCF distribution registry and cosign (the test bed's OCI registry and chart signing) and
# Prometheus (the metric gates of the progressive rollout), at pinned versions, into a cache
# outside the work tree. Idempotent: a binary that is already there at its version is kept.
# Also writes lane-helm3/, the same tools with helm being Helm 3.
# With the argument `kind`, also what the kind lane needs (SPEC T9): kind, kubeadm,
# kube-proxy and CoreDNS, for the node image krypton.testing.kind builds.
# Prints the cache directory on its last line.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v4.3.2}"
HELM3_VERSION="${HELM3_VERSION:-v3.19.5}"
REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.2}"
COSIGN_VERSION="${COSIGN_VERSION:-v3.1.3}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"  # the Go module's version of Prometheus 3
KIND_VERSION="${KIND_VERSION:-v0.30.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.12.1}"  # the one kubeadm of K8S_VERSION deploys
INVENTORY_VERSION="${INVENTORY_VERSION:-v0.1.0}"  # sigs.k8s.io/cluster-inventory-api (D10)
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)
[ "${1:-}" = kind ] && KUBE_BINARIES+=(kubeadm kube-proxy)

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}_helm3-${HELM3_VERSION}_kwok-${KWOK_VERSION}"
dir="${KRYPTON_TESTBIN:-${HOME}/.cache/krypton/testbin/${key}}"
work="${dir}/.src"
mkdir -p "${dir}" "${work}"

say() { printf 'testbin: %s\n' "$*" >&2; }
have() { [ -x "${dir}/$1" ] && "${dir}/$1" "${@:2}" >/dev/null 2>&1; }

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

# build_helm NAME VERSION: helm.sh/helm/<major> at VERSION, installed as NAME.
build_helm() {
  local name=$1 version=$2 major
  major="v${version#v}"; major="${major%%.*}"
  if [ -x "${dir}/${name}" ] && \
      [ "$("${dir}/${name}" version --template '{{.Version}}' 2>/dev/null)" = "${version}" ]; then
    say "${name} ${version}: cached"; return
  fi
  say "${name} ${version}: building"
  local bin="${work}/helm-${version}"
  mkdir -p "${bin}"
  GOBIN="${bin}" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/${major}/internal/version.version=${version}" \
    "helm.sh/helm/${major}/cmd/helm@${version}"
  mv -f "${bin}/helm" "${dir}/${name}"
}

# kwok and the stage definitions of its module (node initialise and heartbeat, pod ready,
# complete and delete), read by krypton.testing.ControlPlane at run time.
build_kwok() {
  local stages="${dir}/kwok-stages" src
  if have kwok --version && [ -f "${stages}/pod-ready.yaml" ]; then
    say "kwok ${KWOK_VERSION}: cached"; return
  fi
  say "kwok ${KWOK_VERSION}: building"
  GOBIN="${dir}" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  src=$(go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  mkdir -p "${stages}"
  cp -f "${src}/kustomize/stage/node/fast/node-initialize.yaml" \
    "${src}/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    "${src}/kustomize/stage/pod/fast/pod-ready.yaml" \
    "${src}/kustomize/stage/pod/fast/pod-complete.yaml" \
    "${src}/kustomize/stage/pod/fast/pod-delete.yaml" "${stages}/"
  chmod u+w "${stages}"/*.yaml
}

# The ClusterProfile CRD of the Cluster Inventory API, as its Go module ships it (D10).
fetch_inventory_crd() {
  local crd="${dir}/crds/clusterprofiles-${INVENTORY_VERSION}.yaml" src
  if [ -f "${crd}" ]; then
    say "ClusterProfile CRD ${INVENTORY_VERSION}: cached"; return
  fi
  src=$(go mod download -json "sigs.k8s.io/cluster-inventory-api@${INVENTORY_VERSION}" | \
    sed -n 's/.*"Dir": "\(.*\)",*/\1/p')
  mkdir -p "${dir}/crds"
  cp -f "${src}/config/crd/bases/multicluster.x-k8s.io_clusterprofiles.yaml" "${crd}"
  chmod u+w "${crd}"
}

# go_tool NAME MODULE/CMD VERSION PROBE...: a plain `go install` of one command, kept while
# PROBE's output names VERSION.
go_tool() {
  local name=$1 pkg=$2 version=$3 bin
  shift 3
  if [ -x "${dir}/${name}" ] && "${dir}/${name}" "$@" 2>&1 | grep -q -- "${version#v}"; then
    say "${name} ${version}: cached"; return
  fi
  say "${name} ${version}: building"
  bin="${work}/${name}-${version}"
  mkdir -p "${bin}"
  GOBIN="${bin}" go install -trimpath -tags "${GO_TAGS:-}" -ldflags "-s -w ${GO_LDFLAGS:-}" \
    "${pkg}@${version}"
  mv -f "${bin}/$(basename "${pkg}")" "${dir}/${name}"
}

helm3_lane() {
  local lane="${dir}/lane-helm3" b
  mkdir -p "${lane}"
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwok-stages; do
    ln -sfn "../${b}" "${lane}/${b}"
  done
  ln -sfn ../helm3 "${lane}/helm"
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
  for b in "${KUBE_BINARIES[@]}"; do
    local probe=(--version)
    [ "$b" = kubectl ] && probe=(version --client)
    [ "$b" = kubeadm ] && probe=(version -o short)
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

build_helm helm "${HELM_VERSION}"
build_helm helm3 "${HELM3_VERSION}"
build_etcd
build_kubernetes
build_kwok
fetch_inventory_crd
go_tool registry github.com/distribution/distribution/v3/cmd/registry "${REGISTRY_VERSION}" --version
go_tool cosign github.com/sigstore/cosign/v3/cmd/cosign "${COSIGN_VERSION}" version
# without its service discovery plugins: the test bed scrapes static targets only
GO_TAGS=remove_all_sd GO_LDFLAGS="-X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}" \
  go_tool prometheus github.com/prometheus/prometheus/cmd/prometheus "${PROMETHEUS_VERSION}" --version
if [ "${1:-}" = kind ]; then
  go_tool kind sigs.k8s.io/kind "${KIND_VERSION}" version
  go_tool coredns github.com/coredns/coredns "${COREDNS_VERSION}" -version
fi
helm3_lane
say "all tools ready in ${dir}"
echo "${dir}"
