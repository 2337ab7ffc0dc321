#!/usr/bin/env bash
# Builds kruised's release binary and its OCI image, offline and without a container engine.
#
#   scripts/build-image.sh                  binary target/dist/kruised, image target/dist/oci
#   scripts/build-image.sh --push REF       then copies the image to REF with skopeo
#                                           (docker://HOST:PORT/kruised:TAG; plain http for
#                                           127.0.0.1/localhost registries)
#   scripts/build-image.sh --binary PATH    packages PATH instead of building (it must be static)
#   scripts/build-image.sh --out DIR        writes binary, image and digest to DIR instead of
#                                           target/dist (the tests read the image's config there)
#
# The binary: `cargo build --profile dist` (fat LTO, one codegen unit, symbols stripped), static.
# For the x86_64-unknown-linux-musl target when its standard library is installed
# (`rustup target add x86_64-unknown-linux-musl`); otherwise, as on machines that cannot fetch
# it, a fully static glibc build (`-C target-feature=+crt-static`, static-pie). Either way it
# needs no library at run time; the script checks that with `file`. On glibc it is linked by
# scripts/lib/link-ordered.sh, which places the functions the daemon runs together (issue 44;
# their list: scripts/hot-functions.sh); the script prints what it placed.
#
# The image: one layer holding that binary as /kruised, /kruise-daemon (the path kruise's Helm
# chart runs) and /crictl (symlinks: kruised answers to the name it is run under), user
# 65532:65532, OCI labels (version, source, revision, created), and the environment
# HOME=/root (credential-provider plugins such as ECR's read $HOME/.aws; kruise's chart mounts
# the host's AWS credentials at /root/.aws, and both DaemonSets run kruised as uid 0; without it
# the runtime sets HOME=/ for a user the image has no passwd entry for) and containerd's
# default PATH (which oci.WithImageConfig, as ctr and nerdctl run images, gives only to an image
# without an environment). Layer, config and manifest are
# written here byte for byte (sorted tar entries with the commit's time, gzip -n, compact JSON
# in a fixed order), so the same source gives the same image digest. Needs: tar, gzip,
# sha256sum, file (apt-get installs what is missing; skopeo only for --push).
#
# Prints the binary's size and the image's digest; writes the digest to target/dist/digest (or
# DIR/digest).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[build-image] %s\n' "$*" >&2; }
# shellcheck source=scripts/lib/target.sh
. "$ROOT/scripts/lib/target.sh"

push="" binary="" out=$ROOT/target/dist
while [ $# -gt 0 ]; do
  case "$1" in
    --push) push=${2:?--push needs a reference}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) log "unknown argument: $1"; exit 2 ;;
  esac
done

need() {
  local missing=()
  for tool in "$@"; do
    local cmd=${tool%%:*} pkg=${tool#*:}
    command -v "$cmd" > /dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null
  fi
}
need tar:tar gzip:gzip sha256sum:coreutils file:file
[ -z "$push" ] || need skopeo:skopeo

mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ]; then
  revision=$revision-dirty
fi
source_url=${KRUISED_SOURCE_URL:-$(git config --get remote.origin.url 2> /dev/null || echo unknown)}
# the commit's time, so that rebuilding the same commit gives the same bytes
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2> /dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

# ---- the binary
if [ -z "$binary" ]; then
  if ! target=$(dist_target); then
    log "x86_64-unknown-linux-musl is not installed (rustup cannot fetch it here): static glibc build"
  fi
  dist_build_env "$ROOT" "$target"
  t0=$(date +%s)
  env "${DIST_BUILD_ENV[@]}" KRUISED_COMMIT="$revision" \
    cargo build --locked --profile dist --target "$target" --bin kruised
  log "built in $(($(date +%s) - t0))s ($target)"
  binary=$ROOT/target/$target/dist/kruised
  # what the linker placed together (scripts/lib/link-ordered.sh): the newest link's report
  report=$(ls -t "$ROOT/target/$target/dist/deps/"kruised-*.hot-functions 2> /dev/null | head -1 || true)
  [ -n "$report" ] && log "hot functions: $(cat "$report")"
fi
[ -x "$binary" ] || { log "no executable at $binary"; exit 1; }
kind=$(file -b "$binary")
case "$kind" in
  *"statically linked"* | *"static-pie linked"*) ;;
  *) log "not a static binary: $binary: $kind"; exit 1 ;;
esac
# replaced by a rename, never rewritten in place, and only when it changed: a test may be
# reading or running the last one (tests/run.sh builds the image twice to check its digest
# while the layers use the binary; a copy in place once handed the systemd layer half a binary)
if ! [ "$binary" -ef "$out/kruised" ] && ! cmp -s "$binary" "$out/kruised"; then
  cp "$binary" "$out/kruised.new.$$"
  mv -f "$out/kruised.new.$$" "$out/kruised"
fi
size=$(stat -c %s "$out/kruised")
log "binary ${out#"$ROOT"/}/kruised: $size bytes ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB), $kind"

# ---- the image, as an OCI layout in target/dist/oci
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
mkdir -p "$rootfs"
install -m 0755 "$out/kruised" "$rootfs/kruised"
ln -s kruised "$rootfs/kruise-daemon"
ln -s kruised "$rootfs/crictl"
touch -h -d "@$epoch" "$rootfs"/*
tar --create --format=ustar --sort=name --owner=0 --group=0 --numeric-owner \
  --mtime="@$epoch" -C "$rootfs" -f "$work/layer.tar" crictl kruise-daemon kruised
gzip -n -9 < "$work/layer.tar" > "$work/layer.tar.gz"
sha() { sha256sum "$1" | cut -d' ' -f1; }
diff_id=$(sha "$work/layer.tar")
layer=$(sha "$work/layer.tar.gz")
layer_size=$(stat -c %s "$work/layer.tar.gz")

labels=$(printf '"org.opencontainers.image.created":"%s","org.opencontainers.image.description":"%s","org.opencontainers.image.licenses":"Apache-2.0","org.opencontainers.image.revision":"%s","org.opencontainers.image.source":"%s","org.opencontainers.image.title":"kruised","org.opencontainers.image.version":"%s"' \
  "$created" "the node side of OpenKruise in-place updates and image pre-pulling; a drop-in for kruise-daemon" \
  "$revision" "$source_url" "$version")
printf '{"architecture":"amd64","config":{"Cmd":["run"],"Entrypoint":["/kruised"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","HOME=/root"],"Labels":{%s},"User":"65532:65532"},"created":"%s","history":[{"created":"%s","created_by":"scripts/build-image.sh"}],"os":"linux","rootfs":{"diff_ids":["sha256:%s"],"type":"layers"}}' \
  "$labels" "$created" "$created" "$diff_id" > "$work/config.json"
config=$(sha "$work/config.json")
config_size=$(stat -c %s "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{%s}}' \
  "$config" "$config_size" "$layer" "$layer_size" "$labels" > "$work/manifest.json"
manifest=$(sha "$work/manifest.json")
manifest_size=$(stat -c %s "$work/manifest.json")

rm -rf "$out/oci"
mkdir -p "$out/oci/blobs/sha256"
cp "$work/layer.tar.gz" "$out/oci/blobs/sha256/$layer"
cp "$work/config.json" "$out/oci/blobs/sha256/$config"
cp "$work/manifest.json" "$out/oci/blobs/sha256/$manifest"
printf '{"imageLayoutVersion":"1.0.0"}' > "$out/oci/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$version" > "$out/oci/index.json"
echo "sha256:$manifest" > "$out/digest"
log "image ${out#"$ROOT"/}/oci (tag $version): sha256:$manifest, layer $layer_size bytes, revision $revision"

if [ -n "$push" ]; then
  tls=true
  case "${push#docker://}" in 127.0.0.1:* | localhost:* | localhost/*) tls=false ;; esac
  skopeo copy --quiet --preserve-digests --dest-tls-verify="$tls" \
    "oci:$out/oci:$version" "docker://${push#docker://}"
  log "pushed to ${push#docker://}@sha256:$manifest"
fi
echo "sha256:$manifest"
