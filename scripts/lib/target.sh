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

# dist_rustflags ROOT: the RUSTFLAGS of the shipped build of the tree at ROOT: static, and no
# local paths in the binary (panic locations), so the same source builds the same bytes anywhere.
dist_rustflags() {
  local cargo_home=${CARGO_HOME:-$HOME/.cargo}
  echo "-C target-feature=+crt-static --remap-path-prefix=$1=/kruised --remap-path-prefix=$cargo_home=/cargo"
}
