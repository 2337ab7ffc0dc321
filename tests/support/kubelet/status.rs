//! The pod status the kubelet reports (status_manager.go, kubelet_pods.go
//! generateAPIPodStatus): each container's status, the pod's phase and IPs, and its
//! conditions, `Ready` only when every container is ready and every readiness gate is True,
//! with the kubelet's reasons and messages. The one writer of a pod's `containerStatuses`:
//! every kubelet of the tests, and every test that plays one, writes them here.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// Host network: the pod's IP is the node's.
pub const POD_IP: &str = "127.0.0.1";

/// A time as RFC 3339 to the second (the API's `Time`).
pub fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A CRI time (nanoseconds since the epoch) as RFC 3339.
pub fn rfc3339_ns(nanos: i64) -> String {
    rfc3339(Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// One container as the kubelet reports it in `containerStatuses`.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Its name in the spec.
    pub name: String,
    /// `<runtime name>://<id>`.
    pub container_id: String,
    /// The image as the spec names it.
    pub image: String,
    /// The image's digest or ID.
    pub image_id: String,
    /// The attempt.
    pub restart_count: u32,
    /// Running, and since when (RFC 3339; empty: no state reported); none: waiting
    /// (`ContainerCreating`).
    pub running: Option<String>,
    /// `lastState.terminated`, once a container of this name exited.
    pub last_terminated: Option<Value>,
}

impl Report {
    /// A ready container as a test reports it: image `busybox`, image ID `sha256:x`, no state.
    pub fn ready(name: &str, container_id: &str, restart_count: u32) -> Self {
        Report {
            name: name.into(),
            container_id: container_id.into(),
            image: "busybox".into(),
            image_id: "sha256:x".into(),
            restart_count,
            running: Some(String::new()),
            ..Default::default()
        }
    }

    /// Its JSON in `containerStatuses`.
    pub fn json(&self) -> Value {
        let ready = self.running.is_some();
        let mut s = json!({"name": self.name, "containerID": self.container_id, "image": self.image,
            "imageID": self.image_id, "restartCount": self.restart_count, "ready": ready, "started": ready});
        match &self.running {
            Some(t) if t.is_empty() => {}
            Some(t) => s["state"] = json!({"running": {"startedAt": t}}),
            None => s["state"] = json!({"waiting": {"reason": "ContainerCreating"}}),
        }
        if let Some(t) = &self.last_terminated {
            s["lastState"] = json!({"terminated": t});
        }
        s
    }
}

/// Sets the pod's reported containers to `reports`.
pub fn set_containers(pod: &mut Value, reports: &[Report]) {
    pod["status"]["containerStatuses"] = reports.iter().map(Report::json).collect();
}

/// Changes the reported status of container `name` with `f`.
pub fn update_container(pod: &mut Value, name: &str, f: impl FnOnce(&mut Value)) {
    let reported = pod["status"]["containerStatuses"].as_array_mut();
    if let Some(s) = reported.into_iter().flatten().find(|s| s["name"] == name) {
        f(s);
    }
}

/// The reported status of container `name`.
pub fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == name)
}

/// The status the kubelet reports for `pod` with `containers` (JSON, as [`Report::json`]):
/// phase `Running`, the IPs, its start time, and its own four conditions (the others are not
/// its to write), `Ready` from the readiness-gate conditions of `gates_from` (the pod a sync
/// took, which may be older than `pod`). A condition's `lastTransitionTime` moves only when its
/// status changes, so an unchanged pod gives the same status.
pub fn pod_status(pod: &Value, gates_from: &Value, containers: Vec<Value>) -> Value {
    let all_ready = !containers.is_empty() && containers.iter().all(|c| c["ready"] == true);
    let gate_problems: Vec<String> = pod["spec"]["readinessGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["conditionType"].as_str())
        .filter_map(|g| match condition(gates_from, g).map(|c| &c["status"]) {
            Some(s) if s == "True" => None,
            Some(s) => Some(format!(
                "the status of pod readiness gate \"{g}\" is not \"True\", but {}",
                s.as_str().unwrap_or_default()
            )),
            None => Some(format!(
                "corresponding condition of pod readiness gate \"{g}\" does not exist."
            )),
        })
        .collect();
    let containers_ready = match all_ready {
        true => ("True", "", String::new()),
        false => (
            "False",
            "ContainersNotReady",
            "containers with unready status".to_string(),
        ),
    };
    let ready = match (all_ready, gate_problems.is_empty()) {
        (false, _) => containers_ready.clone(),
        (true, false) => ("False", "ReadinessGatesNotReady", gate_problems.join(", ")),
        (true, true) => ("True", "", String::new()),
    };
    let now = rfc3339(Timestamp::now());
    let conditions: Vec<Value> = [
        ("PodScheduled", ("True", "", String::new())),
        ("Initialized", ("True", "", String::new())),
        ("ContainersReady", containers_ready),
        ("Ready", ready),
    ]
    .into_iter()
    .map(|(type_, (status, reason, message))| {
        let old = condition(pod, type_);
        let mut c = json!({"type": type_, "status": status, "lastTransitionTime": now});
        if let Some(old) = old.filter(|o| o["status"] == status) {
            c["lastTransitionTime"] = old["lastTransitionTime"].clone();
        }
        if let Some(t) = old.map(|o| &o["lastProbeTime"]).filter(|t| !t.is_null()) {
            c["lastProbeTime"] = t.clone();
        }
        for (k, v) in [("reason", reason), ("message", message.as_str())] {
            if !v.is_empty() {
                c[k] = json!(v);
            }
        }
        c
    })
    .collect();
    let start = pod["status"]["startTime"]
        .as_str()
        .map_or(now.clone(), String::from);
    json!({"phase": "Running", "hostIP": POD_IP, "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
           "startTime": start, "conditions": conditions, "containerStatuses": containers})
}

/// Writes `status` (as [`pod_status`] gives it) into the pod: its conditions by type, the rest
/// over what was there.
pub fn merge(pod: &mut Value, mut status: Value) {
    let conditions = status["conditions"].take();
    let mut list = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in conditions.as_array().into_iter().flatten() {
        match list.iter_mut().find(|x| x["type"] == c["type"]) {
            Some(x) => *x = c.clone(),
            None => list.push(c.clone()),
        }
    }
    status["conditions"] = Value::Array(list);
    for (k, v) in status.as_object().into_iter().flatten() {
        pod["status"][k] = v.clone();
    }
}

/// Whether what the kubelet reports differs between the pod's status and `status`: its
/// containers (IDs, restart counts, readiness), its conditions' statuses, its phase.
pub fn changed(pod: &Value, status: &Value) -> bool {
    let containers = |s: &Value| -> Vec<[Value; 4]> {
        let reported = s["containerStatuses"].as_array().into_iter().flatten();
        let fields = ["name", "containerID", "restartCount", "ready"];
        reported.map(|c| fields.map(|k| c[k].clone())).collect()
    };
    let condition_changed = |c: &Value| {
        let old = condition(pod, c["type"].as_str().unwrap_or_default());
        old.map(|o| &o["status"]) != Some(&c["status"])
    };
    let old = &pod["status"];
    let mut conditions = status["conditions"].as_array().into_iter().flatten();
    containers(old) != containers(status)
        || old["phase"] != status["phase"]
        || conditions.any(condition_changed)
}

/// A status condition of `type_`.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
