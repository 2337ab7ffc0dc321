//! A fleet of simulated nodes against one API server, for the fleet benchmark
//! (`benches/fleet.rs`): a real one (`tests/fleet-lab.sh`: etcd and kube-apiserver, nothing else)
//! where the Kubernetes binaries are provided, else the API-server double.
//!
//! - [`FleetLab`]: the control plane, its identities (one token a node and daemon kind, so the
//!   audit log, or the double's request log, tells every daemon's requests apart), the requests
//!   by daemon, and its processes' cost (the real one's only).
//! - [`SimNode`] and [`Kubelets`]: each node a Node object and a CRI server of its own (the fake
//!   runtime on a unix socket, where a DaemonSet would find the node's runtime), and the
//!   kubelet's part of every node in one task, the tests' one kubelet through CRI
//!   ([`crate::kubelet::run`], the demo's kubelet too): it watches the pods once for all nodes,
//!   as its own user (`fleet-kubelet`), whose requests the figures leave out.
//! - [`FleetDaemon`]: kruised or kruise-daemon for one node, run as its DaemonSet runs it
//!   (`NODE_NAME`, the node's runtime under its host run directory, its RBAC), its log in a
//!   file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::fake::FakeRuntime;
use kruised::cri::{RemoteRuntime, Timeouts};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::client_from;
use crate::daemon::{ByMapping, Resident};
use crate::kubelet::Kubelet;
use crate::kubelet::run::{NodeKubelet, NodeKubelets};

/// The namespace of the fleet's pods.
pub const NAMESPACE: &str = "fleet";

/// The two node daemons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// OpenKruise's kruise-daemon.
    KruiseDaemon,
    /// This project's daemon.
    Kruised,
}

impl Kind {
    /// The user name prefix (and token prefix) of its identities.
    pub fn user(self) -> &'static str {
        match self {
            Kind::KruiseDaemon => "kruise-daemon",
            Kind::Kruised => "kruised",
        }
    }
}

/// The fleet's control plane: a real kube-apiserver and etcd (`tests/fleet-lab.sh`) where the
/// Kubernetes binaries are provided, else the API-server double in this process, with the same
/// identities and RBAC (the double authenticates the same tokens and authorizes with the same
/// roles and bindings).
pub struct FleetLab {
    /// Its state directory (kubeconfigs, daemons' logs).
    pub dir: PathBuf,
    /// The admin's client.
    pub admin: Client,
    /// The simulated kubelets' client.
    pub kubelet: Client,
    salt: String,
    plane: Plane,
    /// The lab's ports start here (`FLEET_LAB_PORT_BASE`); the daemons' admin ports follow.
    port_base: u16,
}

/// Which API server the fleet talks to.
enum Plane {
    /// `tests/fleet-lab.sh`: kube-apiserver and etcd, with an audit log.
    Real { script: PathBuf },
    /// The API-server double; its request log stands in for the audit log.
    Double { api: apiserver_double::Handle },
}

/// A point in the API server's record of requests (from which [`FleetLab::counts`] sums).
#[derive(Clone, Debug)]
pub enum Mark {
    /// A byte offset in the audit log.
    Audit(u64),
    /// The double's counts by (user, verb, resource) then.
    Double(BTreeMap<(String, String, String), u64>),
}

/// What the lab's Kubernetes binaries are: `KRUISED_KUBE_ASSETS` holding kube-apiserver, etcd
/// and kubectl.
fn kube_assets() -> Option<PathBuf> {
    let dir = std::env::var_os("KRUISED_KUBE_ASSETS").map(PathBuf::from)?;
    ["kube-apiserver", "etcd", "kubectl"]
        .iter()
        .all(|b| dir.join(b).is_file())
        .then_some(dir)
}

/// What a process has cost so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcUsage {
    /// User and system CPU time.
    pub cpu: Duration,
    /// Resident memory, all of it and by kind.
    pub rss: Resident,
}

impl FleetLab {
    /// Starts the lab under `dir`: `tests/fleet-lab.sh start` where the Kubernetes binaries are
    /// provided (`KRUISED_KUBE_ASSETS`), else the API-server double.
    pub async fn start(dir: &Path) -> FleetLab {
        let (salt, plane) = match kube_assets() {
            Some(assets) => Self::start_real(dir, &assets).await,
            None => {
                eprintln!(
                    "fleet: on the API-server double (no kube-apiserver, etcd and kubectl in \
                     KRUISED_KUBE_ASSETS): request counts from its log, no API-server CPU"
                );
                Self::start_double(dir).await
            }
        };
        FleetLab {
            port_base: crate::env_or("FLEET_LAB_PORT_BASE", 18000),
            dir: dir.to_path_buf(),
            admin: client_from(&dir.join("kubeconfig")).await,
            kubelet: client_from(&dir.join("kubelet.kubeconfig")).await,
            salt,
            plane,
        }
    }

    /// Whether the fleet runs on the API-server double.
    pub fn on_double(&self) -> bool {
        matches!(self.plane, Plane::Double { .. })
    }

    /// `tests/fleet-lab.sh start`: the token salt and the plane.
    async fn start_real(dir: &Path, assets: &Path) -> (String, Plane) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let script = root.join("tests/fleet-lab.sh");
        let status = tokio::process::Command::new("bash")
            .arg(&script)
            .arg("start")
            .env("FLEET_LAB", dir)
            .env("KRUISED_KUBE_ASSETS", assets)
            .status()
            .await
            .expect("run tests/fleet-lab.sh");
        assert!(status.success(), "tests/fleet-lab.sh start failed");
        let salt = std::fs::read_to_string(dir.join("token-salt")).expect("token salt");
        (salt.trim().to_string(), Plane::Real { script })
    }

    /// The double with fleet-lab.sh's identities (tokens `<who>-<salt>`; the daemons' users
    /// `kruised:n<i>` and `kruise-daemon:n<i>` in groups `fleet:kruised` and
    /// `fleet:kruise-daemon`) and RBAC (deploy/rbac.yaml's roles and the chart's, bound to
    /// those groups), kruise's kinds and the test workload's, and its kubeconfigs as
    /// fleet-lab.sh writes them: the token salt and the plane. It serves TLS with HTTP/2, as
    /// kube-apiserver does, so a daemon's TLS and HTTP/2 code runs (and is resident) as on a
    /// cluster.
    async fn start_double(dir: &Path) -> (String, Plane) {
        use apiserver_double::{Config, KindInfo, UserInfo};
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        // the double in this process guards nothing: a salt only tells its tokens apart
        let salt = format!("{:016x}", std::process::id());
        let mut tokens = BTreeMap::new();
        tokens.insert(
            format!("admin-{salt}"),
            UserInfo::new("fleet-admin", &["system:masters"]),
        );
        tokens.insert(
            format!("kubelet-{salt}"),
            UserInfo::new("fleet-kubelet", &["system:masters"]),
        );
        // the nodes whose daemons the lab has identities for
        for i in 0..crate::env_or("FLEET_LAB_MAX_NODES", 500) {
            for kind in [Kind::Kruised, Kind::KruiseDaemon] {
                let group = format!("fleet:{}", kind.user());
                tokens.insert(
                    format!("{}-n{i}-{salt}", kind.user()),
                    UserInfo::new(&format!("{}:n{i}", kind.user()), &[&group]),
                );
            }
        }
        let mut config = Config {
            tokens: Some(tokens),
            rbac: true,
            tls: Some(apiserver_double::Tls::test_ca()),
            ..Config::default()
        };
        config.kinds.push(KindInfo::custom(
            kruised::k8s::keys::KRUISE_GROUP,
            "v1alpha1",
            "testworkloads",
            "TestWorkload",
            true,
        ));
        let api = apiserver_double::ApiServer::start_with(config)
            .await
            .expect("start the API-server double");
        let control = api.control();
        for file in [
            "deploy/namespace.yaml",
            "deploy/rbac.yaml",
            "tests/fixtures/kruise-chart/rbac.yaml",
            "tests/fixtures/fleet-bindings.yaml",
        ] {
            let yaml = std::fs::read_to_string(root.join(file)).expect(file);
            control
                .apply_manifests(&yaml)
                .unwrap_or_else(|e| panic!("{file}: {e:?}"));
        }
        std::fs::create_dir_all(dir).expect("the lab's directory");
        for (file, who) in [("kubeconfig", "admin"), ("kubelet.kubeconfig", "kubelet")] {
            let text = apiserver_double::kubeconfig_with_ca(
                &api.url(),
                &format!("{who}-{salt}"),
                apiserver_double::TEST_CA_PEM,
            );
            std::fs::write(dir.join(file), text).expect("write a kubeconfig");
        }
        (salt, Plane::Double { api })
    }

    /// Stops the lab's processes (also when a run panics), keeping its state.
    fn stop(&self) {
        if let Plane::Real { script } = &self.plane {
            let _ = std::process::Command::new("bash")
                .arg(script)
                .arg("stop")
                .env("FLEET_LAB", &self.dir)
                .status();
        }
    }

    /// A kubeconfig for daemon `kind` of node `i`, written under the lab: the admin's with the
    /// daemon's token.
    pub fn kubeconfig(&self, kind: Kind, i: usize) -> PathBuf {
        let admin = std::fs::read_to_string(self.dir.join("kubeconfig")).expect("admin kubeconfig");
        let token = format!("{}-n{i}-{}", kind.user(), self.salt);
        let text = admin.replace(&format!("admin-{}", self.salt), &token);
        let path = self.dir.join(format!("{}-n{i}.kubeconfig", kind.user()));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// What the API server (`kube-apiserver`) or etcd (`etcd`) has cost so far; nothing on the
    /// double (it shares this process).
    pub fn usage(&self, process: &str) -> ProcUsage {
        if self.on_double() {
            return ProcUsage::default();
        }
        let pid = std::fs::read_to_string(self.dir.join(format!("run/{process}.pid")))
            .unwrap_or_default();
        let pid = pid.trim().parse().unwrap_or(0);
        ProcUsage {
            cpu: crate::daemon::cpu_time(pid).unwrap_or_default(),
            rss: Resident::of(pid).unwrap_or_default(),
        }
    }

    /// Where the requests after this moment start.
    pub fn audit_mark(&self) -> Mark {
        match &self.plane {
            Plane::Real { .. } => {
                Mark::Audit(std::fs::metadata(self.dir.join("audit.log")).map_or(0, |m| m.len()))
            }
            Plane::Double { api } => Mark::Double(api.control().request_counts_by_user().0),
        }
    }

    /// How much the record of requests has grown in all (to see it still growing).
    fn audit_size(&self) -> u64 {
        match &self.plane {
            Plane::Real { .. } => {
                std::fs::metadata(self.dir.join("audit.log")).map_or(0, |m| m.len())
            }
            Plane::Double { api } => api.control().request_counts_by_user().1,
        }
    }

    /// Waits until the record of requests has not grown for `quiet` (what was in flight is
    /// recorded, and nothing is asking), at most `limit`.
    pub async fn audit_quiet(&self, quiet: Duration, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut last = (self.audit_size(), Instant::now());
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while last.1.elapsed() < quiet {
            assert!(
                Instant::now() < deadline,
                "the record of requests still grew after {limit:?}"
            );
            tick.tick().await;
            let size = self.audit_size();
            if size != last.0 {
                last = (size, Instant::now());
            }
        }
    }

    /// The requests of daemon `kind`'s users since `from`, by (verb, resource).
    pub fn counts(&self, kind: Kind, from: &Mark) -> BTreeMap<(String, String), u64> {
        let requests: Vec<_> = match (from, self.audit_mark()) {
            (Mark::Audit(a), Mark::Audit(b)) => self.audited(*a, b),
            (Mark::Double(a), Mark::Double(b)) => b
                .into_iter()
                .map(|(k, n)| (n.saturating_sub(a.get(&k).copied().unwrap_or(0)), k))
                .collect(),
            _ => unreachable!("a mark is of its lab's plane"),
        };
        let prefix = format!("{}:", kind.user());
        let mut out = BTreeMap::new();
        for (n, (user, verb, resource)) in requests {
            if user.starts_with(&prefix) && n > 0 {
                let resource = if resource.is_empty() {
                    "-".into()
                } else {
                    resource
                };
                *out.entry((verb, resource)).or_default() += n;
            }
        }
        out
    }

    /// The requests logged between the audit log's offsets `from` and `to`, once each, as
    /// (user, verb, resource) (a watch counted when it started, anything else when it
    /// completed).
    fn audited(&self, from: u64, to: u64) -> Vec<(u64, (String, String, String))> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(self.dir.join("audit.log")).expect("open the audit log");
        f.seek(SeekFrom::Start(from)).expect("seek");
        let mut text = String::new();
        f.take(to.saturating_sub(from))
            .read_to_string(&mut text)
            .expect("read the audit log");
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                let stage = e["stage"].as_str().unwrap_or_default();
                if e["verb"] == "watch" {
                    stage == "ResponseStarted"
                } else {
                    stage == "ResponseComplete"
                }
            })
            .map(|e| {
                let resource = match (
                    e["objectRef"]["resource"].as_str(),
                    e["objectRef"]["subresource"].as_str(),
                ) {
                    (Some(r), Some(s)) => format!("{r}/{s}"),
                    (Some(r), None) => r.to_string(),
                    _ => "-".to_string(),
                };
                let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
                (
                    1,
                    (text(&e["user"]["username"]), text(&e["verb"]), resource),
                )
            })
            .collect()
    }

    /// The watches the API server holds open now, summed over resources
    /// (`apiserver_longrunning_requests{verb="WATCH"}`; the double counts its own).
    pub async fn open_watches(&self) -> u64 {
        if let Plane::Double { api } = &self.plane {
            return api.control().open_watches() as u64;
        }
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        let text = self.admin.request_text(req).await.expect("API metrics");
        text.lines()
            .filter(|l| {
                l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }
}

impl Drop for FleetLab {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One simulated node: its name and its runtime.
pub struct SimNode {
    /// `n<i>`.
    pub name: String,
    /// Where its DaemonSet pods see the host's `/var/run` (`containerd/containerd.sock` in it).
    pub varrun: PathBuf,
    /// The same for kruise-daemon: its socket reaches the runtime through the relay that
    /// gives its requests an `:authority` the runtime's h2 accepts ([`crate::authority`]).
    pub varrun_relayed: PathBuf,
    /// Its runtime.
    pub cri: FakeRuntime,
    _relay: AbortOnDropHandle<()>,
}

impl SimNode {
    /// Starts node `n<i>`'s runtime under `root` and registers the Node.
    pub async fn start(lab: &FleetLab, root: &Path, i: usize) -> SimNode {
        let name = format!("n{i}");
        let varrun = root.join(&name).join("varrun");
        std::fs::create_dir_all(varrun.join("containerd")).expect("node dir");
        let socket = varrun.join("containerd/containerd.sock");
        let cri = FakeRuntime::start(&socket, "containerd")
            .await
            .expect("start the node's runtime");
        let varrun_relayed = root.join(&name).join("varrun-relayed");
        std::fs::create_dir_all(varrun_relayed.join("containerd")).expect("node dir");
        let relayed = varrun_relayed.join("containerd/containerd.sock");
        let relay = AbortOnDropHandle::new(crate::authority::relay(&relayed, &socket));
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(lab.admin.clone());
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
        nodes
            .patch(&name, &PatchParams::apply("fleet"), &Patch::Apply(&node))
            .await
            .expect("register the node");
        SimNode {
            name,
            varrun,
            varrun_relayed,
            cri,
            _relay: relay,
        }
    }

    /// The StopContainer calls its runtime received, by container ID: the daemon's (its kubelet
    /// stops a container only when its spec changes or its pod goes, which the bench never does).
    pub fn stops(&self) -> Vec<String> {
        self.cri
            .state()
            .stops
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The kubelets of every node, in one task: one watch of the fleet's pods, a sync of every
/// pod on each change and every `period` (the PLEG's relist), status written when it changed.
pub struct Kubelets {
    store: Store<Pod>,
    _task: AbortOnDropHandle<()>,
}

impl Kubelets {
    /// Starts them for `nodes`.
    pub fn start(lab: &FleetLab, nodes: Arc<Vec<SimNode>>, period: Duration) -> Kubelets {
        let kubelets = nodes.iter().map(|n| {
            let runtime = RemoteRuntime::new(n.cri.endpoint(), None, Timeouts::default());
            let kubelet = Kubelet::new(runtime, lab.dir.join("pods").join(&n.name));
            NodeKubelet::new(&n.name, kubelet, n.cri.runtime_name(), false)
        });
        let pods: Api<Pod> = Api::namespaced(lab.kubelet.clone(), NAMESPACE);
        let mut kubelets = NodeKubelets::new(pods, kubelets.collect());
        let store = kubelets.store();
        let task = tokio::spawn(async move { kubelets.run(period).await });
        Kubelets {
            store,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The pods as the kubelets last saw them.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.store.state()
    }
}

/// A node daemon of the fleet.
pub struct FleetDaemon {
    /// Which.
    pub kind: Kind,
    /// Its node's index.
    pub node: usize,
    /// Its admin address (`/healthz`; kruised also `/readyz`).
    pub addr: SocketAddr,
    /// Its log.
    pub log: PathBuf,
    child: tokio::process::Child,
}

impl FleetDaemon {
    /// Starts `kind` for node `i` as its DaemonSet would: kruised with `--host-run-dir` at the
    /// node's run directory; kruise-daemon (`exe`) in a mount namespace of its own with that
    /// directory at `/hostvarrun`. Both with `NODE_NAME`, their node's identity, and a free
    /// admin port.
    pub fn start(lab: &FleetLab, node: &SimNode, i: usize, kind: Kind, exe: &Path) -> FleetDaemon {
        // fixed, below the ephemeral range: a port found free and let go can be taken again
        // before the daemon binds it, by another daemon's lookup or by an outgoing connection
        // (clear of tests/run.sh's other ports: 5000s, 16000s, 19000s)
        let offset = match kind {
            Kind::Kruised => 2000,
            Kind::KruiseDaemon => 4000,
        };
        let port = lab.port_base + offset + u16::try_from(i).expect("fewer than 2,000 nodes");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // a port held by anything else (another fleet lab's daemon) would answer the readiness
        // probe for a daemon that could not bind it
        if let Err(e) = std::net::TcpListener::bind(addr) {
            panic!(
                "{kind:?} of node {i}: its admin port {port} is not free ({e}): is another fleet \
                 lab running? FLEET_LAB_PORT_BASE (now {}) moves every port (base + 443, 379, \
                 380, 2000 + i, 4000 + i); two labs need bases 6000 apart",
                lab.port_base
            );
        }
        let kubeconfig = lab.kubeconfig(kind, i);
        let log = lab.dir.join(format!("{}-n{i}.log", kind.user()));
        let file = std::fs::File::create(&log).expect("daemon log");
        let mut cmd = match kind {
            Kind::Kruised => {
                let mut c = tokio::process::Command::new(exe);
                c.args(["run", "--addr"])
                    .arg(addr.to_string())
                    .arg("--host-run-dir")
                    .arg(&node.varrun)
                    .env("RUST_LOG", "info")
                    .env_remove("CONTAINER_RUNTIME_ENDPOINT");
                c
            }
            Kind::KruiseDaemon => {
                let script = format!(
                    "mkdir -p /hostvarrun && mount --bind {} /hostvarrun && exec {} --addr={addr} \
                     --enable-pprof=false --socket-file=containerd/containerd.sock \
                     --feature-gates=ImagePullJobGate=true --logtostderr=true --v=2",
                    node.varrun_relayed.display(),
                    exe.display()
                );
                let mut c = tokio::process::Command::new("unshare");
                c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
                c
            }
        };
        let child = cmd
            .env("NODE_NAME", &node.name)
            .env("KUBECONFIG", &kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("start the daemon");
        FleetDaemon {
            kind,
            node: i,
            addr,
            log,
            child,
        }
    }

    /// Whether it is ready: kruised's `/readyz`, kruise-daemon's `/healthz` (it has no
    /// readiness).
    pub async fn is_ready(&self) -> bool {
        let path = match self.kind {
            Kind::Kruised => "/readyz",
            Kind::KruiseDaemon => "/healthz",
        };
        let probe = crate::daemon::try_http_get(self.addr, path);
        // a daemon still starting may refuse or reset the connection: not ready yet
        let answer = tokio::time::timeout(Duration::from_secs(2), probe).await;
        matches!(answer, Ok(Ok((200, _))))
    }

    /// Its resident memory now; `None` once it has exited.
    pub fn resident(&self) -> Option<Resident> {
        Resident::of(self.child.id()?)
    }

    /// Its resident memory now with where it lies; `None` once it has exited.
    pub fn resident_by_mapping(&self) -> Option<(Resident, ByMapping)> {
        let pid = self.child.id()?;
        Some((Resident::of(pid)?, ByMapping::of(pid)?))
    }

    /// Whether its process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Stops it (SIGTERM) and waits for it to exit, at most `limit`.
    pub async fn stop(mut self, limit: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(limit, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Waits until every daemon is ready, at most `limit`; returns when each became ready, from
/// `started`.
pub async fn wait_ready(
    daemons: &mut [FleetDaemon],
    started: Instant,
    limit: Duration,
) -> Vec<Duration> {
    let mut ready: Vec<Option<Duration>> = vec![None; daemons.len()];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while let Some(waiting) = ready.iter().position(Option::is_none) {
        tick.tick().await;
        if let Some(d) = daemons.iter_mut().find_map(|d| d.exited().then_some(d)) {
            panic!(
                "the {:?} of node {} exited before it was ready (log: {})",
                d.kind,
                d.node,
                d.log.display()
            );
        }
        assert!(
            started.elapsed() < limit,
            "{} of {} daemons not ready after {limit:?} (the first one's log: {})",
            ready.iter().filter(|r| r.is_none()).count(),
            daemons.len(),
            daemons[waiting].log.display()
        );
        let checks = futures::future::join_all(
            daemons
                .iter()
                .zip(&ready)
                .map(|(d, r)| async move { r.is_none() && d.is_ready().await }),
        )
        .await;
        for (r, up) in ready.iter_mut().zip(checks) {
            if up {
                r.get_or_insert(started.elapsed());
            }
        }
    }
    ready.into_iter().flatten().collect()
}
