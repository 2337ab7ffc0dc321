//! `kubelet-stand-in`: the kubelet's part of one node, for kruised's demo on a machine without
//! Kubernetes (`scripts/demo.sh --api double`): the API-server double plays the control plane,
//! a real containerd runs the containers, and this plays the kubelet between them. Test
//! infrastructure, never shipped.
//!
//! Every `--sync-period` it lists the pods bound to `--node-name` and, for each, does what the
//! kubelet does as far as kruised can tell, with the tests' one kubelet
//! (`kruised_test_support::kubelet`: its labels, env, hash, CRI steps and status):
//!
//! * a new pod gets a sandbox and its containers through CRI, with the kubelet's labels and
//!   annotations (pod identity, container hash, restart count, grace period), each image pulled
//!   as its `imagePullPolicy` says, and each env var resolved from the pod as it is at that
//!   moment (`fieldRef` to labels, annotations, name, namespace, uid, node name);
//! * a container that exited is created again with attempt + 1 and the env of the pod as it is
//!   now (restart policy `Always`; the last dead container is kept, older ones removed); one
//!   whose spec changed (its hash) is killed first, as the kubelet does;
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

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kruised::cri::{
    ContainerState, Endpoint, KubeletService, RemoteRuntime, RuntimeService, SandboxConfig,
    Timeouts,
};
use kruised::k8s::keys;
use kruised_test_support::kubelet::meta::PodRef;
use kruised_test_support::kubelet::status::{self, Report, rfc3339_ns};
use kruised_test_support::kubelet::{Kubelet, PullPolicy, spec};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::json;

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

/// How long a pod that failed to start waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A container this process created, as it stands.
struct Running {
    id: String,
    attempt: u32,
    /// The previous container of this name, exited, kept as the kubelet keeps one.
    dead: Option<String>,
    /// `lastState.terminated` of the status, once a container of this name exited.
    last_terminated: Option<serde_json::Value>,
}

/// A pod this process runs.
struct RunningPod {
    namespace: String,
    name: String,
    sandbox: String,
    sandbox_config: SandboxConfig,
    grace: Duration,
    containers: BTreeMap<String, Running>,
}

struct StandIn {
    args: Args,
    pods: Api<Pod>,
    kubelet: Kubelet,
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
    let mut kubelet = Kubelet::new(runtime, &args.log_dir);
    kubelet.cgroup_root = args.cgroup_root.clone();
    let mut stand_in = StandIn {
        pods: Api::all(client),
        kubelet,
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

    /// Creates again the containers that exited or whose spec changed, then reports the
    /// containers in the pod status when what it reports changed.
    async fn sync_containers(&self, pod: &Pod, running: &mut RunningPod) -> Result<()> {
        let runtime = self.kubelet.runtime();
        let mut reports = Vec::new();
        let sandbox = (running.sandbox.clone(), running.sandbox_config.clone());
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let Some(r) = running.containers.get_mut(&c.name) else {
                continue;
            };
            let mut status = runtime.container_status(&r.id, false).await?;
            let exited = status.state == ContainerState::Exited;
            // a runtime that keeps no annotations tells of no change
            let recorded = status.annotations.get(keys::KUBELET_CONTAINER_HASH);
            let changed = recorded.is_some_and(|h| *h != spec::hash(c));
            if exited || changed {
                // the kubelet kills a container whose spec changed, with the pod's grace
                let old = r.id.clone();
                let kill = (!exited).then_some((old.as_str(), running.grace));
                r.attempt += 1;
                r.id = self
                    .start_container(pod, c, r.attempt, &sandbox, kill)
                    .await?;
                let dead = runtime.container_status(&old, false).await?;
                r.last_terminated = Some(json!({
                    "exitCode": dead.exit_code,
                    "reason": dead.reason,
                    "startedAt": rfc3339_ns(dead.started_at),
                    "finishedAt": rfc3339_ns(dead.finished_at),
                    "containerID": format!("{}://{old}", self.runtime_name),
                }));
                if let Some(older) = r.dead.replace(old) {
                    let _ = runtime.remove_container(&older).await;
                }
                let why = if exited { "exited" } else { "changed" };
                log(format!(
                    "pod {}/{}: container {} {why} ({}), started again as {} (restartCount {})",
                    running.namespace, running.name, c.name, dead.exit_code, r.id, r.attempt
                ));
                status = runtime.container_status(&r.id, false).await?;
            }
            let is_running = status.state == ContainerState::Running;
            reports.push(Report {
                name: c.name.clone(),
                container_id: format!("{}://{}", self.runtime_name, r.id),
                image: c.image.clone().unwrap_or_default(),
                image_id: if status.image_ref.is_empty() {
                    status.image_id
                } else {
                    status.image_ref
                },
                restart_count: r.attempt,
                running: is_running.then(|| rfc3339_ns(status.started_at)),
                waiting: Some("ContainerCreating".into()),
                last_terminated: r.last_terminated.clone(),
            });
        }
        let pod_json = serde_json::to_value(pod)?;
        let containers = reports.iter().map(Report::json).collect();
        let status = status::pod_status(&pod_json, &pod_json, containers);
        if status::changed(&pod_json, &status) {
            Api::<Pod>::namespaced(self.pods.clone().into_client(), &running.namespace)
                .patch_status(
                    &running.name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({ "status": status })),
                )
                .await
                .context("patching the pod status")?;
        }
        Ok(())
    }

    async fn start_pod(&self, uid: &str, pod: &Pod) -> Result<RunningPod> {
        let spec = pod.spec.as_ref().context("the pod has no spec")?;
        let pod_ref = PodRef::of(pod);
        let meta = &pod.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        let sandbox_config = spec::sandbox_config(
            pod_ref,
            0,
            &labels,
            meta.annotations.clone().unwrap_or_default(),
            &self.args.log_dir,
            &self.args.cgroup_root,
        );
        std::fs::create_dir_all(&sandbox_config.log_directory).with_context(|| {
            format!(
                "creating the log directory {}",
                sandbox_config.log_directory
            )
        })?;
        let runtime = self.kubelet.runtime();
        let mut running = RunningPod {
            namespace: pod_ref.namespace.into(),
            name: pod_ref.name.into(),
            sandbox: runtime.run_pod_sandbox(sandbox_config.clone()).await?,
            sandbox_config,
            grace: Duration::from_secs(spec::grace_seconds(pod).try_into().unwrap_or(30)),
            containers: BTreeMap::new(),
        };
        for c in &spec.containers {
            match self
                .start_container(
                    pod,
                    c,
                    0,
                    &(running.sandbox.clone(), running.sandbox_config.clone()),
                    None,
                )
                .await
            {
                Ok(id) => {
                    let r = Running {
                        id,
                        attempt: 0,
                        dead: None,
                        last_terminated: None,
                    };
                    running.containers.insert(c.name.clone(), r);
                }
                Err(e) => {
                    self.remove(running).await;
                    return Err(e.context(format!("container {}", c.name)));
                }
            }
        }
        let ids: Vec<String> = running
            .containers
            .iter()
            .map(|(n, r)| format!("{n}={}", r.id))
            .collect();
        log(format!(
            "pod {}/{} (uid {uid}): sandbox {} with {}",
            running.namespace,
            running.name,
            running.sandbox,
            ids.join(" ")
        ));
        Ok(running)
    }

    /// Starts container `c` of `pod` with `attempt` as the kubelet does, killing `kill` first:
    /// the image step (a pull as its policy says), the create, the start.
    async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        (sandbox, sandbox_config): &(String, SandboxConfig),
        kill: Option<(&str, Duration)>,
    ) -> Result<String> {
        let config = spec::container_config(pod, c, attempt);
        let policy = PullPolicy::of_container(c);
        self.kubelet
            .start_config(sandbox, config, policy, sandbox_config.clone(), kill)
            .await
            .map_err(|e| anyhow!("starting the container: {e}"))
    }

    /// Stops and removes a pod's containers and sandbox, as the kubelet does for a deleted pod.
    async fn remove(&self, pod: RunningPod) {
        for r in pod.containers.values() {
            if let Err(e) = self
                .kubelet
                .runtime()
                .stop_container(&r.id, pod.grace)
                .await
            {
                log(format!("stopping {}: {e}", r.id));
            }
        }
        match self.kubelet.remove_sandbox(&pod.sandbox).await {
            Ok(()) => log(format!("pod {}/{}: removed", pod.namespace, pod.name)),
            Err(e) => log(format!(
                "pod {}/{}: removing sandbox {}: {e}",
                pod.namespace, pod.name, pod.sandbox
            )),
        }
    }
}
