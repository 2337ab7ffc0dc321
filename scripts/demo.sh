#!/usr/bin/env bash
# What kruised does, on this machine, in about a minute, with no cluster needed: a real
# containerd + runc + registry from Debian's packages, a control plane, kruised run, and this
# script playing kruise-manager:
#
#   1. a kruise-managed pod whose env APP_CONFIG reads the annotation app-config (=v1);
#   2. kruised reports what really runs (apps.kruise.io/runtime-containers-meta);
#   3. an in-place update: the pod is marked not ready (InPlaceUpdateReady=False) and
#      app-config changes to v2; kruised stops the stale container, the kubelet starts it
#      again, and the new container reads v2;
#   4. a NodeImage pre-pull and its status; 5. `kruised explain` of the pod.
#
#   scripts/demo.sh                  run it all, clean up, exit 0
#   scripts/demo.sh --keep           leave it running to explore (it prints how), Ctrl-C cleans up
#   scripts/demo.sh --api double     the control plane: the in-memory API-server double and
#                                    tests/kubelet-stand-in as the kubelet (needs nothing more;
#                                    the default when no Kubernetes binaries are found)
#   scripts/demo.sh --api cluster    a real one-node Kubernetes (kube-apiserver with RBAC, a real
#                                    kubelet, kruise's CRDs; the project's test cluster), kruised
#                                    as its least-privilege ServiceAccount (the default when the
#                                    binaries are provided: KRUISED_KUBE_ASSETS, a directory of
#                                    kube-apiserver, etcd, kubelet, kube-controller-manager,
#                                    kube-scheduler and kubectl; started with
#                                    ../shared/tools/kube-lab.sh, or KRUISED_KUBE_LAB_SCRIPT)
#
# Needs root (containerd, apt-get for Debian's containerd, runc, registry). Ports: 17000 and up
# (KRUISED_DEMO_PORT_BASE), admin 127.0.0.1:17221. Everything lives under one temp directory,
# removed at the end. KRUISED_DEMO_BINARIES=DIR runs kruised, apiserver-double and
# kubelet-stand-in from DIR instead of building them (CI: as the test build made them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
keep=0
mode=auto
usage() { echo "usage: scripts/demo.sh [--keep] [--api double|cluster]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --api) [ $# -ge 2 ] || usage; mode=$2; shift ;;
    --api=*) mode=${1#--api=} ;;
    *) usage ;;
  esac
  shift
done
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold="" plain=""; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
say() { printf '   %s\n' "$*"; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }
indent() { sed 's/^/     /'; }

assets=${KRUISED_KUBE_ASSETS:-}
kube_lab=${KRUISED_KUBE_LAB_SCRIPT:-$ROOT/../shared/tools/kube-lab.sh}
crds=${KRUISED_KRUISE_CRDS:-$ROOT/../shared/kube/kruise-crds}
have_assets() {
  local b
  [ -n "$assets" ] && [ -x "$kube_lab" ] && [ -d "$crds" ] || return 1
  for b in kube-apiserver etcd kubelet kube-controller-manager kube-scheduler kubectl; do
    [ -f "$assets/$b" ] || return 1
  done
}
case "$mode" in
  auto) if have_assets; then mode=cluster; else mode=double; fi ;;
  cluster) have_assets || fail "no Kubernetes binaries: set KRUISED_KUBE_ASSETS (a directory of kube-apiserver, etcd, kubelet, kube-controller-manager, kube-scheduler, kubectl; with kube-lab.sh at $kube_lab and kruise's CRDs at $crds), or use --api double" ;;
  double) ;;
  *) usage ;;
esac
base=${KRUISED_DEMO_PORT_BASE:-17000}
admin=127.0.0.1:$((base + 221))

DEMO=$(mktemp -d "${TMPDIR:-/tmp}/kruised-demo.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  # kruised first, then the stand-in kubelet (it removes its pods), then the control plane
  for p in "${pids[@]}"; do
    kill "$p" 2> /dev/null && wait "$p" 2> /dev/null || true
  done
  if [ "$mode" = cluster ]; then
    "$kube_lab" clean > "$DEMO/clean.log" 2>&1 || { tail -20 "$DEMO/clean.log" >&2; echo "demo: kube-lab clean failed" >&2; }
  else
    LAB=$DEMO/cri bash tests/cri-lab.sh clean > "$DEMO/clean.log" 2>&1 || { tail -20 "$DEMO/clean.log" >&2; echo "demo: cri-lab clean failed" >&2; }
  fi
  rm -rf "$DEMO"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A value from the JSON on stdin: jget key key ... (list indices as numbers); "" when absent,
# JSON for anything but a string.
jget() {
  python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1:]:
    v = (v[int(k)] if int(k) < len(v) else None) if isinstance(v, list) else v.get(k) if isinstance(v, dict) else None
    if v is None:
        break
print("" if v is None else v if isinstance(v, str) else json.dumps(v))' "$@"
}
# Waits until "$@" succeeds, at most $1 seconds (every 0.2 s), or fails the demo with $2.
wait_until() {
  local limit=$1 what=$2 deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what: not within ${limit}s"
    sleep 0.2
  done
}

bin=$ROOT/target/debug
if [ -n "${KRUISED_DEMO_BINARIES:-}" ]; then
  # CI: kruised, apiserver-double and kubelet-stand-in as the test build made them
  bin=$KRUISED_DEMO_BINARIES
  for b in kruised apiserver-double kubelet-stand-in; do
    [ -x "$bin/$b" ] || fail "KRUISED_DEMO_BINARIES=$bin has no $b"
  done
else
  step "building kruised"
  if ! command -v cargo > /dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    source "$HOME/.cargo/env"
  fi
  command -v cargo > /dev/null 2>&1 || fail "no cargo: install a Rust toolchain (https://rustup.rs), 1.89 or later"
  cargo build --locked --quiet --workspace --bins
fi
kruised=$bin/kruised

# Each control plane defines: node, image, cri (socket), api_get PATH, api_post PATH (body on
# stdin), patch_pod [status] merge|strategic BODY, kruised_kubeconfig, admin_kubeconfig,
# make_owner (prints the uid of the pod's CloneSet), and how to explore it (--keep).
start_cluster() {
  export KLAB=$DEMO/kube KLAB_PORT_BASE=$base KLAB_CRI_LAB=$ROOT/tests/cri-lab.sh \
    REG_AUTH_ADDR=127.0.0.1:$((base + 501)) KLAB_CRDS=$crds KLAB_BIN_DIR=$assets
  step "starting a one-node Kubernetes on loopback (real apiserver, kubelet, containerd)"
  "$kube_lab" start > "$DEMO/start.log" 2>&1 || { tail -20 "$DEMO/start.log" >&2; fail "the cluster did not start"; }
  eval "$("$kube_lab" env)"
  say "$(tail -1 "$DEMO/start.log" | sed 's/^[0-9:.]* \[kube-lab\] //')"
  node=$KLAB_NODE image=$KLAB_REG_ADDR/test/busybox cri=$KLAB_CRI_SOCKET admin_kubeconfig=$KUBECONFIG

  step "kruised's identity: deploy/rbac.yaml, nothing more"
  kubectl apply -f deploy/namespace.yaml -f deploy/rbac.yaml > /dev/null
  local token server ca
  token=$(kubectl -n kruise-system create token kruised --duration=2h)
  server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  kruised_kubeconfig=$DEMO/kruised.kubeconfig
  cat > "$kruised_kubeconfig" << EOF
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: kruised, user: {token: "$token"}}]
contexts: [{name: demo, context: {cluster: demo, user: kruised}}]
current-context: demo
EOF
  say "ServiceAccount kruise-system/kruised: $(kubectl get clusterrole kruised -o jsonpath='{range .rules[*]}{.resources}{.verbs} {end}')"
}
cluster_api_get() { kubectl get --raw "$1"; }
cluster_api_post() { kubectl create --raw "$1" -f - > /dev/null; }
cluster_patch_pod() {
  local sub=()
  if [ "$1" = status ]; then sub=(--subresource=status); shift; fi
  kubectl -n demo patch pod web-0 "${sub[@]}" --type="$1" -p "$2" > /dev/null
}
cluster_make_owner() {
  # the real garbage collector deletes a pod whose owner does not exist; kruise's own CloneSet
  # CRD where the cluster has it (the stand-in may not replace it), else the stand-in
  if ! kubectl get crd clonesets.apps.kruise.io > /dev/null 2>&1; then
    kubectl apply -f tests/fixtures/cluster/cloneset-crd.yaml > /dev/null
  fi
  kubectl wait --for=condition=Established crd/clonesets.apps.kruise.io --timeout=60s > /dev/null
  kubectl -n demo apply -f - > /dev/null <<< '{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "metadata": {"name": "web"},
    "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}'
  kubectl wait -n demo --for=create serviceaccount/default --timeout=60s > /dev/null
  kubectl -n demo get cloneset web -o jsonpath='{.metadata.uid}'
}
cluster_explore() {
  cat << EOF
   export KUBECONFIG=$KUBECONFIG PATH=$KLAB/bin:\$PATH
   kubectl -n demo get pod web-0 -o yaml
   # another in-place update: out of service first, then the new value
   kubectl -n demo patch pod web-0 --subresource=status -p '{"status":{"conditions":[{"type":"InPlaceUpdateReady","status":"False"}]}}'
   kubectl -n demo annotate pod web-0 --overwrite app-config=v3
EOF
}

start_double() {
  step "starting containerd + runc + a registry (Debian's packages) and the API-server double"
  export LAB=$DEMO/cri REG_ADDR=127.0.0.1:$((base + 500)) REG_AUTH_ADDR=127.0.0.1:$((base + 501))
  { bash tests/cri-lab.sh install && bash tests/cri-lab.sh start; } > "$DEMO/start.log" 2>&1 ||
    { tail -20 "$DEMO/start.log" >&2; fail "containerd and the registry did not start"; }
  node=demo-node image=$REG_ADDR/test/busybox cri=$LAB/containerd.sock
  admin_kubeconfig=$DEMO/kubeconfig kruised_kubeconfig=$DEMO/kubeconfig
  "$bin/apiserver-double" --listen 127.0.0.1:0 --kubeconfig "$DEMO/kubeconfig" \
    --ready-file "$DEMO/apiserver.ready" > "$DEMO/apiserver.log" 2>&1 &
  pids=("$!" "${pids[@]}")
  wait_until 30 "the API-server double starting" test -s "$DEMO/apiserver.ready"
  api=$(cat "$DEMO/apiserver.ready")
  "$bin/kubelet-stand-in" --kubeconfig "$DEMO/kubeconfig" --node-name "$node" \
    --runtime-endpoint "unix://$cri" --log-dir "$LAB/pods" > "$DEMO/kubelet.log" 2>&1 &
  pids=("$!" "${pids[@]}")
  say "containerd $(containerd --version | awk '{print $3}') at $cri, registry $REG_ADDR (test/busybox:v1, :v2)"
  say "API-server double at $api (in memory; kruise's CRDs, watches, patches, no RBAC)"
  say "tests/kubelet-stand-in as the kubelet of node $node: runs its pods through CRI with the"
  say "kubelet's labels, hash and env, restarts exited containers, reports the pod status"

  step "kruised's identity: none here (the double has no RBAC; --api cluster runs it as deploy/rbac.yaml's ServiceAccount)"
}
double_api_get() { curl -sSf "$api$1"; }
double_api_post() { curl -sSf -X POST -H 'Content-Type: application/json' --data-binary @- "$api$1" > /dev/null; }
double_patch_pod() {
  local path=/api/v1/namespaces/demo/pods/web-0
  if [ "$1" = status ]; then path=$path/status; shift; fi
  local type=merge-patch
  if [ "$1" = strategic ]; then type=strategic-merge-patch; fi
  curl -sSf -X PATCH -H "Content-Type: application/$type+json" -d "$2" \
    "$api$path" > /dev/null
}
double_make_owner() {
  # no garbage collector here: the owner reference alone makes the pod kruise-managed
  echo 6b1f1c52-5d0e-4f8e-9a51-0c8a1f0d0e01
}
double_explore() {
  cat << EOF
   curl -s $api/api/v1/namespaces/demo/pods/web-0 | python3 -m json.tool
   # another in-place update: out of service first, then the new value
   curl -s -X PATCH -H 'Content-Type: application/strategic-merge-patch+json' $api/api/v1/namespaces/demo/pods/web-0/status \\
     -d '{"status":{"conditions":[{"type":"InPlaceUpdateReady","status":"False"}]}}'
   curl -s -X PATCH -H 'Content-Type: application/merge-patch+json' $api/api/v1/namespaces/demo/pods/web-0 \\
     -d '{"metadata":{"annotations":{"app-config":"v3"}}}'
   the stand-in kubelet's log: $DEMO/kubelet.log
EOF
}

"start_$mode"
api_get() { "${mode}_api_get" "$@"; }
api_post() { "${mode}_api_post" "$@"; }
patch_pod() { "${mode}_patch_pod" "$@"; }
pod() { api_get /api/v1/namespaces/demo/pods/web-0; }
crictl() { "$kruised" crictl -r "unix://$cri" "$@"; }

step "kruised run (node $node, runtime unix://$cri, admin $admin)"
"$kruised" run --node-name "$node" --kubeconfig "$kruised_kubeconfig" \
  --runtime-endpoint "unix://$cri" --addr "$admin" > "$DEMO/kruised.log" 2>&1 &
pids=("$!" "${pids[@]}")
curl -sf --retry 60 --retry-connrefused --retry-delay 1 --retry-max-time 60 "http://$admin/readyz" > /dev/null ||
  { tail -20 "$DEMO/kruised.log" >&2; fail "kruised did not become ready"; }
say "ready: $(curl -s "http://$admin/readyz?verbose" | tr '\n' ' ')"

step "kruise-manager's part: a CloneSet's pod whose env reads an annotation"
api_post /api/v1/namespaces <<< '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo"}}'
owner=$("${mode}_make_owner")
api_post /api/v1/namespaces/demo/pods << EOF
{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "web-0", "annotations": {"app-config": "v1"},
              "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                   "name": "web", "uid": "$owner", "controller": true}]},
 "spec": {"nodeName": "$node", "hostNetwork": true, "terminationGracePeriodSeconds": 5,
          "readinessGates": [{"conditionType": "InPlaceUpdateReady"}],
          "containers": [{"name": "app", "image": "$image:v1",
                          "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                          "env": [{"name": "APP_CONFIG", "valueFrom": {"fieldRef":
                                   {"fieldPath": "metadata.annotations['app-config']"}}}]}]}}
EOF
set_update_ready() {
  patch_pod status strategic "{\"status\":{\"conditions\":[{\"type\":\"InPlaceUpdateReady\",\"status\":\"$1\",\"lastTransitionTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}]}}"
}
set_update_ready True
condition() { pod | python3 -c 'import json, sys; print(*[c["status"] for c in json.load(sys.stdin).get("status", {}).get("conditions", []) if c["type"] == sys.argv[1]])' "$1"; }
is_ready() { [ "$(condition Ready)" = True ]; }
wait_until 90 "the pod becoming Ready" is_ready
meta() { pod | jget metadata annotations apps.kruise.io/runtime-containers-meta; }
has_meta() { [ -n "$(meta)" ]; }
wait_until 60 "kruised's runtime-containers-meta" has_meta
container() { pod | jget status containerStatuses 0 containerID; }
before=$(container)
say "pod demo/web-0 running, container ${before#*://}"
# what the process in the container sees (busybox has no printenv)
# shellcheck disable=SC2016
in_container() { crictl exec "${1#*://}" sh -c 'echo "$APP_CONFIG"'; }
value=$(in_container "$before")
[ "$value" = v1 ] || fail "the container sees APP_CONFIG=$value, not v1"
say "inside the container (kruised crictl exec): APP_CONFIG=$value"
say "apps.kruise.io/runtime-containers-meta (written by kruised):"
meta | python3 -m json.tool | indent

step "an in-place update: InPlaceUpdateReady=False, then app-config: v1 -> v2"
set_update_ready False
patch_pod merge '{"metadata":{"annotations":{"app-config":"v2"}}}'
restarted() { [ "$(pod | jget status containerStatuses 0 restartCount)" = 1 ] && [ "$(pod | jget status containerStatuses 0 ready)" = true ]; }
wait_until 60 "the container restarted by the kubelet" restarted
after=$(container)
grep 'stopping container' "$DEMO/kruised.log" | sed 's/.*\(stopping container\)/   kruised: \1/' | head -3
# shellcheck disable=SC2016
say "event: $(api_get /api/v1/namespaces/demo/events | python3 -c 'import json, sys; print(*[e["message"] for e in json.load(sys.stdin)["items"] if e["involvedObject"]["name"] == "web-0" and e["reason"] == "Killing"][:1])')"
say "container ${before#*://} stopped; the kubelet started ${after#*://} (restartCount 1)"
value=$(in_container "$after")
[ "$value" = v2 ] || fail "the new container sees APP_CONFIG=$value, not v2"
say "inside the new container: APP_CONFIG=$value"
# kruised rewrites the annotation once the kubelet reports the new container
follows() { meta | grep -q "${after#*://}"; }
wait_until 30 "the annotation following the new container" follows
say "runtime-containers-meta after the restart:"
meta | python3 -m json.tool | indent
set_update_ready True

step "a NodeImage pre-pull: $image:v2 on $node"
api_post /apis/apps.kruise.io/v1beta1/nodeimages << EOF
{"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage", "metadata": {"name": "$node"},
 "spec": {"images": {"$image": {"tags": [{"tag": "v2", "version": 1, "createdAt": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}]}}}}
EOF
nodeimage() { api_get "/apis/apps.kruise.io/v1beta1/nodeimages/$node"; }
pulled() { [ "$(nodeimage | jget status succeeded)" = 1 ]; }
wait_until 90 "the NodeImage pre-pull succeeding" pulled
nodeimage | jget status | python3 -m json.tool | indent
crictl images | grep -E 'IMAGE|busybox' | sed 's/^/   /'

step "kruised explain demo/web-0"
RUST_LOG=warn "$kruised" explain demo/web-0 --kubeconfig "$admin_kubeconfig" -r "unix://$cri" | sed 's/^/   /'

if [ "$keep" = 1 ]; then
  step "left running (Ctrl-C cleans up)"
  cat << EOF
   $kruised crictl -r unix://$cri ps --kruise
   $kruised explain demo/web-0 --kubeconfig $admin_kubeconfig -r unix://$cri
   curl -s http://$admin/metrics | grep ^kruised_
   kruised's log: $DEMO/kruised.log
EOF
  "${mode}_explore"
  wait "${pids[0]}" || true
fi
step "done: cleaning up"
