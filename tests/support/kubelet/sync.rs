//! The kubelet's sync loop on an in-process node ([`FakeNode`]), [`KubeletTiming`], in two
//! timings:
//!
//! - [`KubeletTiming::at_once`], for tests where the manager double drives the node: it
//!   registers the Node (Ready) and acts at once on what it sees (no relist period, no sync
//!   holding an older pod, no back-off);
//! - [`KubeletTiming::start`], the real one's sync timing, for the tests of kruised's settle
//!   model (`src/controller/containermeta/settle.rs`): what made a second restart possible on a
//!   real kubelet, played on the fake node.
//!
//! A sync creates again (attempt + 1, from the pod it took) a container that exited (a stop by
//! the daemon) or whose spec hash changed (an in-place image update): kill, the image step,
//! start ([`FakeNode::recreate_reported`]); then it reports the pod's status
//! ([`super::status`]) with each container's image, image ID, restart count and start time from
//! the runtime.
//!
//! The timing, seen on the cluster layer (a real v1.36 kubelet, `tests/cluster/containermeta.rs`
//! and `dropin.rs`, and written down in `settle.rs`): the pod lifecycle event generator (PLEG)
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

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kruised::cri::ContainerState;
use kruised::cri::fake::{FakeContainer, FakeState};
use kruised::k8s::keys;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::status::{self, POD_IP, rfc3339, rfc3339_ns};
use crate::node::{FakeNode, NODE};

const FAR: Duration = Duration::from_secs(3600);

/// A kubelet with the real one's sync timing for the pods of one [`FakeNode`]; dropping it
/// stops it.
#[derive(Debug)]
pub struct KubeletTiming {
    _task: AbortOnDropHandle<()>,
    held: watch::Sender<bool>,
    waiting: watch::Receiver<Vec<String>>,
}

impl KubeletTiming {
    /// Starts it, relisting every `relist` (the kubelet's: 1 s).
    pub fn start(node: Arc<FakeNode>, relist: Duration) -> KubeletTiming {
        KubeletTiming::spawn(node, Some(relist))
    }

    /// For tests where the manager double drives the node: registers the node (`Ready=True`,
    /// label `kubernetes.io/hostname`) and syncs every pod of `node` that has a sandbox at once
    /// on any change of the API or the runtime (no relist period, no sync holding an older pod).
    pub fn at_once(node: Arc<FakeNode>) -> KubeletTiming {
        if node.api.get("nodes", "", NODE).is_none() {
            let t = rfc3339(Timestamp::now());
            node.api
                .create(
                    "nodes",
                    json!({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                           "status": {"conditions": [{"type": "Ready", "status": "True",
                               "reason": "KubeletReady", "message": "kubelet is posting ready status",
                               "lastHeartbeatTime": t, "lastTransitionTime": t}],
                               "addresses": [{"type": "InternalIP", "address": POD_IP}]}}),
                )
                .expect("register the node");
        }
        KubeletTiming::spawn(node, None)
    }

    fn spawn(node: Arc<FakeNode>, relist: Option<Duration>) -> KubeletTiming {
        let (held, rx) = watch::channel(false);
        let (waiting_tx, waiting) = watch::channel(Vec::new());
        let task = tokio::spawn(run(node, relist, rx, waiting_tx));
        KubeletTiming {
            _task: AbortOnDropHandle::new(task),
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

/// What of a pod starts a sync: everything but what the kubelet writes itself (container
/// statuses, its own conditions, phase and IPs).
fn sync_signature(obj: &Value) -> String {
    let mut o = obj.clone();
    let own = ["Ready", "ContainersReady", "Initialized", "PodScheduled"];
    let conditions = o["status"]["conditions"].take();
    let others = conditions.as_array().into_iter().flatten();
    let others: Vec<Value> = others
        .filter(|c| !own.iter().any(|t| c["type"] == *t))
        .map(|c| json!({"type": c["type"], "status": c["status"]}))
        .collect();
    o["status"] = json!({ "conditions": others });
    if let Some(meta) = o["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    o.to_string()
}

/// The runtime's containers and their states.
fn runtime_states(st: &FakeState) -> BTreeMap<String, ContainerState> {
    let state = |(id, c): (&String, &FakeContainer)| (id.clone(), c.status.state);
    st.containers.iter().map(state).collect()
}

/// The sync loop; without `relist`, at once: every wake syncs every pod as it is now.
async fn run(
    node: Arc<FakeNode>,
    relist: Option<Duration>,
    mut held: watch::Receiver<bool>,
    waiting_tx: watch::Sender<Vec<String>>,
) {
    // the pod each waiting sync took, by pod name
    let mut waiting: HashMap<String, Value> = HashMap::new();
    // pods changed while their sync waited: another sync after it
    let mut again: Vec<String> = Vec::new();
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut states = runtime_states(&node.cri.state());
    let mut tick = tokio::time::interval(relist.unwrap_or(FAR));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // read before the syncs, so a change made while they run wakes the loop again
        let rv = node.api.resource_version();
        let now = runtime_states(&node.cri.state());
        if relist.is_none() {
            node.sandboxes
                .keys()
                .for_each(|name| sync(&node, name, None));
        }
        // pod changes start syncs, each with the pod as it is now
        for name in node.sandboxes.keys().filter(|_| relist.is_some()) {
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
        let is_held = *held.borrow() || relist.is_none();
        let api = node.api.control();
        tokio::select! {
            _ = api.wait_for(FAR, |v| v.resource_version() != rv) => continue,
            _ = held.changed() => continue,
            _ = node.cri.wait_for(FAR, |s| runtime_states(s) != now), if relist.is_none() => continue,
            _ = tick.tick(), if !is_held => {}
        }
        // a relist: the waiting syncs act on it with the pods they took
        let now_states = runtime_states(&node.cri.state());
        // the pods whose reported containers changed state since the last relist
        let changed: Vec<&String> = node
            .sandboxes
            .keys()
            .filter(|name| {
                let obj = node.api.get("pods", "default", name).unwrap_or_default();
                let reported = obj["status"]["containerStatuses"].as_array().cloned();
                let mut ids = reported.into_iter().flatten().map(|s| node.runtime_id(&s));
                ids.any(|id| states.get(&id) != now_states.get(&id))
            })
            .collect();
        let mut synced: Vec<String> = Vec::new();
        for (name, copy) in waiting.drain() {
            sync(&node, &name, Some(&copy));
            synced.push(name);
        }
        // a relist that saw a container change starts a sync at once, with the pod as it is
        for name in changed.into_iter().filter(|n| !synced.contains(n)) {
            sync(&node, name, None);
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
        states = runtime_states(&node.cri.state());
    }
}

/// One sync of pod `name` with the pod it took (`took`; none: the pod as it is now): its
/// containers that exited, or whose spec hash changed in that pod, are created again from it
/// (a missing image the policy may not pull leaves the container waiting); the status is
/// reported with `Ready` from that pod's readiness-gate conditions.
fn sync(node: &FakeNode, name: &str, took: Option<&Value>) {
    let Some(live) = node.api.get("pods", "default", name) else {
        return;
    };
    let Ok(pod) = serde_json::from_value::<Pod>(took.unwrap_or(&live).clone()) else {
        return;
    };
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        // the container as reported now: the kubelet's own last write
        let Some(reported) = status::container(&live, &c.name) else {
            continue;
        };
        let id = node.runtime_id(reported);
        let st = node.cri.state();
        let rc = st.containers.get(&id).map(|rc| &rc.status);
        let running = rc.is_some_and(|s| s.state == ContainerState::Running);
        let hash = rc.and_then(|s| s.annotations.get(keys::KUBELET_CONTAINER_HASH).cloned());
        drop(st);
        if running && hash.is_none_or(|h| h == super::spec::hash(c)) {
            continue;
        }
        let new = node.recreate_reported(&pod, c, reported, running.then_some(137));
        let new = new.map(|(id, attempt)| (node.kubelet_id(&id), attempt));
        let _ = node.api.modify("pods", "default", name, |p| {
            status::update_container(p, &c.name, |s| match &new {
                Ok((kubelet_id, attempt)) => {
                    s["containerID"] = json!(kubelet_id);
                    s["restartCount"] = json!(attempt);
                    s["lastState"] = json!({"terminated": {"exitCode": if running { 137 } else { 0 },
                                                           "finishedAt": rfc3339(Timestamp::now())}});
                }
                Err(e) => s["state"] = json!({"waiting": {"reason": e.reason, "message": e.message}}),
            })
        });
    }
    let _ = node
        .api
        .modify("pods", "default", name, |p| report(node, p, took));
}

/// The pod's status as the kubelet reports it now: each container's image (the spec's), image
/// ID, readiness and start time from the runtime, `Ready` from the readiness-gate conditions of
/// `gates_from` or, without it, of the pod as it is.
fn report(node: &FakeNode, p: &mut Value, gates_from: Option<&Value>) {
    let mut containers = p["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let st = node.cri.state();
    for s in &mut containers {
        let Some(rc) = st.containers.get(&node.runtime_id(s)) else {
            s["ready"] = json!(false);
            continue;
        };
        let running = rc.status.state == ContainerState::Running;
        let mut specs = p["spec"]["containers"].as_array().into_iter().flatten();
        let spec = specs.find(|c| c["name"] == s["name"]);
        s["image"] = spec.map(|c| c["image"].clone()).unwrap_or_default();
        let digest = Some(&rc.image.repo_digest).filter(|d| !d.is_empty());
        s["imageID"] = json!(digest.unwrap_or(&rc.image.id));
        s["ready"] = json!(running);
        s["started"] = json!(running);
        if running {
            s["state"] = json!({"running": {"startedAt": rfc3339_ns(rc.status.started_at)}});
        }
    }
    drop(st);
    let status = status::pod_status(p, gates_from.unwrap_or(p), containers);
    status::merge(p, status);
}
