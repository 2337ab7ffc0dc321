//! ContainerRecreateRequests: kruise-manager 07169cf's mutating webhook (the only CRR webhook;
//! `pkg/webhook/containerrecreaterequest/mutating/crr_mutating_handler.go`) and its CRR
//! controller (`pkg/controller/containerrecreaterequest/crr_controller.go`). The manager never
//! serialises a pod's requests (no lock, no order, no refusal of a second request): that is the
//! daemon's part (pkg/daemon/containerrecreate/crr_daemon_controller.go:207-305), and only the
//! daemon's.

use apiserver_double::{AdmissionRequest, Control, Denial, Operation};
use serde_json::{Value, json};

use super::{
    Inner, Res, Wake, condition, deleting, label, now, ns_of, pod_active, rfc3339, secs, time_of,
    uid_of,
};

/// The webhook's name in a denial (kruise's `config/webhook`, `mcontainerrecreaterequest.kb.io`).
pub const CRR_WEBHOOK: &str = "mcontainerrecreaterequest.kb.io";

const NODE_NAME_LABEL: &str = "crr.apps.kruise.io/node-name";
const POD_UID_LABEL: &str = "crr.apps.kruise.io/pod-uid";
const ACTIVE_LABEL: &str = "crr.apps.kruise.io/active";
const UNREADY_ACQUIRED: &str = "crr.apps.kruise.io/unready-acquired";
/// `pkg/util/virtual_kubelet.go:21-23`.
const VIRTUAL_KUBELET: (&str, &str) = ("type", "virtual-kubelet");
/// `crr_mutating_handler.go:44`.
const MIN_DEADLINE_SECONDS: i64 = 3;

pub(crate) fn register_webhook(control: &Control) {
    control.add_mutating_admission(
        CRR_WEBHOOK,
        "apps.kruise.io",
        "containerrecreaterequests",
        &[Operation::Create, Operation::Update],
        mutate,
    );
}

fn bad(message: impl Into<String>) -> Denial {
    Denial::errored(400, message)
}

/// The handler (crr_mutating_handler.go:55-252): checks and defaults on create, immutability on
/// update; the v1alpha1 and v1beta1 paths differ only in v1alpha1's extra update rule (:89-92).
fn mutate(r: &mut AdmissionRequest<'_>) -> Result<(), Denial> {
    match r.operation {
        Operation::Update => check_update(r),
        Operation::Create => default_create(r),
    }
}

/// UPDATE (:171-186; v1alpha1 also :89-92): all 403.
fn check_update(r: &AdmissionRequest<'_>) -> Result<(), Denial> {
    let Some(old) = &r.old_object else {
        return Ok(());
    };
    let new = &r.object;
    let forbid = |message: String| Err(Denial::errored(403, message));
    if r.version == "v1alpha1" {
        let key = UNREADY_ACQUIRED;
        let before = old["metadata"]["annotations"][key].as_str().unwrap_or("");
        if !before.is_empty() && new["metadata"]["annotations"][key].as_str() != Some(before) {
            return forbid(format!("not allowed to update immutable annotation {key}"));
        }
    }
    if old["spec"] != new["spec"] {
        return forbid("spec of ContainerRecreateRequest is immutable".into());
    }
    match [POD_UID_LABEL, NODE_NAME_LABEL]
        .into_iter()
        .find(|k| label(old, k) != label(new, k))
    {
        Some(key) => forbid(format!("not allowed to update immutable label {key}")),
        None => Ok(()),
    }
}

/// CREATE, in kruise's order (:188-252).
fn default_create(r: &mut AdmissionRequest<'_>) -> Result<(), Denial> {
    let obj = &mut r.object;
    if !obj["metadata"]["labels"].is_object() {
        obj["metadata"]["labels"] = json!({});
    }
    let pod_name = obj["spec"]["podName"].as_str().unwrap_or("").to_string();
    if pod_name.is_empty() {
        return Err(bad("podName can not be empty"));
    }
    if !obj["spec"]["strategy"].is_object() {
        obj["spec"]["strategy"] = json!({});
    }
    obj["metadata"]["labels"][ACTIVE_LABEL] = json!("true");
    if obj["spec"]["containers"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        return Err(bad("containers list can not be null"));
    }
    if obj["spec"]["activeDeadlineSeconds"]
        .as_i64()
        .is_some_and(|s| s < MIN_DEADLINE_SECONDS)
    {
        return Err(bad(format!(
            "activeDeadlineSeconds can not be less than {MIN_DEADLINE_SECONDS}s"
        )));
    }
    let strategy = &mut obj["spec"]["strategy"];
    for key in ["terminationGracePeriodSeconds", "unreadyGracePeriodSeconds"] {
        if strategy[key].as_i64().is_some_and(|s| s < 0) {
            return Err(bad(format!("{key} must be non-negative integer")));
        }
    }
    match strategy["failurePolicy"].as_str().unwrap_or("") {
        "" => strategy["failurePolicy"] = json!("Fail"),
        "Fail" | "Ignore" => {}
        other => return Err(bad(format!("unknown failurePolicy {other}"))),
    }
    let Some(pod) = r.store.get("pods", r.namespace, &pod_name) else {
        return Err(bad(format!("no found Pod named {pod_name}")));
    };
    // :227-228, helper :255-262
    if !pod_active(&pod) && condition(&pod, "SidecarTerminated").is_none() {
        return Err(bad("not allowed to recreate containers in an inactive Pod"));
    }
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
    if node_name.is_empty() {
        return Err(bad("not allowed to recreate containers in a pending Pod"));
    }
    let Some(node) = r.store.get("nodes", "", &node_name) else {
        return Err(bad(format!(
            "failed to get Node {node_name}: nodes \"{node_name}\" not found"
        )));
    };
    inject(&mut r.object, &pod, &node).map_err(bad)
}

/// `injectPodIntoContainerRecreateRequestV1beta1` (:320-374).
fn inject(obj: &mut Value, pod: &Value, node: &Value) -> Result<(), String> {
    let labels = &mut obj["metadata"]["labels"];
    labels[NODE_NAME_LABEL] = pod["spec"]["nodeName"].clone();
    labels[POD_UID_LABEL] = json!(uid_of(pod));
    if label(node, VIRTUAL_KUBELET.0) == Some(VIRTUAL_KUBELET.1) {
        obj["metadata"]["labels"][VIRTUAL_KUBELET.0] = json!(VIRTUAL_KUBELET.1);
    }
    let grace = &mut obj["spec"]["strategy"]["terminationGracePeriodSeconds"];
    if grace.is_null()
        && let Some(g) = pod["spec"]["terminationGracePeriodSeconds"].as_i64()
    {
        *grace = json!(g);
    }
    let find = |list: &str, name: &str| -> Option<Value> {
        pod["spec"][list]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
    };
    let mut seen = Vec::new();
    let containers = obj["spec"]["containers"]
        .as_array_mut()
        .expect("checked non-empty above");
    for c in containers.iter_mut() {
        let name = c["name"].as_str().unwrap_or("").to_string();
        if seen.contains(&name) {
            return Err(format!("can not recreate {name} multi times"));
        }
        seen.push(name.clone());
        if ["preStop", "ports", "statusContext"]
            .iter()
            .any(|f| c.get(*f).is_some_and(|v| !v.is_null()))
        {
            // sic: kruise's message says "ready-only"
            return Err("preStop, ports, statusContext in container are ready-only fields".into());
        }
        // pkg/util/pods.go:191-209: init containers first, then containers
        let Some(spec) = find("initContainers", &name).or_else(|| find("containers", &name)) else {
            return Err(format!("container {name} not found in Pod"));
        };
        // pods.go:211-222: init containers' statuses are not searched
        let status = pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name.as_str()));
        let Some(status) = status else {
            return Err(format!("not found {name} containerStatus in Pod Status"));
        };
        let id = status["containerID"].as_str().unwrap_or("");
        if id.is_empty() {
            return Err(format!(
                "no containerID in {name} containerStatus, maybe the container has not been initialized"
            ));
        }
        let pre_stop = &spec["lifecycle"]["preStop"];
        if pre_stop.is_object() {
            let mut copied = json!({});
            for handler in ["exec", "httpGet", "tcpSocket"] {
                if let Some(h) = pre_stop.get(handler).filter(|h| !h.is_null()) {
                    copied[handler] = h.clone();
                }
            }
            let http = copied.get("httpGet").is_some();
            c["preStop"] = copied;
            if http {
                c["ports"] = spec["ports"].clone();
            }
        }
        c["statusContext"] = json!({
            "containerID": id,
            "restartCount": status["restartCount"].as_i64().unwrap_or(0),
        });
    }
    Ok(())
}

// === the controller ===

/// One pass over every request (crr_controller.go:123-226).
pub(crate) async fn reconcile(m: &Inner) -> Wake {
    let mut wake = Wake::default();
    for crr in m.list(Res::Crrs, None) {
        wake.merge(sync(m, &crr).await);
    }
    wake
}

async fn sync(m: &Inner, crr: &Value) -> Wake {
    let pod_name = crr["spec"]["podName"].as_str().unwrap_or_default();
    let pod = m.get(Res::Pods, ns_of(crr), pod_name);
    let status = &crr["status"];
    let completed = status["completionTime"].is_string();
    if deleting(crr) || completed {
        // :151-179 (the unready-acquired finalizer is only added for pods with the
        // KruisePodReady gate, which the double does not model: nothing to release)
        if deleting(crr) {
            return Wake::default();
        }
        if label(crr, ACTIVE_LABEL).is_some() {
            let patch = json!({"metadata": {"labels": {ACTIVE_LABEL: null}}});
            m.merge_patch("remove the active label", Res::Crrs, crr, &patch)
                .await;
            return Wake::default();
        }
        let (mut wake, ttl) = (
            Wake::default(),
            secs(&crr["spec"]["ttlSecondsAfterFinished"]),
        );
        let done_at = time_of(&status["completionTime"]).unwrap_or_else(now);
        if let Some(ttl) = ttl
            && wake.passed(ttl, done_at)
        {
            m.delete("delete after its TTL", Res::Crrs, crr).await;
        }
        return wake;
    }
    // :181-185
    let gone = pod
        .as_ref()
        .is_none_or(|p| deleting(p) || label(crr, POD_UID_LABEL) != Some(uid_of(p)));
    if gone {
        complete(m, crr, "pod has gone").await;
        return Wake::default();
    }
    let created = time_of(&crr["metadata"]["creationTimestamp"]).unwrap_or_else(now);
    let phase = status["phase"].as_str().unwrap_or("");
    let mut wake = Wake::default();
    // :190-197: only while the daemon has set no phase
    if phase.is_empty() && wake.passed(m.timing.crr_response_timeout, created) {
        complete(m, crr, "daemon has not responded for a long time").await;
        return Wake::default();
    }
    // :200-207: counted from creation
    if let Some(ads) = secs(&crr["spec"]["activeDeadlineSeconds"])
        && wake.passed(ads, created)
    {
        complete(m, crr, "recreating has exceeded the activeDeadlineSeconds").await;
        return Wake::default();
    }
    if phase != "Recreating" {
        return wake;
    }
    let pod = pod.expect("checked above");
    sync_snapshot(m, crr, &pod, created).await;
    wake.merge(Wake::after(m.timing.crr_recreating_requeue));
    if crr["spec"]["strategy"]["unreadyGracePeriodSeconds"].is_i64() {
        grace_condition(m, crr).await;
    }
    wake
}

/// `status.containerStatusSnapshot` from the pod's status (:243-278): containers running and
/// started at or after the request's creation, in spec order; an empty list never replaces a
/// snapshot.
async fn sync_snapshot(m: &Inner, crr: &Value, pod: &Value, created: k8s_openapi::jiff::Timestamp) {
    let created = created.as_second();
    let statuses = pod["status"]["containerStatuses"].as_array();
    let mut snapshot = Vec::new();
    for c in crr["spec"]["containers"].as_array().into_iter().flatten() {
        let Some(s) = statuses.and_then(|s| s.iter().find(|s| s["name"] == c["name"])) else {
            continue;
        };
        let Some(started) = time_of(&s["state"]["running"]["startedAt"]) else {
            continue;
        };
        if started.as_second() < created {
            continue;
        }
        let mut entry = json!({"name": s["name"], "ready": s["ready"].as_bool().unwrap_or(false),
                               "restartCount": s["restartCount"].as_i64().unwrap_or(0)});
        if let Some(id) = s["containerID"].as_str().filter(|id| !id.is_empty()) {
            entry["containerID"] = json!(id);
        }
        snapshot.push(entry);
    }
    let old = crr["status"]["containerStatusSnapshot"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if (snapshot.is_empty() && !old.is_empty()) || snapshot == old {
        return;
    }
    let patch = json!({"status": {"containerStatusSnapshot": snapshot}});
    m.merge_patch_status("container status snapshot", Res::Crrs, crr, &patch)
        .await;
}

/// `waitRecreateGracePeriod` step 2 (:325-347): condition `PreRecreateGrace=True` once. (Step 1,
/// holding a pod with the `KruisePodReady` gate unready, is not modelled: the tests' pods have
/// no such gate, and kruise leaves a pod without it alone.)
async fn grace_condition(m: &Inner, crr: &Value) {
    let held = condition(crr, "PreRecreateGrace").is_some_and(|c| c["status"] == "True");
    if held {
        return;
    }
    let mut conditions = crr["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "PreRecreateGrace");
    conditions.push(json!({"type": "PreRecreateGrace", "status": "True",
        "reason": "PreRecreateGrace",
        "message": "Pod has been forced to not-ready for unreadyGracePeriodSeconds drain",
        "lastTransitionTime": rfc3339(now())}));
    let patch = json!({"status": {"conditions": conditions}});
    m.merge_patch_status("PreRecreateGrace", Res::Crrs, crr, &patch)
        .await;
}

/// `completeCRR` (:374-388): the phase is only ever `Completed`.
async fn complete(m: &Inner, crr: &Value, message: &str) {
    let mut status = json!({"phase": "Completed", "completionTime": rfc3339(now())});
    if !message.is_empty() {
        status["message"] = json!(message);
    }
    let patch = json!({"status": status});
    m.merge_patch_status("complete the request", Res::Crrs, crr, &patch)
        .await;
}
