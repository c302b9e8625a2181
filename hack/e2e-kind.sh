#!/usr/bin/env bash
# Two-cluster end to end on kind (needs a container engine, kind, kubectl, helm and skopeo
# on PATH). The same flow runs without a container engine on local control planes: `make e2e`.
#
# Creates the kind clusters "home" and "remote", installs the Tenant CRD on both, loads the
# image `make image` built into home and installs the operator there with its chart, puts
# the remote kubeconfig Secret (the address kind's network reaches) on home, applies a Tenant
# on remote, waits for its namespace, its Helm release and phase Ready, then tears
# everything down.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
HOME_CTX="kind-home"
REMOTE_CTX="kind-remote"
KEEP="${KEEP_CLUSTERS:-0}"
CHART_REPO="${CHART_REPO:-https://charts.jetstack.io}"
CHART_NAME="${CHART_NAME:-cert-manager}"
CHART_VERSION="${CHART_VERSION:-1.19.1}"
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "${ROOT}/chart/Chart.yaml")"
ARCHIVE="${ROOT}/dist/krypton-${VERSION}.oci.tar"
IMAGE="ghcr.io/openkcm/krypton:${VERSION}"  # the chart's default image
DRIVER=configmap  # where the releases are recorded (the chart's helm.driver, said outright)
LOG_FILE="${LOG_FILE:-/tmp/krypton-e2e-kind.log}"  # the operator's log, kept
NODE_IMAGE=()  # kind's default node image unless KIND_NODE_IMAGE names another
[ -z "${KIND_NODE_IMAGE:-}" ] || NODE_IMAGE=(--image "${KIND_NODE_IMAGE}")

log() { printf '%s\n' "$*"; }

cleanup() {
  if [ "${KEEP}" != "1" ]; then
    kubectl --context "${HOME_CTX}" -n krypton-system logs deploy/krypton --tail=200 \
      >"${LOG_FILE}" 2>/dev/null || true
    kind delete cluster --name home >/dev/null 2>&1 || true
    kind delete cluster --name remote >/dev/null 2>&1 || true
  fi
  rm -rf "${WORK}"
}
trap cleanup EXIT INT TERM

for tool in kind kubectl helm skopeo; do
  command -v "${tool}" >/dev/null || { log "missing ${tool} on PATH"; exit 2; }
done
[ -f "${ARCHIVE}" ] || make -C "${ROOT}" image

log "creating kind clusters home and remote"
kind create cluster --name home "${NODE_IMAGE[@]}" --wait 120s
sleep 2 # the remote API server port is sometimes reused too quickly
kind create cluster --name remote "${NODE_IMAGE[@]}" --wait 120s

for ctx in "${HOME_CTX}" "${REMOTE_CTX}"; do
  kubectl --context "${ctx}" apply -f "${ROOT}/crds/"
done

log "loading ${IMAGE} from ${ARCHIVE} into home"
skopeo copy "oci-archive:${ARCHIVE}" "docker-archive:${WORK}/krypton.tar:${IMAGE}"
kind load image-archive "${WORK}/krypton.tar" --name home

# The operator runs in home, so the remote kubeconfig must reach the remote API server
# from there: kind's internal address, on the network both clusters share.
kind get kubeconfig --internal --name remote >"${WORK}/remote.kubeconfig"
kubectl --context "${HOME_CTX}" create namespace krypton-system
kubectl --context "${HOME_CTX}" -n krypton-system create secret generic remote \
  --from-file=kubeconfig="${WORK}/remote.kubeconfig"
kubectl --context "${HOME_CTX}" -n krypton-system label secret remote \
  sigs.k8s.io/multicluster-runtime-kubeconfig=true

helm --kube-context "${HOME_CTX}" install krypton "${ROOT}/chart" -n krypton-system \
  --set image.pullPolicy=Never --set helm.driver="${DRIVER}" --set chart.repo="${CHART_REPO}" \
  --set chart.name="${CHART_NAME}" --set chart.version="${CHART_VERSION}"
kubectl --context "${HOME_CTX}" -n krypton-system rollout status deploy/krypton --timeout=180s
log "operator running in home from ${IMAGE}"

cat <<YAML | kubectl --context "${REMOTE_CTX}" apply -f -
apiVersion: mesh.openkcm.io/v1alpha1
kind: Tenant
metadata:
  name: acme
  namespace: default
spec:
  clusterRef:
    secretName: remote
YAML

for _ in $(seq 1 120); do
  kubectl --context "${REMOTE_CTX}" get namespace acme >/dev/null 2>&1 && break
  sleep 2
done
kubectl --context "${REMOTE_CTX}" get namespace acme >/dev/null
log "workspace namespace created"

for _ in $(seq 1 150); do
  HELM_DRIVER="${DRIVER}" helm --kube-context "${REMOTE_CTX}" -n acme status tenant-acme-remote \
    2>/dev/null | grep 'STATUS: deployed' >/dev/null && break  # all read: no SIGPIPE for helm
  sleep 2
done
HELM_DRIVER="${DRIVER}" helm --kube-context "${REMOTE_CTX}" -n acme status tenant-acme-remote \
  | grep 'STATUS: deployed' >/dev/null
log "helm install success"

kubectl --context "${REMOTE_CTX}" wait --for=jsonpath='{.status.phase}'=Ready tenant/acme \
  --timeout=300s
log "tenant phase is Ready on remote cluster"
log "e2e passed"
