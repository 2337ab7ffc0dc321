//! The node's own Node object, read for what only it says: which container runtime the kubelet
//! uses (`status.nodeInfo.containerRuntimeVersion`), where more than one answers on the node.

use k8s_openapi::api::core::v1::Node;
use kube::Api;

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
    match Api::<Node>::all(client.clone()).get(node).await {
        Ok(n) => Ok(runtime_of(&n).ok_or_else(|| NotReported::NoField(node.to_string()))),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            Ok(Err(NotReported::Forbidden(node.to_string())))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Err(NotReported::NoNode(node.to_string()))),
        Err(e) => Err(e),
    }
}

/// A Node's `status.nodeInfo.containerRuntimeVersion`, if set.
fn runtime_of(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.container_runtime_version.clone())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_runtime_is_its_node_info_container_runtime_version_when_set() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"nodeInfo": {"containerRuntimeVersion": "cri-o://1.36.3",
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "", "architecture": ""}}
        }))
        .expect("a Node");
        assert_eq!(runtime_of(&node).as_deref(), Some("cri-o://1.36.3"));
        let bare: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}}))
            .expect("a Node");
        assert_eq!(runtime_of(&bare), None);
    }
}
