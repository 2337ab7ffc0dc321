#!/usr/bin/env bash
# Installs kruised on a node as a systemd service (bare metal, or any node whose daemons are not
# Kubernetes pods). Run as root from a checkout or an unpacked release:
#
#   systemd/install.sh --kubeconfig /etc/kruised/kubeconfig [--binary target/dist/kruised]
#                      [--node-name NAME] [--crictl] [--no-start] [--root DIR]
#
#   --binary PATH      the static kruised (default: target/dist/kruised, from scripts/build-image.sh)
#   --kubeconfig PATH  the kubeconfig of kruised's identity (docs/systemd.md: how to make one with
#                      deploy/rbac.yaml's ServiceAccount); written to the env file, never copied
#   --node-name NAME   the node's name in Kubernetes (default: hostname, as the kubelet's default)
#   --crictl           also link /usr/local/bin/crictl to kruised (not over an existing crictl)
#   --no-start         install and enable, but do not start
#   --root DIR         install under DIR and touch no running system (for packaging and CI)
#
# Installs /usr/local/bin/kruised, /etc/systemd/system/kruised.service and, unless it exists,
# /etc/default/kruised (NODE_NAME, KUBECONFIG, KRUISED_ARGS); on systemd >= 254 a drop-in with
# exponential restart backoff (RestartSteps=, RestartMaxDelaySec=, unknown to older systemd).
# Then `systemctl daemon-reload` and `systemctl enable --now kruised`. Uninstall: systemctl
# disable --now kruised; rm those files.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { printf '[install] %s\n' "$*" >&2; }

binary=$HERE/../target/dist/kruised kubeconfig="" node="" crictl=0 start=1 root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?}; shift 2 ;;
    --kubeconfig) kubeconfig=${2:?}; shift 2 ;;
    --node-name) node=${2:?}; shift 2 ;;
    --crictl) crictl=1; shift ;;
    --no-start) start=0; shift ;;
    --root) root=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) log "unknown argument: $1"; exit 2 ;;
  esac
done
[ -n "$kubeconfig" ] || { log "--kubeconfig is required (see docs/systemd.md)"; exit 2; }
[ -x "$binary" ] || { log "no kruised at $binary (build it with scripts/build-image.sh, or pass --binary)"; exit 1; }
"$binary" version --client-only > /dev/null || { log "$binary does not run here"; exit 1; }
node=${node:-$(hostname)}

install -d "$root/usr/local/bin" "$root/etc/systemd/system" "$root/etc/default"
install -m 0755 "$binary" "$root/usr/local/bin/kruised"
install -m 0644 "$HERE/kruised.service" "$root/etc/systemd/system/kruised.service"
if [ -f "$HERE/../docs/systemd.md" ]; then
  install -D -m 0644 "$HERE/../docs/systemd.md" "$root/usr/local/share/doc/kruised/systemd.md"
fi
if [ "$crictl" = 1 ]; then
  if [ -e "$root/usr/local/bin/crictl" ] || { [ -z "$root" ] && command -v crictl > /dev/null; }; then
    log "a crictl is installed already; not linking /usr/local/bin/crictl"
  else
    ln -s kruised "$root/usr/local/bin/crictl"
  fi
fi
env_file=$root/etc/default/kruised
if [ -e "$env_file" ]; then
  log "keeping the existing $env_file"
else
  cat > "$env_file" << EOF
# kruised's settings (systemd/kruised.service reads this file); flags as in \`kruised run --help\`
NODE_NAME=$node
KUBECONFIG=$kubeconfig
# e.g. --runtime-endpoint unix:///run/containerd/containerd.sock --max-workers-for-pull-image 2
KRUISED_ARGS=
EOF
  chmod 0644 "$env_file"
fi
[ -e "$root$kubeconfig" ] || log "note: $kubeconfig does not exist yet: kruised exits at start (and systemd retries) until it does"

systemd_version=$(systemctl --version 2> /dev/null | awk 'NR == 1 {print $2}')
if [ "${systemd_version:-0}" -ge 254 ] 2> /dev/null; then
  install -d "$root/etc/systemd/system/kruised.service.d"
  printf '[Service]\n# exponential backoff between restarts: 5s, then up to a minute\nRestartSteps=5\nRestartMaxDelaySec=60s\n' \
    > "$root/etc/systemd/system/kruised.service.d/10-backoff.conf"
fi

if [ -n "$root" ]; then
  log "installed under $root"
  exit 0
fi
if [ ! -d /run/systemd/system ]; then
  log "installed; systemd is not running here: start it with systemctl enable --now kruised on the node"
  exit 0
fi
systemctl daemon-reload
if [ "$start" = 1 ]; then
  systemctl enable --now kruised
  systemctl --no-pager status kruised | head -5 || true
else
  systemctl enable kruised
fi
log "installed: journalctl -u kruised -f; curl -s 127.0.0.1:10221/readyz?verbose"
