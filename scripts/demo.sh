#!/usr/bin/env bash
# What kruised does, on this machine, in about a minute, with no cluster needed: a real
# one-node Kubernetes (kube-apiserver with RBAC, a real kubelet on a real containerd, kruise's
# CRDs; the project's test cluster), kruised run as its least-privilege ServiceAccount, and
# this script playing kruise-manager:
#
#   1. a kruise-managed pod whose env APP_CONFIG reads the annotation app-config (=v1);
#   2. kruised reports what really runs (apps.kruise.io/runtime-containers-meta);
#   3. an in-place update: the pod is marked not ready (InPlaceUpdateReady=False) and
#      app-config changes to v2; kruised stops the stale container, the kubelet starts it
#      again, and the new container reads v2;
#   4. a NodeImage pre-pull and its status; 5. `kruised explain` of the pod.
#
#   scripts/demo.sh           run it all, clean up, exit 0
#   scripts/demo.sh --keep    leave it running to explore (it prints how), Ctrl-C to clean up
#
# Needs root (containerd, kubelet, apt-get for Debian's containerd, runc, registry) and the
# test cluster's Kubernetes binaries: KRUISED_KUBE_ASSETS (default ../shared/kube, with
# ../tools/kube-lab.sh beside it). Ports: 17000 and up (KRUISED_DEMO_PORT_BASE), admin
# 127.0.0.1:17221. Everything lives under one temp directory, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
keep=0
case "${1:-}" in
  --keep) keep=1 ;;
  "") ;;
  *) echo "usage: scripts/demo.sh [--keep]" >&2; exit 2 ;;
esac
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold="" plain=""; fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
say() { printf '   %s\n' "$*"; }
fail() { printf 'demo: %s\n' "$*" >&2; exit 1; }

assets=${KRUISED_KUBE_ASSETS:-}
if [ -z "$assets" ] && [ -d ../shared/kube ]; then assets=$(cd ../shared/kube && pwd); fi
{ [ -n "$assets" ] && [ -f "$assets/SHA256SUMS" ]; } ||
  fail "no Kubernetes binaries: set KRUISED_KUBE_ASSETS (the test cluster's, default ../shared/kube)"
kube_lab=$(cd "$assets/.." && pwd)/tools/kube-lab.sh
base=${KRUISED_DEMO_PORT_BASE:-17000}
admin=127.0.0.1:$((base + 221))

DEMO=$(mktemp -d "${TMPDIR:-/tmp}/kruised-demo.XXXXXX")
export KLAB=$DEMO/kube KLAB_PORT_BASE=$base KLAB_CRI_LAB=$ROOT/tests/cri-lab.sh \
  REG_AUTH_ADDR=127.0.0.1:$((base + 501)) KLAB_CRDS=$assets/kruise-crds
daemon=""
cleanup() {
  local rc=$?
  [ -z "$daemon" ] || { kill "$daemon" 2> /dev/null && wait "$daemon" 2> /dev/null; } || true
  "$kube_lab" clean > "$DEMO/clean.log" 2>&1 || { tail -20 "$DEMO/clean.log" >&2; echo "demo: kube-lab clean failed" >&2; }
  rm -rf "$DEMO"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "building kruised"
cargo build --locked --quiet --bin kruised
kruised=$ROOT/target/debug/kruised

step "starting a one-node Kubernetes on loopback (real apiserver, kubelet, containerd)"
"$kube_lab" start > "$DEMO/start.log" 2>&1 || { tail -20 "$DEMO/start.log" >&2; fail "the cluster did not start"; }
eval "$("$kube_lab" env)"
say "$(tail -1 "$DEMO/start.log" | sed 's/^[0-9:.]* \[kube-lab\] //')"
node=$KLAB_NODE
image=$KLAB_REG_ADDR/test/busybox

step "kruised's identity: deploy/rbac.yaml, nothing more"
kubectl apply -f deploy/namespace.yaml -f deploy/rbac.yaml > /dev/null
token=$(kubectl -n kruise-system create token kruised --duration=2h)
server=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
cat > "$DEMO/kruised.kubeconfig" << EOF
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: kruised, user: {token: "$token"}}]
contexts: [{name: demo, context: {cluster: demo, user: kruised}}]
current-context: demo
EOF
say "ServiceAccount kruise-system/kruised: $(kubectl get clusterrole kruised -o jsonpath='{range .rules[*]}{.resources}{.verbs} {end}')"

step "kruised run (node $node, runtime unix://$KLAB_CRI_SOCKET, admin $admin)"
"$kruised" run --node-name "$node" --kubeconfig "$DEMO/kruised.kubeconfig" \
  --runtime-endpoint "unix://$KLAB_CRI_SOCKET" --addr "$admin" > "$DEMO/kruised.log" 2>&1 &
daemon=$!
curl -sf --retry 60 --retry-connrefused --retry-delay 1 --retry-max-time 60 "http://$admin/readyz" > /dev/null ||
  { tail -20 "$DEMO/kruised.log" >&2; fail "kruised did not become ready"; }
say "ready: $(curl -s "http://$admin/readyz?verbose" | tr '\n' ' ')"

step "kruise-manager's part: a CloneSet's pod whose env reads an annotation"
kubectl apply -f tests/fixtures/cluster/cloneset-crd.yaml > /dev/null
kubectl wait --for=condition=Established crd/clonesets.apps.kruise.io --timeout=60s > /dev/null
kubectl create namespace demo > /dev/null
kubectl -n demo apply -f - > /dev/null << EOF
apiVersion: apps.kruise.io/v1alpha1
kind: CloneSet
metadata: {name: web}
spec: {replicas: 0}
EOF
owner=$(kubectl -n demo get cloneset web -o jsonpath='{.metadata.uid}')
kubectl wait -n demo --for=create serviceaccount/default --timeout=60s > /dev/null
kubectl -n demo apply -f - > /dev/null << EOF
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  annotations: {app-config: v1}
  ownerReferences:
    - {apiVersion: apps.kruise.io/v1alpha1, kind: CloneSet, name: web, uid: "$owner", controller: true}
spec:
  nodeName: $node
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  readinessGates: [{conditionType: InPlaceUpdateReady}]
  containers:
    - name: app
      image: $image:v1
      command: [sh, -c, "trap 'exit 0' TERM; sleep 3600 & wait"]
      env:
        - name: APP_CONFIG
          valueFrom: {fieldRef: {fieldPath: "metadata.annotations['app-config']"}}
EOF
set_update_ready() {
  kubectl -n demo patch pod web-0 --subresource=status --type=strategic -p \
    "{\"status\":{\"conditions\":[{\"type\":\"InPlaceUpdateReady\",\"status\":\"$1\",\"lastTransitionTime\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}]}}" > /dev/null
}
set_update_ready True
kubectl -n demo wait --for=condition=Ready pod/web-0 --timeout=90s > /dev/null
meta() { kubectl -n demo get pod web-0 -o jsonpath='{.metadata.annotations.apps\.kruise\.io/runtime-containers-meta}'; }
kubectl -n demo wait --for=jsonpath='{.metadata.annotations.apps\.kruise\.io/runtime-containers-meta}' pod/web-0 --timeout=60s > /dev/null
container() { kubectl -n demo get pod web-0 -o jsonpath='{.status.containerStatuses[0].containerID}'; }
before=$(container)
say "pod demo/web-0 running, container ${before#containerd://}"
# what the process in the container sees (busybox has no printenv)
# shellcheck disable=SC2016
in_container() { kubectl -n demo exec web-0 -c app -- sh -c 'echo "$APP_CONFIG"'; }
value=$(in_container)
[ "$value" = v1 ] || fail "the container sees APP_CONFIG=$value, not v1"
say "inside the container: APP_CONFIG=$value"
say "apps.kruise.io/runtime-containers-meta (written by kruised):"
meta | python3 -m json.tool | sed 's/^/     /'

step "an in-place update: InPlaceUpdateReady=False, then app-config: v1 -> v2"
set_update_ready False
kubectl -n demo annotate pod web-0 --overwrite app-config=v2 > /dev/null
kubectl -n demo wait --for=jsonpath='{.status.containerStatuses[0].restartCount}'=1 pod/web-0 --timeout=60s > /dev/null
kubectl -n demo wait --for=jsonpath='{.status.containerStatuses[0].ready}'=true pod/web-0 --timeout=60s > /dev/null
after=$(container)
grep 'stopping container' "$DEMO/kruised.log" | sed 's/.*\(stopping container\)/   kruised: \1/' | head -3
say "event: $(kubectl -n demo get events --field-selector involvedObject.name=web-0,reason=Killing -o jsonpath='{.items[0].message}')"
say "container ${before#containerd://} stopped; the kubelet started ${after#containerd://} (restartCount 1)"
value=$(in_container)
[ "$value" = v2 ] || fail "the new container sees APP_CONFIG=$value, not v2"
say "inside the new container: APP_CONFIG=$value"
# kruised rewrites the annotation once the kubelet reports the new container
deadline=$((SECONDS + 30))
until meta | grep -q "${after#containerd://}"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the annotation did not follow the new container"
  sleep 0.2
done
say "runtime-containers-meta after the restart:"
meta | python3 -m json.tool | sed 's/^/     /'
set_update_ready True

step "a NodeImage pre-pull: $image:v2 on $node"
kubectl apply -f - > /dev/null << EOF
apiVersion: apps.kruise.io/v1beta1
kind: NodeImage
metadata: {name: $node}
spec:
  images:
    "$image":
      tags: [{tag: v2, version: 1, createdAt: "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}]
EOF
kubectl wait --for=jsonpath='{.status.succeeded}'=1 nodeimage/"$node" --timeout=90s > /dev/null
kubectl get nodeimage "$node" -o jsonpath='{.status}' | python3 -m json.tool | sed 's/^/     /'
"$kruised" crictl -r "unix://$KLAB_CRI_SOCKET" images | grep -E 'IMAGE|busybox' | sed 's/^/   /'

step "kruised explain demo/web-0"
RUST_LOG=warn "$kruised" explain demo/web-0 --kubeconfig "$KUBECONFIG" -r "unix://$KLAB_CRI_SOCKET" | sed 's/^/   /'

if [ "$keep" = 1 ]; then
  step "left running (Ctrl-C cleans up)"
  cat << EOF
   export KUBECONFIG=$KUBECONFIG PATH=$KLAB/bin:\$PATH
   $kruised crictl -r unix://$KLAB_CRI_SOCKET ps --kruise
   $kruised explain demo/web-0 -r unix://$KLAB_CRI_SOCKET
   curl -s http://$admin/metrics | grep ^kruised_
   # another in-place update: out of service first, then the new value
   kubectl -n demo patch pod web-0 --subresource=status -p '{"status":{"conditions":[{"type":"InPlaceUpdateReady","status":"False"}]}}'
   kubectl -n demo annotate pod web-0 --overwrite app-config=v3
   kruised's log: $DEMO/kruised.log
EOF
  wait "$daemon" || true
fi
step "done: cleaning up"
