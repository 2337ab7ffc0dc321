#!/usr/bin/env bash
# cri-lab: real CRI runtimes for the tests: containerd 1.6 (Debian's), containerd 2.x (Debian's
# unstable package, or a provided build) and CRI-O (a provided build), each with runc, in
# directories of their own under $LAB, beside a local registry on loopback with small offline
# busybox images. Proven on Debian bookworm as root.
#
#   cri-lab.sh install  apt-get install the packages (e2fsprogs: the loop-mounted ext4 of the size
#                       admission's e2e test)
#   cri-lab.sh start    write configs, start registry, build+push images, start every runtime of
#                       $CRI_LAB_RUNTIMES, wait until each answers CRI (pids in $LAB/*.pid)
#   cri-lab.sh status   show pids / sockets
#   cri-lab.sh socket   the CRI socket of $CRI_LAB_RUNTIME (the lab need not run)
#   cri-lab.sh unpack   only put the binaries $CRI_LAB_RUNTIMES needs into $CRI_LAB_BIN (below)
#   cri-lab.sh stop     kill exactly the recorded pids (+ the shims / conmons of our runtimes),
#                       unmount leftovers, rmdir our cgroups. Remove CRI pods through CRI first
#                       (StopPodSandbox + RemovePodSandbox), or containers keep running.
#   cri-lab.sh clean    stop + delete all state
#
# Runtimes (CRI_LAB_RUNTIMES, space-separated; default "containerd"):
#   containerd   Debian's containerd 1.6.20: socket $LAB/containerd.sock, no container events
#   containerd2  containerd 2.x: socket $LAB/containerd2/containerd.sock, container events
#   crio         CRI-O with conmon: socket $LAB/crio/crio.sock, container events on
#                (enable_pod_events = true)
#   crio-noevents  the same with CRI-O's default, enable_pod_events = false (GetContainerEvents
#                ends at once, status OK): socket $LAB/crio-noevents/crio.sock, state of its own
# Their binaries go to $LAB/bin (or CRI_LAB_BIN, which labs may share), taken from the directory of
# plain binaries named by KRUISED_RUNTIMES_ASSETS (provided by whoever runs the lab: no
# registry this project reaches ships them): containerd and containerd-shim-runc-v2 (containerd 2.x), crio and pinns (CRI-O),
# crictl (the real crictl, which the crictl tests compare kruised's with), each used when present.
# Without a provided containerd, containerd2 is Debian's own package of containerd 2.x, from
# unstable (sid: 2.1.9 when this was written; it needs only glibc 2.34), fetched and checked by
# apt (signatures, hashes) into the lab, never installed on the system
# (KRUISED_DEBIAN_CONTAINERD2=0 refuses it; KRUISED_DEBIAN_MIRROR, default deb.debian.org).
# $BIN/<runtime>.source says where each came from. CRI-O has no Debian package: the lab refuses
# to start it without a provided build.
#
# Images pushed: $REG_ADDR/test/busybox:v1 and :v2 (same base layer, one small layer each that differs:
# /etc/image-version), test/pull:v1 and :v2 (the same base, then a marker layer and a top layer found
# in no other image: only the pull tests use them, and watch their blob fetches in the registry's
# access log), $REG_ADDR/test/pause:v1 (the sandbox image), test/noenv:v1 (busybox:v1 without
# /bin/env); for the image-pull tests
# imagepull/busybox:v1 and :v2 (the same shape as test/pull, with layers of their own) and
# imagepull/present:v1, crictl/busybox:v1 and :alias (one image of its own, for the crictl tests'
# pull and rmi), runtimes/busybox:v1 (one of its own, for the two-runtime node test), admit/small:v1
# and admit/refused:v1 (one image of their own, for the size admission's tests), pin/busybox:v1
# (one of its own, for the pinning test, whose garbage collector removes it), pin/giveway:v1 and
# :v2 (two of their own, for the test of pins giving way to a full disk), and on the
# authenticated registry $REG_AUTH_ADDR/secure/busybox:v1,
# secure/plugin:v1 (the credential-provider test's own; both one image of their own),
# crictl/busybox:v1 and secure/admit:v1 (admit's image).
#
# A second registry on $REG_AUTH_ADDR requires a login (htpasswd, bcrypt); its user and password
# are in $LAB/registry-auth/credentials (user:password), chosen at random on the first start.
#
#   cri-lab.sh bench-images    build and push bench/img1..4:v1 (each the busybox base plus one
#                              16 MiB layer of random bytes) for the pre-pull benchmark;
#                              BENCH_IMAGES=5 adds img5 (the burst benchmark)
#
# One runtime ($CRI_LAB_RUNTIME, default the first of $CRI_LAB_RUNTIMES), as an upgrade or a
# crash would treat it; its shims (conmons) and containers keep running:
#   cri-lab.sh stop-runtime    SIGTERM the runtime's daemon
#   cri-lab.sh kill-runtime    SIGKILL it (a crash: no shutdown of its own)
#   cri-lab.sh start-runtime   start it again; returns once it answers CRI
#
# Env: LAB ($TMPDIR/cri-lab)  SNAPSHOTTER (overlayfs|native, default overlayfs; containerd 1.6)
#      REG_ADDR (127.0.0.1:5000)  REG_AUTH_ADDR (127.0.0.1:5001)
#      CRI_LAB_RUNTIMES, CRI_LAB_RUNTIME, KRUISED_RUNTIMES_ASSETS, KRUISED_DEBIAN_CONTAINERD2,
#      KRUISED_DEBIAN_MIRROR (above)
#      CRI_RUNTIME (containerd 1.6's default runtime handler: runc|crun, default runc)
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
CRI_LAB_RUNTIMES=${CRI_LAB_RUNTIMES:-containerd}
CRI_LAB_RUNTIME=${CRI_LAB_RUNTIME:-${CRI_LAB_RUNTIMES%% *}}
RUNTIMES_ASSETS=${KRUISED_RUNTIMES_ASSETS:-}
# the binaries of containerd 2.x / CRI-O and crictl; several labs may share them
BIN=${CRI_LAB_BIN:-$LAB/bin}
DEBIAN_MIRROR=${KRUISED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$CRI_RUNTIME" = crun ]; then MOUNT_HUGETLB=${MOUNT_HUGETLB:-1}; else MOUNT_HUGETLB=${MOUNT_HUGETLB:-0}; fi
SOCK=$LAB/containerd.sock
CTR=(ctr --address "$SOCK" -n k8s.io)
PKGS=(containerd runc crun docker-registry skopeo umoci busybox-static curl apache2-utils xz-utils
  conmon containernetworking-plugins e2fsprogs)

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
  echo crictl > "$st/crictl"; echo secure > "$st/secure"; echo runtimes > "$st/runtimes"
  echo admit > "$st/admit"
  echo pin > "$st/pin"; echo giveway-v1 > "$st/gw1"; echo giveway-v2 > "$st/gw2"
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
  # runtimes/busybox: base + a layer of its own, for the test of a node where two runtimes
  # answer (tests/e2e/runtimes.rs): removed and pulled into the kubelet's runtime only
  umoci insert --image "$oci:base" --tag runtimes "$H" "$st/runtimes" /etc/runtimes-test
  umoci config --image "$oci:runtimes" --created=$T --no-history
  # pin/busybox: base + a layer of its own, for the pinning test (tests/e2e/pin.rs), whose
  # garbage collector removes it
  umoci insert --image "$oci:base" --tag pin "$H" "$st/pin" /etc/pin-test
  umoci config --image "$oci:pin" --created=$T --no-history
  # pin/giveway:v1 and :v2: two images of their own, for the test of pins giving way to a full disk
  umoci insert --image "$oci:base" --tag gw1 "$H" "$st/gw1" /etc/giveway-test
  umoci insert --image "$oci:base" --tag gw2 "$H" "$st/gw2" /etc/giveway-test
  umoci config --image "$oci:gw1" --created=$T --no-history
  umoci config --image "$oci:gw2" --created=$T --no-history
  # secure: the images of the registry that wants a login, with a layer of their own (tests
  # remove them; were they test/busybox:v1 under another name, that would go too)
  umoci insert --image "$oci:base" --tag secure "$H" "$st/secure" /etc/secure-test
  umoci config --image "$oci:secure" --created=$T --no-history
  # admit: base + a layer of its own, for the size admission's tests (tests/e2e/admit.rs), which
  # remove it: admit/small:v1 and admit/refused:v1, and secure/admit:v1 behind the login
  umoci insert --image "$oci:base" --tag admit "$H" "$st/admit" /etc/admit-test
  umoci config --image "$oci:admit" --created=$T --no-history
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
           crictl:crictl/busybox:v1 crictl:crictl/busybox:alias runtimes:runtimes/busybox:v1 \
           admit:admit/small:v1 admit:admit/refused:v1 pin:pin/busybox:v1 \
           gw1:pin/giveway:v1 gw2:pin/giveway:v2; do
    d=${s#*:}
    skopeo copy --quiet --dest-tls-verify=false "oci:$oci:${s%%:*}" "docker://$REG_ADDR/$d"
    log "pushed $REG_ADDR/$d $(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REG_ADDR/$d")"
  done
  local creds; creds=$(cat "$LAB/registry-auth/credentials")
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:secure" "docker://$REG_AUTH_ADDR/secure/busybox:v1"
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:secure" "docker://$REG_AUTH_ADDR/secure/plugin:v1"
  log "pushed $REG_AUTH_ADDR/secure/busybox:v1 and secure/plugin:v1 (login required)"
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:crictl" "docker://$REG_AUTH_ADDR/crictl/busybox:v1"
  log "pushed $REG_AUTH_ADDR/crictl/busybox:v1 (login required)"
  skopeo copy --quiet --dest-tls-verify=false --dest-creds "$creds" "oci:$oci:admit" "docker://$REG_AUTH_ADDR/secure/admit:v1"
  log "pushed $REG_AUTH_ADDR/secure/admit:v1 (login required)"
  log "images built+pushed in $(since "$t0")s"
}

# ---------------------------------------------------------------- the runtimes
rt_socket() { # $1 runtime: its CRI socket. Those of containerd 2 and CRI-O have their packages'
  # names, each in a folder of its own, which a test can mount as a host's /var/run
  case "$1" in
    containerd) echo "$LAB/containerd.sock" ;;
    containerd2) echo "$LAB/containerd2/containerd.sock" ;;
    crio) echo "$LAB/crio/crio.sock" ;;
    crio-noevents) echo "$LAB/crio-noevents/crio.sock" ;;
    *) log "unknown runtime '$1' (containerd, containerd2, crio, crio-noevents)"; exit 2 ;;
  esac
}

# containerd 2.x puts a shim's socket at <socket_dir>/<64 hex>: the dir may have 42 characters
C2_SHIMS=$LAB/c2s
if [ ${#C2_SHIMS} -gt 42 ]; then C2_SHIMS=/tmp/cri-lab-$(printf %s "$LAB" | md5sum | cut -c1-12); fi

provide() { # $1..: copy these plain binaries from KRUISED_RUNTIMES_ASSETS into $BIN; fails
  # unless every one is there
  local b
  [ -n "$RUNTIMES_ASSETS" ] || return 1
  for b in "$@"; do [ -f "$RUNTIMES_ASSETS/$b" ] || return 1; done
  mkdir -p "$BIN"
  for b in "$@"; do
    [ -x "$BIN/$b" ] && continue
    install -m 0755 "$RUNTIMES_ASSETS/$b" "$BIN/$b.tmp" && mv "$BIN/$b.tmp" "$BIN/$b"
  done
}

debian_containerd2() { # Debian's containerd 2.x (unstable's package) into $BIN, through apt in a
  # directory of its own: the archive's signature and the package's hash checked, nothing
  # installed on the system
  local d=$BIN/.debian t0 ver
  t0=$(now)
  rm -rf "$d"; mkdir -p "$d"/{lists/partial,cache/archives/partial,deb,root}
  echo "deb $DEBIAN_MIRROR sid main" > "$d/sources.list"
  : > "$d/status"
  local o=(-o Dir::Etc::SourceList="$d/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$d/lists" -o Dir::Cache="$d/cache" -o Dir::State::status="$d/status"
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get -qq "${o[@]}" update > "$d/apt.log" 2>&1 ||
    { cat "$d/apt.log" >&2; log "ERROR: apt could not read Debian unstable's index at $DEBIAN_MIRROR"; return 1; }
  ver=$(apt-cache "${o[@]}" show containerd 2> /dev/null | sed -n 's/^Version: //p' | head -1)
  case "$ver" in
    2.*) ;;
    *) log "ERROR: Debian unstable's containerd is '$ver', not 2.x"; return 1 ;;
  esac
  (cd "$d/deb" && apt-get -qq "${o[@]}" download "containerd=$ver") >> "$d/apt.log" 2>&1 ||
    { cat "$d/apt.log" >&2; log "ERROR: apt could not download containerd $ver"; return 1; }
  dpkg-deb -x "$d/deb"/containerd_*.deb "$d/root"
  install -m 0755 "$d/root/usr/bin/containerd" "$d/root/usr/bin/containerd-shim-runc-v2" "$d/root/usr/bin/ctr" "$BIN/"
  echo "containerd $ver (Debian unstable's package)" > "$BIN/containerd2.source"
  rm -rf "$d"
  log "containerd $ver from Debian unstable in $(since "$t0")s"
}

unpack_runtimes() { # the binaries of containerd 2.x / CRI-O, and the real crictl (the tests
  # compare kruised crictl with it), once for the labs that share $BIN
  mkdir -p "$BIN"
  case " $CRI_LAB_RUNTIMES " in
    *" containerd2 "*)
      if [ -x "$BIN/containerd" ]; then
        :
      elif provide containerd containerd-shim-runc-v2; then
        echo "containerd $("$BIN/containerd" --version | awk '{print $3}') (provided: $RUNTIMES_ASSETS)" > "$BIN/containerd2.source"
        log "containerd 2.x from $RUNTIMES_ASSETS"
      elif [ "${KRUISED_DEBIAN_CONTAINERD2:-1}" = 1 ]; then
        debian_containerd2 || exit 1
      else
        log "ERROR: containerd2 needs containerd and containerd-shim-runc-v2 in KRUISED_RUNTIMES_ASSETS (or KRUISED_DEBIAN_CONTAINERD2=1)"
        exit 1
      fi
      ;;
  esac
  case " $CRI_LAB_RUNTIMES " in
    *" crio"*)
      provide crio pinns ||
        { log "ERROR: crio needs crio and pinns in KRUISED_RUNTIMES_ASSETS (a directory of plain binaries)"; exit 1; }
      echo "CRI-O $("$BIN/crio" --version 2> /dev/null | awk '/^Version:/ {print $2}') (provided: $RUNTIMES_ASSETS)" > "$BIN/crio.source"
      ;;
  esac
  if provide crictl; then
    log "the real crictl from $RUNTIMES_ASSETS"
  fi
}

write_cni_loopback() { # $1 conf dir: a loopback-only network (host-network pods need no more)
  mkdir -p "$1"
  cat > "$1/10-cri-lab-loopback.conflist" <<EOF
{ "cniVersion": "1.0.0", "name": "cri-lab-loopback", "plugins": [ { "type": "loopback" } ] }
EOF
}

cri_ready() { # $1 socket: the runtime answers CRI's Status and says RuntimeReady (HTTP/2 over
  # the socket with curl: no crictl needed)
  printf '\0\0\0\0\0' | curl -sS -m 2 --http2-prior-knowledge --unix-socket "$1" \
    -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @- \
    http://localhost/runtime.v1.RuntimeService/Status 2> /dev/null |
    python3 -c 'import sys; sys.exit(0 if b"\x0a\x0cRuntimeReady\x10\x01" in sys.stdin.buffer.read() else 1)' 2> /dev/null
}

wait_ready() { # $1 runtime $2 pid: until it answers CRI, or it dies, or 60 s pass
  local sock i; sock=$(rt_socket "$1")
  for i in $(seq 1 600); do
    pid_alive "$2" || return 1
    if [ -S "$sock" ]; then
      if [ "$1" = containerd ]; then
        "${CTR[@]}" version >/dev/null 2>&1 &&
          "${CTR[@]}" plugins ls | awk '$2=="cri" && $NF=="ok" {found=1} END {exit !found}' && return 0
      else
        cri_ready "$sock" && return 0
      fi
    fi
    sleep 0.05
  done
  return 1
}

containerd2_config() {
  local d=$LAB/containerd2
  mkdir -p "$d"/{root,state} "$C2_SHIMS"
  write_cni_loopback "$d/cni"
  cat > "$d/config.toml" <<EOF
# version 3 on purpose: in a version-4 file (2.3's own format) a top-level [grpc] section is
# ignored and containerd serves on /run/containerd/containerd.sock, the host's; version 3 is
# migrated correctly. 'start' checks the effective config before starting.
version = 3
root = "$d/root"
state = "$d/state"
oom_score = 0

[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.shim.v1.manager"]
    socket_dir = "$C2_SHIMS"
  # NRI would listen on /var/run/nri/nri.sock, machine-wide
  [plugins."io.containerd.nri.v1.nri"]
    disable = true
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$REG_ADDR/test/pause:v1"
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "$LAB/certs.d"
  [plugins."io.containerd.cri.v1.runtime"]
    enable_selinux = false
    disable_apparmor = true
    # see containerd 1.6's config: runc cannot lower oom_score_adj here
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "/usr/bin/runc"
          Root = "$d/runc-root"
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$d/cni"
  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF
  # the effective config (after migration and the default import of /etc/containerd/conf.d)
  # must keep every path of ours
  "$BIN/containerd" --config "$d/config.toml" config dump 2>/dev/null > "$d/config.effective.toml"
  python3 - "$LAB" "$C2_SHIMS" "$d/config.effective.toml" <<'EOF' ||
import sys, tomllib
lab, shims, f = sys.argv[1], sys.argv[2], sys.argv[3]
c = tomllib.load(open(f, "rb")); p = c.get("plugins", {})
got = {
  "root": c.get("root"), "state": c.get("state"),
  "grpc": p.get("io.containerd.server.v1.grpc", {}).get("address", c.get("grpc", {}).get("address")),
  "ttrpc": p.get("io.containerd.server.v1.ttrpc", {}).get("address", c.get("ttrpc", {}).get("address")),
  "shim socket_dir": p.get("io.containerd.shim.v1.manager", {}).get("socket_dir"),
}
# containerd before 2.2 has no socket_dir (its dump shows every option it knows, so it is absent):
# its shims' sockets go to /run/containerd/s/<hash of this lab's own address>, apart from any
# other containerd's
if "socket_dir" not in p.get("io.containerd.shim.v1.manager", {}):
    del got["shim socket_dir"]
    print("  shims' sockets in /run/containerd/s (this containerd has no socket_dir)", file=sys.stderr)
bad = {k: v for k, v in got.items() if not (isinstance(v, str) and (v.startswith(lab + "/") or v == shims))}
if not p.get("io.containerd.nri.v1.nri", {}).get("disable"): bad["nri.disable"] = False
for k, v in bad.items(): print("  %s = %r" % (k, v), file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
    { log "REFUSING to start containerd 2: its effective config leaves $LAB ($d/config.effective.toml)"; exit 1; }
}

write_runc_wrapper() { # $1 path. CRI-O has no restrict_oom_score_adj: it gives sandboxes -998 and
  # Guaranteed containers -997, and runc fails ("failed to update /proc/self/oom_score_adj:
  # Permission denied") where root lacks CAP_SYS_RESOURCE, as on these machines. The wrapper raises
  # a negative oomScoreAdj in the bundle's config.json / exec's process.json to runc's own score
  # (what containerd's knob does), then runs the real runc.
  cat > "$1" <<EOF
#!/bin/sh
own=\$(cat /proc/self/oom_score_adj)
prev=
for a in "\$@"; do
  f=
  case "\$prev" in --bundle|-b) f="\$a/config.json" ;; --process|-p) f="\$a" ;; esac
  case "\$a" in --bundle=*) f="\${a#--bundle=}/config.json" ;; --process=*) f="\${a#--process=}" ;; esac
  if [ -n "\$f" ] && [ -f "\$f" ] && grep -q '"oomScoreAdj": *-' "\$f"; then
    python3 - "\$f" "\$own" <<'PY'
import json, sys
f, own = sys.argv[1], int(sys.argv[2])
c = json.load(open(f)); p = c.get("process", c)
if p.get("oomScoreAdj", 0) < own:
    p["oomScoreAdj"] = own; json.dump(c, open(f, "w"))
PY
  fi
  prev=\$a
done
exec /usr/bin/runc "\$@"
EOF
  chmod +x "$1"
}

crio_config() { # $1 instance (crio, crio-noevents) $2 enable_pod_events
  local d=$LAB/$1 addr
  mkdir -p "$d"/{root,runroot,run,lib,conf.d,ns,hooks.d,exits,attach,logs,cdi,oci,keys,policies,auth,registries.conf.d}
  write_runc_wrapper "$d/runc-oomclamp"
  write_cni_loopback "$d/cni"
  echo '{ "default": [ { "type": "insecureAcceptAnything" } ] }' > "$d/policy.json"
  { echo 'unqualified-search-registries = []'
    for addr in "$REG_ADDR" "$REG_AUTH_ADDR"; do printf '[[registry]]\nlocation = "%s"\ninsecure = true\n' "$addr"; done
  } > "$d/registries.conf"
  printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/root"\nrunroot = "%s/runroot"\n' "$d" "$d" > "$d/storage.conf"
  cat > "$d/crio.conf" <<EOF
# every path under $d, so that nothing of the host's CRI-O (or a second instance) is shared
[crio]
root = "$d/root"
runroot = "$d/runroot"
storage_driver = "overlay"
log_dir = "$d/logs"
version_file = "$d/run/version"
version_file_persist = "$d/lib/version"
clean_shutdown_file = "$d/lib/clean.shutdown"
internal_wipe = true
internal_repair = false

[crio.api]
listen = "$d/crio.sock"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
container_exits_dir = "$d/exits"
container_attach_socket_dir = "$d/attach"
namespaces_dir = "$d/ns"
pinns_path = "$BIN/pinns"
hooks_dir = ["$d/hooks.d"]
cdi_spec_dirs = ["$d/cdi"]
apparmor_profile = ""
selinux = false
seccomp_profile = ""
default_mounts_file = ""
irqbalance_config_file = ""
irqbalance_config_restore_file = "disable"
infra_ctr_cpuset = ""
drop_infra_ctr = true
enable_criu_support = false
# GetContainerEvents: false (CRI-O's default) ends the call at once with an empty, OK stream
enable_pod_events = $2
decryption_keys_path = "$d/keys"

[crio.runtime.runtimes.runc]
runtime_path = "$d/runc-oomclamp"
runtime_type = "oci"
runtime_root = "$d/oci/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

# CRI-O always adds a "crun" handler, whose start-up probe creates /run/crun: pointed at a missing
# binary, CRI-O drops it
[crio.runtime.runtimes.crun]
runtime_path = "$d/crun-disabled"
runtime_type = "oci"
runtime_root = "$d/oci/crun"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
namespaced_auth_dir = "$d/auth"
pause_image = "$REG_ADDR/test/pause:v1"
# "" runs the pause image's own entrypoint (ours is busybox sh), not /pause
pause_command = ""
# no signature policy file: with one, CRI-O refuses CreateContainer without user_specified_image
signature_policy = "$d/policy.json"
signature_policy_dir = "$d/policies"

[crio.network]
network_dir = "$d/cni"
plugin_dirs = ["/usr/lib/cni"]

[crio.nri]
enable_nri = false

[crio.metrics]
enable_metrics = false
EOF
}

start_runtime() { # $1 runtime: start its daemon (configs written on its first start)
  local rt=$1 sock pidf t0 pid
  sock=$(rt_socket "$rt"); pidf=$LAB/$rt.pid
  if alive "$pidf"; then log "$rt already running (pid $(cat "$pidf"))"; return; fi
  rm -f "$sock" "$sock.ttrpc"
  t0=$(now)
  case "$rt" in
    containerd)
      nohup containerd --config "$LAB/containerd.toml" >>"$LAB/logs/containerd.log" 2>&1 &
      ;;
    containerd2)
      [ -f "$LAB/containerd2/config.toml" ] || containerd2_config
      # the shim is found beside containerd, on the PATH
      PATH=$BIN:$PATH nohup "$BIN/containerd" --config "$LAB/containerd2/config.toml" \
        >>"$LAB/logs/containerd2.log" 2>&1 &
      ;;
    crio | crio-noevents)
      local d=$LAB/$rt
      if [ ! -f "$d/crio.conf" ]; then
        if [ "$rt" = crio ]; then crio_config crio true; else crio_config crio-noevents false; fi
      fi
      # registries only through the flags (CRI-O ignores CONTAINERS_REGISTRIES_CONF)
      CONTAINERS_STORAGE_CONF=$d/storage.conf PATH=$BIN:$PATH nohup "$BIN/crio" \
        --config "$d/crio.conf" --config-dir "$d/conf.d" \
        --registries-conf "$d/registries.conf" --registries-conf-dir "$d/registries.conf.d" \
        >>"$LAB/logs/$rt.log" 2>&1 &
      ;;
  esac
  pid=$!
  echo "$pid" > "$pidf"
  wait_ready "$rt" "$pid" || { log "$rt failed to start"; tail -20 "$LAB/logs/$rt.log"; exit 1; }
  log "$rt pid $pid: CRI up $(since "$t0")s after spawn on unix://$sock"
  if [ "$rt" = containerd ]; then
    "${CTR[@]}" plugins ls | awk '$2=="cri" || $2=="'"$SNAPSHOTTER"'" {print "plugin " $1 " " $2 " " $NF}' >&2
  fi
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
  local t0 rt; t0=$(now)
  for rt in $CRI_LAB_RUNTIMES; do rt_socket "$rt" >/dev/null; done
  write_configs
  hugetlb_mount
  unpack_runtimes &
  local unpack=$!
  start_registry
  start_auth_registry
  build_images
  wait "$unpack" || exit 1
  echo "$CRI_LAB_RUNTIMES" > "$LAB/runtimes"
  for rt in $CRI_LAB_RUNTIMES; do start_runtime "$rt"; done
  log "start done in $(since "$t0")s"
}

procs_matching() { # pids whose argv[0] basename starts with $1 and one of whose arguments is $2
  python3 - "$1" "$2" <<'EOF'
import os, sys
pre, arg = sys.argv[1], sys.argv[2]
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        a = open("/proc/%s/cmdline" % p, "rb").read().decode(errors="replace").split("\0")
    except OSError:
        continue
    if a and os.path.basename(a[0]).startswith(pre) and arg in a[1:]:
        print(p)
EOF
}

kill_pidfile() { # $1 pidfile $2 name [$3 signal]
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$pid"; then
    kill "-${3:-TERM}" "$pid"
    for _ in $(seq 1 200); do pid_alive "$pid" || break; sleep 0.05; done
    pid_alive "$pid" && kill -9 "$pid"
    log "stopped $2 (pid $pid, SIG${3:-TERM})"
  fi
  rm -f "$f"
}

oci_delete() { # $1 OCI runtime $2 its root (ours): delete every container left in it
  local id
  [ -d "$2" ] || return 0
  for id in $("$1" --root "$2" list -q 2>/dev/null); do
    "$1" --root "$2" delete -f "$id" >/dev/null 2>&1 && log "$(basename "$1") delete -f $id" || true
  done
}

stop_runtime_all() { # $1 runtime: the daemon, then what outlives it (shims / conmons, containers)
  local rt=$1 sock pid
  sock=$(rt_socket "$rt")
  kill_pidfile "$LAB/$rt.pid" "$rt"
  case "$rt" in
    containerd)
      oci_delete /usr/bin/runc "$LAB/containerd/runc-root/k8s.io"
      oci_delete /usr/bin/crun "$LAB/containerd/crun-root/k8s.io"
      ;;
    containerd2) oci_delete /usr/bin/runc "$LAB/containerd2/runc-root/k8s.io" ;;
    crio | crio-noevents) oci_delete /usr/bin/runc "$LAB/$rt/oci/runc" ;;
  esac
  # shims (containerd) and conmons (CRI-O) are daemonized and outlive their runtime: found by
  # an exact argument that is ours
  case "$rt" in
    crio | crio-noevents) for pid in $(procs_matching conmon "$LAB/$rt/exits"); do kill -9 "$pid" 2>/dev/null && log "killed leftover conmon $pid" || true; done ;;
    *) for pid in $(procs_matching containerd-shim "$sock"); do kill -9 "$pid" 2>/dev/null && log "killed leftover shim $pid" || true; done ;;
  esac
  rm -f "$sock" "$sock.ttrpc"
}

cmd_stop() {
  local rt
  for rt in containerd containerd2 crio crio-noevents; do
    if [ -f "$LAB/$rt.pid" ] || [ -S "$(rt_socket "$rt")" ]; then stop_runtime_all "$rt"; fi
  done
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
  [ "$C2_SHIMS" = "$LAB/c2s" ] || rm -rf "$C2_SHIMS"
}

cmd_clean() {
  cmd_stop
  rm -rf "${LAB:?}"/{containerd,containerd2,crio,crio-noevents,c2s,bin,registry,registry-auth,oci,stage,pods,logs,certs.d,cni,runtimes,seccomp}
  log "state removed"
}

cmd_bench_images() {
  # bench/img1..4:v1: the busybox base plus one 16 MiB layer of random bytes each, so every pull
  # moves real data and shares nothing but the base with the others
  # one at a time: e2e tests that call this run side by side (pull_dedup, pull_progress), and
  # two at once raced on the stage directory and the OCI layout. Each test pulls an image of
  # its own, so a later call remaking the others' images harms none (their blobs stay in the
  # registry; only this call's own image must be new to every runtime)
  local lock
  exec {lock}>"$LAB/bench-images.lock"
  flock "$lock"
  local t0; t0=$(now)
  local oci=$LAB/oci st=$LAB/stage-bench T=2000-01-01T00:00:00Z i
  [ -d "$oci" ] || { log "no OCI layout: run start first"; exit 1; }
  rm -rf "$st"; mkdir -p "$st"
  for i in $(seq 1 "${BENCH_IMAGES:-4}"); do
    head -c $((16 << 20)) /dev/urandom > "$st/blob$i"
    umoci insert --image "$oci:base" --tag "bench$i" --history.created=$T "$st/blob$i" /opt/blob
    umoci config --image "$oci:bench$i" --created=$T --no-history
    skopeo copy --quiet --dest-tls-verify=false "oci:$oci:bench$i" "docker://$REG_ADDR/bench/img$i:v1"
  done
  rm -rf "$st"
  log "bench images built+pushed in $(since "$t0")s"
}

cmd_status() {
  local f rt
  for f in "$LAB"/*.pid; do [ -f "$f" ] && echo "$(basename "$f" .pid): pid $(cat "$f") $(alive "$f" && echo alive || echo DEAD)"; done
  for rt in containerd containerd2 crio crio-noevents; do
    [ -S "$(rt_socket "$rt")" ] && echo "$rt: unix://$(rt_socket "$rt")"
  done
  return 0
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  clean) cmd_clean ;;
  status) cmd_status ;;
  socket) rt_socket "$CRI_LAB_RUNTIME" ;;
  unpack) unpack_runtimes ;;
  stop-runtime) kill_pidfile "$LAB/$CRI_LAB_RUNTIME.pid" "$CRI_LAB_RUNTIME" TERM ;;
  kill-runtime) kill_pidfile "$LAB/$CRI_LAB_RUNTIME.pid" "$CRI_LAB_RUNTIME" KILL ;;
  start-runtime) start_runtime "$CRI_LAB_RUNTIME" ;;
  bench-images) cmd_bench_images ;;
  *) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 2 ;;
esac
