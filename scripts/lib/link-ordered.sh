#!/usr/bin/env bash
# The linker of kruised's shipped build (scripts/lib/target.sh, `dist_build_env`): the C compiler
# driver rustc runs anyway, with the functions a running daemon executes placed together at the
# start of `.text` (LLD's --symbol-ordering-file). Their list, scripts/lib/hot-functions.txt, is
# written by scripts/hot-functions.sh from a run of the daemon under callgrind.
#
# Why (issue 44): the kernel maps a file page that is already in the page cache together with
# its neighbours, 64 KiB around each page touched ("fault-around"), and a freshly started binary
# is all in the cache. The code a daemon runs, scattered over 7 MB of text among code it never
# runs (crictl, `kruised hash`, error paths), makes most of the text resident; packed together,
# about only what it runs is (docs/PERFORMANCE.md, "The daemon's code placed together").
#
# A line of the list is `HASH KEY` (target.sh's `symbol_keys`): a Rust function's mangled name
# without its hash (`17h<16 hex>E` -> `E`), cut at 160 bytes, and the hash; `-` and the name for
# C (glibc, ring).
# A function of this link whose name and hash are listed is ordered; where a listed name has no
# function with its hash (the hashes change with the compiler and the build's settings), every
# function of that name is, so a stale list orders more than it should and never fails the link.
# Anything else (build scripts, proc macros, a linker other than LLD, no list, no nm) links as
# rustc would have linked it. Writes what it matched to `<output>.hot-functions`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib/target.sh
. "$here/target.sh"
list=${KRUISED_HOT_FUNCTIONS:-$here/hot-functions.txt}
cc=${KRUISED_LINK_CC:-cc}

out="" prev="" lld="" objects=()
for arg in "$@"; do
  [ "$prev" = -o ] && out=$arg
  case "$arg" in
    *.rcgu.o) objects+=("$arg") ;;
    -fuse-ld=lld) lld=1 ;;
  esac
  prev=$arg
done
case "$(basename -- "$out")" in
  kruised-*) ;;
  *) exec "$cc" "$@" ;;
esac
if [ -z "$lld" ] || [ ! -s "$list" ] || [ ${#objects[@]} -eq 0 ] || ! command -v nm > /dev/null; then
  exec "$cc" "$@"
fi

order=$(mktemp)
trap 'rm -f "$order"' EXIT
# each defined function as `HASH<tab>KEY<tab>NAME`, read against the list
function_names "${objects[@]}" |
  symbol_keys |
  awk -F '\t' -v list="$list" '
    BEGIN {
      while ((getline line < list) > 0) {
        if (line == "" || line ~ /^#/) continue
        sp = index(line, " ")
        hash = substr(line, 1, sp - 1); name = substr(line, sp + 1)
        n++; names[n] = name; hashes[n] = hash; listed[name] = 1
      }
    }
    {
      if (!($2 in listed)) next
      exact[$2 SUBSEP $1] = exact[$2 SUBSEP $1] $3 "\n"
      any[$2] = any[$2] $3 "\n"
    }
    END {
      for (i = 1; i <= n; i++) {
        name = names[i]; pair = name SUBSEP hashes[i]
        if (pair in exact) { printf "%s", exact[pair]; hit[name] = 1; exacts++ }
      }
      for (i = 1; i <= n; i++) {
        name = names[i]
        if (name in hit || name in done) continue
        done[name] = 1
        if (name in any) { printf "%s", any[name]; loose++ }
        else if (hashes[i] == "-") print name   # C: in an archive, not in the objects read
      }
      printf "ordered by the list of %d functions: %d by name and hash, %d more names without their hash\n", n, exacts, loose > "/dev/stderr"
    }' > "$order" 2> "$out.hot-functions"
"$cc" "$@" "-Wl,--symbol-ordering-file=$order" -Wl,--no-warn-symbol-ordering
