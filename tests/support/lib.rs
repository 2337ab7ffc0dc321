//! The tests' shared crate, built once for every test and bench binary that uses it. A map of
//! `tests/`, then of this crate.
//!
//! **`tests/`, one folder a layer** (the README's Tests section says what each runs against):
//! `integration/` (one binary: the `kruised` binary and library against the doubles below, the
//! command line, the module layering (`layers.rs`) and the test tree's own rules
//! (`test_tree.rs`)), `e2e/` then `e2e_faults/` (the shipped binary against real runtimes from
//! `cri-lab.sh`), `cluster/` (a real Kubernetes, where its binaries are provided), `fixtures/`
//! (recorded crictl output, certificates, chart manifests); the labs `cri-lab.sh`,
//! `fleet-lab.sh`, `systemd-lab.sh`, `kubectl.sh`; `run.sh`, every layer. Two doubles are crates
//! of their own: the API-server double (`tests/apiserver/`) and the kubelet stand-in binary
//! (`tests/kubelet-stand-in/`, the demo's kubelet, built on [`kubelet`]); the fake CRI runtime is
//! `src/cri/fake/` (feature `test-util`).
//!
//! **This crate:**
//!
//! - *Doubles.* [`kubelet`]: the one kubelet of every layer that plays it (its labels, env,
//!   container hash, CRI calls, the one writer of a pod's `containerStatuses`, its sync timing);
//!   [`node`]: a whole fake node (API double, fake runtime, kubelet); [`manager`]:
//!   kruise-manager's controllers and webhooks on the API double; [`fleet`]: many simulated
//!   nodes for the fleet benchmark; [`pull`]: a node for the image-pull tests, the puller
//!   in-process; [`image_gc`]: the kubelet's image garbage collector (its rule, over the CRI);
//!   [`loop_fs`]: a small loop-mounted ext4 standing for the image filesystem.
//! - *Launchers.* [`Lab`] and [`LabRuntime`] (below): the real runtime lab; [`Plane`]: the API
//!   double with its kubeconfig; [`daemon`]: `kruised` as its own process, its log followed;
//!   [`cluster`]: the real cluster layer; [`restarts`]: the env-restart workload on it.
//! - *Attacks.* [`hostile`]: a hostile tenant's tools (a trickling probe target, pods holding
//!   the admin port's connections, fat recreate requests), shared by the hostile tests and
//!   the benchmark that runs them at once.
//! - *Benchmarks.* [`unready`]: the unready-window benchmark's cases, report and relay host,
//!   shared by its two modes (a lab's runtime with the doubles; the real cluster); [`arg_or`]:
//!   a benchmark's option on its command line.
//! - *Builders.* [`crr`]: recreate requests as kruise's webhook leaves them; [`rbac`]: kruised's
//!   identity and RBAC on the API double, and telling a refusal from its log.
//! - *Network.* [`proxy`]: HTTP CONNECT, absolute-form and SOCKS5 proxies; [`tcp_relay`]: a
//!   relay that can go silent, cut connections or forward at a fixed rate, counting bytes;
//!   [`authority`]: a CRI relay for clients that send the socket's path as `:authority`;
//!   [`events`]: a runtime's container events followed.
//! - *Waiting.* [`wait`]: every wait of the tests, each on a change notification where one
//!   exists, each with its limit, each failing with what it saw last; [`within`] bounds any
//!   future.

pub mod authority;
pub mod cluster;
pub mod crr;
pub mod daemon;
pub mod events;
pub mod fleet;
pub mod hostile;
pub mod image_gc;
pub mod kubelet;
pub mod loop_fs;
pub mod manager;
pub mod node;
pub mod proxy;
pub mod pull;
pub mod rbac;
pub mod restarts;
pub mod tcp_relay;
pub mod unready;
pub mod wait;

use std::path::PathBuf;
use std::time::Duration;

use kruised::cri::{Endpoint, RemoteRuntime, Timeouts};

/// The runtimes `tests/cri-lab.sh` starts; the end-to-end layer runs on each
/// (`KRUISED_LAB_RUNTIME`, default `containerd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabRuntime {
    /// Debian's containerd 1.6.20: no container events.
    Containerd,
    /// containerd 2.3: container events.
    Containerd2,
    /// CRI-O 1.36: container events (the lab turns them on), another ID prefix and image fields.
    Crio,
}

impl LabRuntime {
    /// Its name in the lab (`CRI_LAB_RUNTIME`).
    pub fn lab_name(self) -> &'static str {
        match self {
            LabRuntime::Containerd => "containerd",
            LabRuntime::Containerd2 => "containerd2",
            LabRuntime::Crio => "crio",
        }
    }

    /// The name it answers in `Version`, which the kubelet puts before container IDs
    /// (`containerd://`, `cri-o://`); `e2e_cri` checks the runtime says so.
    pub fn cri_name(self) -> &'static str {
        match self {
            LabRuntime::Containerd | LabRuntime::Containerd2 => "containerd",
            LabRuntime::Crio => "cri-o",
        }
    }

    /// Whether `message` is this runtime's way of saying a pulled tag does not exist.
    pub fn says_no_such_tag(self, message: &str) -> bool {
        let m = message.to_lowercase();
        match self {
            LabRuntime::Containerd | LabRuntime::Containerd2 => m.contains("not found"),
            LabRuntime::Crio => m.contains("manifest unknown"),
        }
    }

    /// Whether `message` is this runtime's way of saying the registry wants a login.
    pub fn says_unauthorized(self, message: &str) -> bool {
        let m = message.to_lowercase();
        match self {
            // a wrong login: 401; none at all: 1.6 says so too, 2.x "authorization failed"
            LabRuntime::Containerd => m.contains("401") || m.contains("unauthorized"),
            LabRuntime::Containerd2 => {
                m.contains("401")
                    || m.contains("unauthorized")
                    || m.contains("authorization failed")
            }
            LabRuntime::Crio => m.contains("authentication required"),
        }
    }

    /// Its socket in the lab's directory (`cri-lab.sh socket`).
    pub fn socket_in(self, lab: &std::path::Path) -> PathBuf {
        match self {
            LabRuntime::Containerd => lab.join("containerd.sock"),
            LabRuntime::Containerd2 => lab.join("containerd2/containerd.sock"),
            LabRuntime::Crio => lab.join("crio/crio.sock"),
        }
    }

    /// Whether it sends CRI container events (`GetContainerEvents`).
    pub fn has_events(self) -> bool {
        self != LabRuntime::Containerd
    }

    /// The runtime under test (`KRUISED_LAB_RUNTIME`, default `containerd`).
    pub fn current() -> LabRuntime {
        LabRuntime::parse(&std::env::var("KRUISED_LAB_RUNTIME").unwrap_or_default())
    }

    fn parse(name: &str) -> LabRuntime {
        match name {
            "" | "containerd" => LabRuntime::Containerd,
            "containerd2" => LabRuntime::Containerd2,
            "crio" => LabRuntime::Crio,
            other => panic!("KRUISED_LAB_RUNTIME={other}: one of containerd, containerd2, crio"),
        }
    }
}

/// A real runtime + registry started by `tests/cri-lab.sh` (the README's Tests section).
#[derive(Clone, Debug)]
pub struct Lab {
    /// The lab's directory (`$LAB`).
    pub dir: PathBuf,
    /// The runtime under test (`KRUISED_LAB_RUNTIME`).
    pub runtime: LabRuntime,
    /// Its CRI socket.
    pub socket: PathBuf,
    /// The registry's `host:port`.
    pub registry: String,
    /// The `host:port` of the second registry, which requires a login
    /// (`KRUISED_LAB_AUTH_REGISTRY`, default `127.0.0.1:5001`).
    pub auth_registry: String,
}

impl Lab {
    /// The lab named by `KRUISED_LAB`, with the runtime `KRUISED_LAB_RUNTIME`, if its socket
    /// exists. When it is absent the test is skipped with a message, except in CI (`CI=true`)
    /// or with `KRUISED_REQUIRE_LAB=1`, where a missing lab fails the test: the end-to-end
    /// tests must never be skipped silently.
    pub fn get() -> Option<Lab> {
        let required = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
            || std::env::var("KRUISED_REQUIRE_LAB").is_ok_and(|v| v == "1");
        let runtime = LabRuntime::current();
        let dir = std::env::var_os("KRUISED_LAB").map(PathBuf::from);
        let lab = dir.and_then(|dir| {
            let socket = runtime.socket_in(&dir);
            socket.exists().then(|| Lab {
                registry: std::env::var("KRUISED_LAB_REGISTRY")
                    .unwrap_or_else(|_| "127.0.0.1:5000".to_string()),
                auth_registry: std::env::var("KRUISED_LAB_AUTH_REGISTRY")
                    .unwrap_or_else(|_| "127.0.0.1:5001".to_string()),
                dir,
                runtime,
                socket,
            })
        });
        if lab.is_none() {
            assert!(
                !required,
                "the real-runtime lab is required here but KRUISED_LAB does not point at a lab \
                 running {}: run the tests with tests/run.sh",
                runtime.lab_name()
            );
            eprintln!("SKIPPED: no real-runtime lab (run the tests with tests/run.sh)");
        }
        lab
    }

    /// Another lab's runtime, beside the one under test (`KRUISED_LAB_OTHER`, its runtime
    /// `KRUISED_LAB_OTHER_RUNTIME`): `tests/run.sh` names one where it runs two labs, for the
    /// tests of a node where two runtimes answer. `None` (the test skipped, with a message)
    /// where none is named; a lab named whose socket is missing fails the test. Only its runtime
    /// is known (its registries are not named).
    pub fn other() -> Option<Lab> {
        let Some(dir) = std::env::var_os("KRUISED_LAB_OTHER").map(PathBuf::from) else {
            eprintln!(
                "SKIPPED: no second runtime (KRUISED_LAB_OTHER, KRUISED_LAB_OTHER_RUNTIME: \
                 tests/run.sh names one where it starts two labs)"
            );
            return None;
        };
        let runtime =
            LabRuntime::parse(&std::env::var("KRUISED_LAB_OTHER_RUNTIME").unwrap_or_default());
        let socket = runtime.socket_in(&dir);
        assert!(
            socket.exists(),
            "KRUISED_LAB_OTHER={} runs no {} ({} is missing)",
            dir.display(),
            runtime.lab_name(),
            socket.display()
        );
        Some(Lab {
            registry: String::new(),
            auth_registry: String::new(),
            dir,
            runtime,
            socket,
        })
    }

    /// The CRI endpoint of the lab's runtime.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::unix(&self.socket)
    }

    /// A client of the lab's runtime.
    pub fn runtime(&self) -> RemoteRuntime {
        RemoteRuntime::new(self.endpoint(), None, Timeouts::default())
    }

    /// `registry/test/<name>`.
    pub fn image(&self, name: &str) -> String {
        format!("{}/test/{name}", self.registry)
    }

    /// User and password of the authenticated registry (written by `cri-lab.sh start` to
    /// `$LAB/registry-auth/credentials` as `user:password`).
    pub fn auth_credentials(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.dir.join("registry-auth/credentials"))
            .expect("the lab's registry-auth/credentials (cri-lab.sh start writes it)");
        let (user, password) = text.trim().split_once(':').expect("user:password");
        (user.to_string(), password.to_string())
    }

    /// Runs `tests/cri-lab.sh <cmd>` against this lab and its runtime (`stop-runtime`,
    /// `kill-runtime`, `start-runtime`, ...).
    pub fn script(&self, cmd: &str) {
        self.script_with(cmd, &[]);
    }

    /// [`Lab::script`] with more of the script's settings in its environment (`bench-images`
    /// with `BENCH_IMAGES=5`, ...).
    pub fn script_with(&self, cmd: &str, env: &[(&str, &str)]) {
        let status = std::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../cri-lab.sh"))
            .arg(cmd)
            .env("LAB", &self.dir)
            .env("CRI_LAB_RUNTIME", self.runtime.lab_name())
            .env("REG_ADDR", &self.registry)
            .env("REG_AUTH_ADDR", &self.auth_registry)
            .envs(env.iter().copied())
            .status()
            .expect("run cri-lab.sh");
        assert!(status.success(), "cri-lab.sh {cmd} failed");
    }
}

/// The control plane of an end-to-end test: the API-server double, with its kubeconfig in a
/// directory of the test's own (which the test may also use for its other files).
pub struct Plane {
    /// The API-server double.
    pub api: apiserver_double::Handle,
    /// Holds `kubeconfig`; removed with the plane.
    pub dir: tempfile::TempDir,
}

impl Plane {
    /// Starts the double on a free port and writes its kubeconfig.
    pub async fn start() -> Plane {
        let api = apiserver_double::ApiServer::start("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("start the API-server double");
        let dir = tempfile::tempdir().expect("tempdir");
        api.write_kubeconfig(dir.path().join("kubeconfig"))
            .expect("write the kubeconfig");
        Plane { api, dir }
    }

    /// The kubeconfig file.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Starts `kruised run` for `node` against this plane and the lab's runtime (drain
    /// deadline 3 s unless `extra` sets one), with `extra` arguments, and waits until it logs
    /// that it is ready.
    pub async fn start_daemon(
        &self,
        lab: &Lab,
        node: &str,
        extra: &[&str],
        limit: Duration,
    ) -> daemon::Daemon {
        let mut args = daemon_args(&self.kubeconfig(), &lab.endpoint().to_string());
        // an explicit drain deadline replaces the tests' default, the last two arguments (clap
        // takes each flag once)
        if extra.contains(&"--drain-timeout") {
            args.truncate(args.len() - 2);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut d = daemon::Daemon::start(node, &args);
        d.wait_for_log("daemon ready", limit).await;
        d
    }
}

/// `kruised run`'s arguments in the tests: the API server's kubeconfig, the runtime endpoint,
/// a drain deadline of 3 s (last).
pub fn daemon_args(kubeconfig: &std::path::Path, endpoint: &str) -> Vec<String> {
    vec![
        "--kubeconfig".into(),
        kubeconfig.display().to_string(),
        "--runtime-endpoint".into(),
        endpoint.to_string(),
        "--drain-timeout".into(),
        "3s".into(),
    ]
}

/// The kubelet's container ID of `id` on the runtime under test: `<runtime name>://<id>`.
pub fn kubelet_id(id: &str) -> String {
    format!("{}://{id}", LabRuntime::current().cri_name())
}

/// Awaits `fut`, failing the test with `what` if it takes longer than `limit`.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// The number in the environment variable `name`, else `default` (also when it does not parse).
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The value after the option `name` on the command line (a benchmark's, after `--`), else
/// `default` (also when it does not parse).
pub fn arg_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Unique suffix for names in one test run (tests run in parallel and share one containerd).
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The machine a benchmark ran on, for its report: CPU model, cores and kernel.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}
