#!/usr/bin/env bash
# fleet-lab: a real control plane for many simulated nodes: etcd and kube-apiserver only (no
# kubelet, scheduler or controller-manager: the fleet harness binds the pods and plays every
# node's kubelet), with an audit log that names who sent each request. For the fleet benchmark
# (benches/fleet.rs) and its smoke run.
#
#   fleet-lab.sh start   copy the binaries (once), PKI, tokens, start etcd and the API
#                        server, apply OpenKruise's CRDs, the test workload CRD and both daemons'
#                        RBAC; idempotent
#   fleet-lab.sh stop    stop both (state kept)
#   fleet-lab.sh clean   stop and delete $FLEET_LAB
#   fleet-lab.sh env     the variables the harness reads
#
# Identities (token authentication, $FLEET_LAB/tokens.csv): the admin (system:masters), the
# simulated kubelets (fleet-kubelet, system:masters), and for node n<i> (i < $FLEET_LAB_MAX_NODES)
# the users kruised:n<i> (group fleet:kruised, bound to deploy/rbac.yaml's roles) and
# kruise-daemon:n<i> (group fleet:kruise-daemon, bound to kruise's chart roles): each daemon runs
# with its DaemonSet's permissions, and the audit log tells every node's requests apart. A
# daemon's token is <kruised|kruise-daemon>-n<i>-<salt>, the salt in $FLEET_LAB/token-salt;
# $FLEET_LAB/kubeconfig is the admin's, $FLEET_LAB/kubelet.kubeconfig the simulated kubelets'.
#
# Env: FLEET_LAB ($TMPDIR/fleet-lab)  FLEET_LAB_PORT_BASE (18000: API server +443, etcd +379/+380)
#      FLEET_LAB_MAX_NODES (500); the harness gives node i's daemons the admin ports base+2000+i
#      (kruised) and base+4000+i (kruise-daemon)  KRUISED_KUBE_ASSETS (a directory holding the plain
#      binaries kube-apiserver, etcd and kubectl, provided by whoever runs it: no registry this
#      project reaches ships them; without them the fleet runs on the API-server double instead)
# Needs: openssl, curl, python3 (tests/run.sh installs them).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FLEET_LAB=${FLEET_LAB:-${TMPDIR:-/tmp}/fleet-lab}
BASE=${FLEET_LAB_PORT_BASE:-18000}
MAX_NODES=${FLEET_LAB_MAX_NODES:-500}
ASSETS=${KRUISED_KUBE_ASSETS:-}
P_API=$((BASE + 443))
P_ETCD=$((BASE + 379))
P_PEER=$((BASE + 380))
BIN=$FLEET_LAB/bin
PKI=$FLEET_LAB/pki
RUN=$FLEET_LAB/run

log() { echo "[fleet-lab] $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

unpack() {
  local b
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/etcd" ] && [ -x "$BIN/kubectl" ] && return
  for b in kube-apiserver etcd kubectl; do
    [ -n "$ASSETS" ] && [ -f "$ASSETS/$b" ] || die "no Kubernetes binaries: KRUISED_KUBE_ASSETS must name a directory holding kube-apiserver, etcd and kubectl"
  done
  mkdir -p "$BIN.tmp"
  for b in kube-apiserver etcd kubectl; do
    install -m 0755 "$ASSETS/$b" "$BIN.tmp/$b"
  done
  rm -rf "$BIN"
  mv "$BIN.tmp" "$BIN"
}

pki() {
  [ -f "$PKI/apiserver.crt" ] && return
  mkdir -p "$PKI"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key"
  openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=fleet-lab-ca" -days 3650 -sha256 -out "$PKI/ca.crt" 2> /dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/apiserver.key"
  openssl req -new -key "$PKI/apiserver.key" -subj "/CN=kube-apiserver" -out "$PKI/apiserver.csr" 2> /dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$PKI/apiserver.ext"
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2> /dev/null
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2> /dev/null
}

# tokens.csv: token,user,uid,"groups"; one token file per user, for the kubeconfigs
tokens() {
  [ -f "$FLEET_LAB/tokens.csv" ] && return
  local salt i
  salt=$(openssl rand -hex 8)
  {
    echo "admin-$salt,fleet-admin,fleet-admin,\"system:masters\""
    echo "kubelet-$salt,fleet-kubelet,fleet-kubelet,\"system:masters\""
    for ((i = 0; i < MAX_NODES; i++)); do
      echo "kruised-n$i-$salt,kruised:n$i,kruised-n$i,\"fleet:kruised\""
      echo "kruise-daemon-n$i-$salt,kruise-daemon:n$i,kruise-daemon-n$i,\"fleet:kruise-daemon\""
    done
  } > "$FLEET_LAB/tokens.csv.tmp"
  mv "$FLEET_LAB/tokens.csv.tmp" "$FLEET_LAB/tokens.csv"
  echo "$salt" > "$FLEET_LAB/token-salt"
}

audit_policy() {
  cat > "$FLEET_LAB/audit-policy.yaml" << 'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
# who asked what: metadata only; a watch is counted when it starts, anything else when done
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
EOF
}

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2> /dev/null; }

start_daemon() { # name, command...
  local name=$1
  shift
  alive "$name" && return
  setsid nohup "$@" > "$RUN/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$name.pid"
}

wait_for() { # what, seconds, command...
  local what=$1 limit=$2 t0=$SECONDS
  shift 2
  until "$@" > /dev/null 2>&1; do
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      tail -n 20 "$RUN"/*.log >&2 || true
      die "$what not up after ${limit}s (logs above and in $RUN)"
    fi
    sleep 0.2
  done
}

admin_token() { cut -d, -f1 "$FLEET_LAB/tokens.csv" | head -1; }

apicurl() {
  curl -sf --max-time 5 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(admin_token)" "https://127.0.0.1:$P_API$1"
}

kubeconfig() { # file, token
  cat > "$1" << EOF
apiVersion: v1
kind: Config
clusters:
- name: fleet-lab
  cluster:
    server: https://127.0.0.1:$P_API
    certificate-authority: $PKI/ca.crt
users:
- name: user
  user:
    token: $2
contexts:
- name: fleet-lab
  context: {cluster: fleet-lab, user: user}
current-context: fleet-lab
EOF
}

kctl() { "$BIN/kubectl" --kubeconfig "$FLEET_LAB/kubeconfig" "$@"; }

start() {
  local t0=$SECONDS
  mkdir -p "$FLEET_LAB" "$RUN"
  unpack
  pki
  tokens
  audit_policy
  kubeconfig "$FLEET_LAB/kubeconfig" "$(admin_token)"
  kubeconfig "$FLEET_LAB/kubelet.kubeconfig" "$(sed -n 2p "$FLEET_LAB/tokens.csv" | cut -d, -f1)"
  ulimit -n "$(ulimit -Hn)" || true
  start_daemon etcd "$BIN/etcd" -data-dir "$FLEET_LAB/etcd" -listen-client-url "http://127.0.0.1:$P_ETCD" \
    -listen-peer-url "http://127.0.0.1:$P_PEER" -log-level warn -unsafe-no-fsync
  wait_for etcd 60 sh -c "curl -sf --max-time 2 http://127.0.0.1:$P_ETCD/health | grep -q '\"health\":\"true\"'"
  start_daemon kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$P_ETCD" --bind-address=127.0.0.1 --secure-port="$P_API" \
    --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --token-auth-file="$FLEET_LAB/tokens.csv" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" --service-cluster-ip-range=10.96.0.0/24 \
    --authorization-mode=RBAC --disable-admission-plugins=ServiceAccount --profiling=false \
    --audit-policy-file="$FLEET_LAB/audit-policy.yaml" --audit-log-path="$FLEET_LAB/audit.log" \
    --audit-log-format=json --audit-log-maxsize=0 --v=1
  # on a loaded machine (the other test layers beside it) the API server takes minutes
  wait_for kube-apiserver 300 apicurl /readyz
  kctl apply --server-side --force-conflicts -f "${KRUISED_KRUISE_CRDS:-$ROOT/../shared/kube/kruise-crds}" > /dev/null
  kctl apply --server-side --force-conflicts -f "$ROOT/tests/fixtures/cluster/testworkload-crd.yaml" > /dev/null
  kctl wait --for=condition=Established crd --all --timeout=60s > /dev/null
  kctl apply --server-side --force-conflicts -f "$ROOT/deploy/namespace.yaml" \
    -f "$ROOT/deploy/rbac.yaml" -f "$ROOT/tests/fixtures/kruise-chart/rbac.yaml" \
    -f "$ROOT/tests/fixtures/fleet-bindings.yaml" > /dev/null
  log "up in $((SECONDS - t0))s: KUBECONFIG=$FLEET_LAB/kubeconfig, audit log $FLEET_LAB/audit.log"
}

stop_pid() {
  local name=$1 pid i
  alive "$name" || {
    rm -f "$RUN/$name.pid"
    return 0
  }
  pid=$(cat "$RUN/$name.pid")
  kill "$pid" 2> /dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2> /dev/null || true
  rm -f "$RUN/$name.pid"
}

stop() {
  stop_pid kube-apiserver
  stop_pid etcd
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  clean)
    stop
    rm -rf "$FLEET_LAB"
    ;;
  env)
    echo "KRUISED_FLEET_LAB=$FLEET_LAB"
    ;;
  *)
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
