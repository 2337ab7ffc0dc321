//! The node's own Node object, read for what only it says: which container runtime the kubelet
//! uses (`status.nodeInfo.containerRuntimeVersion`), where more than one answers on the node;
//! and the one write kruised makes to it, the removal of its startup taint ([`remove_taint`]).
//!
//! `spec.taints` is an atomic list (no patch merge key: a strategic merge patch or a merge
//! patch replaces it whole, so either would have to carry everyone else's taints back). The
//! removal is therefore a JSON patch (RFC 6902) that names nothing but the taints it removes,
//! guarded by `test` operations: the Node's `resourceVersion` as read, and each removed
//! entry's key at its index. The API server applies it to the Node as stored or not at all:
//! a Node changed since the read (someone's taint added, any other write) fails the test, is
//! read again and the patch made anew. No other taint is ever sent, so none is ever dropped.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use serde::Deserialize;

/// What kruised reads of a Node: its metadata, its taints' keys, the kubelet's runtime. Not
/// k8s-openapi's `Node`, whose deserialiser (the status's images, conditions, addresses, the
/// spec's config source and the rest) would be in the binary for these few fields (issue 44;
/// `docs/PERFORMANCE.md`, "The cuts so far"). Every field the API server may leave out is
/// optional, as in `Node`; the rest of the object is skipped unread.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    /// The Node's metadata (its `resourceVersion`, `creationTimestamp`).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Its taints.
    pub spec: Option<NodeSpecView>,
    /// The kubelet's report.
    pub status: Option<NodeStatusView>,
}

/// A Node's `spec`, as far as kruised reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeSpecView {
    /// `spec.taints`.
    pub taints: Option<Vec<TaintView>>,
}

/// A taint, as far as kruised reads it: its key.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TaintView {
    /// The taint's key.
    #[serde(default)]
    pub key: String,
}

/// A Node's `status`, as far as kruised reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeStatusView {
    /// `status.nodeInfo`.
    #[serde(rename = "nodeInfo")]
    pub node_info: Option<NodeInfoView>,
}

/// `status.nodeInfo`, as far as kruised reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeInfoView {
    /// The runtime the kubelet uses, `name://version`.
    #[serde(rename = "containerRuntimeVersion", default)]
    pub container_runtime_version: String,
}

/// Reads the Node `name` (as a `GET` of `Api<Node>` would, errors and all).
pub async fn get(client: &kube::Client, name: &str) -> Result<NodeView, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Node>(&()));
    super::client::from_dynamic(api.get(name).await?)
}

/// Why the Node's answer names no runtime of the kubelet's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReported {
    /// The read was refused.
    #[error(
        "kruised may not read its Node {0} (RBAC: get on nodes; deploy/rbac.yaml grants it, \
         kruise's chart does not: deploy/overlays/swap-kruise-daemon/node-reader.yaml)"
    )]
    Forbidden(String),
    /// There is no such Node.
    #[error("its Node {0} does not exist")]
    NoNode(String),
    /// The Node's field is empty.
    #[error("its Node {0} reports no containerRuntimeVersion")]
    NoField(String),
}

/// What the Node `node` says of the kubelet's runtime, asked once: `Ok(Ok(v))` its
/// `containerRuntimeVersion` (`cri-o://1.36.3`: the runtime's name in CRI `Version`, `://`, its
/// version, as the kubelet writes it); `Ok(Err(why))` an answer that names none; `Err` the API
/// server did not answer, worth asking again.
pub async fn kubelets_runtime(
    client: &kube::Client,
    node: &str,
) -> Result<Result<String, NotReported>, kube::Error> {
    match get(client, node).await {
        Ok(n) => Ok(runtime_of(&n).ok_or_else(|| NotReported::NoField(node.to_string()))),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            Ok(Err(NotReported::Forbidden(node.to_string())))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Err(NotReported::NoNode(node.to_string()))),
        Err(e) => Err(e),
    }
}

/// A Node's `status.nodeInfo.containerRuntimeVersion`, if set.
fn runtime_of(node: &NodeView) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.container_runtime_version.clone())
        .filter(|v| !v.is_empty())
}

/// What [`remove_taint`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaintRemoval {
    /// The taints with the key were removed: how many (one per effect), and how many times the
    /// Node had changed between a read and the write (each then read again).
    Removed {
        /// Taints removed.
        taints: usize,
        /// Writes refused because the Node had changed since it was read.
        conflicts: u32,
    },
    /// No taint had the key: nothing was written.
    Absent,
}

/// How often [`remove_taint`] reads the Node again after a write refused because it changed:
/// a Node written to more often than kruised can read and patch it is left for the caller's
/// next try.
pub const TAINT_CONFLICT_RETRIES: u32 = 10;

/// The JSON patch that removes every taint with `key` from `node` as read, or `None` when it
/// has none: a `test` of the `resourceVersion` it was read at, then for each such taint, the
/// last first so that the indices stay right, a `test` of its key and its `remove`.
pub fn taint_removal_patch(node: &NodeView, key: &str) -> Option<serde_json::Value> {
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    let mut ops = vec![serde_json::json!({
        "op": "test", "path": "/metadata/resourceVersion",
        "value": node.metadata.resource_version.as_deref().unwrap_or_default(),
    })];
    for (i, _) in taints
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, t)| t.key == key)
    {
        let at = format!("/spec/taints/{i}");
        ops.push(serde_json::json!({"op": "test", "path": format!("{at}/key"), "value": key}));
        ops.push(serde_json::json!({"op": "remove", "path": at}));
    }
    (ops.len() > 1).then_some(serde_json::Value::Array(ops))
}

/// Sends `patch` as a JSON patch of the Node `name` (kube's typed `Patch::Json` would bring in
/// a JSON-patch crate for what is one request with a content type).
async fn json_patch_node(
    client: &kube::Client,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let body = serde_json::to_vec(patch).map_err(kube::Error::SerdeError)?;
    let request = http::Request::builder()
        .method(http::Method::PATCH)
        .uri(format!(
            "/api/v1/nodes/{name}?fieldManager={}",
            super::client::FIELD_MANAGER
        ))
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
    // the patched Node is not read: nothing needs it
    super::client::send_unread(client, Ok(request)).await
}

/// Whether a refused write means the Node changed between its read and the write: a `test`
/// that failed (`422`, as kube-apiserver answers a JSON patch it cannot apply) or a conflict.
fn changed_since_read(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409 || s.code == 422)
}

/// Removes every taint with `key` from the Node `name`, and nothing else: reads the Node, sends
/// [`taint_removal_patch`], and when the Node changed in between, reads it again, up to
/// [`TAINT_CONFLICT_RETRIES`] times. Errors are the API server's (a name that is no DNS
/// subdomain is refused before any request, as `404` would be).
pub async fn remove_taint(
    client: &kube::Client,
    name: &str,
    key: &str,
) -> Result<TaintRemoval, kube::Error> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    {
        return Err(kube::Error::Api(Box::new(kube::core::Status {
            code: 404,
            reason: "NotFound".into(),
            message: format!("{name:?} is not the name of a Node (a DNS subdomain)"),
            ..Default::default()
        })));
    }
    let mut conflicts = 0;
    loop {
        let node = get(client, name).await?;
        let Some(patch) = taint_removal_patch(&node, key) else {
            return Ok(TaintRemoval::Absent);
        };
        let taints = patch.as_array().map_or(0, |ops| (ops.len() - 1) / 2);
        match json_patch_node(client, name, &patch).await {
            Ok(_) => return Ok(TaintRemoval::Removed { taints, conflicts }),
            Err(e) if changed_since_read(&e) && conflicts < TAINT_CONFLICT_RETRIES => {
                conflicts += 1;
                tracing::debug!(error = %e, conflicts, "the Node changed since it was read; reading it again");
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tainted(rv: &str, keys: &[&str]) -> NodeView {
        let taints: Vec<serde_json::Value> = keys
            .iter()
            .map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "resourceVersion": rv},
            "spec": {"taints": taints}
        }))
        .expect("a Node view")
    }

    #[test]
    fn the_taint_removal_tests_the_version_read_and_removes_each_taint_of_the_key_last_first() {
        let node = tainted("7", &["w", "other", "w"]);
        assert_eq!(
            taint_removal_patch(&node, "w").expect("a patch"),
            serde_json::json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "test", "path": "/spec/taints/2/key", "value": "w"},
                {"op": "remove", "path": "/spec/taints/2"},
                {"op": "test", "path": "/spec/taints/0/key", "value": "w"},
                {"op": "remove", "path": "/spec/taints/0"},
            ])
        );
    }

    #[test]
    fn a_node_without_the_taint_gets_no_patch() {
        assert_eq!(taint_removal_patch(&tainted("7", &["other"]), "w"), None);
        assert_eq!(taint_removal_patch(&tainted("7", &[]), "w"), None);
        let bare: NodeView =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}}))
                .expect("a Node view");
        assert_eq!(taint_removal_patch(&bare, "w"), None);
    }

    #[test]
    fn a_nodes_runtime_is_its_node_info_container_runtime_version_when_set() {
        let node: NodeView = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"nodeInfo": {"containerRuntimeVersion": "cri-o://1.36.3",
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "", "architecture": ""}}
        }))
        .expect("a Node view");
        assert_eq!(runtime_of(&node).as_deref(), Some("cri-o://1.36.3"));
        let bare: NodeView =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}}))
                .expect("a Node view");
        assert_eq!(runtime_of(&bare), None);
    }
}
