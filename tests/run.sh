#!/usr/bin/env bash
# The whole test suite, four layers: unit tests, integration tests against the in-process
# doubles, end-to-end tests against real runtimes (containerd 1.6, containerd 2.3 and CRI-O,
# each with runc and a registry), and cluster tests against a real Kubernetes (kube-apiserver
# with RBAC, etcd, controller-manager, scheduler, and a kubelet on a containerd 2.3 of its own).
# It installs what they need (Debian packages), starts every lab in fresh directories, and
# stops them again, whatever happens.
#
#   tests/run.sh                 everything
#   tests/run.sh -- ARGS         ARGS to every test binary (a name filter, --nocapture, ...)
#
# How it runs, on two cores: the shipped binary and image build in the background from the start
# (the longest chain), the labs start beside them (the cluster's once that binary or the
# layers' test binaries are built), and the binaries of the layers on real processes build;
# then, at once (each is mostly
# waiting on real processes): the end-to-end layer on each runtime (its own lab and registry;
# `tests/e2e`, then the tests that kill the runtime, `tests/e2e_faults`) and the cluster layer
# (`tests/cluster`; the tests that deploy the shipped image last, once `scripts/build-image.sh`
# has built it). Beside them the rest builds (clippy on every target); then the demo (the
# README's first command, `scripts/demo.sh --api double`), the integration and the unit tests.
# Each part's output goes to a log of its own, printed when it fails; a table of what took how
# long ends the run (KRUISED_PHASES=FILE appends it there too).
#
# Builds this repository does not ship, found through one variable each:
#   KRUISED_RUNTIMES_ASSETS  containerd 2.3, CRI-O 1.36, crictl 1.36 (default ../shared/runtimes)
#   KRUISED_KUBE_ASSETS      the Kubernetes binaries (default ../shared/kube; its kube-lab.sh is
#                            ../tools/kube-lab.sh beside it)
#   KRUISED_KRUISE_ASSETS    OpenKruise's kruise-manager (and kruise-daemon, for the benchmark) with
#                            the manifests the manager needs (default ../shared/kruise): the cluster
#                            layer runs the real manager beside its kubelet
# Without them the parts that need them are skipped with a message, except in CI (CI=true) or
# with KRUISED_REQUIRE_LAB=1, where the run fails.
#
# Needs root (runtimes, runc, kubelet, apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
log() { printf '[tests/run.sh] %s\n' "$*" >&2; }
T0=$(now)
PHASES=()
# phase NAME START: records how long NAME took, from START to now
phase() { PHASES+=("$(printf '%-44s %7ss' "$1" "$(since "$2")")"); }

TEST_ARGS=()
if [ "${1:-}" = -- ]; then shift; TEST_ARGS=("$@"); elif [ $# -gt 0 ]; then
  echo "usage: tests/run.sh [-- TEST_ARGS...]" >&2; exit 2
fi

require=${KRUISED_REQUIRE_LAB:-0}
case "${CI:-}" in true | 1) require=1 ;; esac

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
  if [ "$require" = 1 ]; then
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
elif [ "$require" = 1 ]; then
  log "ERROR: the end-to-end layer on containerd 2.3 and CRI-O is required (CI or KRUISED_REQUIRE_LAB=1) but no runtime builds were found: set KRUISED_RUNTIMES_ASSETS"
  exit 1
else
  log "SKIPPING the end-to-end layer on containerd 2.3 and CRI-O: no runtime builds (set KRUISED_RUNTIMES_ASSETS, default ../shared/runtimes)"
fi

# ---- OpenKruise's own manager, for the cluster layer
kruise=${KRUISED_KRUISE_ASSETS:-}
if [ -z "$kruise" ] && [ -d ../shared/kruise ]; then kruise=$(cd ../shared/kruise && pwd); fi
if [ -n "$kruise" ] && { [ ! -f "$kruise/SHA256SUMS" ] || [ ! -f "$kruise/kruise-manager.xz" ] ||
  [ ! -f "$kruise/manifests.yaml" ]; }; then
  log "KRUISED_KRUISE_ASSETS=$kruise has no SHA256SUMS, kruise-manager.xz or manifests.yaml"
  kruise=""
fi
if [ -z "$kruise" ] && [ -n "$kube_lab" ]; then
  if [ "$require" = 1 ]; then
    log "ERROR: the cluster layer runs the real kruise-manager in CI (or with KRUISED_REQUIRE_LAB=1) but none was found: set KRUISED_KRUISE_ASSETS"
    exit 1
  fi
  log "SKIPPING the cluster tests with the real kruise-manager: none found (set KRUISED_KRUISE_ASSETS, default ../shared/kruise)"
  export KRUISED_KRUISE_MANAGER_SKIPPED=1
fi

# ---- labs, each in a fresh directory, stopped whatever happens
RUN=$(mktemp -d "${TMPDIR:-/tmp}/kruised-run.XXXXXX")
declare -A E2E_LAB E2E_REG E2E_AUTH LAB_PID PART_PID
i=0
for rt in "${E2E_RUNTIMES[@]}"; do
  # a registry pair of its own per runtime: the pull tests read the registry's access log
  E2E_LAB[$rt]=$RUN/lab-$rt
  E2E_REG[$rt]=127.0.0.1:$((5000 + 10 * i)) E2E_AUTH[$rt]=127.0.0.1:$((5001 + 10 * i))
  i=$((i + 1))
done
lab() { # lab RUNTIME COMMAND: tests/cri-lab.sh COMMAND on that runtime's lab
  local rt=$1; shift
  local which=$rt
  if [ "$rt" = crio ]; then which="crio crio-noevents"; fi
  LAB=${E2E_LAB[$rt]} REG_ADDR=${E2E_REG[$rt]} REG_AUTH_ADDR=${E2E_AUTH[$rt]} \
    CRI_LAB_RUNTIMES=$which bash tests/cri-lab.sh "$@"
}
KLAB=""
# the cluster's own runtime (containerd 2.3 from tests/cri-lab.sh under $KLAB.cri) and
# registries, on ports apart from the end-to-end labs': a real kubelet kills every pod of its
# runtime it did not make. Without the runtime builds: kube-lab's own containerd 1.6. The one
# cluster pass is on containerd 2.3, what new clusters run: the cluster layer is the longest part
# of the run (its tests share the node), and a second pass on CRI-O would add its length again.
KCRI=""
# containerd 2.3 in CI; KRUISED_CLUSTER_RUNTIME=crio runs the cluster layer's kubelet on CRI-O
CLUSTER_RUNTIME=${KRUISED_CLUSTER_RUNTIME:-containerd2}
KREG=127.0.0.1:16500 KREG_AUTH=127.0.0.1:16501
KUBE_ENV=(KLAB_CRI_LAB="$ROOT/tests/cri-lab.sh" REG_AUTH_ADDR="$KREG_AUTH" KLAB_REG_ADDR="$KREG"
  KLAB_CRDS="${assets:-}/kruise-crds")
JOBS=()
kill_tree() { # a background job and everything it started (cargo, test binaries, daemons)
  local child
  for child in $(ps -o pid= --ppid "$1" 2> /dev/null); do kill_tree "$child"; done
  kill "$1" 2> /dev/null || true
}
cleanup() {
  local rc=$? rt pid
  for pid in "${JOBS[@]}"; do kill_tree "$pid"; done
  wait 2> /dev/null || true
  if [ -n "$KLAB" ]; then
    env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" clean > "$RUN/kube-lab-stop.log" 2>&1 ||
      log "kube-lab.sh clean failed (log: $RUN/kube-lab-stop.log)"
  fi
  if [ -n "$KCRI" ]; then
    LAB=$KCRI REG_ADDR=$KREG REG_AUTH_ADDR=$KREG_AUTH bash tests/cri-lab.sh clean > /dev/null 2>&1 || true
  fi
  for rt in "${E2E_RUNTIMES[@]}"; do lab "$rt" clean > /dev/null 2>&1 || true; done
  if [ "$rc" = 0 ] || [ -z "${KRUISED_KEEP_LOGS:-}" ]; then rm -rf "$RUN"; fi
  exit "$rc"
}
trap cleanup EXIT
t=$(now)
bash tests/cri-lab.sh install
phase "install packages" "$t"

# the runtime builds, unpacked once for every lab
if [ -n "$runtimes" ]; then
  t=$(now)
  export CRI_LAB_BIN=$RUN/bin KRUISED_CRICTL=$RUN/bin/crictl
  CRI_LAB_RUNTIMES="containerd2 crio" LAB=$RUN bash tests/cri-lab.sh unpack
  phase "unpack containerd 2.3, CRI-O, crictl" "$t"
fi

if [ -n "$kruise" ] && [ -n "$kube_lab" ]; then
  t=$(now)
  mkdir -p "$RUN/kruise"
  xz -dc "$kruise/kruise-manager.xz" > "$RUN/kruise/kruise-manager"
  # kruise-daemon, beside kruised in the fleet benchmark's smoke run
  if [ -f "$kruise/kruise-daemon.xz" ]; then
    xz -dc "$kruise/kruise-daemon.xz" > "$RUN/kruise/kruise-daemon"
  fi
  chmod +x "$RUN/kruise"/kruise-*
  (cd "$RUN/kruise" && sha256sum -c --ignore-missing --quiet "$kruise/SHA256SUMS")
  phase "unpack kruise-manager and kruise-daemon" "$t"
fi

# the shipped binary and image (the layers on real runtimes run the binary, the cluster layer
# deploys the image), built in the background from now on, beside the tests' build (its own
# profile and target directory: no build lock shared with it). It is the longest chain of the
# run: its dependencies (about 3.5 minutes on two cores), then kruised in one codegen unit (1.5
# minutes) and the fat-LTO link (3 minutes), each on one core. So it goes first, and the tests' build (below, at a lower priority) takes what
# it leaves: the core the chain does not use, instead of a core idle at the end while the last
# link runs alone. Static, runs, and the image's digest is the same when built again from the
# same source. Not linted again (RUSTC_WORKSPACE_WRAPPER is CI's clippy, which the tests'
# build runs).
t_image=$(now)
(
  unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
  digest=$(bash scripts/build-image.sh)
  target/dist/kruised version --client-only
  touch "$RUN/shipped-binary"
  [ "$(bash scripts/build-image.sh 2> /dev/null)" = "$digest" ] ||
    { echo "ERROR: the image's digest changed on a rebuild of the same source"; exit 1; }
  echo "built in $(since "$t_image")s"
  echo "image $digest"
) > "$RUN/image.log" 2>&1 &
image_pid=$!
JOBS+=("$image_pid")
wait_for_shipped_binary() { # until the image job has built it; fails if the job ended without it
  until [ -e "$RUN/shipped-binary" ]; do
    kill -0 "$image_pid" 2> /dev/null || [ -e "$RUN/shipped-binary" ] || return 1
    sleep 1
  done
}

# the labs, started in the background while the tests build
t_labs=$(now)
for rt in "${E2E_RUNTIMES[@]}"; do
  lab "$rt" start > "$RUN/lab-$rt.log" 2>&1 &
  LAB_PID[$rt]=$!
done
kube_pid=""
if [ -n "$kube_lab" ]; then
  KLAB=$RUN/kube
  mkdir -p "$KLAB"
  if [ -n "$runtimes" ]; then
    KCRI=$RUN/kcri
    case "$CLUSTER_RUNTIME" in
      containerd2) KUBE_ENV+=(KLAB_CRI_SOCKET="$KCRI/containerd2/containerd.sock" KLAB_CNI_CONF_DIR="$KCRI/containerd2/cni") ;;
      crio) KUBE_ENV+=(KLAB_CRI_SOCKET="$KCRI/crio/crio.sock" KLAB_CNI_CONF_DIR="$KCRI/crio/cni") ;;
      *) log "KRUISED_CLUSTER_RUNTIME=$CLUSTER_RUNTIME: containerd2 or crio"; exit 2 ;;
    esac
  fi
  (
    # not before the first of the two builds the cluster layer needs (the shipped binary, the
    # layers' test binaries) is done: an idle cluster costs about 5 CPU-seconds a minute,
    # which the builds need more, and it is ready in 20 to 30 s, before the other build ends on
    # a slow host, and soon after on a fast one (where the cluster layer is the longest chain)
    until [ -e "$RUN/shipped-binary" ] || [ -e "$RUN/layers-built" ]; do
      kill -0 "$image_pid" 2> /dev/null || break
      sleep 1
    done
    if [ -n "$KCRI" ]; then
      LAB=$KCRI REG_ADDR=$KREG REG_AUTH_ADDR=$KREG_AUTH CRI_LAB_RUNTIMES=$CLUSTER_RUNTIME bash tests/cri-lab.sh start
    fi
    env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" start
  ) > "$RUN/kube-lab.log" 2>&1 &
  kube_pid=$!
fi


# ---- build, in two stages. First what the layers on real runtimes and the cluster run (their
# test binaries, the kruised binary they start, the benchmarks they measure), so that those
# layers start as soon as possible: they mostly wait on real processes and leave CPU over. Then,
# beside them, the rest (the unit tests, the integration tests on the doubles, the tools the
# demo runs): the same build with clippy, all targets. Niced, so that the image's chain keeps its
# core (see above) and the layers' processes theirs. The test binaries are listed by name for
# the parts below.
LAYER_TARGETS=(--test e2e --test e2e_faults --test cluster --bench prepull --bench inplace)
list_binaries() { # the test binaries of `cargo test ARGS --no-run`, "name path" per line
  cargo test --workspace --locked --no-run "$@" --message-format=json 2> /dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' > "$RUN/binaries.new"
  mv "$RUN/binaries.new" "$RUN/binaries" # whole: the parts read it as they go
}
bin() { awk -v n="$1" '$1 == n {print $2; exit}' "$RUN/binaries"; }
t=$(now)
nice -n 10 cargo test --workspace --locked --no-run "${LAYER_TARGETS[@]}"
list_binaries "${LAYER_TARGETS[@]}"
touch "$RUN/layers-built"
phase "build what the layers run" "$t"

# ---- the labs of the end-to-end layer
t=$(now)
for rt in "${E2E_RUNTIMES[@]}"; do
  if ! wait "${LAB_PID[$rt]}"; then
    tail -30 "$RUN/lab-$rt.log" >&2
    log "ERROR: the $rt lab did not start (log above)"
    exit 1
  fi
done
phase "labs ready (after the build)" "$t"
phase "labs ready (since they started)" "$t_labs"

# ---- the end-to-end layer on each runtime, and the cluster layer, beside each other
run_part() { # run_part NAME COMMAND...: in the background, output to $RUN/NAME.log
  local name=$1; shift
  (
    t=$(now)
    if "$@" > "$RUN/$name.log" 2>&1; then
      echo "ok $(since "$t")" > "$RUN/$name.status"
    else
      echo "FAILED $(since "$t")" > "$RUN/$name.status"
    fi
  ) &
  PART_PID[$name]=$!
  JOBS+=("$!")
}
e2e_part() { # the end-to-end binaries, one after the other, on one runtime's lab
  local rt=$1
  use_shipped_binary || return 1
  export KRUISED_LAB=${E2E_LAB[$rt]} KRUISED_LAB_RUNTIME=$rt
  export KRUISED_LAB_REGISTRY=${E2E_REG[$rt]} KRUISED_LAB_AUTH_REGISTRY=${E2E_AUTH[$rt]}
  "$(bin e2e)" "${TEST_ARGS[@]}" && "$(bin e2e_faults)" "${TEST_ARGS[@]}" || return 1
  if [ "$rt" = containerd ]; then "$(bin prepull)"; fi
}
cluster_part() { # once the cluster lab is up
  local t
  use_shipped_binary || return 1
  # what the cluster tests need, under our own names (the kube-lab's KUBECONFIG and
  # CONTAINER_RUNTIME_ENDPOINT must not leak into the other layers)
  local kenv
  kenv=$(env "${KUBE_ENV[@]}" KLAB="$KLAB" "$kube_lab" env)
  get() { sed -n "s/^export $1=//p" <<< "$kenv" | tr -d '"'; }
  export KRUISED_KUBE_LAB=$KLAB KRUISED_KUBE_LAB_NODE KRUISED_KUBE_LAB_CRI
  KRUISED_KUBE_LAB_NODE=$(get KLAB_NODE)
  KRUISED_KUBE_LAB_CRI=$(get KLAB_CRI_SOCKET)
  export KRUISED_KUBE_LAB_REGISTRY=$KREG KRUISED_KUBE_LAB_AUTH_REGISTRY=$KREG_AUTH
  export KRUISED_KUBE_LAB_CRI_LAB=${KCRI:-$KLAB/cri}
  echo "kubelet on the runtime at $KRUISED_KUBE_LAB_CRI"
  # the tests that deploy the shipped image (ship::) once it is built; the rest first
  "$(bin cluster)" --skip ship:: "${TEST_ARGS[@]}" || return 1
  t=$(now)
  wait_for_image || return 1
  echo "waited $(since "$t")s for the image"
  "$(bin cluster)" ship:: "${TEST_ARGS[@]}" || return 1
  "$(bin inplace)"
}
# the layers on real runtimes run the kruised that ships (KRUISED_TEST_BIN), built by the image
# job: it is the longest chain of the build and ends before the layers' test binaries do
use_shipped_binary() {
  local t
  t=$(now)
  if ! wait_for_shipped_binary; then
    cat "$RUN/image.log"
    echo "ERROR: the shipped binary was not built (log above)"
    return 1
  fi
  echo "waited $(since "$t")s for the shipped binary"
  export KRUISED_TEST_BIN=$ROOT/target/dist/kruised
}
wait_for_image() { # the image job is not this subshell's child: it writes its last line last
  while kill -0 "$image_pid" 2> /dev/null; do sleep 1; done
  grep -q '^image sha256:' "$RUN/image.log" || { cat "$RUN/image.log"; return 1; }
}

# kruise-manager out of the cluster, as ../shared/kruise/README.md runs it: its webhooks on
# loopback with certificates of its own, every feature gate the node daemon serves. Its objects
# first (the namespaces, the webhook configurations it rewrites to its address; created, never
# applied again) and stand-ins for the CRDs of the kinds no test uses (without them it waits
# about 16 s for each before its controllers start), then the manager; ready once its own
# webhook answers.
KRUISE_MANAGER_HEALTH=127.0.0.1:19001
start_kruise_manager() {
  local dir=$RUN/kruise kubectl=$KLAB/bin/kubectl
  mkdir -p "$dir/certs" "$dir/protection"
  {
    KUBECONFIG=$KLAB/kubeconfig "$kubectl" create -f "$kruise/manifests.yaml" &&
      KUBECONFIG=$KLAB/kubeconfig "$kubectl" create -f tests/fixtures/cluster/kruise-stand-in-crds.yaml &&
      KUBECONFIG=$KLAB/kubeconfig "$kubectl" wait --for=condition=Established crd --all --timeout=60s
  } > "$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2; log "ERROR: kruise-manager's objects could not be created"; exit 1; }
  WEBHOOK_HOST=127.0.0.1 WEBHOOK_PORT=19000 WEBHOOK_CERT_DIR=$dir/certs POD_NAMESPACE=kruise-system \
    "$dir/kruise-manager" --kubeconfig="$KLAB/kubeconfig" --enable-leader-election=false \
    --metrics-addr=127.0.0.1:19002 --health-probe-addr=$KRUISE_MANAGER_HEALTH --enable-pprof=false \
    --protection-log-path="$dir/protection" --nodeimage-creation-delay=0s \
    --feature-gates=ImagePullJobGate=true,PodProbeMarkerGate=true,InPlaceUpdateEnvFromMetadata=true,KruiseDaemon=true \
    --logtostderr=true --v=2 > "$dir/manager.log" 2>&1 &
  JOBS+=("$!")
  local deadline=$((SECONDS + 90))
  until curl -sf "http://$KRUISE_MANAGER_HEALTH/readyz" > /dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "${JOBS[-1]}" 2> /dev/null; then
      tail -30 "$dir/manager.log" >&2
      log "ERROR: kruise-manager did not become ready within 90 s (log above: $dir/manager.log)"
      exit 1
    fi
    sleep 0.5
  done
  export KRUISED_KRUISE_MANAGER=$KRUISE_MANAGER_HEALTH KRUISED_KRUISE_MANAGER_LOG=$dir/manager.log
}

# the cluster layer (the longest part: its tests share the node, one at a time) and the
# end-to-end layer on each runtime, at once
t_parts=$(now)
export KRUISED_REQUIRE_LAB=1
if [ -n "$kube_lab" ]; then
  t=$(now)
  if ! wait "$kube_pid"; then
    tail -30 "$RUN/kube-lab.log" >&2
    log "ERROR: the cluster lab did not start (log above, logs in $KLAB/logs)"
    exit 1
  fi
  phase "cluster lab ready (after the build)" "$t"
  if [ -n "$kruise" ]; then
    t=$(now)
    start_kruise_manager
    phase "kruise-manager ready" "$t"
  fi
  run_part cluster cluster_part
fi
for rt in "${E2E_RUNTIMES[@]}"; do run_part "e2e-$rt" e2e_part "$rt"; done

# the rest of the build, beside the layers; then, beside each other, the demo (the README's
# first command, on the API-server double, with the binaries of this build), the integration
# tests on the doubles (the longest of the rest: faults over a thousand changes) and the unit
# tests with the benchmarks' smoke runs that need no lab
t=$(now)
# every target but the test harnesses that `test = false` turns off (`--all-targets` would build
# them, empty): clippy sees what `cargo clippy --all-targets` sees
nice -n 10 cargo test --workspace --tests --benches --locked --no-run
list_binaries --tests --benches
phase "build the rest (beside the layers)" "$t"
run_part demo env KRUISED_DEMO_BINARIES="$ROOT/target/debug" bash scripts/demo.sh --api double
run_part integration "$(bin integration)" "${TEST_ARGS[@]}"
# the fleet benchmark's smoke run: five simulated nodes against an API server of its own
# (tests/fleet-lab.sh, on ports 18xxx), kruise-daemon then the shipped kruised on each
fleet_part() {
  # after the end-to-end layer, beside the cluster layer (the longest): not on the machine at
  # its busiest
  local rt
  for rt in "${E2E_RUNTIMES[@]}"; do
    while [ ! -f "$RUN/e2e-$rt.status" ]; do sleep 1; done
  done
  use_shipped_binary || return 1
  if [ -x "$RUN/kruise/kruise-daemon" ]; then export KRUISED_KRUISE_DAEMON=$RUN/kruise/kruise-daemon; fi
  KRUISED_KUBE_ASSETS=$assets "$(bin fleet)"
}
if [ -n "$kube_lab" ]; then run_part fleet fleet_part; fi
t=$(now)
cargo test --workspace --locked --lib --bins --test api --test cli --bench reaction \
  --bench podprobe -- "${TEST_ARGS[@]}"
phase "unit tests" "$t"

failed=0
failed_parts=()
parts=()
for rt in "${E2E_RUNTIMES[@]}"; do parts+=("e2e-$rt"); done
if [ -n "$kube_lab" ]; then parts+=(cluster fleet); fi
parts+=(demo integration)
for p in "${parts[@]}"; do
  wait "${PART_PID[$p]}" || true
  read -r status secs < "$RUN/$p.status"
  PHASES+=("$(printf '%-44s %7ss  %s' "  $p" "$secs" "$status")")
  if [ "$status" != ok ]; then
    failed=1
    failed_parts+=("$p")
    log "$p FAILED: its log follows"
    cat "$RUN/$p.log" >&2
  else
    grep -E '^test result|^(image|cluster lab|waited|kubelet)' "$RUN/$p.log" | sed "s/^/[$p] /" >&2 || true
  fi
done
phase "the layers (the parts above overlap)" "$t_parts"
if ! wait "$image_pid"; then failed=1; cat "$RUN/image.log" >&2; fi
cat "$RUN/image.log" >&2
PHASES+=("$(printf '%-44s %7ss' "  shipped binary and image (background)" "$(sed -n 's/^built in \(.*\)s$/\1/p' "$RUN/image.log")")")

phase "tests/run.sh" "$T0"
{
  echo "[tests/run.sh] what took how long (wall clock; the parts below overlap):"
  for p in "${PHASES[@]}"; do echo "  $p"; done
} | tee -a "${KRUISED_PHASES:-/dev/null}" >&2
if [ "$failed" = 1 ]; then
  # the gist last, where a truncated log still shows it: each failing test's first lines
  for p in "${failed_parts[@]}"; do
    log "$p: what failed"
    # the message, then the backtrace's frames in the tests (RUST_BACKTRACE may be set); where
    # no test failed (a part's own step did), the log's end
    if grep -q '^---- .* stdout ----$' "$RUN/$p.log"; then
      awk '/^---- .* stdout ----$/ {n = 25; bt = 0}
        /^stack backtrace:$/ {bt = 4; n = 0}
        bt > 0 && /^ +at \.\/tests\// {print "  " $0; bt--}
        n > 0 {print "  " substr($0, 1, 300); n--}' "$RUN/$p.log" >&2
    else
      tail -n 15 "$RUN/$p.log" | cut -c1-300 | sed 's/^/  /' >&2
    fi
  done
  log "FAILED"
  exit 1
fi
log "every layer passed"
