//! `kubelet-stand-in`: the kubelet's part of one node, for kruised's demo on a machine without
//! Kubernetes (`scripts/demo.sh --api double`): the API-server double plays the control plane,
//! a real containerd runs the containers, and this plays the kubelet between them. Test
//! infrastructure, never shipped.
//!
//! Every `--sync-period` it lists the pods bound to `--node-name` and, for each, does what the
//! kubelet does as far as kruised can tell:
//!
//! * a new pod gets a sandbox and its containers through CRI, with the kubelet's labels and
//!   annotations (pod identity, container hash, restart count, grace period), images pulled when
//!   the runtime lacks them, and each env var resolved from the pod as it is at that moment
//!   (`fieldRef` to labels, annotations, name, namespace, uid, node name);
//! * a container that exited is created again with attempt + 1 and the env of the pod as it is
//!   now (restart policy `Always`; the last dead container is kept, older ones removed);
//! * the pod status reports each container (ID with the runtime's prefix, image ID, restart
//!   count, running state, last termination) and the conditions, `Ready` only when every
//!   container runs and every readiness gate is True; it is patched only when it changed;
//! * a pod that left the API is stopped and removed, and so is every pod at SIGTERM or Ctrl-C.
//!
//! Not a kubelet: no volumes, probes, resources, init containers, networking (pods share the
//! host's network namespace) or restart backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[path = "../../support/kubelet_meta.rs"]
mod kubelet_meta;

use anyhow::{Context, Result};
use clap::Parser;
use k8s_openapi::api::core::v1::{Container as SpecContainer, EnvVar, Pod};
use k8s_openapi::jiff::Timestamp;
use kruised::cri::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, Endpoint, ImageService,
    KubeletService, PullRequest, RemoteRuntime, RuntimeService, SandboxConfig, SandboxMetadata,
    StringMap, Timeouts,
};
use kruised::hash::env::env_meta_ref;
use kruised::hash::kubelet::{format_hash, hash_container};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};

use self::kubelet_meta::PodRef;

/// The kubelet's part of one node, on a real CRI runtime, for the API-server double.
#[derive(Debug, Parser)]
#[command(name = "kubelet-stand-in", version)]
struct Args {
    /// Kubeconfig of the API server (the double writes one).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node whose pods this runs.
    #[arg(long)]
    node_name: String,
    /// The CRI runtime, `unix:///path` or a path.
    #[arg(long)]
    runtime_endpoint: Endpoint,
    /// Root of the pods' log directories.
    #[arg(long)]
    log_dir: PathBuf,
    /// Cgroup parent of the sandboxes (`<this>/pod<uid>`), cgroupfs.
    #[arg(long, default_value = "/cri-lab")]
    cgroup_root: String,
    /// How often pods and containers are compared (the kubelet relists every second).
    #[arg(long, default_value = "500ms", value_parser = parse_millis)]
    sync_period: Duration,
}

fn parse_millis(s: &str) -> Result<Duration, String> {
    let ms = s.strip_suffix("ms").unwrap_or(s);
    ms.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{s}: {e} (milliseconds, e.g. 500ms)"))
}

/// How long a pull may take, and how long a pod that failed to start waits before the next try.
const PULL_LIMIT: Duration = Duration::from_secs(300);
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A container this process created, as it stands.
struct Running {
    id: String,
    attempt: u32,
    /// The previous container of this name, exited, kept as the kubelet keeps one.
    dead: Option<String>,
    /// `lastState.terminated` of the status, once a container of this name exited.
    last_terminated: Option<Value>,
}

/// A pod this process runs.
struct RunningPod {
    namespace: String,
    name: String,
    sandbox: String,
    grace: Duration,
    containers: BTreeMap<String, Running>,
    /// The status last patched, to patch only changes.
    reported: Option<Value>,
}

struct StandIn {
    args: Args,
    pods: Api<Pod>,
    runtime: RemoteRuntime,
    /// The runtime's name: the prefix of container IDs in the pod status.
    runtime_name: String,
    running: HashMap<String, RunningPod>,
    /// Pods whose start failed, by uid, and when.
    failed: HashMap<String, Instant>,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!(
        "{} kubelet-stand-in: {msg}",
        Timestamp::now().strftime("%H:%M:%S%.3f")
    );
}

fn rfc3339(nanos: i64) -> String {
    Timestamp::from_second(nanos / 1_000_000_000)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let runtime = RemoteRuntime::new(args.runtime_endpoint.clone(), None, Timeouts::default());
    let version = runtime
        .version()
        .await
        .with_context(|| format!("the runtime at {}", args.runtime_endpoint))?;
    log(format!(
        "node {}, runtime {} {} at {}",
        args.node_name, version.runtime_name, version.runtime_version, args.runtime_endpoint
    ));
    let mut stand_in = StandIn {
        pods: Api::all(client),
        runtime,
        runtime_name: version.runtime_name,
        running: HashMap::new(),
        failed: HashMap::new(),
        args,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        if let Err(e) = stand_in.sync().await {
            log(format!("sync: {e:#}"));
        }
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            () = tokio::time::sleep(stand_in.args.sync_period) => {}
        }
    }
    for (_, pod) in std::mem::take(&mut stand_in.running) {
        stand_in.remove(pod).await;
    }
    log("stopped; every pod it ran is removed");
    Ok(())
}

impl StandIn {
    async fn sync(&mut self) -> Result<()> {
        let selector = format!("spec.nodeName={}", self.args.node_name);
        let pods = self
            .pods
            .list(&ListParams::default().fields(&selector))
            .await
            .context("listing the node's pods")?;
        let mut seen = BTreeSet::new();
        for pod in &pods.items {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            seen.insert(uid.clone());
            if let Err(e) = self.sync_pod(&uid, pod).await {
                log(format!(
                    "pod {}/{}: {e:#}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(pod) = self.running.remove(&uid) {
                self.remove(pod).await;
            }
        }
        self.failed.retain(|uid, _| seen.contains(uid));
        Ok(())
    }

    async fn sync_pod(&mut self, uid: &str, pod: &Pod) -> Result<()> {
        if !self.running.contains_key(uid) {
            if self
                .failed
                .get(uid)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                return Ok(());
            }
            match self.start_pod(uid, pod).await {
                Ok(running) => {
                    self.failed.remove(uid);
                    self.running.insert(uid.to_string(), running);
                }
                Err(e) => {
                    self.failed.insert(uid.to_string(), Instant::now());
                    return Err(e);
                }
            }
        }
        let Some(mut running) = self.running.remove(uid) else {
            return Ok(());
        };
        let result = self.sync_containers(pod, &mut running).await;
        self.running.insert(uid.to_string(), running);
        result
    }

    /// Restarts exited containers, then reports the containers in the pod status.
    async fn sync_containers(&self, pod: &Pod, running: &mut RunningPod) -> Result<()> {
        let mut statuses = Vec::new();
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let Some(r) = running.containers.get_mut(&c.name) else {
                continue;
            };
            let mut status = self.runtime.container_status(&r.id, false).await?;
            if status.state == ContainerState::Exited {
                r.last_terminated = Some(json!({
                    "exitCode": status.exit_code,
                    "reason": status.reason,
                    "startedAt": rfc3339(status.started_at),
                    "finishedAt": rfc3339(status.finished_at),
                    "containerID": format!("{}://{}", self.runtime_name, status.id),
                }));
                if let Some(older) = r.dead.replace(r.id.clone()) {
                    let _ = self.runtime.remove_container(&older).await;
                }
                r.attempt += 1;
                let sandbox = sandbox_config(pod, &self.args)?;
                let config = container_config(pod, c, r.attempt);
                r.id = self
                    .start_container(&running.sandbox, config, sandbox)
                    .await?;
                log(format!(
                    "pod {}/{}: container {} exited ({}), started again as {} (restartCount {})",
                    running.namespace, running.name, c.name, status.exit_code, r.id, r.attempt
                ));
                status = self.runtime.container_status(&r.id, false).await?;
            }
            statuses.push(self.container_status(c, r, &status));
        }
        let status = pod_status(pod, statuses);
        if running.reported.as_ref() != Some(&status) {
            Api::<Pod>::namespaced(self.pods.clone().into_client(), &running.namespace)
                .patch_status(
                    &running.name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({ "status": status })),
                )
                .await
                .context("patching the pod status")?;
            running.reported = Some(status);
        }
        Ok(())
    }

    fn container_status(&self, c: &SpecContainer, r: &Running, status: &ContainerStatus) -> Value {
        let is_running = status.state == ContainerState::Running;
        let state = if is_running {
            json!({ "running": { "startedAt": rfc3339(status.started_at) } })
        } else {
            json!({ "waiting": { "reason": "ContainerCreating" } })
        };
        let mut out = json!({
            "name": c.name,
            "image": c.image,
            "imageID": if status.image_ref.is_empty() { &status.image_id } else { &status.image_ref },
            "containerID": format!("{}://{}", self.runtime_name, r.id),
            "restartCount": r.attempt,
            "ready": is_running,
            "started": is_running,
            "state": state,
        });
        if let Some(t) = &r.last_terminated {
            out["lastState"] = json!({ "terminated": t });
        }
        out
    }

    async fn start_pod(&self, uid: &str, pod: &Pod) -> Result<RunningPod> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let spec = pod.spec.as_ref().context("the pod has no spec")?;
        for c in &spec.containers {
            let image = c.image.clone().unwrap_or_default();
            if self.runtime.image_status(&image).await?.is_none() {
                log(format!("pod {namespace}/{name}: pulling {image}"));
                self.runtime
                    .pull_image(
                        PullRequest {
                            image: image.clone(),
                            ..Default::default()
                        },
                        PULL_LIMIT,
                    )
                    .await
                    .with_context(|| format!("pulling {image}"))?;
            }
        }
        let sandbox_cfg = sandbox_config(pod, &self.args)?;
        std::fs::create_dir_all(&sandbox_cfg.log_directory)
            .with_context(|| format!("creating the log directory {}", sandbox_cfg.log_directory))?;
        let sandbox = self.runtime.run_pod_sandbox(sandbox_cfg.clone()).await?;
        let mut running = RunningPod {
            namespace,
            name,
            sandbox,
            grace: Duration::from_secs(
                spec.termination_grace_period_seconds
                    .unwrap_or(30)
                    .try_into()
                    .unwrap_or(30),
            ),
            containers: BTreeMap::new(),
            reported: None,
        };
        for c in &spec.containers {
            let config = container_config(pod, c, 0);
            match self
                .start_container(&running.sandbox, config, sandbox_cfg.clone())
                .await
            {
                Ok(id) => {
                    running.containers.insert(
                        c.name.clone(),
                        Running {
                            id,
                            attempt: 0,
                            dead: None,
                            last_terminated: None,
                        },
                    );
                }
                Err(e) => {
                    self.remove(running).await;
                    return Err(e.context(format!("container {}", c.name)));
                }
            }
        }
        log(format!(
            "pod {}/{} (uid {uid}): sandbox {} with {}",
            running.namespace,
            running.name,
            running.sandbox,
            running
                .containers
                .iter()
                .map(|(n, r)| format!("{n}={}", r.id))
                .collect::<Vec<_>>()
                .join(" ")
        ));
        Ok(running)
    }

    /// Creates and starts a container as the kubelet does: the image resolved to its ID (what
    /// the kubelet passes to the runtime, the spec's name beside it) and the container's log
    /// directory made first (CRI-O's conmon needs it).
    async fn start_container(
        &self,
        sandbox: &str,
        mut config: ContainerConfig,
        sandbox_cfg: SandboxConfig,
    ) -> Result<String> {
        let image = self
            .runtime
            .image_status(&config.image)
            .await?
            .with_context(|| format!("image {} is not on the node", config.image))?;
        config.user_specified_image = std::mem::replace(&mut config.image, image.id);
        let dir = std::path::Path::new(&sandbox_cfg.log_directory).join(&config.metadata.name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the log directory {}", dir.display()))?;
        let id = self
            .runtime
            .create_container(sandbox, config, sandbox_cfg)
            .await
            .context("creating the container")?;
        self.runtime
            .start_container(&id)
            .await
            .context("starting the container")?;
        Ok(id)
    }

    /// Stops and removes a pod's containers and sandbox, as the kubelet does for a deleted pod.
    async fn remove(&self, pod: RunningPod) {
        for r in pod.containers.values() {
            if let Err(e) = self.runtime.stop_container(&r.id, pod.grace).await {
                log(format!("stopping {}: {e}", r.id));
            }
        }
        let result = async {
            self.runtime.stop_pod_sandbox(&pod.sandbox).await?;
            self.runtime.remove_pod_sandbox(&pod.sandbox).await
        }
        .await;
        match result {
            Ok(()) => log(format!("pod {}/{}: removed", pod.namespace, pod.name)),
            Err(e) => log(format!(
                "pod {}/{}: removing sandbox {}: {e}",
                pod.namespace, pod.name, pod.sandbox
            )),
        }
    }
}

fn sandbox_config(pod: &Pod, args: &Args) -> Result<SandboxConfig> {
    let meta = &pod.metadata;
    let name = meta.name.clone().context("the pod has no name")?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let uid = meta.uid.clone().context("the pod has no uid")?;
    let labels = kubelet_meta::sandbox_labels(
        PodRef {
            name: &name,
            namespace: &namespace,
            uid: &uid,
        },
        &meta.labels.clone().unwrap_or_default(),
    );
    Ok(SandboxConfig {
        metadata: SandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            attempt: 0,
        },
        // host network: the node's hostname (no UTS namespace of its own)
        hostname: String::new(),
        log_directory: args
            .log_dir
            .join(format!("{namespace}_{name}_{uid}"))
            .display()
            .to_string(),
        labels,
        annotations: meta.annotations.clone().unwrap_or_default(),
        cgroup_parent: format!("{}/pod{uid}", args.cgroup_root),
    })
}

fn container_config(pod: &Pod, c: &SpecContainer, attempt: u32) -> ContainerConfig {
    let meta = &pod.metadata;
    let pod_ref = PodRef {
        name: meta.name.as_deref().unwrap_or_default(),
        namespace: meta.namespace.as_deref().unwrap_or_default(),
        uid: meta.uid.as_deref().unwrap_or_default(),
    };
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    ContainerConfig {
        metadata: ContainerMetadata {
            name: c.name.clone(),
            attempt,
        },
        // the spec's image; start_container resolves it to the ID, as the kubelet does
        image: c.image.clone().unwrap_or_default(),
        user_specified_image: String::new(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), env_value(pod, e)))
            .collect(),
        labels: kubelet_meta::container_labels(pod_ref, &c.name, &StringMap::new()),
        annotations: kubelet_meta::container_annotations(
            &format_hash(hash_container(c)),
            attempt,
            grace,
            None,
        ),
        log_path: format!("{}/{attempt}.log", c.name),
    }
}

/// An env var's value as the kubelet resolves it when it creates the container.
fn env_value(pod: &Pod, e: &EnvVar) -> String {
    let meta = &pod.metadata;
    if let Some(r) = env_meta_ref(e) {
        let labels = meta.labels.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        return r.resolve(&labels, &annotations).to_string();
    }
    let field = e
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    match field {
        Some("metadata.name") => meta.name.clone().unwrap_or_default(),
        Some("metadata.namespace") => meta.namespace.clone().unwrap_or_default(),
        Some("metadata.uid") => meta.uid.clone().unwrap_or_default(),
        Some("spec.nodeName") => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        Some("status.hostIP" | "status.podIP") => "127.0.0.1".into(),
        _ => e.value.clone().unwrap_or_default(),
    }
}

/// The pod status the kubelet reports: phase, containers, and the conditions, `Ready` only when
/// every container runs and every readiness gate is True. Transition times move only when a
/// condition's status changes, so an unchanged pod gives the same status.
fn pod_status(pod: &Pod, containers: Vec<Value>) -> Value {
    let current: BTreeMap<&str, (&str, Option<String>)> = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .map(|c| {
            let time = c
                .last_transition_time
                .as_ref()
                .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            (c.type_.as_str(), (c.status.as_str(), time))
        })
        .collect();
    let all_running = !containers.is_empty()
        && containers
            .iter()
            .all(|c| c["ready"].as_bool().unwrap_or(false));
    let gates_true = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .all(|g| current.get(g.condition_type.as_str()).map(|c| c.0) == Some("True"));
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let condition = |type_: &str, ok: bool| {
        let status = if ok { "True" } else { "False" };
        let time = match current.get(type_) {
            Some((s, Some(t))) if *s == status => t.clone(),
            _ => now.clone(),
        };
        let mut c = json!({ "type": type_, "status": status, "lastTransitionTime": time });
        // the kubelet's reasons, which kruised reads (the readiness gate's)
        if !ok && (type_ == "Ready" || type_ == "ContainersReady") {
            c["reason"] = json!(if all_running {
                "ReadinessGatesNotReady"
            } else {
                "ContainersNotReady"
            });
        }
        c
    };
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map_or(now.clone(), |t| {
            t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
        });
    json!({
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": started,
        "conditions": [
            condition("PodScheduled", true),
            condition("Initialized", true),
            condition("ContainersReady", all_running),
            condition("Ready", all_running && gates_true),
        ],
        "containerStatuses": containers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kruised::k8s::keys;

    fn pod(gate_status: Option<&str>) -> Pod {
        let mut conditions = vec![json!({"type": "Ready", "status": "False",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"})];
        if let Some(s) = gate_status {
            conditions.push(json!({"type": "InPlaceUpdateReady", "status": s}));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "demo", "uid": "u1",
                         "labels": {"tier": "front"}, "annotations": {"app-config": "v1"}},
            "spec": {"nodeName": "n1", "readinessGates": [{"conditionType": "InPlaceUpdateReady"}],
                     "containers": [{"name": "app", "image": "busybox", "env": [
                        {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['app-config']"}}},
                        {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
                        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "P", "value": "plain"},
                        {"name": "M", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['missing']"}}}]}]},
            "status": {"conditions": conditions}
        }))
        .expect("a pod")
    }

    fn condition(status: &Value, type_: &str) -> (String, String) {
        let c = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["lastTransitionTime"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    fn running() -> Vec<Value> {
        vec![json!({"name": "app", "ready": true})]
    }

    #[test]
    fn the_pod_is_ready_only_when_its_containers_run_and_every_readiness_gate_is_true() {
        assert_eq!(
            condition(&pod_status(&pod(Some("True")), running()), "Ready").0,
            "True"
        );
        assert_eq!(
            condition(&pod_status(&pod(Some("False")), running()), "Ready").0,
            "False"
        );
        assert_eq!(
            condition(&pod_status(&pod(None), running()), "Ready").0,
            "False"
        );
        let stopped = vec![json!({"name": "app", "ready": false})];
        let status = pod_status(&pod(Some("True")), stopped);
        assert_eq!(condition(&status, "Ready").0, "False");
        assert_eq!(condition(&status, "ContainersReady").0, "False");
    }

    #[test]
    fn ready_false_gives_the_kubelets_reason_which_kruised_reads() {
        let reason = |status: &Value| {
            status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["reason"].clone())
        };
        let gate = pod_status(&pod(Some("False")), running());
        assert_eq!(reason(&gate), Some(json!("ReadinessGatesNotReady")));
        let stopped = vec![json!({"name": "app", "ready": false})];
        let containers = pod_status(&pod(Some("False")), stopped);
        assert_eq!(reason(&containers), Some(json!("ContainersNotReady")));
        let ready = pod_status(&pod(Some("True")), running());
        assert_eq!(reason(&ready), Some(Value::Null));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let unchanged = pod_status(&pod(Some("False")), running());
        assert_eq!(
            condition(&unchanged, "Ready"),
            ("False".to_string(), "2026-01-01T00:00:00Z".to_string())
        );
        let changed = pod_status(&pod(Some("True")), running());
        assert_ne!(condition(&changed, "Ready").1, "2026-01-01T00:00:00Z");
    }

    #[test]
    fn env_is_resolved_from_the_pod_as_it_is_when_the_container_is_created() {
        let p = pod(None);
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let config = container_config(&p, c, 2);
        let env: BTreeMap<_, _> = config.envs.iter().cloned().collect();
        assert_eq!(env["A"], "v1");
        assert_eq!(env["L"], "front");
        assert_eq!(env["N"], "web-0");
        assert_eq!(env["H"], "n1");
        assert_eq!(env["P"], "plain");
        assert_eq!(
            env["M"], "",
            "a missing key resolves to empty, as in the kubelet"
        );
        assert_eq!(config.metadata.attempt, 2);
        assert_eq!(
            config.annotations[keys::KUBELET_CONTAINER_RESTART_COUNT],
            "2"
        );
        assert_eq!(
            config.annotations[keys::KUBELET_CONTAINER_HASH],
            format_hash(hash_container(c))
        );
        assert_eq!(config.labels[keys::KUBELET_POD_UID], "u1");
    }
}
