#!/usr/bin/env bash
# Writes scripts/lib/hot-functions.txt: the functions the daemon runs, which the shipped build
# places together at the start of its code (scripts/lib/link-ordered.sh; issue 44, "The daemon's
# code placed together" in docs/PERFORMANCE.md).
#
# Builds kruised as scripts/build-image.sh does, its symbols kept (the same build settings, so
# the same function names and hashes; as scripts/size-report.sh, in target/size-report), then
# runs two benchmarks with the daemon under valgrind's callgrind and lists every function it
# ran in either: the fleet's node of 100 pods (the API server over TLS and HTTP/2 as a
# cluster's; start, list and watch, 30 s at rest, the in-place update of every pod: an env
# restart each) and `reaction`'s 110 pods of 3 containers (200 changes of the values their env
# reads). Run it again when the list has gone stale: after a new compiler
# or new dependencies, build-image.sh's line "ordered by the list of N functions: E by name and
# hash" shows E falling well below N.
#
#   scripts/hot-functions.sh                 build, run, write the list
#   scripts/hot-functions.sh --binary PATH   run PATH instead (an unstripped build of the tree)
#   scripts/hot-functions.sh --out FILE      write FILE instead of scripts/lib/hot-functions.txt
#
# Needs: cargo, valgrind (installed with apt-get when missing), binutils (nm). About 15 minutes:
# the build, the benchmarks' harnesses, and the daemon's runs under callgrind (50 times slower).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[hot-functions] %s\n' "$*" >&2; }
# shellcheck source=scripts/lib/target.sh
. "$ROOT/scripts/lib/target.sh"

binary="" out=$ROOT/scripts/lib/hot-functions.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) log "unknown argument: $1"; exit 2 ;;
  esac
done

if ! command -v valgrind > /dev/null; then
  log "installing valgrind"
  apt-get update -qq > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind > /dev/null
fi

if [ -z "$binary" ]; then
  target=$(dist_target) || true
  target_dir=${CARGO_TARGET_DIR:-$ROOT/target/size-report}
  log "building the dist profile for $target with symbols kept, in $target_dir"
  dist_build_env "$ROOT" "$target" symbols
  env "${DIST_BUILD_ENV[@]}" CARGO_TARGET_DIR="$target_dir" \
    cargo build --locked --profile dist --target "$target" --bin kruised
  binary=$target_dir/$target/dist/kruised
fi
[ -f "$binary" ] || { log "no binary at $binary"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# one wrapper per benchmark, so that each run's functions are known apart
for run in fleet reaction; do
  cat > "$work/kruised-$run" << EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$work/$run.%p --dump-instr=no \\
  --compress-strings=no --compress-pos=no --demangle=no "$binary" "\$@"
EOF
  chmod +x "$work/kruised-$run"
done
log "running the fleet benchmark's node of 100 pods with $binary under callgrind"
KRUISED_TEST_BIN=$work/kruised-fleet KRUISED_FLEET_NODES=1 KRUISED_FLEET_PODS=100 \
  KRUISED_FLEET_REST_SECS=30 cargo bench --locked --bench fleet > "$work/fleet.log" 2>&1 ||
  { tail -20 "$work/fleet.log" >&2; log "the fleet benchmark failed"; exit 1; }
log "running the reaction benchmark (110 pods, 200 changes) with $binary under callgrind"
KRUISED_TEST_BIN=$work/kruised-reaction cargo bench --locked --bench reaction > "$work/reaction.log" 2>&1 ||
  { tail -20 "$work/reaction.log" >&2; log "the reaction benchmark failed"; exit 1; }

# the functions each run ran (callgrind's fn= and cfn= lines) of the binary's code
function_names "$binary" | LC_ALL=C sort -u > "$work/code"
for run in fleet reaction; do
  ls "$work/$run".* > /dev/null 2>&1 || { log "callgrind wrote nothing for $run"; exit 1; }
  cat "$work/$run".* | sed -n -E 's/^c?fn=(\(?[0-9]*\)? ?)?//p' | LC_ALL=C sort -u |
    LC_ALL=C comm -12 - "$work/code" > "$work/$run.ran"
done
# as the linker wrapper reads them (target.sh's `symbol_keys`): HASH KEY, sorted by KEY within
# each group
listed() {
  symbol_keys | awk -F '\t' '{ print $1 " " $2 }' | LC_ALL=C sort -u -k2 -k1
}
{
  echo "# The functions kruised ran on the fleet benchmark's node of 100 pods (start, 30 s at rest,"
  echo "# an in-place update of every pod) and the reaction benchmark's 110 pods (200 changes),"
  echo "# placed together in this order by scripts/lib/link-ordered.sh: those both ran, then the"
  echo "# fleet's own (a node's daemon on a cluster: TLS, HTTP/2), then the reaction's own."
  echo "# Written by scripts/hot-functions.sh from the source $(git rev-parse --short HEAD 2> /dev/null || echo unknown), $(rustc --version | cut -d' ' -f1-2)."
  echo "# A line: the hash (- for C) and the mangled name without its hash, cut at 160 bytes."
  LC_ALL=C comm -12 "$work/fleet.ran" "$work/reaction.ran" | listed
  LC_ALL=C comm -23 "$work/fleet.ran" "$work/reaction.ran" | listed
  LC_ALL=C comm -13 "$work/fleet.ran" "$work/reaction.ran" | listed
} > "$out.tmp"
mv "$out.tmp" "$out"
log "wrote $out: $(grep -vc '^#' "$out") functions"
