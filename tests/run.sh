#!/usr/bin/env bash
# The whole test suite. What the package registries give runs everywhere, CI included: unit
# tests, integration tests against the in-process doubles (the API-server double, the fake CRI
# runtime, the fuzz targets' seeds), the demo, end-to-end tests against real runtimes (Debian's
# containerd 1.6 and, from Debian unstable's package, containerd 2.x, each with runc and a
# registry), kruised under a real systemd (Debian's, booted in systemd-nspawn) and the fleet
# smoke run on the API-server double. Where someone provides binaries that no registry ships,
# more layers run: the cluster layer (a real Kubernetes with kruise-manager), the end-to-end
# layer on CRI-O and on a provided containerd 2.x, crictl compared live, the fleet on a real API
# server and kruise-daemon beside kruised. It installs what the layers need (Debian packages),
# starts every lab in fresh directories, and stops them again, whatever happens.
#
#   tests/run.sh                 everything
#   tests/run.sh -- ARGS         ARGS to every test binary (a name filter, --nocapture, ...)
#
# How it runs, on two cores: the shipped binary and image build in the background from the start
# (the longest chain), the labs start beside them (the cluster's once that binary or the
# layers' test binaries are built), and the binaries of the layers on real processes build;
# then, at once (each is mostly waiting on real processes): the end-to-end layer on each runtime
# (its own lab and registry; `tests/e2e`, then the tests that kill the runtime,
# `tests/e2e_faults`), the systemd layer and, where provided, the cluster layer (`tests/cluster`;
# the tests that deploy the shipped image last, once `scripts/build-image.sh` has built it).
# Beside them the rest builds (clippy on every target); then the demo (the README's first
# command, `scripts/demo.sh --api double`), the integration and the unit tests, and the fleet
# smoke run. Each part's output goes to a log of its own, printed when it fails; a table of what
# ran, what was skipped and why, and what took how long ends the run (KRUISED_PHASES=FILE
# appends it there too).
#
# Binaries this repository does not ship (no registry it reaches has them), each a directory of
# plain binaries named by one variable; a layer whose binaries are not named is skipped with one
# line, in CI too; a variable that names a directory without them fails the run:
#   KRUISED_KUBE_ASSETS      kube-apiserver etcd kubelet kube-controller-manager kube-scheduler
#                            kubectl: the cluster layer (started with ../shared/tools/kube-lab.sh,
#                            or KRUISED_KUBE_LAB_SCRIPT), and the fleet on a real API server
#                            (kube-apiserver, etcd and kubectl are enough for that)
#   KRUISED_RUNTIMES_ASSETS  containerd + containerd-shim-runc-v2 (a containerd 2.x of your
#                            choice, instead of Debian's), crio + pinns (CRI-O), crictl (the real
#                            crictl: the crictl tests compare with it live instead of with the
#                            recorded goldens); each used when present
#   KRUISED_KRUISE_ASSETS    kruise-manager (the cluster layer runs it beside its kubelet; the
#                            manifests it needs from ../shared/kruise/manifests.yaml unless the
#                            directory has its own), kruise-daemon (beside kruised in the fleet)
# KRUISED_DEBIAN_CONTAINERD2=0 leaves out the containerd 2.x pass where none is provided.
#
# Needs root (runtimes, runc, systemd-nspawn, kubelet, apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
log() { printf '[tests/run.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
T0=$(now)
PHASES=()
# phase NAME START: records how long NAME took, from START to now
phase() { PHASES+=("$(printf '%-44s %7ss' "$1" "$(since "$2")")"); }
# what ran and what did not, for the closing table: layer NAME WHAT
LAYERS=()
layer() { LAYERS+=("$(printf '%-34s %s' "$1" "$2")"); }
skip() { # skip NAME WHY: one line now, one in the closing table
  log "SKIPPING $1: $2"
  layer "$1" "skipped: $2"
}

TEST_ARGS=()
if [ "${1:-}" = -- ]; then shift; TEST_ARGS=("$@"); elif [ $# -gt 0 ]; then
  echo "usage: tests/run.sh [-- TEST_ARGS...]" >&2; exit 2
fi

# asset_dir VAR FILES...: the directory VAR names, if it holds every FILE (plain binaries);
# empty when VAR is unset; the run fails when VAR names a directory without them
asset_dir() {
  local var=$1 dir b; shift
  dir=${!var:-}
  [ -n "$dir" ] || return 0
  [ -d "$dir" ] || die "$var=$dir is not a directory"
  for b in "$@"; do [ -f "$dir/$b" ] || return 0; done
  (cd "$dir" && pwd)
}

# ---- the Kubernetes binaries: the cluster layer, the fleet on a real API server
KUBE_BINS=(kube-apiserver etcd kubelet kube-controller-manager kube-scheduler kubectl)
assets=$(asset_dir KRUISED_KUBE_ASSETS "${KUBE_BINS[@]}")
if [ -n "${KRUISED_KUBE_ASSETS:-}" ] && [ -z "$assets" ]; then
  die "KRUISED_KUBE_ASSETS=$KRUISED_KUBE_ASSETS lacks one of ${KUBE_BINS[*]}"
fi
kube_lab=""
if [ -n "$assets" ]; then
  kube_lab=${KRUISED_KUBE_LAB_SCRIPT:-$ROOT/../shared/tools/kube-lab.sh}
  [ -x "$kube_lab" ] || die "the cluster layer needs kube-lab.sh: $kube_lab is not there (KRUISED_KUBE_LAB_SCRIPT)"
  kube_lab=$(cd "$(dirname "$kube_lab")" && pwd)/$(basename "$kube_lab")
  export KRUISED_KUBE_ASSETS=$assets
else
  skip "cluster (real Kubernetes)" "no Kubernetes binaries (KRUISED_KUBE_ASSETS unset)"
  export KRUISED_KUBE_LAB_SKIPPED=1
  unset KRUISED_KUBE_ASSETS
fi
# kruise's CRDs, for the cluster (data: ../shared/kube/kruise-crds)
KRUISE_CRDS=${KRUISED_KRUISE_CRDS:-$ROOT/../shared/kube/kruise-crds}
if [ -n "$kube_lab" ] && [ ! -d "$KRUISE_CRDS" ]; then
  die "the cluster layer needs kruise's CRDs: $KRUISE_CRDS is not there (KRUISED_KRUISE_CRDS)"
fi

# ---- the runtimes beside Debian's containerd 1.6: containerd 2.x (provided, or Debian
# unstable's package) and CRI-O (provided), and the real crictl (provided)
runtimes=""
if [ -n "${KRUISED_RUNTIMES_ASSETS:-}" ]; then
  [ -d "$KRUISED_RUNTIMES_ASSETS" ] || die "KRUISED_RUNTIMES_ASSETS=$KRUISED_RUNTIMES_ASSETS is not a directory"
  runtimes=$(cd "$KRUISED_RUNTIMES_ASSETS" && pwd)
  export KRUISED_RUNTIMES_ASSETS=$runtimes
  if [ -z "$(asset_dir KRUISED_RUNTIMES_ASSETS containerd)$(asset_dir KRUISED_RUNTIMES_ASSETS crio)$(asset_dir KRUISED_RUNTIMES_ASSETS crictl)" ]; then
    die "KRUISED_RUNTIMES_ASSETS=$runtimes holds none of containerd, crio, crictl"
  fi
else
  # never ../shared/runtimes' leftovers: only what is named
  export KRUISED_RUNTIMES_ASSETS=""
fi
has_runtime_bin() { [ -n "$runtimes" ] && [ -f "$runtimes/$1" ]; }
E2E_RUNTIMES=(containerd)
if has_runtime_bin containerd || [ "${KRUISED_DEBIAN_CONTAINERD2:-1}" = 1 ]; then
  E2E_RUNTIMES+=(containerd2)
else
  skip "e2e on containerd 2.x" "KRUISED_DEBIAN_CONTAINERD2=0 and no containerd in KRUISED_RUNTIMES_ASSETS"
fi
if has_runtime_bin crio && has_runtime_bin pinns; then
  E2E_RUNTIMES+=(crio)
else
  skip "e2e on CRI-O" "no crio and pinns in KRUISED_RUNTIMES_ASSETS"
fi
if has_runtime_bin crictl; then
  layer "crictl compared live" "with $runtimes/crictl"
else
  layer "crictl compared live" "skipped: no crictl in KRUISED_RUNTIMES_ASSETS (compared with the recorded goldens of tests/fixtures/crictl)"
  log "SKIPPING crictl compared live: no crictl in KRUISED_RUNTIMES_ASSETS (the crictl tests compare with recorded goldens)"
fi

# ---- OpenKruise's own manager (the cluster layer) and daemon (the fleet, beside kruised)
kruise=""
if [ -n "${KRUISED_KRUISE_ASSETS:-}" ]; then
  [ -d "$KRUISED_KRUISE_ASSETS" ] || die "KRUISED_KRUISE_ASSETS=$KRUISED_KRUISE_ASSETS is not a directory"
  kruise=$(cd "$KRUISED_KRUISE_ASSETS" && pwd)
  [ -f "$kruise/kruise-manager" ] || [ -f "$kruise/kruise-daemon" ] ||
    die "KRUISED_KRUISE_ASSETS=$kruise holds neither kruise-manager nor kruise-daemon"
fi
KRUISE_MANIFESTS=$kruise/manifests.yaml
[ -f "$KRUISE_MANIFESTS" ] || KRUISE_MANIFESTS=$ROOT/../shared/kruise/manifests.yaml
kruise_manager=""
if [ -n "$kruise" ] && [ -f "$kruise/kruise-manager" ] && [ -n "$kube_lab" ]; then
  [ -f "$KRUISE_MANIFESTS" ] || die "kruise-manager needs its manifests: neither $kruise/manifests.yaml nor ../shared/kruise/manifests.yaml"
  kruise_manager=$kruise/kruise-manager
else
  if [ -z "$kube_lab" ]; then
    skip "the real kruise-manager" "no cluster to run it beside"
  else
    skip "the real kruise-manager" "no kruise-manager in KRUISED_KRUISE_ASSETS"
  fi
  export KRUISED_KRUISE_MANAGER_SKIPPED=1
fi
if [ -n "$kruise" ] && [ -f "$kruise/kruise-daemon" ]; then
  export KRUISED_KRUISE_DAEMON=$kruise/kruise-daemon
else
  unset KRUISED_KRUISE_DAEMON
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
KLAB="" SDLAB=""
# the cluster's own runtime (containerd 2.x from tests/cri-lab.sh under $KCRI: provided, or
# Debian's) and registries, on ports apart from the end-to-end labs': a real kubelet kills every
# pod of its runtime it did not make. Without a containerd 2.x: kube-lab's own containerd 1.6.
# The one cluster pass is on containerd 2.x, what new clusters run: the cluster layer is the
# longest part of the run (its tests share the node), and a second pass on CRI-O would add its
# length again. KRUISED_CLUSTER_RUNTIME=crio runs the cluster layer's kubelet on a provided CRI-O.
KCRI=""
CLUSTER_RUNTIME=${KRUISED_CLUSTER_RUNTIME:-containerd2}
KREG=127.0.0.1:16500 KREG_AUTH=127.0.0.1:16501
KUBE_ENV=(KLAB_BIN_DIR="${assets:-}" KLAB_CRI_LAB="$ROOT/tests/cri-lab.sh" REG_AUTH_ADDR="$KREG_AUTH"
  KLAB_REG_ADDR="$KREG" KLAB_CRDS="$KRUISE_CRDS")
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
  SYSTEMD_LAB=$SDLAB bash tests/systemd-lab.sh clean > /dev/null 2>&1 || true
  for rt in "${E2E_RUNTIMES[@]}"; do lab "$rt" clean > /dev/null 2>&1 || true; done
  if [ "$rc" = 0 ] || [ -z "${KRUISED_KEEP_LOGS:-}" ]; then rm -rf "$RUN"; fi
  exit "$rc"
}
trap cleanup EXIT
t=$(now)
bash tests/cri-lab.sh install
phase "install packages" "$t"

# kubectl for the swap tests (tests/integration/swap.rs): Debian unstable's package, fetched by
# apt into the run's directory, nothing installed; KRUISED_DEBIAN_KUBECTL=0 leaves them skipped
if [ "${KRUISED_DEBIAN_KUBECTL:-1}" = 1 ]; then
  t=$(now)
  KRUISED_KUBECTL=$(bash tests/kubectl.sh "$RUN/kubectl") || die "tests/kubectl.sh could not fetch Debian's kubectl"
  export KRUISED_KUBECTL KRUISED_REQUIRE_KUBECTL=1
  layer "kubectl (swap tests)" "$(cat "$RUN/kubectl/kubectl.source")"
  phase "kubectl (Debian unstable)" "$t"
else
  skip "the swap tests with kubectl" "KRUISED_DEBIAN_KUBECTL=0"
  unset KRUISED_KUBECTL KRUISED_REQUIRE_KUBECTL
fi

# the binaries of containerd 2.x (provided, or Debian unstable's package), CRI-O and crictl
# (provided), put once where every lab finds them
export CRI_LAB_BIN=$RUN/bin
if [ ${#E2E_RUNTIMES[@]} -gt 1 ] || has_runtime_bin crictl; then
  t=$(now)
  CRI_LAB_RUNTIMES="${E2E_RUNTIMES[*]}" LAB=$RUN bash tests/cri-lab.sh unpack
  phase "containerd 2.x, CRI-O, crictl" "$t"
fi
if [ -x "$RUN/bin/crictl" ]; then export KRUISED_CRICTL=$RUN/bin/crictl; else unset KRUISED_CRICTL; fi
# what each runtime pass runs on, for the closing table
runtime_source() {
  case "$1" in
    containerd) echo "containerd $(dpkg-query -W -f '${Version}' containerd 2> /dev/null) (Debian's package)" ;;
    *) cat "$RUN/bin/$1.source" 2> /dev/null || echo "$1" ;;
  esac
}

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
  # the commit the shipped binary reports is the one it was built from (build.rs)
  target/dist/kruised version --client-only | grep -qx "Commit:  $(git rev-parse HEAD)\(-dirty\)\?" ||
    { echo "ERROR: the shipped binary does not report the commit it was built from"; exit 1; }
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
# a real systemd (Debian's, in a container of its own) for the systemd layer, with the
# containerd 1.6 lab's socket where kruised's detection looks (the directory exists before the
# socket does)
SDLAB=$RUN/systemd
mkdir -p "${E2E_LAB[containerd]}"
(
  if SYSTEMD_LAB=$SDLAB SYSTEMD_LAB_RUNTIME_DIR=${E2E_LAB[containerd]} bash tests/systemd-lab.sh start; then
    echo ok > "$RUN/systemd-lab.status"
  else
    echo FAILED > "$RUN/systemd-lab.status"
  fi
) > "$RUN/systemd-lab.log" 2>&1 &
kube_pid=""
if [ -n "$kube_lab" ]; then
  KLAB=$RUN/kube
  mkdir -p "$KLAB"
  case "$CLUSTER_RUNTIME" in
    containerd2 | crio) ;;
    *) log "KRUISED_CLUSTER_RUNTIME=$CLUSTER_RUNTIME: containerd2 or crio"; exit 2 ;;
  esac
  if [[ " ${E2E_RUNTIMES[*]} " == *" $CLUSTER_RUNTIME "* ]]; then
    KCRI=$RUN/kcri
    case "$CLUSTER_RUNTIME" in
      containerd2) KUBE_ENV+=(KLAB_CRI_SOCKET="$KCRI/containerd2/containerd.sock" KLAB_CNI_CONF_DIR="$KCRI/containerd2/cni") ;;
      crio) KUBE_ENV+=(KLAB_CRI_SOCKET="$KCRI/crio/crio.sock" KLAB_CNI_CONF_DIR="$KCRI/crio/cni") ;;
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
  use_shipped_binary || { touch "$RUN/e2e-$rt.ended"; return 1; }
  export KRUISED_LAB=${E2E_LAB[$rt]} KRUISED_LAB_RUNTIME=$rt
  export KRUISED_LAB_REGISTRY=${E2E_REG[$rt]} KRUISED_LAB_AUTH_REGISTRY=${E2E_AUTH[$rt]}
  # another lab's runtime, for the test of a node where two answer (tests/e2e/runtimes.rs): it
  # only reads that one, whose own tests run beside
  unset KRUISED_LAB_OTHER KRUISED_LAB_OTHER_RUNTIME
  local other
  for other in "${E2E_RUNTIMES[@]}"; do
    if [ "$other" != "$rt" ]; then
      export KRUISED_LAB_OTHER=${E2E_LAB[$other]} KRUISED_LAB_OTHER_RUNTIME=$other
      break
    fi
  done
  echo "layer: on $(runtime_source "$rt")$([ -n "${KRUISED_CRICTL:-}" ] && echo ", crictl compared live")"
  local ok=1
  "$(bin e2e)" --skip systemd:: "${TEST_ARGS[@]}" || ok=0
  # the fault tests stop and kill this lab's runtime: not before every other lab's e2e binary,
  # whose two-runtime test reads it, has ended (each part says so, whatever its result)
  touch "$RUN/e2e-$rt.ended"
  for other in "${E2E_RUNTIMES[@]}"; do
    while [ ! -f "$RUN/e2e-$other.ended" ]; do sleep 1; done
  done
  [ "$ok" = 1 ] && "$(bin e2e_faults)" "${TEST_ARGS[@]}" || return 1
  if [ "$rt" = containerd ]; then "$(bin prepull)"; fi
}
systemd_part() { # kruised installed and run by a real systemd, on the containerd 1.6 lab
  use_shipped_binary || return 1
  # the lab's job is no child of this part's shell: its status file says how it ended
  while [ ! -f "$RUN/systemd-lab.status" ]; do sleep 1; done
  if [ "$(cat "$RUN/systemd-lab.status")" != ok ]; then
    cat "$RUN/systemd-lab.log"
    echo "ERROR: the systemd lab did not start"
    return 1
  fi
  cat "$RUN/systemd-lab.log"
  echo "layer: $(SYSTEMD_LAB=$SDLAB bash tests/systemd-lab.sh run systemctl --version | sed -n 1p) (Debian bookworm's, in systemd-nspawn), containerd 1.6"
  export KRUISED_SYSTEMD_LAB=$SDLAB KRUISED_REQUIRE_SYSTEMD=1
  export KRUISED_LAB=${E2E_LAB[containerd]} KRUISED_LAB_RUNTIME=containerd
  export KRUISED_LAB_REGISTRY=${E2E_REG[containerd]} KRUISED_LAB_AUTH_REGISTRY=${E2E_AUTH[containerd]}
  "$(bin e2e)" systemd:: "${TEST_ARGS[@]}"
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
  echo "layer: Kubernetes from $assets, its kubelet on $(if [ -n "$KCRI" ]; then runtime_source "$CLUSTER_RUNTIME"; else echo "kube-lab's containerd 1.6"; fi)$([ -n "$kruise_manager" ] && echo ", the real kruise-manager")"
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

# kruise-manager out of the cluster, as its developers run it: its webhooks on
# loopback with certificates of its own, every feature gate the node daemon serves, and the
# pre-download of a CloneSet's new images before its in-place update (an ImagePullJob: only for
# more than 3 replicas in more than one batch, so never for the cluster tests' CloneSets of one;
# benches/unready_cluster.rs measures kruise-daemon with it, and reads the gates). Its objects
# first (the namespaces, the webhook configurations it rewrites to its address; created, never
# applied again) and stand-ins for the CRDs of the kinds no test uses (without them it waits
# about 16 s for each before its controllers start), then the manager; ready once its own
# webhook answers.
KRUISE_MANAGER_HEALTH=127.0.0.1:19001
start_kruise_manager() {
  local dir=$RUN/kruise kubectl=$KLAB/bin/kubectl
  local gates=ImagePullJobGate=true,PodProbeMarkerGate=true,InPlaceUpdateEnvFromMetadata=true,KruiseDaemon=true,PreDownloadImageForInPlaceUpdate=true
  mkdir -p "$dir/certs" "$dir/protection"
  {
    KUBECONFIG=$KLAB/kubeconfig "$kubectl" create -f "$KRUISE_MANIFESTS" &&
      KUBECONFIG=$KLAB/kubeconfig "$kubectl" create -f tests/fixtures/cluster/kruise-stand-in-crds.yaml &&
      KUBECONFIG=$KLAB/kubeconfig "$kubectl" wait --for=condition=Established crd --all --timeout=60s
  } > "$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2; log "ERROR: kruise-manager's objects could not be created"; exit 1; }
  WEBHOOK_HOST=127.0.0.1 WEBHOOK_PORT=19000 WEBHOOK_CERT_DIR=$dir/certs POD_NAMESPACE=kruise-system \
    "$kruise_manager" --kubeconfig="$KLAB/kubeconfig" --enable-leader-election=false \
    --metrics-addr=127.0.0.1:19002 --health-probe-addr=$KRUISE_MANAGER_HEALTH --enable-pprof=false \
    --protection-log-path="$dir/protection" --nodeimage-creation-delay=0s \
    --feature-gates="$gates" \
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
  export KRUISED_KRUISE_MANAGER_GATES=$gates
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
  if [ -n "$kruise_manager" ]; then
    t=$(now)
    start_kruise_manager
    phase "kruise-manager ready" "$t"
  fi
  run_part cluster cluster_part
fi
for rt in "${E2E_RUNTIMES[@]}"; do run_part "e2e-$rt" e2e_part "$rt"; done
run_part systemd systemd_part

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
demo_part() {
  echo "layer: scripts/demo.sh --api double, on containerd 1.6"
  KRUISED_DEMO_BINARIES="$ROOT/target/debug" bash scripts/demo.sh --api double
}
run_part demo demo_part
# the five-minute outage (tests/integration/silent_api.rs) waits more than it works: in a process
# of its own from the start, beside the rest, it no longer lengthens the layer by its 5 minutes
# (libtest takes tests in name order, and it came late: the layer took 486 s; now the rest
# take 267 s beside its 314). Only for a whole run: a run given test names runs them as asked.
OUTAGE_TEST=silent_api::changes_made_while_the_api_server_was_away_for_five_minutes_are_each_acted_on_once_after_it
integration_part() {
  echo "layer: the fake CRI runtime and the API-server double (and the manager double), the fuzz seeds"
  if [ "${#TEST_ARGS[@]}" -gt 0 ]; then
    "$(bin integration)" "${TEST_ARGS[@]}"
    return
  fi
  local ok=1 outage_pid
  "$(bin integration)" --exact "$OUTAGE_TEST" > "$RUN/integration-outage.log" 2>&1 &
  outage_pid=$!
  "$(bin integration)" --skip "$OUTAGE_TEST" || ok=0
  wait "$outage_pid" || ok=0
  echo "the outage test, in a process of its own:"
  cat "$RUN/integration-outage.log"
  # a renamed test must not drop out of the run unseen
  grep -q '^running 1 test$' "$RUN/integration-outage.log" ||
    { echo "ERROR: no integration test named $OUTAGE_TEST (renamed? say so here)"; ok=0; }
  [ "$ok" = 1 ]
}
run_part integration integration_part
# the fleet benchmark's smoke run: five simulated nodes against an API server of its own (a real
# one from tests/fleet-lab.sh on ports 18xxx where the Kubernetes binaries are provided, else
# the API-server double), kruise-daemon (where provided) then the shipped kruised on each
fleet_part() {
  # after the end-to-end layer, beside the cluster layer (the longest): not on the machine at
  # its busiest
  local rt
  for rt in "${E2E_RUNTIMES[@]}"; do
    while [ ! -f "$RUN/e2e-$rt.status" ]; do sleep 1; done
  done
  use_shipped_binary || return 1
  "$(bin fleet)"
}
run_part fleet fleet_part
t=$(now)
# unready_cluster: its line saying what it would run and why not (no cluster is named here)
cargo test --workspace --locked --lib --bins --test api --test cli --bench reaction \
  --bench podprobe --bench hostile --bench unready_cluster -- "${TEST_ARGS[@]}"
phase "unit tests" "$t"

failed=0
failed_parts=()
parts=()
for rt in "${E2E_RUNTIMES[@]}"; do parts+=("e2e-$rt"); done
if [ -n "$kube_lab" ]; then parts+=(cluster); fi
parts+=(systemd fleet demo integration)
for p in "${parts[@]}"; do
  wait "${PART_PID[$p]}" || true
  read -r status secs < "$RUN/$p.status"
  PHASES+=("$(printf '%-44s %7ss  %s' "  $p" "$secs" "$status")")
  what=$(sed -n '/^layer: /{s///p;q}' "$RUN/$p.log")
  layer "$p" "$([ "$status" = ok ] && echo ran || echo FAILED): ${what:-?}"
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
layer unit "ran: beside the code, and the benchmarks' smoke runs that need no lab"
{
  echo "[tests/run.sh] the layers: what ran, on what, and what was skipped and why:"
  for l in "${LAYERS[@]}"; do echo "  $l"; done
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
