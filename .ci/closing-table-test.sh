#!/usr/bin/env bash
# The closing table keeps the run's exit status, whatever the machine's process accounting
# holds: a fresh machine's run sees hundreds of program names (apt, dpkg, mmdebstrap's chroot),
# and a `sort | head` in the EXIT trap once turned a passing run into exit 141 there while it
# passed on every machine that had run the suite before.
#
# It writes a process-accounting file of thousands of distinct program names (the kernel's
# acct_v3 records, as `accton` has the kernel write them), then ends a script under
# `set -euo pipefail` with `trap table EXIT`, once passing and once failing, and checks that
# the status is the script's own and that the table listed the largest programs.
#
#   .ci/closing-table-test.sh [NAMES]     NAMES distinct programs (5000)
#
# Needs: Debian's acct (sa) and perl.
set -euo pipefail
cd "$(dirname "$0")/.."
names=${1:-5000}
fail() { echo "closing-table-test: FAILED: $*" >&2; exit 1; }
command -v sa > /dev/null 2>&1 || fail "no sa (Debian's acct)"
work=$(mktemp -d "${TMPDIR:-/tmp}/kruised-closing-table.XXXXXX")
trap 'rm -rf "$work"' EXIT

# struct acct_v3 (linux/acct.h), 64 bytes: flag, version 3, tty, exitcode, uid, gid, pid, ppid,
# btime, etime (float), then utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t: 13-bit
# mantissa, 3-bit base-8 exponent; small values are the ticks themselves), comm[16]. Each program
# gets its own name and a CPU time that grows with its number.
perl -e '
  my $n = shift;
  binmode STDOUT;
  for my $i (1 .. $n) {
    my $ticks = $i % 8000;
    print pack("C C S L L L L L L f S S S S S S S S a16",
      0, 3, 0, 0, 0, 0, 1000 + $i, 1, 1700000000, 1.0,
      $ticks, 0, 0, 0, 0, 0, 0, 0, sprintf("prog%05d", $i));
  }' "$names" > "$work/pacct"
seen=$(sa -a -i "$work/pacct" 2> /dev/null | awk 'NR > 1' | wc -l)
[ "$seen" -ge "$names" ] || fail "sa read $seen programs from a file of $names"

# run_table STATUS: a script ends with STATUS under set -euo pipefail, the table in its EXIT
# trap; prints the status the shell exited with
run_table() {
  local status=$1 rc=0
  cp "$work/pacct" "$work/pacct.run"
  : > "$work/phases"
  WORK=$work STATUS=$status bash -c '
    set -euo pipefail
    now() { date +%s.%N; }
    since() { awk -v a="$1" -v b="$(now)" "BEGIN {printf \"%.1f\", b - a}"; }
    cpu_busy() { echo 0; }
    start=$(now); cpu_start=0
    PHASES=$WORK/phases
    source .ci/closing-table.sh
    PACCT=$WORK/pacct.run
    # accton off would stop the machine'"'"'s own accounting: not in a test
    accton() { :; }
    trap table EXIT
    exit "$STATUS"' 2> "$work/table.$status" || rc=$?
  echo "$rc"
}

for status in 0 1 3; do
  got=$(run_table "$status")
  [ "$got" = "$status" ] || { cat "$work/table.$status" >&2; fail "a run that ended with $status exited $got after its closing table"; }
  listed=$(grep -c '^  prog[0-9]*  *[0-9.]*s$' "$work/table.$status" || true)
  [ "$listed" = 12 ] || { cat "$work/table.$status" >&2; fail "the table listed $listed programs, not the 12 largest"; }
  # the largest first: sa counts in hundredths of a minute, so many programs tie; the listed
  # seconds never grow down the list, and the first is the most any program had
  awk '/^  prog/ {if (n++ && $2 + 0 > last + 0) bad = 1; last = $2} END {exit bad}' "$work/table.$status" ||
    { cat "$work/table.$status" >&2; fail "the table is not largest first"; }
  first=$(awk '/^  prog/ {print $2 + 0; exit}' "$work/table.$status")
  most=$(sa -a -i "$work/pacct" 2> /dev/null | awk 'NR > 1 && $3 * 60 > m {m = $3 * 60} END {print m + 0}')
  [ "$first" = "$most" ] || { cat "$work/table.$status" >&2; fail "the table's first program has ${first}s, the most any had is ${most}s"; }
done
echo "closing-table-test: the closing table kept statuses 0, 1 and 3 with $names programs in the accounting file"
