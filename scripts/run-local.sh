#!/usr/bin/env bash
# Runs kruised's main job on this machine with no cluster around: a real containerd + runc +
# registry (tests/cri-lab.sh, Debian packages), the in-memory API server standing in for the
# control plane, and `kruised run` against both, until Ctrl-C; then stops everything it started.
#
#   scripts/run-local.sh            build (release), start, run in the foreground
#
# While it runs (another shell):
#   curl -s localhost:10221/readyz?verbose      what kruised waits for
#   curl -s localhost:10221/metrics              Prometheus metrics
#   KUBECONFIG=$LAB/kubeconfig kruised explain default/<pod> -r unix://$LAB/containerd.sock
# The API server's control endpoints (create objects etc.) are under http://<its url>/_double/.
#
# Needs root (containerd, apt-get). On a real node, run `kruised run` with NODE_NAME and a
# kubeconfig instead (see README.md).
set -euo pipefail
cd "$(dirname "$0")/.."

export LAB
LAB=${LAB:-$(mktemp -d "${TMPDIR:-/tmp}/kruised-local.XXXXXX")}
cargo build --release --workspace --bins
bash tests/cri-lab.sh install
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  bash tests/cri-lab.sh clean || true
}
trap cleanup EXIT
bash tests/cri-lab.sh start

target/release/apiserver-double --listen 127.0.0.1:0 --kubeconfig "$LAB/kubeconfig" \
  --ready-file "$LAB/apiserver.ready" &
pids+=($!)
for _ in $(seq 1 100); do [ -f "$LAB/apiserver.ready" ] && break; sleep 0.1; done
[ -f "$LAB/apiserver.ready" ] || { echo "the API server double did not start" >&2; exit 1; }

echo "kruised: node local-node, runtime unix://$LAB/containerd.sock, kubeconfig $LAB/kubeconfig" >&2
target/release/kruised run --node-name local-node --kubeconfig "$LAB/kubeconfig" \
  --runtime-endpoint "unix://$LAB/containerd.sock" --addr 127.0.0.1:10221 &
pids+=($!)
wait "${pids[1]}"
