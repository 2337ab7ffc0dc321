#!/bin/sh
# RUSTC_WRAPPER of fuzz/run.sh: SanitizerCoverage instrumentation (the stable codegen options
# cargo-fuzz passes) for kruised and the fuzz crate only. The dependencies are built plain: the
# fuzzer needs no coverage of serde or tokio, and instrumenting ~300 crates is most of a fuzz
# build's time on two cores.
rustc=$1
shift
case " $* " in
  *" --crate-name kruised "* | *" --crate-name kruised_fuzz "*)
    exec "$rustc" "$@" --cfg fuzzing -Cpasses=sancov-module \
      -Cllvm-args=-sanitizer-coverage-level=4 \
      -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
      -Cllvm-args=-sanitizer-coverage-pc-table \
      -Cllvm-args=-sanitizer-coverage-trace-compares ;;
  *) exec "$rustc" "$@" ;;
esac
