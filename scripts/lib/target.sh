# shellcheck shell=bash
# The target and flags of kruised's shipped build, shared by scripts/build-image.sh and
# scripts/size-report.sh (which builds it again, its symbols kept). Sourced; defines functions
# only.

# dist_target: the target of the shipped build. KRUISED_TARGET when set; else
# x86_64-unknown-linux-musl when its standard library is installed
# (`rustup target add x86_64-unknown-linux-musl`); else x86_64-unknown-linux-gnu, a fully static
# glibc build, and the status 1 (musl is not installed) for the caller to say so if it wants.
dist_target() {
  if [ -n "${KRUISED_TARGET:-}" ]; then
    echo "$KRUISED_TARGET"
  elif rustup target list --installed 2> /dev/null | grep -qx x86_64-unknown-linux-musl; then
    echo x86_64-unknown-linux-musl
  else
    echo x86_64-unknown-linux-gnu
    return 1
  fi
}

# dist_rustflags ROOT TARGET: the RUSTFLAGS of the shipped build of the tree at ROOT for TARGET:
# static, and no local paths in the binary (panic locations), so the same source builds the same
# bytes anywhere. For glibc, relative relocations packed (DT_RELR: glibc 2.36's static-pie start
# applies them, and the linker is rustc's LLD): a static-pie binary has one 24-byte entry for
# every pointer the loader fixes, 23,000 of them (0.56 MB, read at every start), packed into a
# bitmap of 7 KB (issue 44). Only with the static glibc 2.36 or newer: an older one's start would
# not apply them.
dist_rustflags() {
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  local flags="-C target-feature=+crt-static --remap-path-prefix=$1=/kruised --remap-path-prefix=$cargo_home=/cargo"
  case "${2:-}" in
    *-linux-gnu) glibc_has_relr && flags="$flags -C link-arg=-Wl,-z,pack-relative-relocs" ;;
  esac
  echo "$flags"
}

# glibc_has_relr: the build machine's glibc (the one linked in) is 2.36 or newer.
glibc_has_relr() {
  local version
  version=$(getconf GNU_LIBC_VERSION 2> /dev/null) || return 1
  version=${version#glibc }
  [ "${version%%.*}" -gt 2 ] 2> /dev/null && return 0
  [ "${version%%.*}" = 2 ] && [ "$(echo "$version" | cut -d. -f2)" -ge 36 ] 2> /dev/null
}

# dist_build_env ROOT TARGET [symbols]: the environment of the shipped build of the tree at ROOT
# for TARGET, in the array DIST_BUILD_ENV: its RUSTFLAGS (dist_rustflags) and, for glibc (where
# rustc links with LLD), scripts/lib/link-ordered.sh as the linker, which places the functions
# the daemon runs together (issue 44). With `symbols`, the symbols are kept: by `-C strip=none`
# in RUSTFLAGS, not CARGO_PROFILE_DIST_STRIP, which would change the profile and with it every
# function's hash (cargo's -C metadata; RUSTFLAGS and the linker do not), so that the names read
# off this build (scripts/size-report.sh, scripts/hot-functions.sh) are the shipped build's.
dist_build_env() {
  local flags
  flags=$(dist_rustflags "$1" "$2")
  [ "${3:-}" = symbols ] && flags="$flags -C strip=none"
  DIST_BUILD_ENV=("RUSTFLAGS=$flags")
  case "$2" in
    *-linux-gnu) DIST_BUILD_ENV+=("CARGO_TARGET_$(echo "$2" | tr 'a-z-' 'A-Z_')_LINKER=$1/scripts/lib/link-ordered.sh") ;;
  esac
}

# function_names FILE...: the functions FILE (objects or a binary) defines, by symbol name.
function_names() {
  nm --defined-only "$@" 2> /dev/null | awk '$2 ~ /^[tTwW]$/ { print $3 }'
}

# symbol_keys: each function name on stdin as `HASH<tab>KEY<tab>NAME`, as
# scripts/lib/hot-functions.txt lists functions (HASH KEY) and scripts/lib/link-ordered.sh
# matches them: KEY is a Rust mangled name without its hash (`17h<16 hex>E` -> `E`) cut at 160
# bytes, HASH its 16 hex digits; a name without a hash (C) is its own KEY, with the HASH `-`.
symbol_keys() {
  sed -E 's/^(.*)17h([0-9a-f]{16})E$/\2\t\1E\t&/; t; s/.*/-\t&\t&/' |
    awk -F '\t' -v OFS='\t' '{ $2 = substr($2, 1, 160); print }'
}
