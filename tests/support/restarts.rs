//! The env-from-metadata restart workload on the real cluster, shared by the cluster test
//! (correctness: exactly one stop and one preStop run per container per change) and the
//! benchmark (the user's figure: from the metadata change to the container running with the
//! new value): kruise-managed pods whose two containers read an annotation, one with an exec
//! preStop hook and one with an HTTP preStop hook, both reporting to a counter here; the manager
//! takes the pods out of service and changes the annotation, in waves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::RuntimeService;
use kube::ResourceExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::{KubeLab, Scene, meta, runtime_id, status_of, wait_for};

/// The containers of a workload pod.
pub const CONTAINERS: [&str; 2] = ["exec-hook", "http-hook"];

/// Counts the preStop hook calls it receives (`GET /hook/<pod>/<container>`), on loopback: the
/// pods run on the host network.
#[derive(Clone)]
pub struct HookServer {
    /// The port.
    pub port: u16,
    hits: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl HookServer {
    /// Starts the server.
    pub async fn start() -> HookServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind hook server");
        let port = listener.local_addr().expect("addr").port();
        let hits: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 2048];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]);
                    if let Some(path) = req.split_whitespace().nth(1) {
                        *h.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry(path.to_string())
                            .or_default() += 1;
                    }
                    let _ = s
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        HookServer { port, hits }
    }

    /// Calls of the hook of `container` of `pod`.
    pub fn count(&self, pod: &str, container: &str) -> u32 {
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        hits.get(&format!("/hook/{pod}/{container}"))
            .map_or(0, |n| *n)
    }
}

/// Busy loops in processes of their own, to load the cores while the workload runs; stopped
/// when dropped.
pub struct CpuLoad {
    _busy: Vec<tokio::process::Child>,
}

impl CpuLoad {
    /// Loads every core: as many busy processes as the cores the machine's load average leaves
    /// idle. Alone on the machine that is one per core; in CI, where the other layers already
    /// keep the cores busy, it adds little or nothing instead of taking their time.
    pub fn top_up() -> CpuLoad {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let load: f64 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let n = cores.saturating_sub(load.round() as usize);
        eprintln!("CPU load: load average {load:.2} on {cores} cores; {n} busy loops added");
        CpuLoad::start(n)
    }

    /// `n` busy processes.
    pub fn start(n: usize) -> CpuLoad {
        CpuLoad {
            _busy: (0..n)
                .map(|_| {
                    tokio::process::Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .kill_on_drop(true)
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        }
    }
}

/// The workload pod `name`: both containers read `app-config`; `exec-hook` has an exec preStop
/// hook (busybox wget to the hook server), `http-hook` an HTTP one.
pub fn workload_pod(scene: &Scene, hooks: &HookServer, name: &str) -> serde_json::Value {
    let image = scene.lab.image("busybox:v1");
    let env: &[(&str, &str)] = &[("APP_CONFIG", "app-config")];
    let mut pod = scene.kruise_pod(
        name,
        &[(CONTAINERS[0], &image, env), (CONTAINERS[1], &image, env)],
    );
    let url = format!(
        "http://127.0.0.1:{}/hook/{name}/{}",
        hooks.port, CONTAINERS[0]
    );
    pod["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {"command":
        ["sh", "-c", format!("wget -q -O /dev/null {url}")]}}});
    pod["spec"]["containers"][1]["lifecycle"] = json!({"preStop": {"httpGet": {
        "host": "127.0.0.1", "port": hooks.port, "path": format!("/hook/{name}/{}", CONTAINERS[1])}}});
    pod
}

/// What one change did.
#[derive(Clone, Debug)]
pub struct ChangeResult {
    /// The pod.
    pub pod: String,
    /// From the annotation write to the kubelet reporting both containers running again (new
    /// IDs) and the daemon's annotation up to date.
    pub took: Duration,
    /// The kubelet's restart count of each container after the change.
    pub restarts: [i32; 2],
    /// preStop hook runs of each container during the change.
    pub hooks: [u32; 2],
    /// What `echo $APP_CONFIG` printed in each new container.
    pub seen: [String; 2],
}

/// Whether every container of the pod runs with a new ID compared with `old` and the daemon's
/// annotation says so with the env hash of the pod's metadata.
fn changed(p: Option<&Pod>, old: &[String; 2]) -> bool {
    let Some(p) = p else { return false };
    let Some(m) = meta(p) else { return false };
    let labels = p.labels().clone();
    let annotations = p.annotations().clone();
    CONTAINERS.iter().zip(old).all(|(name, old)| {
        let s = status_of(p, name);
        let spec = kruised::controller::containermeta::decide::spec_of(p, name);
        s.container_id.as_deref().is_some_and(|id| id != old)
            && s.state.as_ref().is_some_and(|st| st.running.is_some())
            && m.container(name).is_some_and(|e| {
                Some(e.container_id.as_str()) == s.container_id.as_deref()
                    && spec.is_some_and(|spec| {
                        e.hashes.extracted_env_from_metadata_hash
                            == kruised::hash::env::expected_env_hash(spec, &labels, &annotations)
                    })
            })
    })
}

async fn echo(lab: &KubeLab, id: &str) -> String {
    let out = lab
        .runtime()
        .exec_sync(
            runtime_id(id),
            vec!["sh".into(), "-c".into(), "echo $APP_CONFIG".into()],
            Duration::from_secs(10),
        )
        .await
        .expect("exec echo");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Creates `n` workload pods named `<prefix>-<i>` and waits until they run and the daemon has
/// annotated them.
pub async fn create_pods(scene: &Scene, hooks: &HookServer, prefix: &str, n: usize) -> Vec<String> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let pods = scene.pods();
    for name in &names {
        pods.create(
            &Default::default(),
            &serde_json::from_value(workload_pod(scene, hooks, name)).expect("pod"),
        )
        .await
        .expect("create pod");
        scene.set_update_ready(name, true).await;
    }
    for name in &names {
        wait_for(
            &pods,
            name,
            "the pod running and annotated",
            |p: Option<&Pod>| {
                super::cluster::all_running(p)
                    && p.and_then(meta).is_some_and(|m| m.containers.len() == 2)
            },
        )
        .await;
    }
    names
}

/// Updates every pod of `wave` in place as kruise-manager does, at once: `InPlaceUpdateReady`
/// set False, then `app-config` changed to `value` right after (two writes, the race a fast
/// daemon must not lose); waits for each change to complete, timed from the first write.
pub async fn change_wave(
    scene: &Scene,
    hooks: &HookServer,
    wave: &[String],
    value: &str,
) -> Vec<ChangeResult> {
    let pods = scene.pods();
    let mut before = Vec::new();
    for name in wave {
        let p = pods.get(name).await.expect("pod");
        let ids = CONTAINERS.map(|c| status_of(&p, c).container_id.clone().unwrap_or_default());
        let hooks_before = CONTAINERS.map(|c| hooks.count(name, c));
        before.push((name.clone(), ids, hooks_before));
    }
    let mut started = Vec::new();
    for (name, _, _) in &before {
        started.push(Instant::now());
        scene.set_update_ready(name, false).await;
        scene
            .patch_pod(
                name,
                json!({"metadata": {"annotations": {"app-config": value}}}),
            )
            .await;
    }
    // wait for every pod at once, so that each change is timed on its own
    let waits = before.iter().zip(&started).map(|((name, ids, _), at)| {
        let pods = pods.clone();
        async move {
            let p = wait_for(
                &pods,
                name,
                "both containers restarted with the new value",
                |p: Option<&Pod>| changed(p, ids),
            )
            .await;
            (p, at.elapsed())
        }
    });
    let done = futures::future::join_all(waits).await;
    // what each new container sees, every pod at once (one exec after another took seconds a wave)
    let seen = futures::future::join_all(done.iter().map(|(p, _)| async move {
        let id = |c: &str| status_of(p, c).container_id.clone().unwrap_or_default();
        [
            echo(&scene.lab, &id(CONTAINERS[0])).await,
            echo(&scene.lab, &id(CONTAINERS[1])).await,
        ]
    }))
    .await;
    let mut out = Vec::new();
    for (((name, _, hooks_before), (p, took)), seen) in before.into_iter().zip(done).zip(seen) {
        out.push(ChangeResult {
            took,
            restarts: CONTAINERS.map(|c| status_of(&p, c).restart_count),
            hooks: [0, 1].map(|i| hooks.count(&name, CONTAINERS[i]) - hooks_before[i]),
            seen,
            pod: name,
        });
    }
    out
}

/// Percentile `q` (0..=1) of `d`, sorted.
pub fn percentile(d: &mut [Duration], q: f64) -> Duration {
    d.sort();
    if d.is_empty() {
        return Duration::ZERO;
    }
    let i = ((d.len() - 1) as f64 * q).round() as usize;
    d[i]
}
