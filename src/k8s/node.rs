//! The node's own Node object, read for what only it says: which container runtime the kubelet
//! uses (`status.nodeInfo.containerRuntimeVersion`), where more than one answers on the node.

use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// What the Node `node` says of the kubelet's runtime, asked once: `Ok(Ok(v))` its
/// `containerRuntimeVersion` (`cri-o://1.36.3`: the runtime's name in CRI `Version`, `://`, its
/// version, as the kubelet writes it); `Ok(Err(why))` an answer that names none (the read
/// refused, no such Node, the field empty); `Err` the API server did not answer, worth asking
/// again.
pub async fn kubelets_runtime(
    client: &kube::Client,
    node: &str,
) -> Result<Result<String, String>, kube::Error> {
    match Api::<Node>::all(client.clone()).get(node).await {
        Ok(n) => Ok(runtime_of(&n)
            .ok_or_else(|| format!("its Node {node} reports no containerRuntimeVersion"))),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Err(format!(
            "kruised may not read its Node {node} (RBAC: get on nodes; deploy/rbac.yaml grants \
             it, kruise's chart does not: deploy/overlays/swap-kruise-daemon/node-reader.yaml)"
        ))),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Ok(Err(format!("its Node {node} does not exist")))
        }
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
