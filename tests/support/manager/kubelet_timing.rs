//! The kubelet's sync timing, for the tests of kruised's settle model
//! (`src/controller/containermeta/settle.rs`): what made a second restart possible on a real
//! kubelet, played on the fake node.
//!
//! Seen on the cluster layer (a real v1.36 kubelet, `tests/cluster/containermeta.rs` and
//! `dropin.rs`, and written down in `settle.rs`): the pod lifecycle event generator (PLEG)
//! relists the runtime every second; a pod worker takes the pod as it is when its sync starts,
//! then waits for a relist newer than that start (`podCache.GetNewerThan`), and acts on what
//! that relist saw with the pod it took: an exited container is created again with env resolved
//! from that pod, and the pod's `Ready` is computed from that pod's readiness-gate conditions.
//! A sync is started by a change of the pod's spec or metadata, or of a readiness gate's
//! condition (`NeedToReconcilePodReadiness`), and by a relist that saw a container change; a
//! change while a sync waits starts another one after it.
//!
//! So a sync that took the pod before an env change (the manager's `InPlaceUpdateReady=False`
//! write starts one, the annotation comes a moment later) and a stop made before its relist
//! give a container created from the old pod: a second restart, which kruised's settle waits
//! out. [`KubeletTiming::hold`] stops the relists, so a test can line that up on purpose.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kruised::cri::ContainerState;
use kruised::hash::kubelet::{format_hash, hash_container};
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::kubelet::{HASH_ANNOTATION, recreate, report_with_gates};
use crate::node::FakeNode;

/// A kubelet with the real one's sync timing for the pods of one [`FakeNode`]; dropping it
/// stops it.
pub struct KubeletTiming {
    task: JoinHandle<()>,
    held: watch::Sender<bool>,
    waiting: watch::Receiver<Vec<String>>,
}

impl KubeletTiming {
    /// Starts it, relisting every `relist` (the kubelet's: 1 s).
    pub fn start(node: Arc<FakeNode>, relist: Duration) -> KubeletTiming {
        let (held, rx) = watch::channel(false);
        let (waiting_tx, waiting) = watch::channel(Vec::new());
        KubeletTiming {
            task: tokio::spawn(run(node, relist, rx, waiting_tx)),
            held,
            waiting,
        }
    }

    /// Waits until a sync of pod `name` has taken the pod and waits for a relist, at most
    /// `limit`; false if none did.
    pub async fn wait_sync_waiting(&self, name: &str, limit: Duration) -> bool {
        let mut rx = self.waiting.clone();
        tokio::time::timeout(limit, rx.wait_for(|w| w.iter().any(|n| n == name)))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// No relist from now on until [`KubeletTiming::release`]: the syncs waiting for one wait.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Relists again.
    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for KubeletTiming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What of a pod starts a sync: everything but what the kubelet writes itself (container
/// statuses, its own conditions, phase and IPs).
fn sync_signature(obj: &Value) -> String {
    let mut o = obj.clone();
    if let Some(status) = o.get_mut("status").and_then(Value::as_object_mut) {
        status.retain(|k, _| k == "conditions");
        if let Some(conditions) = status.get_mut("conditions").and_then(Value::as_array_mut) {
            conditions.retain(|c| {
                !matches!(
                    c["type"].as_str(),
                    Some("Ready" | "ContainersReady" | "Initialized" | "PodScheduled")
                )
            });
            for c in conditions.iter_mut() {
                if let Some(m) = c.as_object_mut() {
                    m.retain(|k, _| k == "type" || k == "status");
                }
            }
        }
    }
    if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    o.to_string()
}

/// The runtime's containers and their states.
fn runtime_states(node: &FakeNode) -> BTreeMap<String, ContainerState> {
    node.cri
        .state()
        .containers
        .iter()
        .map(|(id, c)| (id.clone(), c.status.state))
        .collect()
}

async fn run(
    node: Arc<FakeNode>,
    relist: Duration,
    mut held: watch::Receiver<bool>,
    waiting_tx: watch::Sender<Vec<String>>,
) {
    const FAR: Duration = Duration::from_secs(3600);
    // the pod each waiting sync took, by pod name
    let mut waiting: HashMap<String, Value> = HashMap::new();
    // pods changed while their sync waited: another sync after it
    let mut again: Vec<String> = Vec::new();
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut states = runtime_states(&node);
    let mut tick = tokio::time::interval(relist);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // pod changes start syncs, each with the pod as it is now
        for name in node.sandboxes.keys() {
            let Some(obj) = node.api.get("pods", "default", name) else {
                continue;
            };
            let sig = sync_signature(&obj);
            if seen.get(name) == Some(&sig) {
                continue;
            }
            seen.insert(name.clone(), sig);
            if waiting.contains_key(name) {
                if !again.contains(name) {
                    again.push(name.clone());
                }
            } else {
                waiting.insert(name.clone(), obj);
            }
        }
        waiting_tx.send_replace(waiting.keys().cloned().collect());
        let rv = node.api.resource_version();
        let is_held = *held.borrow();
        let api = node.api.control();
        tokio::select! {
            _ = api.wait_for(FAR, |v| v.resource_version() != rv) => continue,
            _ = held.changed() => continue,
            _ = tick.tick(), if !is_held => {}
        }
        // a relist: the waiting syncs act on it with the pods they took
        let now_states = runtime_states(&node);
        let changed: Vec<String> = node
            .sandboxes
            .keys()
            .filter(|name| pod_containers_changed(&node, name, &states, &now_states))
            .cloned()
            .collect();
        let mut synced: Vec<String> = Vec::new();
        for (name, copy) in waiting.drain() {
            sync_with(&node, &name, &copy);
            synced.push(name);
        }
        // a relist that saw a container change starts a sync at once, with the pod as it is
        for name in changed.iter().filter(|n| !synced.contains(n)) {
            if let Some(obj) = node.api.get("pods", "default", name) {
                sync_with(&node, name, &obj);
            }
        }
        // changes that came while a sync waited: a new sync, with the pod now
        for name in again.drain(..) {
            if let Some(obj) = node.api.get("pods", "default", &name) {
                waiting.insert(name, obj);
            }
        }
        // what the syncs wrote is the kubelet's own: no sync of its own for it
        for name in node.sandboxes.keys() {
            if let Some(obj) = node.api.get("pods", "default", name) {
                seen.insert(name.clone(), sync_signature(&obj));
            }
        }
        states = runtime_states(&node);
    }
}

/// Whether a container of pod `name` (by its reported IDs) changed state between two relists.
fn pod_containers_changed(
    node: &FakeNode,
    name: &str,
    before: &BTreeMap<String, ContainerState>,
    after: &BTreeMap<String, ContainerState>,
) -> bool {
    let Some(obj) = node.api.get("pods", "default", name) else {
        return false;
    };
    let prefix = node.cri.kubelet_id("");
    obj["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["containerID"].as_str())
        .map(|id| id.strip_prefix(prefix.as_str()).unwrap_or(id).to_string())
        .any(|id| before.get(&id) != after.get(&id))
}

/// One sync of pod `name` with the pod `copy` it took: containers that exited, or whose spec
/// hash changed in `copy`, are created again from `copy`; the status is reported with `Ready`
/// from `copy`'s readiness-gate conditions.
fn sync_with(node: &FakeNode, name: &str, copy: &Value) {
    let Ok(pod) = serde_json::from_value::<Pod>(copy.clone()) else {
        return;
    };
    let Some(live) = node.api.get("pods", "default", name) else {
        return;
    };
    let specs: Vec<Container> = pod.spec.clone().map(|s| s.containers).unwrap_or_default();
    let prefix = node.cri.kubelet_id("");
    for c in &specs {
        // the container as reported now: the kubelet's own last write
        let Some(status) = live["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == c.name.as_str()))
        else {
            continue;
        };
        let raw = status["containerID"].as_str().unwrap_or("");
        let id = raw.strip_prefix(prefix.as_str()).unwrap_or(raw).to_string();
        let (running, hash) = {
            let st = node.cri.state();
            match st.containers.get(&id) {
                Some(rc) => (
                    rc.status.state == ContainerState::Running,
                    rc.status.annotations.get(HASH_ANNOTATION).cloned(),
                ),
                None => (false, None),
            }
        };
        let spec_changed = hash.is_some_and(|h| h != format_hash(hash_container(c)));
        if !running || spec_changed {
            recreate(node, &pod, c, &id, status, running);
        }
    }
    report_with_gates(node, name, Some(copy));
}

impl std::fmt::Debug for KubeletTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletTiming")
            .field("held", &*self.held.borrow())
            .finish_non_exhaustive()
    }
}
