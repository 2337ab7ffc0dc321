#!/usr/bin/env bash
# Coverage-guided fuzzing of kruised's parsers and encoders with libFuzzer, on the stable
# toolchain: libfuzzer-sys (crates.io) brings libFuzzer's C++ sources and builds them with the
# machine's C++ compiler; rustc instruments the code with the same stable codegen options
# cargo-fuzz passes (SanitizerCoverage: inline 8-bit counters, PC table, compare tracing),
# added by fuzz/instrument.sh to kruised and the fuzz crate only.
# cargo-fuzz itself is not needed, and no sanitizer is used (AddressSanitizer needs nightly's
# -Zsanitizer; safe Rust needs it little: panics, overflows and debug assertions are the crashes).
#
#   fuzz/run.sh [SECONDS] [TARGET...]   build, then fuzz each target SECONDS (default 8) in turn,
#                                       starting from fuzz/seeds/TARGET plus the corpus kept in
#                                       fuzz/corpus/TARGET from earlier runs (not committed)
#   fuzz/run.sh build                   only build
#   fuzz/run.sh replay [TARGET...]      run the seeds and corpus once, no fuzzing
#
# Targets: keys reference keyring credprovider gojson endpoint http_response http_request
# (fuzz/src/lib.rs says what each checks). A crash leaves its input in fuzz/artifacts/TARGET/ and ends the script with status 1;
# replay it with: fuzz/target/<host>/debug/TARGET fuzz/artifacts/TARGET/crash-...
# Env: FUZZ_JOBS (parallel workers per target, default 1), FUZZ_MAX_LEN (default 4096),
#      FUZZ_ARGS (more libFuzzer flags, e.g. -dict=... or -seed=N).
set -euo pipefail
cd "$(dirname "$0")"
ALL=(keys reference keyring credprovider gojson endpoint http_response http_request)
log() { printf '[fuzz/run.sh] %s\n' "$*" >&2; }

mode=fuzz
secs=8
case "${1:-}" in
  build) mode=build; shift ;;
  replay) mode=replay; shift ;;
  '' ) ;;
  *[!0-9]*) ;;
  *) secs=$1; shift ;;
esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  source "$HOME/.cargo/env"
fi
if ! command -v c++ >/dev/null 2>&1; then
  log "no C++ compiler (libFuzzer is C++): apt-get install g++"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
fi

host=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=$PWD/target
# instrumentation for kruised and the fuzz crate only (see the wrapper)
export RUSTC_WRAPPER=$PWD/instrument.sh
t0=$(date +%s)
cargo build --locked --target "$host" --bins
log "built in $(( $(date +%s) - t0 ))s"
[ "$mode" = build ] && exit 0

bin=$CARGO_TARGET_DIR/$host/debug
failed=()
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { log "no such target: $t (${ALL[*]})"; exit 2; }
  mkdir -p "corpus/$t" "artifacts/$t"
  if [ "$mode" = replay ]; then
    if "$bin/$t" -runs=0 "corpus/$t" "seeds/$t" > "artifacts/$t/replay.log" 2>&1; then
      log "$t: $(grep -oE 'INITED .*' "artifacts/$t/replay.log" | tail -1)"
    else
      failed+=("$t"); tail -40 "artifacts/$t/replay.log" >&2
    fi
    continue
  fi
  log "fuzzing $t for ${secs}s"
  # new inputs go to corpus/$t (the first directory); seeds/$t is only read
  # shellcheck disable=SC2086
  if ! "$bin/$t" "corpus/$t" "seeds/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -max_len="${FUZZ_MAX_LEN:-4096}" -jobs="${FUZZ_JOBS:-1}" -workers="${FUZZ_JOBS:-1}" \
      -print_final_stats=1 -artifact_prefix="artifacts/$t/" ${FUZZ_ARGS:-} > "artifacts/$t/last.log" 2>&1; then
    failed+=("$t")
    tail -40 "artifacts/$t/last.log" >&2
  fi
  # one summary line: executions, speed, coverage, corpus
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "artifacts/$t/last.log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "artifacts/$t/last.log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' "artifacts/$t/last.log" | tail -1)
  log "$t: ${runs:-?} runs, ${speed:-?}/s, ${cov:-no coverage line}"
done
if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED: ${failed[*]} (inputs in fuzz/artifacts/)"
  exit 1
fi
log "no crash in ${targets[*]}"
