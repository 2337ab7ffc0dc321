#!/usr/bin/env bash
# cri-lab: a real CRI runtime for the tests: containerd (CRI v1 plugin) + runc + a local registry
# on loopback + small offline busybox images, all under $LAB. Proven on Debian bookworm as root.
#
#   cri-lab.sh install  apt-get install the packages
#   cri-lab.sh start    write configs, start registry, build+push images, start containerd,
#                       wait until its CRI plugin is up (pids in $LAB/*.pid)
#   cri-lab.sh status   show pids / sockets
#   cri-lab.sh stop     kill exactly the recorded pids (+ shims of our containerd), unmount leftovers,
#                       rmdir our cgroups. Remove CRI pods through CRI first (StopPodSandbox +
#                       RemovePodSandbox), or containers keep running under their shims.
#   cri-lab.sh clean    stop + delete all state
#
# Images pushed: $REG_ADDR/test/busybox:v1 and :v2 (same base layer, one small layer each that differs:
# /etc/image-version), test/pull:v1 and :v2 (the same base, then a marker layer and a top layer found
# in no other image: only the pull tests use them, and watch their blob fetches in the registry's
# access log), $REG_ADDR/test/pause:v1 (the sandbox image), test/noenv:v1 (busybox:v1 without
# /bin/env); for the image-pull tests
# imagepull/busybox:v1 and :v2 (the same shape as test/pull, with layers of their own) and
# imagepull/present:v1, crictl/busybox:v1 and :alias (one image of its own, for the crictl tests'
# pull and rmi), and on the authenticated registry $REG_AUTH_ADDR/secure/busybox:v1,
# secure/plugin:v1 (the credential-provider test's own) and crictl/busybox:v1.
#
# A second registry on $REG_AUTH_ADDR requires a login (htpasswd, bcrypt); its user and password
# are in $LAB/registry-auth/credentials (user:password), chosen at random on the first start.
#
#   cri-lab.sh bench-images      build and push bench/img1..4:v1 (each the busybox base plus one
#                                16 MiB layer of random bytes) for the pre-pull benchmark
#
#   cri-lab.sh stop-containerd   stop containerd only (its shims and containers keep running), as
#                                an upgrade or crash would
#   cri-lab.sh kill-containerd   SIGKILL containerd (a crash: no shutdown of its own); shims and
#                                containers keep running
#   cri-lab.sh start-containerd  start it again; returns once its CRI plugin answers
#
# Env: LAB ($TMPDIR/cri-lab)  SNAPSHOTTER (overlayfs|native, default overlayfs)
#      REG_ADDR (127.0.0.1:5000)  REG_AUTH_ADDR (127.0.0.1:5001)  CRI_RUNTIME (default runtime handler: runc|crun, default runc)
#      MOUNT_HUGETLB (1 = mount the hugetlb v1 hierarchy while the lab runs; needed for crun,
#                     default 1 when CRI_RUNTIME=crun, else 0). This is a machine-wide change,
#                     undone by 'stop'.
set -euo pipefail

LAB=${LAB:-${TMPDIR:-/tmp}/cri-lab}
SNAPSHOTTER=${SNAPSHOTTER:-overlayfs}
REG_ADDR=${REG_ADDR:-127.0.0.1:5000}
REG_AUTH_ADDR=${REG_AUTH_ADDR:-127.0.0.1:5001}
REG_AUTH_USER=kruised-lab
CRI_RUNTIME=${CRI_RUNTIME:-runc}
if [ "$CRI_RUNTIME" = crun ]; then MOUNT_HUGETLB=${MOUNT_HUGETLB:-1}; else MOUNT_HUGETLB=${MOUNT_HUGETLB:-0}; fi
SOCK=$LAB/containerd.sock
CTR=(ctr --address "$SOCK" -n k8s.io)
PKGS=(containerd runc crun docker-registry skopeo umoci busybox-static curl apache2-utils)

log() { printf '%s [lab] %s\n' "$(date +%T.%3N)" "$*" >&2; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print('%.3f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }
# running and not a zombie (our daemons are reparented to PID 1, which may reap them late)
pid_alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
alive() { [ -f "$1" ] && pid_alive "$(cat "$1")"; }

cmd_install() {
  local t0; t0=$(now)
  local missing=()
  for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    # no systemd in the VM: postinst 'invoke-rc.d' is denied by policy-rc.d, nothing is auto-started
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  log "install done in $(since "$t0")s"
}

write_configs() {
  mkdir -p "$LAB"/{registry,logs,containerd,cni/net.d,pods,"certs.d/$REG_ADDR","certs.d/$REG_AUTH_ADDR"}
  mkdir -p "$LAB/registry-auth/storage"
  cat > "$LAB/registry.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $LAB/registry
  delete:
    enabled: true
http:
  addr: $REG_ADDR
  secret: cri-lab-not-secret
EOF
  # the second registry: the same, behind htpasswd (bcrypt) basic auth
  if [ ! -s "$LAB/registry-auth/credentials" ]; then
    local password
    password="lab-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    echo "$REG_AUTH_USER:$password" > "$LAB/registry-auth/credentials"
    htpasswd -Bbn "$REG_AUTH_USER" "$password" > "$LAB/registry-auth/htpasswd"
  fi
  cat > "$LAB/registry-auth.yml" <<EOF
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $LAB/registry-auth/storage
http:
  addr: $REG_AUTH_ADDR
  secret: cri-lab-not-secret
auth:
  htpasswd:
    realm: cri-lab
    path: $LAB/registry-auth/htpasswd
EOF
  # containerd 1.6 registry config via config_path + hosts.toml (plain http for the local registries)
  local addr
  for addr in "$REG_ADDR" "$REG_AUTH_ADDR"; do
    cat > "$LAB/certs.d/$addr/hosts.toml" <<EOF
server = "http://$addr"

[host."http://$addr"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
EOF
  done
  cat > "$LAB/containerd.toml" <<EOF
version = 2
root = "$LAB/containerd/root"
state = "$LAB/containerd/state"
oom_score = 0

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  level = "info"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$LAB/containerd/opt"

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$REG_ADDR/test/pause:v1"
    disable_apparmor = true
    enable_selinux = false
    # The VM's bounding set lacks CAP_SYS_RESOURCE, so runc/crun cannot lower oom_score_adj
    # (CRI puts -998 on sandboxes): "nsexec: failed to update /proc/self/oom_score_adj: Permission denied"
    # -> "can't get final child's PID from pipe: EOF". Clamp to containerd's own score instead.
    restrict_oom_score_adj = true
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "$SNAPSHOTTER"
      default_runtime_name = "$CRI_RUNTIME"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "/usr/bin/runc"
          Root = "$LAB/containerd/runc-root"
          SystemdCgroup = false

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
          BinaryName = "/usr/bin/crun"
          Root = "$LAB/containerd/crun-root"
          SystemdCgroup = false

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$LAB/cni/net.d"

    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$LAB/certs.d"
EOF
}

start_registry() {
  if alive "$LAB/registry.pid"; then log "registry already running (pid $(cat "$LAB/registry.pid"))"; return; fi
  nohup /usr/bin/docker-registry serve "$LAB/registry.yml" >>"$LAB/logs/registry.log" 2>&1 &
  echo $! > "$LAB/registry.pid"
  for _ in $(seq 1 100); do curl -sf "http://$REG_ADDR/v2/" >/dev/null && break; sleep 0.05; done
  curl -sf "http://$REG_ADDR/v2/" >/dev/null || { log "registry did not come up"; tail "$LAB/logs/registry.log"; exit 1; }
  log "registry up on $REG_ADDR (pid $(cat "$LAB/registry.pid"))"
}

start_auth_registry() {
  if alive "$LAB/registry-auth.pid"; then log "auth registry already running (pid $(cat "$LAB/registry-auth.pid"))"; return; fi
  nohup /usr/bin/docker-registry serve "$LAB/registry-auth.yml" >>"$LAB/logs/registry-auth.log" 2>&1 &
  echo $! > "$LAB/registry-auth.pid"
  local code=
  for _ in $(seq 1 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$REG_AUTH_ADDR/v2/" || true)
    [ "$code" = 401 ] && break; sleep 0.05
  done
  [ "$code" = 401 ] || { log "auth registry did not come up (HTTP $code)"; tail "$LAB/logs/registry-auth.log"; exit 1; }
  log "auth registry up on $REG_AUTH_ADDR (pid $(cat "$LAB/registry-auth.pid")), answers 401 without a login"
}

build_images() {
  # Offline OCI images: base layer = static busybox (+ applet symlinks), v1/v2 = base + one tiny layer,
  # pause = base + entrypoint. Fixed mtimes/timestamps => the same digests on every run/machine
  # (as long as the busybox-static package version is the same).
  local t0; t0=$(now)
  local st=$LAB/stage oci=$LAB/oci T=2000-01-01T00:00:00Z
  local H="--history.created=$T"
  rm -rf "$st" "$oci"
  mkdir -p "$st/rootfs/"{bin,etc,tmp,proc,sys,dev,root}
  cp /bin/busybox "$st/rootfs/bin/busybox"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$st/rootfs/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$st/rootfs/etc/passwd"
  echo 'root:x:0:' > "$st/rootfs/etc/group"
  echo v1 > "$st/v1"; echo v2 > "$st/v2"
  echo pull > "$st/pull"; echo pull-v1 > "$st/pv1"; echo pull-v2 > "$st/pv2"
  echo imagepull > "$st/ip"; echo imagepull-v1 > "$st/ipv1"; echo imagepull-v2 > "$st/ipv2"
  echo crictl > "$st/crictl"
  find "$st" -exec touch -h -d @946684800 {} +
  umoci init --layout "$oci"
  umoci new --image "$oci:base"
  umoci insert --image "$oci:base" "$H" "$st/rootfs" /
  umoci config --image "$oci:base" --created=$T "$H" --config.cmd /bin/sh \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  umoci insert --image "$oci:base" --tag v1 "$H" "$st/v1" /etc/image-version
  umoci insert --image "$oci:base" --tag v2 "$H" "$st/v2" /etc/image-version
  umoci config --image "$oci:v1" --created=$T --no-history
  umoci config --image "$oci:v2" --created=$T --no-history
  # test/pull: busybox base + a marker layer + a top layer, none of which but the base is in any
  # other image, so the pull tests see exactly which blobs a pull fetches
  umoci insert --image "$oci:base" --tag pullbase "$H" "$st/pull" /etc/pull-test
  umoci insert --image "$oci:pullbase" --tag pull-v1 "$H" "$st/pv1" /etc/image-version
  umoci insert --image "$oci:pullbase" --tag pull-v2 "$H" "$st/pv2" /etc/image-version
  umoci config --image "$oci:pull-v1" --created=$T --no-history
  umoci config --image "$oci:pull-v2" --created=$T --no-history
  # imagepull/busybox: the same shape with layers of its own, for the image-pull tests
  umoci insert --image "$oci:base" --tag ipbase "$H" "$st/ip" /etc/imagepull-test
  umoci insert --image "$oci:ipbase" --tag ip-v1 "$H" "$st/ipv1" /etc/image-version
  umoci insert --image "$oci:ipbase" --tag ip-v2 "$H" "$st/ipv2" /etc/image-version
  umoci config --image "$oci:ip-v1" --created=$T --no-history
  umoci config --image "$oci:ip-v2" --created=$T --no-history
  # crictl/busybox: base + a layer of its own (an image ID no other image has), for the crictl
  # tests that pull and remove images
  umoci insert --image "$oci:base" --tag crictl "$H" "$st/crictl" /etc/crictl-test
  umoci config --image "$oci:crictl" --created=$T --no-history
  # noenv: busybox without its env applet: the env-from-metadata tests show the daemon does not
  # need `env` in the image
  rm -rf "$st/noenv-bundle"
  umoci unpack --image "$oci:v1" "$st/noenv-bundle" >/dev/null
  rm -f "$st/noenv-bundle/rootfs/bin/env"
  umoci repack --image "$oci:noenv" "$H" "$st/noenv-bundle"
  umoci config --image "$oci:noenv" --created=$T --no-history
  # pause: same base layer, no extra layer; PID 1 that exits on TERM
  umoci config --image "$oci:base" --tag pause --created=$T "$H" --clear=config.cmd \
    --config.entrypoint /bin/sh --config.entrypoint -c \
    --config.entrypoint 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done'
  local s d
  for s in v1:test/busybox:v1 v2:test/busybox:v2 pull-v1:test/pull:v1 pull-v2:test/pull:v2 pause:test/pause:v1 noenv:test/noenv:v1 \
           ip-v1:imagepull/busybox:v1 ip-v2:imagepull/busybox:v2 ip-v1:imagepull/present:v1 \
           crictl:crictl/busybox:v1 crictl:crictl/busybox:alias; do
    d=${s#*:}
    skopeo copy --quiet --dest-tls-verify=false "oci:$oci:${s%%:*}" "docker://$REG_ADDR/$d"
    log "pushed $REG_ADDR/$d $(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REG_ADDR/$d")"
  done
  local creds; creds=$(cat "$LAB/registry-auth/credentials")
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:v1" "docker://$REG_AUTH_ADDR/secure/busybox:v1"
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:v1" "docker://$REG_AUTH_ADDR/secure/plugin:v1"
  log "pushed $REG_AUTH_ADDR/secure/busybox:v1 and secure/plugin:v1 (login required)"
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:crictl" "docker://$REG_AUTH_ADDR/crictl/busybox:v1"
  log "pushed $REG_AUTH_ADDR/crictl/busybox:v1 (login required)"
  log "images built+pushed in $(since "$t0")s"
}

cri_wait() { # wait until containerd answers and its CRI plugin is ok
  local i
  for i in $(seq 1 600); do
    if [ -S "$SOCK" ] && "${CTR[@]}" version >/dev/null 2>&1; then
      "${CTR[@]}" plugins ls | awk '$2=="cri" && $NF=="ok" {found=1} END {exit !found}' && return 0
    fi
    sleep 0.05
  done
  return 1
}

start_containerd() {
  if alive "$LAB/containerd.pid"; then log "containerd already running (pid $(cat "$LAB/containerd.pid"))"; return; fi
  rm -f "$SOCK" "$SOCK.ttrpc"
  local t0; t0=$(now)
  nohup containerd --config "$LAB/containerd.toml" >>"$LAB/logs/containerd.log" 2>&1 &
  echo $! > "$LAB/containerd.pid"
  cri_wait || { log "containerd failed"; tail -20 "$LAB/logs/containerd.log"; exit 1; }
  log "containerd pid $(cat "$LAB/containerd.pid"): CRI up $(since "$t0")s after spawn"
  "${CTR[@]}" plugins ls | awk '$2=="cri" || $2=="'"$SNAPSHOTTER"'" {print "plugin " $1 " " $2 " " $NF}' >&2
  "${CTR[@]}" plugins ls | awk '$2=="cri" && $NF!="ok" {exit 1}' || { log "CRI plugin not ok"; exit 1; }
}

# crun 1.8 refuses cgroup "hybrid" mode when any controller sits on the v2 hierarchy:
#   "cgroups in hybrid mode not supported, drop all controllers from cgroupv2"
# Here hugetlb is not mounted as v1, so it shows in /sys/fs/cgroup/unified/cgroup.controllers.
# Mounting a v1 hugetlb hierarchy moves it off v2. runc does not care.
hugetlb_mount() {
  [ "$MOUNT_HUGETLB" = 1 ] || return 0
  grep -qw hugetlb /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null || return 0
  mkdir -p /sys/fs/cgroup/hugetlb
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb
  touch "$LAB/hugetlb.mounted"
  log "mounted cgroup v1 hugetlb (for crun); v2 controllers now: [$(cat /sys/fs/cgroup/unified/cgroup.controllers)]"
}

hugetlb_umount() {
  [ -f "$LAB/hugetlb.mounted" ] || return 0
  if mountpoint -q /sys/fs/cgroup/hugetlb; then
    find /sys/fs/cgroup/hugetlb -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
    umount /sys/fs/cgroup/hugetlb
  fi
  # a v1 hierarchy that still had (dying) children at umount time lingers and keeps hugetlb off v2;
  # mounting it again once it is empty and unmounting destroys it.
  local i
  for i in $(seq 1 20); do
    sleep 0.5
    grep -qw hugetlb /sys/fs/cgroup/unified/cgroup.controllers && break
    if mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb; then
      find /sys/fs/cgroup/hugetlb -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
      umount /sys/fs/cgroup/hugetlb
    fi
  done
  rmdir /sys/fs/cgroup/hugetlb 2>/dev/null || true
  rm -f "$LAB/hugetlb.mounted"
  log "hugetlb v1 hierarchy removed; v2 controllers: [$(cat /sys/fs/cgroup/unified/cgroup.controllers)]"
}

cmd_start() {
  local t0; t0=$(now)
  write_configs
  hugetlb_mount
  start_registry
  start_auth_registry
  build_images
  start_containerd
  log "start done in $(since "$t0")s"
}

shim_pids() { # pids of the shims that belong to OUR containerd (exact -address and -id match)
  python3 - "$SOCK" "$LAB/containerd/state/io.containerd.runtime.v2.task" <<'EOF'
import os, sys
sock, tasks = sys.argv[1], sys.argv[2]
ids = {i for ns in (os.listdir(tasks) if os.path.isdir(tasks) else [])
       for i in os.listdir(os.path.join(tasks, ns))}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        a = open("/proc/%s/cmdline" % p, "rb").read().decode().split("\0")
    except OSError:
        continue
    if (a and os.path.basename(a[0]).startswith("containerd-shim") and "-address" in a and "-id" in a
            and a[a.index("-address") + 1] == sock and a[a.index("-id") + 1] in ids):
        print(p)
EOF
}

kill_pidfile() { # $1 pidfile $2 name
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$pid"; then
    kill "$pid"
    for _ in $(seq 1 100); do pid_alive "$pid" || break; sleep 0.05; done
    pid_alive "$pid" && kill -9 "$pid"
    log "stopped $2 (pid $pid)"
  fi
  rm -f "$f"
}

cmd_kill_containerd() {
  local f=$LAB/containerd.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$pid"; then
    kill -9 "$pid"
    for _ in $(seq 1 100); do pid_alive "$pid" || break; sleep 0.02; done
    log "killed containerd (pid $pid) with SIGKILL"
  fi
  rm -f "$f"
}

cmd_stop() {
  kill_pidfile "$LAB/containerd.pid" containerd
  # if containerd died before the CRI cleanup, containers are still running under their shims:
  # delete them with the OCI runtime, using OUR runtime roots only
  local f pid rt root id
  for rt in runc crun; do
    root=$LAB/containerd/$rt-root/k8s.io
    [ -d "$root" ] || continue
    for id in $("/usr/bin/$rt" --root "$root" list -q 2>/dev/null); do
      "/usr/bin/$rt" --root "$root" delete -f "$id" >/dev/null 2>&1 && log "$rt delete -f $id" || true
    done
  done
  # shims are daemonized (reparented to init) and outlive containerd; containerd 1.6 writes no shim.pid,
  # so find them by exact argv: containerd-shim-runc-v2 ... -id <id in OUR state dir> -address $SOCK
  for pid in $(shim_pids); do kill -9 "$pid" 2>/dev/null && log "killed leftover shim $pid" || true; done
  kill_pidfile "$LAB/registry.pid" registry
  kill_pidfile "$LAB/registry-auth.pid" "auth registry"
  # leftover mounts (overlay rootfs, sandbox shm) under $LAB, deepest first
  awk -v l="$LAB/" 'index($2, l)==1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount -l "$m" && log "umounted $m"; done
  # cgroupfs driver: pod-level parents (cgroup_parent=/cri-lab/...) are left behind like kubelet's would be
  for d in /sys/fs/cgroup/*/cri-lab; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  hugetlb_umount
  rm -f "$SOCK" "$SOCK.ttrpc"
}

cmd_clean() {
  cmd_stop
  rm -rf "$LAB"/{containerd,registry,registry-auth,oci,stage,pods,logs,certs.d,cni}
  log "state removed"
}

cmd_bench_images() {
  # bench/img1..4:v1: the busybox base plus one 16 MiB layer of random bytes each, so every pull
  # moves real data and shares nothing but the base with the others
  local t0; t0=$(now)
  local oci=$LAB/oci st=$LAB/stage-bench T=2000-01-01T00:00:00Z i
  [ -d "$oci" ] || { log "no OCI layout: run start first"; exit 1; }
  rm -rf "$st"; mkdir -p "$st"
  for i in 1 2 3 4; do
    head -c $((16 << 20)) /dev/urandom > "$st/blob$i"
    umoci insert --image "$oci:base" --tag "bench$i" --history.created=$T "$st/blob$i" /opt/blob
    umoci config --image "$oci:bench$i" --created=$T --no-history
    skopeo copy --quiet --dest-tls-verify=false "oci:$oci:bench$i" "docker://$REG_ADDR/bench/img$i:v1"
  done
  rm -rf "$st"
  log "bench images built+pushed in $(since "$t0")s"
}

cmd_status() {
  local f
  for f in "$LAB"/*.pid; do [ -f "$f" ] && echo "$(basename "$f" .pid): pid $(cat "$f") $(alive "$f" && echo alive || echo DEAD)"; done
  [ -S "$SOCK" ] && "${CTR[@]}" version 2>&1 | sed -n 's/^ *Version: */containerd server /p' | tail -1
  return 0
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  clean) cmd_clean ;;
  status) cmd_status ;;
  stop-containerd) kill_pidfile "$LAB/containerd.pid" containerd ;;
  kill-containerd) cmd_kill_containerd ;;
  start-containerd) start_containerd ;;
  bench-images) cmd_bench_images ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 2 ;;
esac
