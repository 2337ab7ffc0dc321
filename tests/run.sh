#!/usr/bin/env bash
# The whole test suite: unit tests, integration tests against the in-process doubles, and the
# end-to-end tests against a real containerd + runc + registry, which this script installs
# (Debian packages), starts in a fresh directory, and stops again, whatever happens.
#
#   tests/run.sh                 everything
#   tests/run.sh -- NAME         only tests whose name contains NAME (cargo test filter)
#
# Needs root (containerd, runc, apt-get). Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

export LAB
LAB=$(mktemp -d "${TMPDIR:-/tmp}/kruised-lab.XXXXXX")
bash tests/cri-lab.sh install
cleanup() { bash tests/cri-lab.sh clean || true; rm -rf "$LAB"; }
trap cleanup EXIT
bash tests/cri-lab.sh start

export KRUISED_LAB=$LAB KRUISED_REQUIRE_LAB=1
cargo test --workspace --all-targets --locked "$@"
