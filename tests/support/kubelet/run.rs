//! The kubelet of nodes whose pods come from an API server through a client and whose runtime
//! it reaches through CRI: the demo's one node on a real runtime (`tests/kubelet-stand-in`) and
//! the fleet's nodes on the fake runtime ([`crate::fleet::Kubelets`]). One watch of the pods
//! for every node; on each change it brings and every `period` (the PLEG's relist), each pod
//! bound to one of the nodes is synced with the pod as it is then:
//!
//! * a new pod gets a sandbox and its containers ([`Kubelet::start_config`]: the image step as
//!   its `imagePullPolicy` says, the create with the kubelet's labels and annotations and the
//!   env resolved from the pod now, the start);
//! * a container that exited is created again with attempt + 1 from the pod as it is now
//!   (restart policy `Always`, no back-off; the last dead container is kept, older ones
//!   removed); one whose spec changed (its hash) is killed first, with the pod's grace period;
//! * the pod status ([`super::status`]: container IDs with the runtime's prefix, image IDs,
//!   restart counts, running states, last terminations; `Ready` from the containers and the
//!   readiness gates) is patched when what it reports changed;
//! * a pod that left the API, or is being deleted, is stopped and removed; a pod whose start
//!   failed is tried again after [`RETRY_AFTER`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kruised::cri::{ContainerState, KubeletService, RuntimeService, SandboxConfig};
use kruised::k8s::keys;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::cri::{BoxError, Kubelet};
use super::meta::PodRef;
use super::spec::{self, PullPolicy};
use super::status::{self, Report, rfc3339_ns};

/// How long a pod whose start failed waits before the next try.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A container the kubelet created, as it stands.
struct Running {
    id: String,
    attempt: u32,
    /// The previous container of this name, exited, kept as the kubelet keeps one.
    dead: Option<String>,
    /// `lastState.terminated` of the status, once a container of this name exited.
    last_terminated: Option<Value>,
}

/// A pod the kubelet runs.
struct RunPod {
    name: String,
    sandbox: String,
    sandbox_config: SandboxConfig,
    grace: Duration,
    containers: BTreeMap<String, Running>,
}

/// The kubelet of one node.
pub struct NodeKubelet {
    /// The node: its pods are those bound to it.
    pub node: String,
    kubelet: Kubelet,
    /// The runtime's name: the prefix of container IDs in the pod status.
    runtime_name: String,
    /// Whether it says what it does on stderr.
    verbose: bool,
    /// The pods it runs, by uid.
    pods: HashMap<String, RunPod>,
    /// Pods whose start failed, by uid, and when.
    failed: HashMap<String, Instant>,
}

impl NodeKubelet {
    /// The kubelet of `node` on the runtime `kubelet` drives, which names itself
    /// `runtime_name`; `verbose`: it says what it does on stderr.
    pub fn new(node: &str, kubelet: Kubelet, runtime_name: &str, verbose: bool) -> NodeKubelet {
        NodeKubelet {
            node: node.into(),
            kubelet,
            runtime_name: runtime_name.into(),
            verbose,
            pods: HashMap::new(),
            failed: HashMap::new(),
        }
    }

    fn log(&self, msg: impl std::fmt::Display) {
        if self.verbose {
            let now = Timestamp::now().strftime("%H:%M:%S%.3f");
            eprintln!("{now} kubelet of {}: {msg}", self.node);
        }
    }

    /// One sync of the node's `pods` (the pods as they are now, by uid): returns the status
    /// patches to write, by namespace and name.
    async fn sync(&mut self, pods: Vec<(String, Arc<Pod>)>) -> Vec<(String, String, Value)> {
        let mut patches = Vec::new();
        let seen: HashSet<String> = pods.iter().map(|(uid, _)| uid.clone()).collect();
        for (uid, pod) in pods {
            let r = PodRef::of(&pod);
            let (ns, name) = (r.namespace.to_string(), r.name.to_string());
            match self.sync_pod(&uid, &pod).await {
                Ok(Some(patch)) => patches.push((ns, name, patch)),
                Ok(None) => {}
                Err(e) => self.log(format!("pod {ns}/{name}: {e}")),
            }
        }
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(pod) = self.pods.remove(&uid) {
                self.remove(pod).await;
            }
        }
        self.failed.retain(|uid, _| seen.contains(uid));
        patches
    }

    /// Starts the pod if it is new, creates again its containers that exited or whose spec
    /// changed; returns its status patch when what it reports changed.
    async fn sync_pod(&mut self, uid: &str, pod: &Pod) -> Result<Option<Value>, BoxError> {
        if !self.pods.contains_key(uid) {
            if self
                .failed
                .get(uid)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                return Ok(None);
            }
            match self.start_pod(pod).await {
                Ok(run) => {
                    self.failed.remove(uid);
                    self.pods.insert(uid.into(), run);
                }
                Err(e) => {
                    self.failed.insert(uid.into(), Instant::now());
                    return Err(e);
                }
            }
        }
        let Some(mut run) = self.pods.remove(uid) else {
            return Ok(None);
        };
        let reports = self.sync_containers(pod, &mut run).await;
        self.pods.insert(uid.into(), run);
        let pod_json = serde_json::to_value(pod)?;
        let containers = reports?.iter().map(Report::json).collect();
        let status = status::pod_status(&pod_json, &pod_json, containers);
        Ok(status::changed(&pod_json, &status).then(|| json!({ "status": status })))
    }

    /// Creates again the containers that exited or whose spec changed; returns each
    /// container's report.
    async fn sync_containers(&self, pod: &Pod, run: &mut RunPod) -> Result<Vec<Report>, BoxError> {
        let runtime = self.kubelet.runtime();
        let mut reports = Vec::new();
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let Some(r) = run.containers.get_mut(&c.name) else {
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
                let kill = (!exited).then_some((old.as_str(), run.grace));
                let sandbox = (run.sandbox.as_str(), &run.sandbox_config);
                let id = self.start(pod, c, r.attempt + 1, sandbox, kill).await?;
                r.attempt += 1;
                r.id = id;
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
                self.log(format!(
                    "pod {}: container {} {why} ({}), started again as {} (restartCount {})",
                    run.name, c.name, dead.exit_code, r.id, r.attempt
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
        Ok(reports)
    }

    /// Creates the pod's sandbox and starts its containers; on a failure, removes what it made.
    async fn start_pod(&self, pod: &Pod) -> Result<RunPod, BoxError> {
        let r = PodRef::of(pod);
        let sandbox_config = self.kubelet.sandbox_config_of(pod)?;
        let mut run = RunPod {
            name: format!("{}/{}", r.namespace, r.name),
            sandbox: self
                .kubelet
                .runtime()
                .run_pod_sandbox(sandbox_config.clone())
                .await?,
            sandbox_config,
            grace: Duration::from_secs(spec::grace_seconds(pod).try_into().unwrap_or(30)),
            containers: BTreeMap::new(),
        };
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            match self
                .start(pod, c, 0, (&run.sandbox, &run.sandbox_config), None)
                .await
            {
                Ok(id) => {
                    let r = Running {
                        id,
                        attempt: 0,
                        dead: None,
                        last_terminated: None,
                    };
                    run.containers.insert(c.name.clone(), r);
                }
                Err(e) => {
                    self.remove(run).await;
                    return Err(format!("container {}: {e}", c.name).into());
                }
            }
        }
        let ids: Vec<String> = run
            .containers
            .iter()
            .map(|(n, r)| format!("{n}={}", r.id))
            .collect();
        self.log(format!(
            "pod {}: sandbox {} with {}",
            run.name,
            run.sandbox,
            ids.join(" ")
        ));
        Ok(run)
    }

    /// Starts container `c` of `pod` with `attempt` in the pod's sandbox as the kubelet does,
    /// killing `kill` first.
    async fn start(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        (sandbox, sandbox_config): (&str, &SandboxConfig),
        kill: Option<(&str, Duration)>,
    ) -> Result<String, BoxError> {
        let config = spec::container_config(pod, c, attempt);
        let policy = PullPolicy::of_container(c);
        let sandbox_config = sandbox_config.clone();
        self.kubelet
            .start_config(sandbox, config, policy, sandbox_config, kill)
            .await
    }

    /// Stops and removes a pod's containers and sandbox, as the kubelet does for a deleted pod.
    async fn remove(&self, pod: RunPod) {
        for r in pod.containers.values() {
            let stop = self.kubelet.runtime().stop_container(&r.id, pod.grace);
            if let Err(e) = stop.await {
                self.log(format!("stopping {}: {e}", r.id));
            }
        }
        match self.kubelet.remove_sandbox(&pod.sandbox).await {
            Ok(()) => self.log(format!("pod {}: removed", pod.name)),
            Err(e) => self.log(format!("pod {}: removing its sandbox: {e}", pod.name)),
        }
    }

    /// Stops and removes every pod it runs.
    pub async fn remove_all(&mut self) {
        for (_, pod) in std::mem::take(&mut self.pods) {
            self.remove(pod).await;
        }
    }
}

/// The kubelets of some nodes, with one watch of the pods for all of them.
pub struct NodeKubelets {
    /// Each node's.
    pub nodes: Vec<NodeKubelet>,
    pods: Api<Pod>,
    store: Store<Pod>,
    writer: Option<reflector::store::Writer<Pod>>,
}

impl NodeKubelets {
    /// The kubelets of `nodes`, watching `pods` (their status written through its client).
    pub fn new(pods: Api<Pod>, nodes: Vec<NodeKubelet>) -> NodeKubelets {
        let (store, writer) = reflector::store();
        NodeKubelets {
            nodes,
            pods,
            store,
            writer: Some(writer),
        }
    }

    /// The pods as the watch last saw them.
    pub fn store(&self) -> Store<Pod> {
        self.store.clone()
    }

    /// Syncs the pods on each change the watch brings and every `period`, for ever (once).
    pub async fn run(&mut self, period: Duration) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        let stream = reflector::reflector(writer, watcher(self.pods.clone(), Default::default()))
            .default_backoff()
            .applied_objects();
        // the watch runs on its own, so the store is current whenever a container is created
        // again (a kubelet takes a pod change from its watch while it syncs others)
        let changed = Arc::new(tokio::sync::Notify::new());
        let notify = changed.clone();
        let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while stream.next().await.is_some() {
                notify.notify_one();
            }
        }));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = changed.notified() => {}
                _ = tick.tick() => {}
            }
            self.sync().await;
        }
    }

    /// One sync of every node's pods, each node's beside the others', then the status writes.
    async fn sync(&mut self) {
        let store = self.store.clone();
        let syncs = self.nodes.iter_mut().map(|node| {
            // the pods as they are now, not as they were when this round began
            let pods = store
                .state()
                .iter()
                .filter_map(|listed| store.get(&reflector::ObjectRef::from_obj(&**listed)))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(&node.node)
                })
                .filter_map(|p| Some((p.uid()?, p)))
                .collect();
            node.sync(pods)
        });
        let patches = futures::future::join_all(syncs).await;
        let client = self.pods.clone().into_client();
        futures::stream::iter(patches.into_iter().flatten())
            .for_each_concurrent(32, |(ns, name, patch)| {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                async move {
                    // a write that fails is made again on the next round: the status still
                    // differs then
                    let params = PatchParams::default();
                    let _ = pods
                        .patch_status(&name, &params, &Patch::Strategic(&patch))
                        .await;
                }
            })
            .await;
    }
}
