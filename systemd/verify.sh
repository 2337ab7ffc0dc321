#!/usr/bin/env bash
# Checks the unit as CI does: installs it with install.sh into a scratch root that holds this
# machine's systemd units, runs `systemd-analyze verify` there (every option known to this
# systemd, the binary executable, dependencies resolvable: no output means clean), and prints
# `systemd-analyze security`'s exposure score (offline: no running systemd needed).
#
#   systemd/verify.sh [BINARY]     default: target/dist/kruised, else target/debug/kruised
#
# Works in a container without systemd as PID 1. Installs Debian's systemd package (the tools
# only; nothing starts) when systemd-analyze is missing; exits 0 with a message when it still
# cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[systemd/verify] %s\n' "$*" >&2; }
binary=${1:-}
if [ -z "$binary" ]; then
  for b in target/dist/kruised target/debug/kruised; do [ -x "$b" ] && { binary=$b; break; }; done
fi
[ -n "$binary" ] || { log "no kruised binary built yet"; exit 1; }
if ! command -v systemd-analyze > /dev/null 2>&1; then
  log "installing systemd (for systemd-analyze)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd; } > /dev/null 2>&1 || true
fi
if ! systemd-analyze --version > /dev/null 2>&1; then
  log "SKIPPED: systemd-analyze cannot run here"
  exit 0
fi
units=$(pkg-config --variable=systemdsystemunitdir systemd 2> /dev/null || echo /lib/systemd/system)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/lib/systemd"
cp -r "$units" "$root/usr/lib/systemd/system"
bash systemd/install.sh --root "$root" --binary "$binary" --kubeconfig /etc/kruised/kubeconfig --node-name ci > /dev/null 2>&1
out=$(systemd-analyze verify --root="$root" kruised.service 2>&1) || {
  printf '%s\n' "$out" >&2
  log "FAILED: systemd-analyze verify"
  exit 1
}
if [ -n "$out" ]; then
  printf '%s\n' "$out" >&2
  log "FAILED: systemd-analyze verify printed warnings"
  exit 1
fi
log "systemd-analyze verify: clean ($(systemd-analyze --version | head -1))"
systemd-analyze security --offline=yes --root="$root" kruised.service 2>&1 | tail -1 | sed 's/^/[systemd\/verify] /' >&2
