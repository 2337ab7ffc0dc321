#!/usr/bin/env bash
# The size of the test doubles against the product's, as issue 40 measures it.
#   doubles: every line of the .rs files under tests/apiserver/src, tests/support,
#            tests/kubelet-stand-in and src/cri/fake
#   product: the .rs files of src/ up to their first `#[cfg(test)]` line (at the start of a line:
#            an indented one marks a test-only item, not the tests module), src/cri/fake and
#            files named *tests.rs left out
# Prints each folder's lines, the product's, and the ratio (the goal: at most 0.5).
#   tools/test-tree-size.sh [--check] [REPO]   REPO defaults to the checkout this script is in;
#                                              --check exits 1 when the ratio is over 0.5 (CI)
set -euo pipefail
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
cd "${1:-$(dirname "$0")/..}"

rs_files() { find "$@" -name '*.rs' -type f -print0 | sort -z; }

doubles=0
for dir in tests/apiserver/src tests/support tests/kubelet-stand-in src/cri/fake; do
    n=$(rs_files "$dir" | xargs -0 cat | wc -l)
    printf '%-24s %7d\n' "$dir" "$n"
    doubles=$((doubles + n))
done
printf '%-24s %7d\n' doubles "$doubles"

product=$(find src -name '*.rs' -type f ! -path 'src/cri/fake/*' ! -name '*tests.rs' -print0 |
    xargs -0 awk 'FNR == 1 { cut = 0 } /^#\[cfg\(test\)\]/ { cut = 1 } !cut { n++ }
        END { print n + 0 }' | awk '{ n += $1 } END { print n + 0 }')  # xargs may split the list
printf '%-24s %7d\n' product "$product"
awk -v d="$doubles" -v p="$product" 'BEGIN { over = d - p / 2; if (over < 0) over = 0
    printf "%-24s %7.3f (goal <= 0.500: %d lines over)\n", "ratio", d / p, over }'
if [ "$check" = 1 ] && [ $((doubles * 2)) -gt "$product" ]; then
    echo "test-tree-size: the doubles are more than half the product's size (issue 40's budget)" >&2
    exit 1
fi
