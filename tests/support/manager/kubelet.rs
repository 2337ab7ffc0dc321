//! The kubelet's part that [`FakeNode`] does not play by itself, for tests where the manager
//! double drives the node: it registers the Node (Ready), recreates a container that exited (a
//! stop by the daemon) or whose spec hash changed (an in-place image update), and reports the
//! pod's status as the kubelet does: each container's image, image ID, restart count and start
//! time from the runtime, the pod's IP, and `Initialized`, `ContainersReady` and `Ready`
//! (`Ready` only when the containers are ready and every readiness gate is True, with the
//! kubelet's reasons; times move only when a status changes).
//!
//! It acts at once on what it sees: no relist period, no sync holding an older pod, no
//! back-off; the daemon's settle logic is not exercised by it (`src/controller/containermeta/
//! settle.rs` and its tests are). It recreates containers itself, with [`FakeNode::start_container`],
//! rather than with [`FakeNode::recreate`], which exits the old container again even when the
//! daemon already stopped it (a second stop event) and reports a fixed start time and image.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kruised::cri::ContainerState;
use kruised::hash::kubelet::{format_hash, hash_container};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{condition, now, rfc3339};
use crate::node::{FakeNode, NODE};

/// The kubelet's container-hash annotation on a runtime container.
pub(super) const HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
/// Host network: the pod's IP is the node's.
const POD_IP: &str = "127.0.0.1";

/// A running kubelet stand-in for one [`FakeNode`]; dropping it stops it.
pub struct KubeletStandIn {
    task: JoinHandle<()>,
}

impl KubeletStandIn {
    /// Registers the node (`Ready=True`, label `kubernetes.io/hostname`) and starts looking
    /// after the pods of `node` that have a sandbox.
    pub fn start(node: Arc<FakeNode>) -> KubeletStandIn {
        if node.api.get("nodes", "", NODE).is_none() {
            let t = rfc3339(now());
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
        KubeletStandIn {
            task: tokio::spawn(run(node)),
        }
    }
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The runtime's containers and their states: what the loop waits to see change.
fn runtime_signature(node: &FakeNode) -> Vec<(String, ContainerState)> {
    node.cri
        .state()
        .containers
        .iter()
        .map(|(id, c)| (id.clone(), c.status.state))
        .collect()
}

async fn run(node: Arc<FakeNode>) {
    const FAR: Duration = Duration::from_secs(3600);
    loop {
        let rv = node.api.resource_version();
        let seen = runtime_signature(&node);
        let pods: Vec<String> = node.sandboxes.keys().cloned().collect();
        for pod in pods {
            sync_pod(&node, &pod);
        }
        let api = node.api.control();
        tokio::select! {
            _ = api.wait_for(FAR, |v| v.resource_version() != rv) => {}
            _ = node.cri.wait_for(FAR, |s| {
                s.containers.iter().map(|(id, c)| (id.clone(), c.status.state)).collect::<Vec<_>>() != seen
            }) => {}
        }
    }
}

fn strip_id<'a>(node: &FakeNode, id: &'a str) -> &'a str {
    let prefix = node.cri.kubelet_id("");
    id.strip_prefix(prefix.as_str()).unwrap_or(id)
}

fn sync_pod(node: &FakeNode, name: &str) {
    let Some(obj) = node.api.get("pods", "default", name) else {
        return;
    };
    let Ok(pod) = serde_json::from_value::<Pod>(obj.clone()) else {
        return;
    };
    let specs: Vec<Container> = pod.spec.clone().map(|s| s.containers).unwrap_or_default();
    for c in &specs {
        let Some(status) = obj["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == c.name.as_str()))
        else {
            continue;
        };
        let id = strip_id(node, status["containerID"].as_str().unwrap_or("")).to_string();
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
    report(node, name);
}

/// Creates the container again (attempt + 1) from the pod as it is now; a running one (its
/// spec changed) is killed first.
pub(super) fn recreate(
    node: &FakeNode,
    pod: &Pod,
    c: &Container,
    old_id: &str,
    status: &Value,
    running: bool,
) {
    if running {
        node.cri.exit_container(old_id, 137);
    }
    let attempt = u32::try_from(status["restartCount"].as_i64().unwrap_or(0) + 1).unwrap_or(0);
    let sandbox = &node.sandboxes[pod.metadata.name.as_deref().unwrap_or_default()];
    let id = node.start_container(pod, sandbox, c, attempt, true, true);
    let name = c.name.clone();
    let kubelet_id = node.kubelet_id(&id);
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let _ = node.api.modify("pods", "default", pod_name, |p| {
        for s in p["status"]["containerStatuses"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            if s["name"] == name.as_str() {
                s["containerID"] = json!(kubelet_id);
                s["restartCount"] = json!(attempt);
                s["lastState"] = json!({"terminated": {"exitCode": if running { 137 } else { 0 },
                                                       "finishedAt": rfc3339(now())}});
            }
        }
    });
}

/// The pod's status as the kubelet reports it now.
fn report(node: &FakeNode, name: &str) {
    report_with_gates(node, name, None);
}

/// The pod's status as the kubelet reports it now, `Ready` computed from the readiness-gate
/// conditions of `gates_from` (the pod a sync took: they may be older than the pod's own) or,
/// without it, of the pod as it is.
pub(super) fn report_with_gates(node: &FakeNode, name: &str, gates_from: Option<&Value>) {
    let _ = node.api.modify("pods", "default", name, |p| {
        let images: Vec<(String, String)> = p["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or("").to_string(),
                    c["image"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let prefix = node.cri.kubelet_id("");
        let mut all_ready = true;
        for s in p["status"]["containerStatuses"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            let id = s["containerID"].as_str().unwrap_or("");
            let id = id.strip_prefix(prefix.as_str()).unwrap_or(id).to_string();
            let st = node.cri.state();
            let Some(rc) = st.containers.get(&id) else {
                all_ready = false;
                continue;
            };
            let running = rc.status.state == ContainerState::Running;
            let spec_image = images
                .iter()
                .find(|(n, _)| s["name"] == n.as_str())
                .map(|(_, i)| i.clone())
                .unwrap_or_default();
            s["image"] = json!(spec_image);
            s["imageID"] = json!(if rc.image.repo_digest.is_empty() {
                rc.image.id.clone()
            } else {
                rc.image.repo_digest.clone()
            });
            s["ready"] = json!(running);
            s["started"] = json!(running);
            if running {
                let started =
                    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(rc.status.started_at))
                        .unwrap_or_else(|_| now());
                s["state"] = json!({"running": {"startedAt": rfc3339(started)}});
            }
            all_ready &= running;
        }
        let gates: Vec<String> = p["spec"]["readinessGates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["conditionType"].as_str().map(String::from))
            .collect();
        let mut gate_problems = Vec::new();
        let from: &Value = gates_from.unwrap_or(p);
        let gate_status: Vec<(String, Option<String>)> = gates
            .iter()
            .map(|g| {
                (
                    g.clone(),
                    condition(from, g).and_then(|c| c["status"].as_str().map(String::from)),
                )
            })
            .collect();
        for (g, status) in &gate_status {
            match status.as_deref() {
                Some("True") => {}
                Some(s) => gate_problems.push(format!(
                    "the status of pod readiness gate \"{g}\" is not \"True\", but {s}"
                )),
                None => gate_problems.push(format!(
                    "corresponding condition of pod readiness gate \"{g}\" does not exist."
                )),
            }
        }
        let containers_ready = if all_ready {
            ("True", "", String::new())
        } else {
            (
                "False",
                "ContainersNotReady",
                "containers with unready status".to_string(),
            )
        };
        let ready = if !all_ready {
            containers_ready.clone()
        } else if !gate_problems.is_empty() {
            ("False", "ReadinessGatesNotReady", gate_problems.join(", "))
        } else {
            ("True", "", String::new())
        };
        set(p, "PodScheduled", ("True", "", String::new()));
        set(p, "Initialized", ("True", "", String::new()));
        set(p, "ContainersReady", containers_ready);
        set(p, "Ready", ready);
        p["status"]["phase"] = json!("Running");
        p["status"]["podIP"] = json!(POD_IP);
        p["status"]["podIPs"] = json!([{"ip": POD_IP}]);
        p["status"]["hostIP"] = json!(POD_IP);
    });
}

/// Sets a kubelet condition; its `lastTransitionTime` moves only when its status changes.
fn set(p: &mut Value, type_: &str, (status, reason, message): (&str, &str, String)) {
    if !p["status"]["conditions"].is_array() {
        p["status"]["conditions"] = json!([]);
    }
    let list = p["status"]["conditions"].as_array_mut().expect("an array");
    let mut c = json!({"type": type_, "status": status});
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    match list.iter_mut().find(|x| x["type"] == type_) {
        Some(x) => {
            let t = if x["status"] == status {
                x["lastTransitionTime"].clone()
            } else {
                json!(rfc3339(now()))
            };
            c["lastTransitionTime"] = t;
            c["lastProbeTime"] = x["lastProbeTime"].clone();
            if c["lastProbeTime"].is_null() {
                c.as_object_mut().map(|m| m.remove("lastProbeTime"));
            }
            *x = c;
        }
        None => {
            c["lastTransitionTime"] = json!(rfc3339(now()));
            list.push(c);
        }
    }
}
