# shellcheck shell=bash
# The closing table of .ci/run, sourced by it (and by .ci/closing-table-test.sh): what took how
# long, and what the CPU went to by program. `trap table EXIT` prints it when the run ends.
#
# It reports; it never decides the run's status. It runs inside the EXIT trap of a script under
# `set -euo pipefail`, where any failing command would replace the tests' verdict with its own
# (a fresh machine's process accounting sees hundreds of program names: `sort | head` then
# died of SIGPIPE and turned a passing run into exit 141). So the trap turns errexit and
# pipefail off, reads nothing through a pipe that closes early, and exits with the status the
# run had when it began.
#
# Needs: PHASES (a file of "name seconds" lines), start and cpu_start (from now and cpu_busy,
# defined by the caller), and PACCT (a process-accounting file, or empty).
# shellcheck disable=SC2154 # start, cpu_start and PHASES are the caller's

table() {
  local rc=$?
  set +e +o pipefail
  {
    echo
    echo "ci: what took how long (wall clock, $(nproc) cores; the parts of tests/run.sh overlap):"
    cat "$PHASES"
    printf '  %-44s %7ss  %s (%s CPU-minutes busy on the machine)\n' ".ci/run" "$(since "$start")" \
      "$([ "$rc" = 0 ] && echo passed || echo FAILED)" "$(awk -v a="$cpu_start" -v b="$(cpu_busy)" 'BEGIN {printf "%.1f", (b - a) / 60}')"
    cpu_by_program
  } >&2
  rm -f "$PHASES"
  exit "$rc"
}

# what the CPU went to, by program, from the kernel's process accounting (Debian's acct): every
# process that ended during the run, the labs' daemons included
PACCT=""
start_accounting() {
  PACCT=$(mktemp "${TMPDIR:-/tmp}/kruised-ci-pacct.XXXXXX")
  if ! accton "$PACCT" > /dev/null 2>&1; then
    echo "ci: no process accounting on this machine; the CPU by program is not counted" >&2
    rm -f "$PACCT"
    PACCT=""
  fi
}
# CPU_BY_PROGRAM_TOP: how many programs the table lists
CPU_BY_PROGRAM_TOP=${CPU_BY_PROGRAM_TOP:-12}
cpu_by_program() {
  [ -n "$PACCT" ] || return 0
  accton off > /dev/null 2>&1 || true
  echo "ci: CPU by program (process accounting; seconds, the $CPU_BY_PROGRAM_TOP largest):"
  # sa's third column is CPU minutes; rustc's ctrl-c thread often ends last and names the
  # process (rustc and clippy-driver alike). The last awk reads all of sort's output (head would
  # close the pipe after the first lines and kill sort with SIGPIPE)
  sa -a -i "$PACCT" 2> /dev/null | awk 'NR > 1 && NF >= 6 {
      n = $6; if (n == "ctrl-c" || n == "clippy-driver") n = "rustc"
      cpu[n] += $3 * 60 }
    END {for (n in cpu) printf "  %-44s %7.1fs\n", n, cpu[n]}' | sort -k2 -rn |
    awk -v top="$CPU_BY_PROGRAM_TOP" 'NR <= top'
  rm -f "$PACCT"
}
