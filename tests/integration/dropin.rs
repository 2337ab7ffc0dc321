//! kruised as a drop-in for kruise-daemon, on the doubles: the binary run as `kruise-daemon`
//! with exactly the arguments of kruise's Helm chart 1.9 and its RBAC, the runtime found under
//! a `/hostvarrun`-like directory; the manifests that ship it (`deploy/`, and the swap overlay
//! over the chart's DaemonSet) checked against what the binary accepts; and NodeImage spoken at
//! `v1beta1`, as kruise 1.9's CRDs serve it. What the cluster layer proved on a real cluster
//! (`tests/cluster/dropin.rs`, `ship.rs`, `imagepull.rs`).

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
use kruised::cri::EndpointSource;
use kruised::cri::endpoint::KRUISE_HOST_RUN_DIR;
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

/// The container's command line parsed as the binary parses it (`argv` starts with the name
/// the binary runs under), resolved with the node name the downward API gives (checked to be
/// `NODE_NAME` from `spec.nodeName`); and the directory where the host's `/var/run` must be
/// mounted for it: `--host-run-dir`, else kruise's `/hostvarrun`, which kruised looks in first
/// when it exists.
fn resolve(container: &Value, argv: Vec<String>) -> (DaemonConfig, PathBuf) {
    let env = container["env"].as_array().expect("env");
    assert!(
        env.iter().any(|e| e["name"] == "NODE_NAME"
            && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "NODE_NAME from the downward API: {env:?}"
    );
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

/// The admin port answers both probes on kruised's paths, and the host's `/var/run` is mounted
/// where the runtime is looked for (`run_dir`).
fn assert_probes_and_socket_directory(pod: &Value, config: &DaemonConfig, run_dir: &Path) {
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
    }
    let mount = c["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .find(|m| run_dir.to_str() == m["mountPath"].as_str())
        .unwrap_or_else(|| panic!("{} is mounted: {}", run_dir.display(), c["volumeMounts"]));
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the mount's volume");
    assert_eq!(
        volume["hostPath"]["path"], "/var/run",
        "the host's /var/run, where the runtimes keep their sockets"
    );
}

/// Seen on the cluster layer (`tests/cluster/ship.rs`, `kubectl apply -k deploy/` on
/// kube-apiserver and kubelet v1.36.2): the pod became Ready on `/readyz` and found the runtime
/// in the mounted `/var/run`.
#[test]
fn deploy_runs_kruised_run_with_arguments_it_accepts_probes_on_its_admin_port_and_the_host_run_dir_mounted()
 {
    let k = &docs("deploy/kustomization.yaml")[0];
    let resources = strings(&k["resources"]);
    for r in ["namespace.yaml", "rbac.yaml", "daemonset.yaml"] {
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
    let (config, run_dir) = resolve(c, argv);
    assert_probes_and_socket_directory(pod, &config, &run_dir);
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

/// Seen on the cluster layer (`tests/cluster/ship.rs`, the overlay applied over the chart's
/// objects on kube-apiserver v1.36.2): the chart's DaemonSet kept its name, ServiceAccount,
/// container and command, and its pod became Ready running kruised.
#[test]
fn the_swap_overlay_keeps_the_charts_daemonset_and_runs_kruised_as_kruise_daemon() {
    let k = &docs("deploy/overlays/swap-kruise-daemon/kustomization.yaml")[0];
    assert_eq!(strings(&k["resources"]), ["daemonset.yaml"]);
    let ours = daemonset("deploy/overlays/swap-kruise-daemon/daemonset.yaml");
    let chart = daemonset("tests/fixtures/kruise-chart/daemon.yaml");
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
    let (config, run_dir) = resolve(c, argv);
    assert_probes_and_socket_directory(pod, &config, &run_dir);
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
    create_secret(&node.api, "regcred", "r.io", "robot", "pw");
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
