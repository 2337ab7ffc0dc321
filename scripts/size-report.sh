#!/usr/bin/env bash
# Where the shipped binary's bytes go (issue 44): builds kruised as `scripts/build-image.sh`
# does (the `dist` profile, fat LTO, static glibc or musl, the same flags) but keeps its
# symbols, then prints:
#
#   - the stripped size (`strip` of a copy: what ships, within a few KB of the `dist` profile's
#     own strip);
#   - the stripped copy's sections (`size -A`): code, read-only data, unwind tables;
#   - the size by crate, from the symbol table (`nm --size-sort -S -C`): each symbol goes to the
#     crate its demangled path starts with (`<A as B>::f` to A's); code of std, core and alloc
#     instantiated for another crate's type (`core::ptr::drop_in_place<k8s_openapi::..>`) goes
#     to that crate, and its column `std generic` says how much of it did; `serde` is the part
#     whose name mentions serde (derived (de)serialisers, visitors); symbols without a Rust path
#     (glibc, ring's C and assembly) by name;
#   - kruised's own bytes by module (two levels: `kruised::cmd::crictl`);
#   - the largest N functions.
#
#   scripts/size-report.sh                   build (about 12 CPU-minutes from scratch), then report
#   scripts/size-report.sh --top N           the N largest crates, modules and functions (30)
#   scripts/size-report.sh --binary PATH     report on PATH (an unstripped build) instead of building
#   scripts/size-report.sh --target-dir DIR  cargo's target directory for the build: by default
#                                            target/size-report (CARGO_TARGET_DIR if set), so the
#                                            unstripped build never replaces target/dist's
#   scripts/size-report.sh --bloat           also cargo-bloat's crate table of the same build, if
#                                            it is installed (`cargo install cargo-bloat`;
#                                            optional, not needed; not with --binary)
#   scripts/size-report.sh --parse [N]       read `nm -S --size-sort -C` lines on stdin and print
#                                            only the crate and function tables (the tests' entry)
#
# Needs: cargo, binutils (nm, strip, size), file, python3: all on a fresh Debian machine with
# Rust; nothing from crates.io. Long (a full fat-LTO build), so CI does not run it; the
# integration test `size_report` checks its parsing. The tables in docs/PERFORMANCE.md
# ("Binary size") come from it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[size-report] %s\n' "$*" >&2; }
# shellcheck source=scripts/lib/target.sh
. "$ROOT/scripts/lib/target.sh"

top=30 binary="" target_dir=${CARGO_TARGET_DIR:-$ROOT/target/size-report} bloat="" parse=""
while [ $# -gt 0 ]; do
  case "$1" in
    --top) top=${2:?--top needs a number}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --target-dir) target_dir=${2:?--target-dir needs a directory}; shift 2 ;;
    --bloat) bloat=1; shift ;;
    --parse) parse=1; shift; if [ $# -gt 0 ]; then top=$1; shift; fi ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) log "unknown argument: $1"; exit 2 ;;
  esac
done
case "$top" in '' | *[!0-9]*) log "--top wants a number, not '$top'"; exit 2 ;; esac

# The tables, from `nm -S --size-sort -C` lines (address, size, type, name) on stdin.
tables() {
  # the program as an argument: stdin is nm's output
  python3 -c "$(
    cat << 'EOF'
import re, sys

top = int(sys.argv[1])
STD = {"std", "core", "alloc", "proc_macro"}
# the start of a Rust path, after any `<`, `&`, `*const `, `dyn ` and the like before it
PATH = re.compile(r"[<&*(\[ ]*(?:(?:const|mut|dyn|unsafe|extern \"C\"|impl) )*([A-Za-z_][A-Za-z0-9_]*)::")
CRATE_IN = re.compile(r"(?<![A-Za-z0-9_:])([A-Za-z_][A-Za-z0-9_]*)::")
HASH = re.compile(r"::h[0-9a-f]{16}$")

def owner(name):
    """(crate, whether std's generic code went to the crate of its type)"""
    m = PATH.match(name)
    if not m:
        if name.startswith("ring_core_") or name.startswith("ring_"):
            return "ring (C, asm)", False
        if name.startswith("anon.") or name.startswith(".L"):
            return "[unnamed constants]", False
        return "[no Rust path: libc, asm]", False
    crate = m.group(1)
    args = name.find("<", m.end())
    if crate in STD and args >= 0:
        # the crates of its type arguments: `core::ptr::drop_in_place<k8s_openapi::..>`
        for other in CRATE_IN.findall(name[args:]):
            if other not in STD and other not in ("_", "impl"):
                return other, True
    return crate, False

OWN_MODULE = re.compile(r"kruised((?:::[a-z_][a-z0-9_]*){1,2})")
seen = set()
by_crate = {}
by_module = {}
functions = []
symbol_bytes = 0
bad = 0
for line in sys.stdin:
    parts = line.split(None, 3)
    if len(parts) < 4 or len(parts[2]) != 1:
        if line.strip():
            bad += 1
        continue
    addr, size, kind, name = parts
    try:
        size = int(size, 16)
    except ValueError:
        bad += 1
        continue
    # bss takes no bytes in the file; an alias at the same address counts once
    if kind in "bBuU" or size == 0 or (addr, kind.lower()) in seen:
        continue
    seen.add((addr, kind.lower()))
    name = HASH.sub("", name.strip())
    crate, generic = owner(name)
    c = by_crate.setdefault(crate, {"text": 0, "data": 0, "generic": 0, "serde": 0})
    is_text = kind in "tTwW"
    c["text" if is_text else "data"] += size
    if generic:
        c["generic"] += size
    if "serde" in name:
        c["serde"] += size
    symbol_bytes += size
    if is_text:
        functions.append((size, crate, name))
    if crate == "kruised":
        # its first two module levels: kruised::cmd::crictl, kruised::controller::recreate
        m = OWN_MODULE.search(name)
        module = "kruised" + (m.group(1) if m else "")
        by_module[module] = by_module.get(module, 0) + size
if bad:
    print(f"size-report: {bad} lines not in nm's `address size type name` form", file=sys.stderr)
if not by_crate:
    sys.exit("size-report: no sized symbols (a stripped binary? build with symbols kept)")

def mib(n):
    return f"{n / 1048576:.2f}"

print(f"## By crate ({top} largest; {symbol_bytes:,} bytes in symbols, {mib(symbol_bytes)} MiB)")
print()
print(f"{'bytes':>11} {'%':>5} {'code':>11} {'data':>10} {'std generic':>11} {'serde':>10}  crate")
rows = sorted(by_crate.items(), key=lambda kv: -(kv[1]["text"] + kv[1]["data"]))
for crate, c in rows[:top]:
    total = c["text"] + c["data"]
    print(f"{total:>11,} {100 * total / symbol_bytes:>5.1f} {c['text']:>11,} {c['data']:>10,} "
          f"{c['generic']:>11,} {c['serde']:>10,}  {crate}")
rest = rows[top:]
if rest:
    total = sum(c["text"] + c["data"] for _, c in rest)
    print(f"{total:>11,} {100 * total / symbol_bytes:>5.1f} {'':>11} {'':>10} {'':>11} {'':>10}  "
          f"({len(rest)} more crates)")
serde = sum(c["serde"] for c in by_crate.values())
print(f"{'':>11} {'':>5} {'':>11} {'':>10} {'':>11} {serde:>10,}  serde in all")
print()
print(f"## kruised's own, by module ({top} largest)")
print()
print(f"{'bytes':>11}  module")
modules = sorted(by_module.items(), key=lambda kv: -kv[1])
for module, size in modules[:top]:
    print(f"{size:>11,}  {module}")
print()
print(f"## The {top} largest functions")
print()
print(f"{'bytes':>9}  {'crate':<24} function")
functions.sort(key=lambda f: -f[0])
for size, crate, name in functions[:top]:
    if len(name) > 160:
        name = name[:157] + "..."
    print(f"{size:>9,}  {crate:<24} {name}")
EOF
  )" "$1"
}

if [ -n "$parse" ]; then
  tables "$top"
  exit 0
fi

for tool in nm strip size file python3; do
  command -v "$tool" > /dev/null 2>&1 || { log "needs $tool (Debian: binutils, file, python3)"; exit 1; }
done

revision=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ]; then
  revision=$revision-dirty
fi
given=$binary
if [ -n "$given" ] && [ -n "$bloat" ]; then
  log "--bloat runs cargo-bloat on the build this script makes: not with --binary"
  exit 2
fi
# the target, flags and linker of scripts/build-image.sh, its symbols kept
target=$(dist_target) || true
commit=$(git rev-parse HEAD 2> /dev/null || echo unknown)
# the same build's environment for cargo build and cargo bloat: one build, not two
dist_build_env "$ROOT" "$target" symbols
build_env=("${DIST_BUILD_ENV[@]}" KRUISED_COMMIT="$commit" CARGO_TARGET_DIR="$target_dir")
if [ -z "$binary" ]; then
  log "building the dist profile for $target with symbols kept, in $target_dir"
  t0=$(date +%s)
  env "${build_env[@]}" cargo build --locked --profile dist --target "$target" --bin kruised
  log "built in $(($(date +%s) - t0))s"
  binary=$target_dir/$target/dist/kruised
fi
[ -f "$binary" ] || { log "no binary at $binary"; exit 1; }
if [ -n "$given" ]; then
  # the commit it was built from, as it says (`kruised version`), not this checkout's
  revision=$(timeout 10 "$binary" version 2> /dev/null | sed -n 's/^Commit: *//p' | cut -c1-7 || true)
  revision="${revision:-unknown} (the given binary's)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
strip -o "$work/kruised" "$binary"
stripped=$(stat -c %s "$work/kruised")
kind=$(file -b "$binary")
echo "# kruised's size, source $revision, $(date -u +%Y-%m-%d)"
echo
echo "binary:   $binary, $(stat -c %s "$binary") bytes with symbols"
echo "          ${kind%%, BuildID*}"
echo "rustc:    $(rustc --version 2> /dev/null || echo unknown)"
printf 'stripped: %s bytes (%s MB, %s MiB): the shipped size\n' \
  "$(echo "$stripped" | sed ':a; s/\B[0-9]\{3\}\>/,&/; ta')" \
  "$(awk -v s="$stripped" 'BEGIN {printf "%.2f", s / 1e6}')" \
  "$(awk -v s="$stripped" 'BEGIN {printf "%.2f", s / 1048576}')"
echo
echo "## Sections of the stripped binary (size -A), 64 KiB or more"
echo
size -A "$work/kruised" | awk 'NR > 2 && $2 >= 65536 {printf "%11s  %s\n", $2, $1}' | sort -rn
echo
nm -S --size-sort -C "$binary" | tables "$top"

if [ -n "$bloat" ]; then
  echo
  if cargo bloat --version > /dev/null 2>&1; then
    echo "## cargo-bloat's view (crates; it gives generic code to the crate that instantiated it)"
    echo
    env "${build_env[@]}" cargo bloat --locked --profile dist --target "$target" \
      --bin kruised --crates -n "$top" || log "cargo bloat failed"
  else
    log "--bloat: cargo-bloat is not installed (cargo install cargo-bloat); the tables above do not need it"
  fi
fi
