//! NodeImages as kruise-manager 07169cf keeps them (`pkg/controller/nodeimage/
//! nodeimage_controller.go`, `pkg/webhook/nodeimage/`): one per Ready node, its labels the
//! node's, tags whose jobs are gone or whose TTL passed dropped, a tag the node does not answer
//! failed after the response timeout, and the webhooks every NodeImage write meets (defaults;
//! refusals, among them a tag without `pullPolicy.ttlSecondsAfterFinished`).

use std::collections::BTreeSet;

use apiserver_double::{AdmissionRequest, Control, Denial, Operation};
use serde_json::{Value, json};

use super::{
    Inner, Res, Wake, array_mut, condition, deleting, label, name_of, now, rfc3339, secs, time_of,
    version,
};

/// The mutating webhook's name (kruise's `config/webhook`).
pub const NODE_IMAGE_MUTATING_WEBHOOK: &str = "mnodeimage.kb.io";
/// The validating webhook's name.
pub const NODE_IMAGE_VALIDATING_WEBHOOK: &str = "vnodeimage.kb.io";
/// A NodeImage the controller never deletes (nodeimage_controller.go:76).
const FAKE_NODE_IMAGE: &str = "apps.kruise.io/fake-nodeimage";
/// nodeimage_validating handler: at most this many images.
const MAX_IMAGES: usize = 256;

pub(crate) fn register_webhooks(control: &Control) {
    let ops = [Operation::Create, Operation::Update];
    control.add_mutating_admission(
        NODE_IMAGE_MUTATING_WEBHOOK,
        "apps.kruise.io",
        "nodeimages",
        &ops,
        default_tags,
    );
    control.add_validating_admission(
        NODE_IMAGE_VALIDATING_WEBHOOK,
        "apps.kruise.io",
        "nodeimages",
        &ops,
        validate,
    );
}

fn sort_tags(list: &mut Value) {
    if let Some(tags) = list.as_array_mut() {
        tags.sort_by(|a, b| a["tag"].as_str().cmp(&b["tag"].as_str()));
    }
}

/// The images under `path` (through a pointer: indexing a missing field mutably would add it).
fn images_at<'a>(ni: &'a mut Value, path: &str) -> impl Iterator<Item = &'a mut Value> {
    let images = ni.pointer_mut(path).and_then(Value::as_object_mut);
    images.into_iter().flat_map(|m| m.values_mut())
}

/// pkg/webhook/nodeimage/mutating/nodeimage_create_update_handler.go:46-77 with
/// apis/apps/defaults/v1beta1.go:255-279: `createdAt` now, `pullPolicy` `{}` then its timeout
/// (600) and back-off (3); tags sorted. No TTL default.
fn default_tags(r: &mut AdmissionRequest<'_>) -> Result<(), Denial> {
    let t = rfc3339(now());
    for image in images_at(&mut r.object, "/spec/images") {
        for tag in image["tags"].as_array_mut().into_iter().flatten() {
            if tag["createdAt"].is_null() {
                tag["createdAt"] = json!(t);
            }
            default_pull_policy(&mut tag["pullPolicy"]);
        }
        sort_tags(&mut image["tags"]);
    }
    for image in images_at(&mut r.object, "/status/imageStatuses") {
        sort_tags(&mut image["tags"]);
    }
    Ok(())
}

/// A `pullPolicy`: `{}` when absent, then its timeout (600) and back-off (3) (apis/apps/defaults/
/// v1beta1.go, for NodeImage tags and ImagePullJobs alike).
pub(crate) fn default_pull_policy(p: &mut Value) {
    if !p.is_object() {
        *p = json!({});
    }
    for (field, default) in [("timeoutSeconds", 600), ("backoffLimit", 3)] {
        if p[field].is_null() {
            p[field] = json!(default);
        }
    }
}

/// pkg/webhook/nodeimage/validating/nodeimage_create_update_handler.go:47-153; all 400.
fn validate(r: &AdmissionRequest<'_>) -> Result<(), Denial> {
    let bad = |m: String| Err(Denial::errored(400, m));
    let Some(images) = r.object["spec"]["images"].as_object() else {
        return Ok(());
    };
    if images.len() > MAX_IMAGES {
        return bad(format!(
            "spec images length {} can not be more than {MAX_IMAGES}",
            images.len()
        ));
    }
    for (name, image) in images {
        if name.is_empty() {
            return bad("image name can not be empty".into());
        }
        let mut seen = BTreeSet::new();
        for tag in image["tags"].as_array().into_iter().flatten() {
            let t = tag["tag"].as_str().unwrap_or("");
            if t.is_empty() {
                return bad(format!("tag for image {name} can not be empty"));
            }
            if !seen.insert(t) {
                return bad(format!("duplicated tag {t} for image {name}"));
            }
            if tag["createdAt"].is_null() {
                return bad(format!("createAt field for {name}/{t} can not be empty"));
            }
            if tag["version"].as_i64().is_some_and(|v| v < 0) {
                return bad(format!("version for {name}/{t} can not be less than 0"));
            }
            if !tag["pullPolicy"].is_object() {
                return bad(format!("pullPolicy field for {name}/{t} must set"));
            }
            if tag["pullPolicy"]["ttlSecondsAfterFinished"].is_null() {
                return bad(format!(
                    "pullPolicy.ttlSecondsAfterFinished for {name}/{t} must set"
                ));
            }
        }
    }
    Ok(())
}

/// Whether a node is Ready and not a virtual kubelet's.
pub(crate) fn ready_node(node: &Value) -> bool {
    !deleting(node)
        && label(node, "type") != Some("virtual-kubelet")
        && condition(node, "Ready").is_some_and(|c| c["status"] == "True")
}

/// NodeImage per Ready node after the creation delay; a NodeImage whose node is gone deleted;
/// its labels the node's (:186-223,274-300,537-547).
pub(crate) async fn reconcile_nodes(m: &Inner) -> Wake {
    let mut wake = Wake::default();
    let nodes = m.list(Res::Nodes, None);
    let images = m.list(Res::NodeImages, None);
    for node in nodes.iter().filter(|n| ready_node(n)) {
        let name = name_of(node);
        match images.iter().find(|ni| name_of(ni) == name) {
            Some(ni) => {
                if ni["metadata"]["labels"] != node["metadata"]["labels"] {
                    let mut ni = ni.clone();
                    ni["metadata"]["labels"] = node["metadata"]["labels"].clone();
                    m.replace("the NodeImage's labels", Res::NodeImages, &ni)
                        .await;
                }
            }
            None => {
                let ready_at = condition(node, "Ready")
                    .and_then(|c| time_of(&c["lastTransitionTime"]))
                    .unwrap_or_else(now);
                if !wake.passed(m.timing.node_image_creation_delay, ready_at) {
                    continue;
                }
                let ni = json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                                "metadata": {"name": name, "labels": node["metadata"]["labels"]},
                                "spec": {}});
                m.create("a NodeImage for a Ready node", Res::NodeImages, &ni)
                    .await;
            }
        }
    }
    for ni in &images {
        let node = nodes.iter().find(|n| name_of(n) == name_of(ni));
        if node.is_none_or(deleting) && label(ni, FAKE_NODE_IMAGE).is_none() {
            m.delete("delete the NodeImage of a gone node", Res::NodeImages, ni)
                .await;
        }
    }
    wake
}

/// Spec clean-up and the status the node did not give (`doUpdateNodeImage`, :274-403;
/// `updateNodeImageStatus`, :405-535).
pub(crate) async fn reconcile_status(m: &Inner) -> Wake {
    let mut wake = Wake::default();
    for ni in m.list(Res::NodeImages, None) {
        if clean_spec(m, &ni, &mut wake).await {
            continue;
        }
        fail_silent_tags(m, &ni, &mut wake).await;
    }
    wake
}

/// Owner pruning and TTL (:274-403). Whether it wrote.
async fn clean_spec(m: &Inner, ni: &Value, wake: &mut Wake) -> bool {
    let mut next = ni.clone();
    let Some(images) = next["spec"]["images"].as_object_mut() else {
        return false;
    };
    for (name, image) in images.iter_mut() {
        let status_tags = ni["status"]["imageStatuses"][name.as_str()]["tags"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let tags = image["tags"].as_array_mut();
        let Some(tags) = tags else { continue };
        tags.retain_mut(|tag| {
            if tag["createdAt"].is_null() {
                return false;
            }
            let owners = tag["ownerReferences"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let kept: Vec<Value> = owners
                .iter()
                .filter(|o| {
                    let job_kind = o["kind"] == "ImagePullJob"
                        && o["apiVersion"]
                            .as_str()
                            .is_some_and(|v| v.starts_with("apps.kruise.io/"));
                    if !job_kind {
                        return true;
                    }
                    let ns = o["namespace"].as_str().unwrap_or("");
                    let job = m.get(Res::ImagePullJobs, ns, o["name"].as_str().unwrap_or(""));
                    job.is_some_and(|j| j["metadata"]["uid"] == o["uid"])
                })
                .cloned()
                .collect();
            if kept.len() != owners.len() {
                if kept.is_empty() {
                    return false;
                }
                tag["ownerReferences"] = json!(kept);
            }
            let ttl = secs(&tag["pullPolicy"]["ttlSecondsAfterFinished"]);
            let done = status_tags
                .iter()
                .find(|s| s["tag"] == tag["tag"] && version(s) == version(tag))
                .and_then(|s| time_of(&s["completionTime"]));
            let expired = matches!((ttl, done), (Some(ttl), Some(done)) if wake.passed(ttl, done));
            !expired
        });
    }
    images.retain(|_, image| image["tags"].as_array().is_some_and(|t| !t.is_empty()));
    if next == *ni {
        return false;
    }
    m.replace("the NodeImage's spec clean-up", Res::NodeImages, &next)
        .await;
    true
}

/// A tag the node has not answered within the response timeout of its `createdAt`, or not
/// finished within its deadline plus that timeout, is failed (:405-535).
async fn fail_silent_tags(m: &Inner, ni: &Value, wake: &mut Wake) {
    let timeout = m.timing.node_image_response_timeout;
    let mut next = ni.clone();
    let mut changed = false;
    let images = ni["spec"]["images"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (name, image) in &images {
        for tag in image["tags"].as_array().into_iter().flatten() {
            let Some(created) = time_of(&tag["createdAt"]) else {
                continue;
            };
            let list = array_mut(&mut next["status"]["imageStatuses"][name.as_str()]["tags"]);
            let found = list.iter().position(|s| s["tag"] == tag["tag"]);
            let failed = |message: &str| {
                json!({"tag": tag["tag"], "phase": "Failed", "completionTime": rfc3339(now()),
                       "version": version(tag), "message": message})
            };
            let answered = found.is_some_and(|i| version(&list[i]) == version(tag));
            if !answered {
                if !wake.passed(timeout, created) {
                    continue;
                }
                let s = failed("node has not responded for a long time");
                match found {
                    Some(i) => list[i] = s,
                    None => list.push(s),
                }
                changed = true;
                continue;
            }
            let i = found.expect("answered");
            let ads = secs(&tag["pullPolicy"]["activeDeadlineSeconds"]);
            if list[i]["completionTime"].is_null()
                && let Some(ads) = ads
                && wake.passed(ads + timeout, created)
            {
                list[i] = failed("pulling exceeds the activeDeadlineSeconds");
                changed = true;
            }
        }
    }
    if !changed {
        return;
    }
    // only when the controller changed a tag: drop statuses of gone tags, recount
    let status = &mut next["status"];
    let mut counts = (0, 0, 0);
    if let Some(images_st) = status["imageStatuses"].as_object_mut() {
        for (name, st) in images_st.iter_mut() {
            let tags = images.get(name).and_then(|i| i["tags"].as_array());
            let spec_tags: BTreeSet<&str> = tags
                .into_iter()
                .flatten()
                .filter_map(|t| t["tag"].as_str())
                .collect();
            if let Some(list) = st["tags"].as_array_mut() {
                list.retain(|s| s["tag"].as_str().is_some_and(|t| spec_tags.contains(t)));
                for s in list.iter() {
                    match s["phase"].as_str() {
                        Some("Succeeded") => counts.0 += 1,
                        Some("Failed") => counts.1 += 1,
                        Some("Pulling") => counts.2 += 1,
                        _ => {}
                    }
                }
            }
        }
        images_st.retain(|_, st| st["tags"].as_array().is_some_and(|t| !t.is_empty()));
    }
    let desired: usize = images
        .values()
        .map(|i| i["tags"].as_array().map_or(0, Vec::len))
        .sum();
    status["desired"] = json!(desired);
    status["succeeded"] = json!(counts.0);
    status["failed"] = json!(counts.1);
    status["pulling"] = json!(counts.2);
    m.replace_status(
        "the NodeImage's status for a silent node",
        Res::NodeImages,
        &next,
    )
    .await;
}
