#!/usr/bin/env bash
# The whole test suite, four layers: unit tests, integration tests against the in-process
# doubles, end-to-end tests against a real containerd + runc + registry, and cluster tests
# against a real Kubernetes (kube-apiserver with RBAC, etcd, controller-manager, scheduler, and
# a kubelet on a containerd of its own). This script installs what they need (Debian
# packages), starts both labs in fresh directories, and stops them again, whatever happens.
#
#   tests/run.sh                 everything
#   tests/run.sh -- NAME         only tests whose name contains NAME (cargo test filter)
#
# The end-to-end layer runs once per runtime: Debian's containerd 1.6 (with every other layer),
# then containerd 2.3 and CRI-O 1.36. The cluster layer's kubelet runs on containerd 2.3 (what
# new clusters run). Both need builds this repository does not ship:
#   KRUISED_RUNTIMES_ASSETS  containerd 2.3, CRI-O 1.36, crictl 1.36 (default ../shared/runtimes)
#   KRUISED_KUBE_ASSETS      the Kubernetes binaries (default ../shared/kube; its kube-lab.sh is
#                            ../tools/kube-lab.sh beside it)
# Without them the passes that need them are skipped with a message, except in CI (CI=true) or
# with KRUISED_REQUIRE_LAB=1, where the run fails.
#
# Needs root (containerd, runc, kubelet, apt-get). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
log() { printf '[tests/run.sh] %s\n' "$*" >&2; }

require_kube=${KRUISED_REQUIRE_LAB:-0}
case "${CI:-}" in true | 1) require_kube=1 ;; esac

# ---- the Kubernetes binaries of the cluster layer
assets=${KRUISED_KUBE_ASSETS:-}
if [ -z "$assets" ] && [ -d ../shared/kube ]; then assets=$(cd ../shared/kube && pwd); fi
kube_lab=""
if [ -n "$assets" ]; then
  kube_lab=$(cd "$assets/.." && pwd)/tools/kube-lab.sh
  if [ ! -f "$assets/SHA256SUMS" ] || [ ! -x "$kube_lab" ]; then
    log "KRUISED_KUBE_ASSETS=$assets has no SHA256SUMS or no ../tools/kube-lab.sh beside it"
    kube_lab=""
  fi
fi
if [ -z "$kube_lab" ]; then
  if [ "$require_kube" = 1 ]; then
    log "ERROR: the cluster layer is required (CI or KRUISED_REQUIRE_LAB=1) but no Kubernetes binaries were found: set KRUISED_KUBE_ASSETS"
    exit 1
  fi
  log "SKIPPING the cluster layer: no Kubernetes binaries (set KRUISED_KUBE_ASSETS, default ../shared/kube)"
  export KRUISED_KUBE_LAB_SKIPPED=1
fi

# ---- the runtimes beside Debian's containerd 1.6
runtimes=${KRUISED_RUNTIMES_ASSETS:-}
if [ -z "$runtimes" ] && [ -d ../shared/runtimes ]; then runtimes=$(cd ../shared/runtimes && pwd); fi
if [ -n "$runtimes" ] && [ ! -f "$runtimes/SHA256SUMS" ]; then
  log "KRUISED_RUNTIMES_ASSETS=$runtimes has no SHA256SUMS"
  runtimes=""
fi
E2E_RUNTIMES=(containerd)
if [ -n "$runtimes" ]; then
  export KRUISED_RUNTIMES_ASSETS=$runtimes
  E2E_RUNTIMES=(containerd containerd2 crio)
elif [ "$require_kube" = 1 ]; then
  log "ERROR: the end-to-end passes on containerd 2.3 and CRI-O are required (CI or KRUISED_REQUIRE_LAB=1) but no runtime builds were found: set KRUISED_RUNTIMES_ASSETS"
  exit 1
else
  log "SKIPPING the end-to-end passes on containerd 2.3 and CRI-O: no runtime builds (set KRUISED_RUNTIMES_ASSETS, default ../shared/runtimes)"
fi
# the end-to-end tests, by test binary: run again for each runtime after the first
E2E_TESTS=()
for f in tests/e2e_*.rs; do E2E_TESTS+=(--test "$(basename "$f" .rs)"); done

# ---- labs: each in a fresh directory, stopped whatever happens
export LAB
LAB=$(mktemp -d "${TMPDIR:-/tmp}/kruised-lab.XXXXXX")
KLAB=""
# the cluster's own runtime (containerd 2.3 from tests/cri-lab.sh under $KLAB.cri) and
# registries, on ports apart from the end-to-end lab's: a real kubelet kills every pod of its
# runtime it did not make. Without the runtime builds: kube-lab's own containerd 1.6.
KCRI=""
KREG=127.0.0.1:16500 KREG_AUTH=127.0.0.1:16501
KUBE_ENV=(KLAB_CRI_LAB="$ROOT/tests/cri-lab.sh" REG_AUTH_ADDR="$KREG_AUTH" KLAB_REG_ADDR="$KREG"
  KLAB_CRDS="${assets:-}/kruise-crds")
cleanup() {
  local rc=$?
  if [ -n "$KLAB" ]; then
    env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" clean > "$LAB.kube-lab-stop.log" 2>&1 ||
      log "kube-lab.sh clean failed (log: $LAB.kube-lab-stop.log)"
  fi
  if [ -n "$KCRI" ]; then
    LAB=$KCRI REG_ADDR=$KREG REG_AUTH_ADDR=$KREG_AUTH bash tests/cri-lab.sh clean > /dev/null 2>&1 || true
    rm -rf "$KCRI"
  fi
  bash tests/cri-lab.sh clean || true
  rm -rf "$LAB"
  exit "$rc"
}
trap cleanup EXIT
bash tests/cri-lab.sh install

kube_pid=""
if [ -n "$kube_lab" ]; then
  KLAB=$(mktemp -d "${TMPDIR:-/tmp}/kruised-kube-lab.XXXXXX")
  if [ -n "$runtimes" ]; then
    KCRI=$KLAB.cri
    KUBE_ENV+=(KLAB_CRI_SOCKET="$KCRI/containerd2/containerd.sock" KLAB_CNI_CONF_DIR="$KCRI/containerd2/cni")
  fi
  # started in the background while the end-to-end lab starts and the tests build
  t_kube=$(now)
  (
    if [ -n "$KCRI" ]; then
      LAB=$KCRI REG_ADDR=$KREG REG_AUTH_ADDR=$KREG_AUTH CRI_LAB_RUNTIMES=containerd2 bash tests/cri-lab.sh start
    fi
    env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" start
  ) > "$KLAB.start.log" 2>&1 &
  kube_pid=$!
fi

CRI_LAB_RUNTIMES="${E2E_RUNTIMES[*]}" bash tests/cri-lab.sh start
if [ -n "$runtimes" ]; then CRI_LAB_RUNTIME=crio-noevents bash tests/cri-lab.sh start-runtime; fi
export KRUISED_LAB=$LAB KRUISED_REQUIRE_LAB=1

t_build=$(now)
cargo test --workspace --all-targets --locked --no-run "$@"
log "tests built in $(since "$t_build")s"

# the shipped binary and image (the cluster layer deploys it): static, runs, and the image's
# digest is the same when built again from the same source
t_image=$(now)
digest=$(bash scripts/build-image.sh)
target/dist/kruised version --client-only
[ "$(bash scripts/build-image.sh 2> /dev/null)" = "$digest" ] ||
  { log "ERROR: the image's digest changed on a rebuild of the same source"; exit 1; }
log "release binary and image ($digest) built in $(since "$t_image")s"

if [ -n "$kube_pid" ]; then
  if ! wait "$kube_pid"; then
    tail -30 "$KLAB.start.log" >&2
    log "ERROR: the cluster lab did not start (log above, logs in $KLAB/logs)"
    exit 1
  fi
  log "cluster lab ready ($(since "$t_kube")s after its start)"
  # what the cluster tests need, under our own names (the kube-lab's KUBECONFIG and
  # CONTAINER_RUNTIME_ENDPOINT must not leak into the other layers)
  kenv=$(env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" env)
  get() { sed -n "s/^export $1=//p" <<< "$kenv" | tr -d '"'; }
  export KRUISED_KUBE_LAB=$KLAB
  KRUISED_KUBE_LAB_NODE=$(get KLAB_NODE)
  KRUISED_KUBE_LAB_CRI=$(get KLAB_CRI_SOCKET)
  export KRUISED_KUBE_LAB_NODE KRUISED_KUBE_LAB_CRI
  export KRUISED_KUBE_LAB_REGISTRY=$KREG KRUISED_KUBE_LAB_AUTH_REGISTRY=$KREG_AUTH
  export KRUISED_KUBE_LAB_CRI_LAB=${KCRI:-$KLAB/cri}
  log "cluster layer: kubelet on the runtime at $KRUISED_KUBE_LAB_CRI"
fi

t_test=$(now)
KRUISED_LAB_RUNTIME=${E2E_RUNTIMES[0]} cargo test --workspace --all-targets --locked "$@"
log "all layers passed in $(since "$t_test")s (end-to-end on ${E2E_RUNTIMES[0]})"
for rt in "${E2E_RUNTIMES[@]:1}"; do
  t_test=$(now)
  KRUISED_LAB_RUNTIME=$rt cargo test --locked "${E2E_TESTS[@]}" "$@"
  log "end-to-end layer on $rt passed in $(since "$t_test")s"
done
