#!/usr/bin/env bash
# Two-cluster end to end on kind (needs a container engine, kind, kubectl and helm on PATH).
# The same flow runs without a container engine on local control planes: `make e2e`.
#
# Creates the kind clusters "home" and "remote", installs the Tenant CRD on both, puts the
# remote kubeconfig Secret on home, starts the operator in the background against home,
# applies a Tenant on remote, waits for its namespace, its Helm release and phase Ready,
# then tears everything down (operator: SIGTERM, ~5 s, SIGKILL).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PID_FILE="${PID_FILE:-/tmp/krypton-operator.pid}"
LOG_FILE="${LOG_FILE:-/tmp/krypton-operator.log}"
WORK="$(mktemp -d)"
HOME_CTX="kind-home"
REMOTE_CTX="kind-remote"
KEEP="${KEEP_CLUSTERS:-0}"
CHART_REPO="${CHART_REPO:-https://charts.jetstack.io}"
CHART_NAME="${CHART_NAME:-cert-manager}"
CHART_VERSION="${CHART_VERSION:-1.19.1}"
PYTHON="${PYTHON:-${ROOT}/.venv/bin/python}"

log() { printf '%s\n' "$*"; }

stop_operator() {
  [ -f "${PID_FILE}" ] || return 0
  local pid
  pid="$(cat "${PID_FILE}")"
  if kill -0 "${pid}" 2>/dev/null; then
    kill -TERM "${pid}" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "${pid}" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "${pid}" 2>/dev/null; then kill -KILL "${pid}" 2>/dev/null || true; fi
  fi
  rm -f "${PID_FILE}"
}

cleanup() {
  stop_operator
  if [ "${KEEP}" != "1" ]; then
    kind delete cluster --name home >/dev/null 2>&1 || true
    kind delete cluster --name remote >/dev/null 2>&1 || true
  fi
  rm -rf "${WORK}"
}
trap cleanup EXIT INT TERM

for tool in kind kubectl helm; do
  command -v "${tool}" >/dev/null || { log "missing ${tool} on PATH"; exit 2; }
done

log "creating kind clusters home and remote"
kind create cluster --name home --wait 120s
sleep 2 # the remote API server port is sometimes reused too quickly
kind create cluster --name remote --wait 120s

for ctx in "${HOME_CTX}" "${REMOTE_CTX}"; do
  kubectl --context "${ctx}" apply -f "${ROOT}/crds/"
done

# The operator runs on this machine, so the remote kubeconfig must reach the remote API
# server from here: use the external kubeconfig that kind writes.
kind get kubeconfig --name remote >"${WORK}/remote.kubeconfig"
kubectl --context "${HOME_CTX}" create namespace krypton-system
kubectl --context "${HOME_CTX}" -n krypton-system create secret generic remote \
  --from-file=kubeconfig="${WORK}/remote.kubeconfig"
kubectl --context "${HOME_CTX}" -n krypton-system label secret remote \
  sigs.k8s.io/multicluster-runtime-kubeconfig=true

kind get kubeconfig --name home >"${WORK}/home.kubeconfig"
KUBECONFIG="${WORK}/home.kubeconfig" nohup "${PYTHON}" -m krypton run \
  --watch-kubeconfig "${WORK}/home.kubeconfig" --namespace krypton-system \
  --chart-repo "${CHART_REPO}" --chart-name "${CHART_NAME}" --chart-version "${CHART_VERSION}" \
  >"${LOG_FILE}" 2>&1 &
echo $! >"${PID_FILE}"
log "operator started with PID $(cat "${PID_FILE}"), log in ${LOG_FILE}"

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
  helm --kube-context "${REMOTE_CTX}" -n acme status tenant-acme-remote 2>/dev/null \
    | grep -q 'STATUS: deployed' && break
  sleep 2
done
helm --kube-context "${REMOTE_CTX}" -n acme status tenant-acme-remote | grep -q 'STATUS: deployed'
log "helm install success"

kubectl --context "${REMOTE_CTX}" wait --for=jsonpath='{.status.phase}'=Ready tenant/acme \
  --timeout=300s
log "tenant phase is Ready on remote cluster"
log "e2e passed"
