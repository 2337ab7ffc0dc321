//! kruised as a drop-in for kruise-daemon, on the doubles: the binary run as `kruise-daemon`
//! with exactly the arguments of kruise's Helm chart 1.9 and its RBAC, the runtime found under
//! a `/hostvarrun`-like directory; the manifests that ship it (`deploy/`, and the swap overlay
//! over the chart's DaemonSet) checked against what the binary accepts; and NodeImage spoken at
//! `v1beta1`, as kruise 1.9's CRDs serve it. What the cluster layer proved on a real cluster
//! (`tests/cluster/dropin.rs`, `ship.rs`, `imagepull.rs`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::cluster::Rbac;
use crate::support::daemon::{Daemon, free_addr, kruised_bin};
use crate::support::node::{FakeNode, NODE};
use crate::support::pull::{CONFIG_NS, create_secret};
use crate::support::rbac::{assert_never_forbidden, assert_nothing_refused, identity_on_double};
use clap::Parser as _;
use kruised::cmd::expand_multicall;
use kruised::config::DaemonConfig;
use kruised::cri::endpoint::{KRUISE_HOST_RUN_DIR, WELL_KNOWN_SOCKETS};
use kruised::cri::{Endpoint, EndpointSource};
use kruised::k8s::crd::NodeImage;
use kruised::{Cli, Command};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

/// The arguments kruise's chart (`templates/manager.yaml`, 1.9) gives the daemon container,
/// with the gates of an install that enabled image pull jobs: `tests/cluster/dropin.rs`'s
/// `CHART_ARGS`, which ran on the real cluster.
const CHART_ARGS: [&str; 7] = [
    "--logtostderr=true",
    "--v=4",
    "--addr=:10221",
    "--feature-gates=ImagePullJobGate=true,ForceDeleteTimeoutExpectationGate=true",
    "--socket-file=",
    "--enable-pprof=true",
    "--pprof-addr=localhost:10222",
];

/// Seen on the cluster layer (`tests/cluster/dropin.rs`, kube-apiserver v1.36.2 with RBAC on,
/// containerd 2.3 under a `/hostvarrun`-like directory): kruise's chart runs kruised as
/// `/kruise-daemon` with its own arguments and RBAC, and it becomes ready.
#[tokio::test]
async fn run_as_kruise_daemon_with_the_charts_arguments_and_rbac_it_becomes_ready_and_finds_the_runtime()
 {
    let mut node = FakeNode::start().await;
    let identity = identity_on_double(&node.api, Rbac::KruiseChart, node.dir.path());
    // the image's /kruise-daemon is kruised under another name
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("kruise-daemon");
    std::os::unix::fs::symlink(kruised_bin(), &exe).unwrap();
    // the chart mounts the host's /var/run at /hostvarrun; here a directory like it, with the
    // fake runtime's socket where containerd keeps its own
    let hostvarrun = dir.path().join("hostvarrun");
    std::fs::create_dir_all(hostvarrun.join("containerd")).unwrap();
    std::os::unix::fs::symlink(
        node.dir.path().join("cri.sock"),
        hostvarrun.join("containerd/containerd.sock"),
    )
    .unwrap();
    // the chart's arguments as they are, but for the port: `:10221` on a free one (the systemd
    // layer's kruised holds 10221 on this machine while the suite runs)
    let addr = format!("--addr=127.0.0.1:{}", free_addr().port());
    let args: Vec<&str> = CHART_ARGS
        .iter()
        .map(|a| {
            if a.starts_with("--addr=") {
                addr.as_str()
            } else {
                a
            }
        })
        .collect();
    let mut d = Daemon::start_exe(
        &exe,
        &args,
        &[
            ("NODE_NAME", NODE),
            ("KUBECONFIG", identity.kubeconfig.to_str().unwrap()),
            ("KRUISED_HOST_RUN_DIR", hostvarrun.to_str().unwrap()),
            ("KRUISED_LOG_FORMAT", "json"),
        ],
    );
    d.wait_for_log("daemon ready", LIMIT).await;
    let ignored = d.wait_for_log("no effect here", LIMIT).await["ignored"].to_string();
    for flag in ["--enable-pprof", "--pprof-addr", "--v", "--logtostderr"] {
        assert!(
            ignored.contains(&format!("\\\"{flag}\\\"")),
            "{flag} named in {ignored}"
        );
    }
    for flag in ["--addr", "--socket-file", "--feature-gates"] {
        assert!(!ignored.contains(flag), "{flag} has an effect: {ignored}");
    }
    let found = d.wait_for_log("found container runtime", LIMIT).await;
    let endpoint = found["endpoint"].as_str().unwrap_or_default();
    assert_eq!(
        endpoint,
        format!(
            "unix://{}",
            hostvarrun.join("containerd/containerd.sock").display()
        ),
        "the runtime found where containerd keeps its socket under the host run directory"
    );
    // the work, as the chart's identity: an env restart and a pull with a secret
    crate::rbac::env_restart(&mut node).await;
    crate::rbac::pull_with_secret(&node).await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
    assert_nothing_refused(&node.api);
    assert_never_forbidden(&d);
}

// === the manifests that ship ===

fn read(path: &str) -> String {
    let full = concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + path;
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {full}: {e}"))
}

fn docs(path: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(&read(path))
        .unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
        .into_iter()
        .filter(Value::is_object)
        .collect()
}

fn daemonset(path: &str) -> Value {
    let mut sets: Vec<Value> = docs(path)
        .into_iter()
        .filter(|d| d["kind"] == "DaemonSet")
        .collect();
    assert_eq!(sets.len(), 1, "one DaemonSet in {path}");
    sets.remove(0)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

/// What the kubelet gives the container's environment: literal values, and the downward API's
/// `spec.nodeName` (`node-a`) and `status.podIP` (`pod_ip`). Any other source fails the test:
/// a new one needs a value here.
fn container_env(container: &Value, pod_ip: &str) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let name = e["name"].as_str().expect("an env name").to_string();
            let value = match (
                e["value"].as_str(),
                e.pointer("/valueFrom/fieldRef/fieldPath"),
            ) {
                (Some(v), _) => v.to_string(),
                (None, Some(f)) if f == "spec.nodeName" => "node-a".into(),
                (None, Some(f)) if f == "status.podIP" => pod_ip.into(),
                // the node's IP: the test's node is this machine's loopback
                (None, Some(f)) if f == "status.hostIP" => "127.0.0.1".into(),
                _ => panic!("no value for the env entry {e}"),
            };
            (name, value)
        })
        .collect()
}

/// `arg` with its `$(NAME)` references replaced as the kubelet does for `args`: a name in
/// `env` by its value, any other reference kept as written, `$$` as a literal `$`.
fn expand(arg: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = rest
            .strip_prefix("$(")
            .and_then(|r| r.split_once(')'))
            .and_then(|(name, after)| env.iter().find(|(n, _)| n == name).map(|(_, v)| (v, after)))
        {
            out.push_str(name);
            rest = after;
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    out
}

/// The kubelet's expansion of `args` (k8s.io/kubernetes `third_party/forked/golang/expansion`,
/// as the Pod API documents it for `args`): `$(VAR)` of a defined name, `$$` escapes.
#[test]
fn env_references_in_args_expand_as_the_kubelet_expands_them() {
    let env = [("POD_IP".to_string(), "10.0.0.7".to_string())];
    assert_eq!(expand("--addr=[$(POD_IP)]:1", &env), "--addr=[10.0.0.7]:1");
    assert_eq!(expand("$(NOPE) $$(POD_IP) $", &env), "$(NOPE) $(POD_IP) $");
}

/// The container's command line parsed as the binary parses it (`argv` starts with the name
/// the binary runs under), after the kubelet's expansion of `$(VAR)` with the container's env on
/// a pod whose IP is `pod_ip`, resolved with the node name the downward API gives (checked to be
/// `NODE_NAME` from `spec.nodeName`); and the directory where the host's run directory (or the
/// runtime's part of it) must be mounted for it: `--host-run-dir`, else kruise's
/// `/hostvarrun`, which kruised looks in first when it exists.
fn resolve(container: &Value, argv: Vec<String>, pod_ip: &str) -> (DaemonConfig, PathBuf) {
    let env = container["env"].as_array().expect("env");
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "NODE_NAME from the downward API: {env:?}"
    );
    let values = container_env(container, pod_ip);
    let argv: Vec<String> = argv.iter().map(|a| expand(a, &values)).collect();
    let argv = expand_multicall(argv.into_iter().map(Into::into).collect());
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("the arguments parse: {e}"));
    let Command::Run(mut run) = cli.command else {
        panic!("the container runs the daemon")
    };
    run.node_name = Some("node-a".into());
    let config = run
        .resolve()
        .unwrap_or_else(|e| panic!("the arguments resolve: {e}"));
    let EndpointSource::Detect { host_run_dirs } = &config.runtime.source else {
        panic!(
            "the runtime is detected, as the chart's daemon does it: {:?}",
            config.runtime.source
        )
    };
    let dir = run
        .runtime
        .host_run_dir
        .clone()
        .unwrap_or_else(|| KRUISE_HOST_RUN_DIR.into());
    assert!(
        host_run_dirs.contains(&dir) || !Path::new(KRUISE_HOST_RUN_DIR).is_dir(),
        "detection looks in {}: {host_run_dirs:?}",
        dir.display()
    );
    (config, dir)
}

/// The port a probe or named port refers to, by number or by the container's port name.
fn port_of(container: &Value, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return u16::try_from(n).expect("a port");
    }
    let name = port.as_str().expect("a port number or name");
    container["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .and_then(|p| p["containerPort"].as_u64())
        .map(|n| u16::try_from(n).expect("a port"))
        .unwrap_or_else(|| panic!("no port named {name}"))
}

/// The admin port answers both probes on kruised's paths, at the pod's address (no `host`: the
/// kubelet probes the pod's IP, which is where `--addr` must listen).
fn assert_probes(pod: &Value, config: &DaemonConfig) {
    let c = &pod["containers"][0];
    let live = &c["livenessProbe"]["httpGet"];
    let ready = &c["readinessProbe"]["httpGet"];
    assert_eq!(live["path"], kruised::admin::HEALTHZ_PATH);
    assert_eq!(ready["path"], kruised::admin::READYZ_PATH);
    for probe in [live, ready] {
        assert_eq!(
            port_of(c, &probe["port"]),
            config.addr.port(),
            "the probes reach --addr"
        );
        assert!(probe.get("host").is_none(), "the probes target the pod IP");
    }
}

/// A host mount of the container: where, from which host path, of which hostPath type
/// (`""` when unset), read-only or not.
#[derive(Debug)]
struct HostMount {
    mount_path: PathBuf,
    host_path: PathBuf,
    kind: String,
    read_only: bool,
}

/// Every hostPath volume of `pod`, where its first container mounts it.
fn host_mounts(pod: &Value) -> Vec<HostMount> {
    let c = &pod["containers"][0];
    let mounts = c["volumeMounts"].as_array().expect("volumeMounts");
    pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| {
            let m = mounts
                .iter()
                .find(|m| m["name"] == v["name"])
                .unwrap_or_else(|| panic!("the volume {} is mounted", v["name"]));
            HostMount {
                mount_path: m["mountPath"].as_str().expect("mountPath").into(),
                host_path: v["hostPath"]["path"].as_str().expect("path").into(),
                kind: v["hostPath"]["type"].as_str().unwrap_or("").into(),
                read_only: m["readOnly"] == true,
            }
        })
        .collect()
}

/// Seen on the cluster layer (`tests/cluster/ship.rs`, `kubectl apply -k deploy/` on
/// kube-apiserver and kubelet v1.36.2): the pod became Ready on `/readyz` and found the runtime
/// under `/hostvarrun`. The lab patches the address (host network, a free port) and the mounted
/// host directory (its containerd's socket directory); the pod-IP address and containerd's
/// `/var/run/containerd` are the issue's fix ("flood the admin port", "all of the host's
/// `/var/run`") and checked here against what the binary does with them.
#[test]
fn deploy_runs_kruised_run_on_the_pod_ip_with_probes_on_its_admin_port_and_only_the_runtimes_socket_directory_and_an_image_fs_directory_mounted()
 {
    let k = &docs("deploy/kustomization.yaml")[0];
    let resources = strings(&k["resources"]);
    for r in [
        "namespace.yaml",
        "rbac.yaml",
        "daemonset.yaml",
        "networkpolicy.yaml",
    ] {
        assert!(resources.iter().any(|x| x == r), "{r} in {resources:?}");
    }
    for r in &resources {
        read(&format!("deploy/{r}"));
    }
    let ds = daemonset("deploy/daemonset.yaml");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert!(
        k["images"]
            .as_array()
            .expect("images")
            .iter()
            .any(|i| i["name"] == c["image"]),
        "the kustomization sets the container's image {}",
        c["image"]
    );
    assert!(
        c.get("command").is_none(),
        "the image's entrypoint is kruised"
    );
    let mut argv = vec!["kruised".to_string()];
    argv.extend(strings(&c["args"]));
    // the admin server listens on the pod's IP, of either family, and nowhere else
    let mut run_dir = PathBuf::new();
    let mut image_fs = None;
    for pod_ip in ["10.244.1.7", "fd00:10:244::7"] {
        let (config, dir) = resolve(c, argv.clone(), pod_ip);
        image_fs = config.image_fs_path.clone();
        assert_eq!(
            config.addr.ip(),
            pod_ip.parse::<IpAddr>().expect("an IP"),
            "--addr is the pod's IP {pod_ip}"
        );
        assert_probes(pod, &config);
        run_dir = dir;
    }

    // of the host's /var/run, only runtime socket directories, read-only, at the same place
    // under the run directory, never created on the host
    let mut mounts = host_mounts(pod);
    // and one directory on the image filesystem, for the size admission's statvfs only (issue
    // 42): containerd's ingest directory, read-only, never created on the host
    let image_fs = image_fs.expect("--image-fs-path is set");
    let at = mounts
        .iter()
        .position(|m| m.mount_path == image_fs)
        .unwrap_or_else(|| {
            panic!(
                "--image-fs-path {} is a mount: {mounts:?}",
                image_fs.display()
            )
        });
    let m = mounts.remove(at);
    assert_eq!(
        m.host_path,
        Path::new("/var/lib/containerd/io.containerd.content.v1.content/ingest"),
        "{m:?}: not the snapshots (the pods' root filesystems)"
    );
    assert_eq!(m.kind, "Directory", "{m:?}: never created on the host");
    assert!(m.read_only, "{m:?}");
    assert!(!mounts.is_empty(), "a runtime socket directory is mounted");
    let socket_dirs: Vec<&Path> = WELL_KNOWN_SOCKETS
        .iter()
        .filter_map(|(rel, _)| Path::new(rel).parent())
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    for m in &mounts {
        let rel = m
            .mount_path
            .strip_prefix(&run_dir)
            .unwrap_or_else(|_| panic!("{m:?} is under {}", run_dir.display()));
        assert!(
            socket_dirs.contains(&rel),
            "{m:?}: a well-known socket's directory ({socket_dirs:?}), not more"
        );
        assert_eq!(m.host_path, Path::new("/var/run").join(rel), "{m:?}");
        assert_eq!(m.kind, "Directory", "{m:?}: never created on the host");
        assert!(m.read_only, "{m:?}");
    }

    // on a node with only containerd (and docker.sock, dbus and systemd beside it), detection
    // through those mounts finds containerd's socket and nothing else is there
    let node = tempfile::tempdir().expect("tempdir");
    let host = node.path().join("host-var-run");
    for f in [
        "containerd/containerd.sock",
        "docker.sock",
        "dbus/system_bus_socket",
        "systemd/private",
    ] {
        let path = host.join(f);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, b"").expect("a socket stand-in");
    }
    let seen = node.path().join("container-run-dir");
    for m in &mounts {
        let from = host.join(
            m.host_path
                .strip_prefix("/var/run")
                .expect("under /var/run"),
        );
        if from.is_dir() {
            let at = seen.join(m.mount_path.strip_prefix(&run_dir).expect("under run_dir"));
            std::fs::create_dir_all(at.parent().expect("a parent")).expect("mkdir");
            std::os::unix::fs::symlink(&from, &at).expect("mount stand-in");
        }
    }
    let found = EndpointSource::Detect {
        host_run_dirs: vec![seen.clone()],
    }
    .candidates();
    assert_eq!(
        found,
        vec![Endpoint::unix(seen.join("containerd/containerd.sock"))]
    );
    for f in ["docker.sock", "dbus", "systemd"] {
        assert!(!seen.join(f).exists(), "{f} is out of reach");
    }

    // the DaemonSet's pods run as the ServiceAccount deploy/rbac.yaml binds
    let sa = pod["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let rbac = docs("deploy/rbac.yaml");
    assert!(rbac.iter().any(|d| d["kind"] == "ServiceAccount"
        && d["metadata"]["name"] == sa
        && d["metadata"]["namespace"] == ds["metadata"]["namespace"]));
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
}

/// NetworkPolicy as kube-apiserver v1.36.2 serves it (`networking.k8s.io/v1`): a policy selects
/// pods in its namespace by labels; once one with `Ingress` selects a pod, only what some rule
/// admits gets in (traffic from the pod's own node always does, so the kubelet's probes need no
/// rule); a rule without `ports` admits every port and one without `from` every source.
#[test]
fn deploy_ships_a_network_policy_that_selects_kruiseds_pods_and_admits_only_named_peers_to_the_admin_port()
 {
    let ds = daemonset("deploy/daemonset.yaml");
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut argv = vec!["kruised".to_string()];
    argv.extend(strings(&c["args"]));
    let (config, _) = resolve(c, argv, "10.244.1.7");

    let policies: Vec<Value> = docs("deploy/networkpolicy.yaml")
        .into_iter()
        .filter(|d| d["kind"] == "NetworkPolicy")
        .collect();
    assert_eq!(policies.len(), 1, "one NetworkPolicy");
    let np = &policies[0];
    assert_eq!(np["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(np["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let selector = &np["spec"]["podSelector"];
    assert!(
        selector.get("matchExpressions").is_none(),
        "labels only: {selector}"
    );
    let wanted = selector["matchLabels"]
        .as_object()
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| panic!("selects by labels, not every pod: {selector}"));
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in wanted {
        assert_eq!(&labels[k], v, "the DaemonSet's pods carry {k}={v}");
    }
    assert_eq!(
        strings(&np["spec"]["policyTypes"]),
        ["Ingress"],
        "ingress only: kruised reaches the API server and pods' hooks"
    );
    let rules = np["spec"]["ingress"].as_array().expect("ingress rules");
    assert!(!rules.is_empty(), "a rule for the metrics scraper");
    for rule in rules {
        let ports = rule["ports"]
            .as_array()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| panic!("a rule without ports admits every port: {rule}"));
        for p in ports {
            assert_eq!(p.get("protocol").unwrap_or(&json!("TCP")), "TCP", "{p}");
            assert_eq!(
                port_of(c, &p["port"]),
                config.addr.port(),
                "the admin port only: {p}"
            );
            assert!(p.get("endPort").is_none(), "{p}");
        }
        let from = rule["from"]
            .as_array()
            .filter(|f| !f.is_empty())
            .unwrap_or_else(|| panic!("a rule without from admits every source: {rule}"));
        for peer in from {
            assert!(peer.get("ipBlock").is_none(), "named peers only: {peer}");
            for s in ["namespaceSelector", "podSelector"] {
                let s = peer.get(s).unwrap_or_else(|| {
                    panic!(
                        "no {s}: the peer admits every pod of a namespace, or of every \
                         namespace: {peer}"
                    )
                });
                assert!(
                    s["matchLabels"].as_object().is_some_and(|l| !l.is_empty()),
                    "an empty selector selects everything: {peer}"
                );
            }
        }
    }
}

/// Seen on the cluster layer (`tests/cluster/ship.rs`, the overlay applied over the chart's
/// objects on kube-apiserver v1.36.2): the chart's DaemonSet kept its name, ServiceAccount,
/// container and command, and its pod became Ready running kruised. It keeps the chart's
/// host network, `:10221` and whole `/var/run` too (what `deploy/` narrows; docs/security.md).
/// The overlay is a strategic-merge patch of the chart's DaemonSet (tests/integration/swap.rs
/// sends it with kubectl); merged here by the API-server double's strategic merge.
#[test]
fn the_swap_overlay_keeps_the_charts_daemonset_and_runs_kruised_as_kruise_daemon() {
    let k = &docs("deploy/overlays/swap-kruise-daemon/kustomization.yaml")[0];
    assert_eq!(strings(&k["resources"]), ["patch.yaml"]);
    let chart = daemonset("tests/fixtures/kruise-chart/daemon.yaml");
    let mut ours = chart.clone();
    apiserver_double::strategic_merge(
        &mut ours,
        &daemonset("deploy/overlays/swap-kruise-daemon/patch.yaml"),
    )
    .expect("patch.yaml is a strategic-merge patch");
    for path in [
        "/metadata/name",
        "/metadata/namespace",
        "/metadata/labels",
        "/spec/selector",
        "/spec/template/metadata/labels",
        "/spec/template/spec/serviceAccountName",
        "/spec/template/spec/hostNetwork",
        "/spec/template/spec/containers/0/name",
        "/spec/template/spec/containers/0/command",
        "/spec/template/spec/containers/0/args",
        "/spec/template/spec/containers/0/livenessProbe/httpGet",
        "/spec/template/spec/containers/0/volumeMounts",
        "/spec/template/spec/volumes",
    ] {
        assert_eq!(
            ours.pointer(path),
            chart.pointer(path),
            "{path} as in kruise's chart"
        );
    }
    let pod = &ours["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(strings(&c["command"]), ["/kruise-daemon"]);
    assert!(
        k["images"]
            .as_array()
            .expect("images")
            .iter()
            .any(|i| i["name"] == c["image"]),
        "the kustomization sets the container's image"
    );
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    let (config, run_dir) = resolve(c, argv, "192.0.2.10");
    assert_probes(pod, &config);
    assert!(
        config.addr.ip().is_unspecified(),
        "the chart's :10221, every address"
    );
    let mounts = host_mounts(pod);
    assert!(
        mounts.iter().any(|m| m.mount_path == run_dir
            && m.host_path == Path::new("/var/run")
            && m.read_only),
        "the chart's whole /var/run at {}, read-only here: {mounts:?}",
        run_dir.display()
    );
    for flag in ["--enable-pprof", "--pprof-addr", "--v", "--logtostderr"] {
        assert!(
            config.ignored.iter().any(|i| i == flag),
            "{flag} is named as having no effect: {:?}",
            config.ignored
        );
    }
}

// === NodeImage at v1beta1 ===

/// Seen on the cluster layer (`tests/cluster/imagepull.rs`: kube-apiserver v1.36.2 with
/// openkruise/kruise@07169cf's CRDs, NodeImage served at v1beta1 and v1alpha1 without a
/// conversion webhook): kruised discovers v1beta1, speaks it for NodeImage, and a field only
/// v1beta1 has (`pullSecrets[].mode`) survives its status writes, where a v1alpha1 write would
/// prune it (tests/apiserver/CONFORMANCE.md, "Custom resources").
#[tokio::test]
async fn nodeimages_are_read_and_written_at_v1beta1_and_a_v1beta1_only_field_survives_the_status_writes()
 {
    let node = FakeNode::start().await;
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    let discovered = d.wait_for_log("using apps.kruise.io/v1beta1", LIMIT).await;
    assert!(
        discovered["v1beta1"]
            .as_str()
            .is_some_and(|v| v.contains("\"nodeimages\"")),
        "NodeImage is among the v1beta1 resources: {discovered}"
    );
    d.wait_for_log("daemon ready", LIMIT).await;
    create_secret(&node.api, "regcred", None, "r.io", "robot", "pw");
    node.api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                   "metadata": {"name": NODE},
                   "spec": {"images": {"r.io/app": {
                       "pullSecrets": [{"namespace": CONFIG_NS, "name": "regcred", "mode": "batch"}],
                       "tags": [{"tag": "v1", "version": 1}, {"tag": "v2", "version": 1}]}}}}),
        )
        .unwrap();
    let done = node
        .api
        .wait_for_value(LIMIT, |v| {
            let obj = v.get("nodeimages", "", NODE)?;
            let ni: NodeImage = serde_json::from_value(obj.clone()).ok()?;
            ni.status
                .as_ref()
                .is_some_and(|s| s.succeeded == 2)
                .then_some(obj)
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "both tags pulled: {:#?}",
                node.api.get("nodeimages", "", NODE)
            )
        });
    assert_eq!(
        done.pointer("/spec/images/r.io~1app/pullSecrets/0/mode"),
        Some(&json!("batch")),
        "mode kept in storage after kruised's status writes: {done:#}"
    );
    let requests = node.api.requests();
    let nodeimages: Vec<_> = requests
        .iter()
        .filter(|r| r.resource.starts_with("nodeimages"))
        .collect();
    assert!(
        nodeimages.iter().any(|r| r.resource == "nodeimages/status"),
        "kruised wrote the status"
    );
    let elsewhere: Vec<&String> = nodeimages
        .iter()
        .filter(|r| {
            !r.path
                .starts_with("/apis/apps.kruise.io/v1beta1/nodeimages")
        })
        .map(|r| &r.path)
        .collect();
    assert!(
        elsewhere.is_empty(),
        "every NodeImage request at v1beta1: {elsewhere:?}"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
