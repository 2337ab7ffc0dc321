#!/usr/bin/env bash
# kubectl for the tests that render and apply the shipped manifests (tests/integration/swap.rs):
# Debian's own package of it (`kubectl`, source kubernetes, from unstable: 1.36.4+ds-1 when this
# was written; `kubernetes-client` is now a transitional package depending on it; it needs only
# glibc 2.34), fetched and checked by apt (the archive's signature, the package's hash) in a
# directory of its own, never installed on the system, as tests/cri-lab.sh fetches Debian's
# containerd 2.x.
#
#   tests/kubectl.sh DIR     puts DIR/kubectl (and DIR/kubectl.source: which version, from
#                            where); prints the binary's path. Nothing is fetched when
#                            DIR/kubectl is there already.
#
# Env: KRUISED_DEBIAN_MIRROR (default http://deb.debian.org/debian), as tests/cri-lab.sh.
# The tests find it through KRUISED_KUBECTL=DIR/kubectl; KRUISED_REQUIRE_KUBECTL=1 makes them
# fail, not skip, without it.
set -euo pipefail

DIR=${1:?usage: tests/kubectl.sh DIR}
DEBIAN_MIRROR=${KRUISED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '[kubectl.sh] %s\n' "$*" >&2; }

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
if [ -x "$DIR/kubectl" ]; then
  echo "$DIR/kubectl"
  exit 0
fi
t0=$(date +%s)
d=$DIR/.debian
rm -rf "$d"
mkdir -p "$d"/{lists/partial,cache/archives/partial,deb,root}
trap 'rm -rf "$d"' EXIT
echo "deb $DEBIAN_MIRROR sid main" > "$d/sources.list"
: > "$d/status"
o=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$d/lists" -o Dir::Cache="$d/cache" -o Dir::State::status="$d/status"
  -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get -qq "${o[@]}" update > "$d/apt.log" 2>&1 ||
  { cat "$d/apt.log" >&2; log "ERROR: apt could not read Debian unstable's index at $DEBIAN_MIRROR"; exit 1; }
ver=$(apt-cache "${o[@]}" show kubectl 2> /dev/null | sed -n 's/^Version: //p' | head -1)
[ -n "$ver" ] || { log "ERROR: Debian unstable has no kubectl package"; exit 1; }
(cd "$d/deb" && apt-get -qq "${o[@]}" download "kubectl=$ver") >> "$d/apt.log" 2>&1 ||
  { cat "$d/apt.log" >&2; log "ERROR: apt could not download kubectl $ver"; exit 1; }
dpkg-deb -x "$d/deb"/kubectl_*.deb "$d/root"
[ -f "$d/root/usr/bin/kubectl" ] || { log "ERROR: Debian's kubectl $ver has no usr/bin/kubectl"; exit 1; }
install -m 0755 "$d/root/usr/bin/kubectl" "$DIR/kubectl.new"
mv "$DIR/kubectl.new" "$DIR/kubectl"
echo "kubectl $ver (Debian unstable's package)" > "$DIR/kubectl.source"
log "kubectl $ver from Debian unstable in $(($(date +%s) - t0))s"
echo "$DIR/kubectl"
