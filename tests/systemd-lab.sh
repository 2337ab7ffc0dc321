#!/usr/bin/env bash
# systemd-lab: a real systemd (Debian bookworm's, from Debian's packages) booted in a container of
# its own, for the systemd layer (tests/e2e/systemd.rs): kruised is installed in it with
# systemd/install.sh and run by its unit as on a bare-metal node. The container shares the host's
# network (the API-server double on loopback is reachable) and sees a CRI runtime's socket at
# /run/containerd/containerd.sock, where kruised's detection looks.
#
#   systemd-lab.sh start    make the root once (mmdebstrap: minbase + systemd, systemd-sysv, dbus,
#                           ca-certificates, as a node has them; about 25 s), boot it (systemd-nspawn -b) and wait until systemd is up;
#                           $SYSTEMD_LAB/leader.pid is the container's PID 1 on the host
#   systemd-lab.sh run CMD  CMD inside the container (nsenter into every namespace of its PID 1)
#   systemd-lab.sh stop     power it off (its units stop as on a node's shutdown), at most 30 s
#   systemd-lab.sh clean    stop, and remove $SYSTEMD_LAB
#
# Env: SYSTEMD_LAB (default $TMPDIR/systemd-lab; the root is $SYSTEMD_LAB/root, writable from the
#      host: tests put files into it directly), SYSTEMD_LAB_RUNTIME_DIR (a directory holding the
#      runtime's containerd.sock, mounted read-only at /run/containerd; required by start),
#      KRUISED_DEBIAN_MIRROR (default deb.debian.org).
# Needs: root, Debian's mmdebstrap and systemd-container (installed here when missing).
set -euo pipefail
SYSTEMD_LAB=${SYSTEMD_LAB:-${TMPDIR:-/tmp}/systemd-lab}
ROOTFS=$SYSTEMD_LAB/root
MIRROR=${KRUISED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '%s [systemd-lab] %s\n' "$(date +%T.%3N)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }
leader() { cat "$SYSTEMD_LAB/leader.pid" 2> /dev/null; }
alive() { [ -n "$1" ] && [ -d "/proc/$1" ]; }

install_tools() {
  local missing=()
  command -v mmdebstrap > /dev/null 2>&1 || missing+=(mmdebstrap)
  command -v systemd-nspawn > /dev/null 2>&1 || missing+=(systemd-container)
  [ ${#missing[@]} = 0 ] && return 0
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
}

make_root() {
  [ -x "$ROOTFS/lib/systemd/systemd" ] && return 0
  local t0; t0=$(now)
  rm -rf "$ROOTFS.tmp"
  mmdebstrap --quiet --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates bookworm "$ROOTFS.tmp" "$MIRROR" \
    > "$SYSTEMD_LAB/mmdebstrap.log" 2>&1 || { tail -20 "$SYSTEMD_LAB/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  # no getty on the console: the container is driven through nsenter only
  ln -sf /dev/null "$ROOTFS.tmp/etc/systemd/system/console-getty.service"
  mv "$ROOTFS.tmp" "$ROOTFS"
  log "root made in $(since "$t0")s: $(chroot "$ROOTFS" systemctl --version | head -1)"
}

cmd_start() {
  local dir=${SYSTEMD_LAB_RUNTIME_DIR:-} t0 nspawn pid state
  [ -n "$dir" ] && [ -d "$dir" ] || die "SYSTEMD_LAB_RUNTIME_DIR: the directory of the runtime's containerd.sock"
  if alive "$(leader)"; then log "already running (PID 1 is $(leader) on the host)"; return 0; fi
  mkdir -p "$SYSTEMD_LAB"
  install_tools
  make_root
  t0=$(now)
  # --register=no --keep-unit: no machined or host systemd needed (this host has none);
  # --bind-ro: the runtime's socket where kruised's detection looks (a read-only view of a
  # socket still connects)
  systemd-nspawn --quiet -D "$ROOTFS" --register=no --keep-unit --machine=kruised-lab \
    --bind-ro="$dir:/run/containerd" -b > "$SYSTEMD_LAB/console.log" 2>&1 < /dev/null &
  nspawn=$!
  echo "$nspawn" > "$SYSTEMD_LAB/nspawn.pid"
  for _ in $(seq 1 300); do
    alive "$nspawn" || { tail -20 "$SYSTEMD_LAB/console.log" >&2; die "systemd-nspawn exited"; }
    pid=$(ps -o pid= --ppid "$nspawn" 2> /dev/null | head -1 | tr -d ' ' || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = systemd ]; then break; fi
    pid=""
    sleep 0.1
  done
  [ -n "$pid" ] || die "no systemd in the container after 30 s"
  echo "$pid" > "$SYSTEMD_LAB/leader.pid"
  # running or degraded: booted either way (a minimal root may lack a unit's hardware); until
  # its manager listens, systemctl cannot connect and says nothing
  state=""
  for _ in $(seq 1 120); do
    alive "$nspawn" || { tail -20 "$SYSTEMD_LAB/console.log" >&2; die "systemd-nspawn exited"; }
    state=$(timeout 60 nsenter -t "$pid" -a systemctl is-system-running --wait 2> /dev/null || true)
    case "$state" in running | degraded) break ;; esac
    sleep 0.5
  done
  case "$state" in
    running | degraded) ;;
    *) tail -20 "$SYSTEMD_LAB/console.log" >&2; die "systemd did not finish booting within 60 s (state '$state')" ;;
  esac
  log "booted in $(since "$t0")s ($state): PID 1 is $pid on the host"
}

cmd_run() {
  local pid; pid=$(leader)
  alive "$pid" || die "not running"
  exec nsenter -t "$pid" -a "$@"
}

cmd_stop() {
  local nspawn pid
  nspawn=$(cat "$SYSTEMD_LAB/nspawn.pid" 2> /dev/null || true)
  pid=$(leader)
  if alive "$pid"; then nsenter -t "$pid" -a systemctl poweroff > /dev/null 2>&1 || true; fi
  for _ in $(seq 1 300); do alive "$nspawn" || break; sleep 0.1; done
  if alive "$nspawn"; then
    log "the container did not power off within 30 s: killing it"
    kill -9 "$nspawn" 2> /dev/null || true
    [ -n "$pid" ] && kill -9 "$pid" 2> /dev/null || true
  fi
  rm -f "$SYSTEMD_LAB/leader.pid" "$SYSTEMD_LAB/nspawn.pid"
}

case "${1:-}" in
  start) cmd_start ;;
  run) shift; cmd_run "$@" ;;
  stop) cmd_stop ;;
  clean) cmd_stop; rm -rf "${SYSTEMD_LAB:?}" ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 2 ;;
esac
