//! The kubelet of nodes whose pods come from an API server through a client and whose runtime
//! it reaches through CRI: the demo's one node on a real runtime (`tests/kubelet-stand-in`) and
//! the fleet's nodes on the fake runtime ([`crate::fleet::Kubelets`]). One watch of the pods
//! for every node; on each change it brings and every `period` (the PLEG's relist), each pod
//! bound to one of the nodes is synced with the pod as it is then:
//!
//! * a new pod gets a sandbox and its containers ([`Kubelet::try_run_pod`]: the image step as
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
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kruised::cri::{ContainerState, KubeletService, RuntimeService};
use kruised::k8s::keys;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::cri::{BoxError, Kubelet, RunningPod};
use super::spec::PodSpec;
use super::status::{self, Report, rfc3339_ns};

/// How long a pod whose start failed waits before the next try.
pub const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A pod the kubelet runs, and per container the one before (exited, kept as the kubelet keeps
/// one) and `lastState.terminated` of the status, once a container of that name exited.
struct RunPod {
    pod: RunningPod,
    dead: BTreeMap<String, String>,
    last_terminated: BTreeMap<String, Value>,
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

    fn log(&self, pod: &PodSpec, msg: impl std::fmt::Display) {
        if self.verbose {
            let now = Timestamp::now().strftime("%H:%M:%S%.3f");
            let (node, ns, name) = (&self.node, &pod.namespace, &pod.name);
            eprintln!("{now} kubelet of {node}: pod {ns}/{name}: {msg}");
        }
    }

    /// One sync of the node's `pods` (the pods as they are now, by uid): returns the status
    /// patches to write, by namespace and name.
    async fn sync(&mut self, pods: Vec<(String, Arc<Pod>)>) -> Vec<(String, String, Value)> {
        let mut patches = Vec::new();
        let seen: HashSet<String> = pods.iter().map(|(uid, _)| uid.clone()).collect();
        for (uid, pod) in pods {
            let spec = PodSpec::of(&pod);
            match self.sync_pod(&uid, &pod, &spec).await {
                Ok(Some(patch)) => patches.push((spec.namespace, spec.name, patch)),
                Ok(None) => {}
                Err(e) => self.log(&spec, e),
            }
        }
        let gone: Vec<_> = self.pods.extract_if(|uid, _| !seen.contains(uid)).collect();
        for (_, run) in gone {
            self.remove(run).await;
        }
        self.failed.retain(|uid, _| seen.contains(uid));
        patches
    }

    /// Starts the pod (`spec`, as it is now) if it is new, creates again its containers that
    /// exited or whose spec changed; returns its status patch when what it reports changed.
    async fn sync_pod(
        &mut self,
        uid: &str,
        pod: &Pod,
        spec: &PodSpec,
    ) -> Result<Option<Value>, BoxError> {
        let mut run = match self.pods.remove(uid) {
            Some(run) => run,
            None if self
                .failed
                .get(uid)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER) =>
            {
                return Ok(None);
            }
            None => {
                let pod = match self.kubelet.try_run_pod(spec.clone()).await {
                    Ok(pod) => pod,
                    Err(e) => {
                        self.failed.insert(uid.into(), Instant::now());
                        return Err(e);
                    }
                };
                let ids = pod.containers.iter().map(|(n, id)| format!(" {n}={id}"));
                let ids: String = ids.collect();
                self.log(spec, format_args!("sandbox {} with{ids}", pod.sandbox_id));
                self.failed.remove(uid);
                RunPod {
                    pod,
                    dead: BTreeMap::new(),
                    last_terminated: BTreeMap::new(),
                }
            }
        };
        run.pod.spec = spec.clone();
        let reports = self.sync_containers(&mut run).await;
        self.pods.insert(uid.into(), run);
        let pod_json = serde_json::to_value(pod)?;
        let containers = reports?.iter().map(Report::json).collect();
        let status = status::pod_status(&pod_json, &pod_json, containers);
        Ok(status::changed(&pod_json, &status).then(|| json!({ "status": status })))
    }

    /// Creates again, from the pod's spec as it is now, the containers that exited or whose
    /// spec changed; returns each container's report.
    async fn sync_containers(&self, run: &mut RunPod) -> Result<Vec<Report>, BoxError> {
        let runtime = self.kubelet.runtime();
        let mut reports = Vec::new();
        for c in run.pod.spec.containers.clone() {
            let Some(old) = run.pod.containers.get(&c.name).cloned() else {
                continue;
            };
            let mut status = runtime.container_status(&old, false).await?;
            let exited = status.state == ContainerState::Exited;
            // a runtime that keeps no annotations tells of no change
            let recorded = status.annotations.get(keys::KUBELET_CONTAINER_HASH);
            if exited || recorded.is_some_and(|h| *h != c.hash) {
                // the kubelet kills a container whose spec changed, with the pod's grace
                let id = self.kubelet.try_recreate(&mut run.pod, &c.name, !exited);
                let id = id.await?;
                let dead = runtime.container_status(&old, false).await?;
                let terminated = json!({
                    "exitCode": dead.exit_code,
                    "reason": dead.reason,
                    "startedAt": rfc3339_ns(dead.started_at),
                    "finishedAt": rfc3339_ns(dead.finished_at),
                    "containerID": format!("{}://{old}", self.runtime_name),
                });
                run.last_terminated.insert(c.name.clone(), terminated);
                if let Some(older) = run.dead.insert(c.name.clone(), old) {
                    let _ = runtime.remove_container(&older).await;
                }
                let (why, attempt) = (
                    if exited { "exited" } else { "changed" },
                    run.pod.attempts[&c.name],
                );
                let msg = format!(
                    "container {} {why} ({}), started again as {id} (restartCount {attempt})",
                    c.name, dead.exit_code
                );
                self.log(&run.pod.spec, msg);
                status = runtime.container_status(&id, false).await?;
            }
            let is_running = status.state == ContainerState::Running;
            reports.push(Report {
                name: c.name.clone(),
                container_id: format!("{}://{}", self.runtime_name, run.pod.container(&c.name)),
                image: c.image.clone(),
                image_id: if status.image_ref.is_empty() {
                    status.image_id
                } else {
                    status.image_ref
                },
                restart_count: run.pod.attempts[&c.name],
                running: is_running.then(|| rfc3339_ns(status.started_at)),
                last_terminated: run.last_terminated.get(&c.name).cloned(),
            });
        }
        Ok(reports)
    }

    /// Stops and removes a pod's containers and sandbox, as the kubelet does for a deleted pod.
    async fn remove(&self, run: RunPod) {
        let (pod, grace) = (&run.pod, run.pod.grace());
        match self.kubelet.try_remove_pod(pod, grace).await {
            Ok(()) => self.log(&pod.spec, "removed"),
            Err(e) => self.log(&pod.spec, format_args!("removing its sandbox: {e}")),
        }
    }

    /// Stops and removes every pod it runs.
    pub async fn remove_all(&mut self) {
        for (_, run) in std::mem::take(&mut self.pods) {
            self.remove(run).await;
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
            // the node's pods as the watch last saw them
            let pods = store
                .state()
                .into_iter()
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
