//! A container's env as the kubelet resolves it when it creates the container
//! (kubelet_pods.go makeEnvironmentVariables): plain values, and `fieldRef`s to the pod's
//! labels, annotations, name, namespace, uid, node name and IPs, read from the pod as it is at
//! that moment. A missing label or annotation gives an empty value, as in the kubelet.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use kruised::hash::env::env_meta_ref;

/// The env the kubelet gives `c` of `pod` now.
pub fn resolve(pod: &Pod, c: &Container) -> Vec<(String, String)> {
    c.env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), value(pod, e)))
        .collect()
}

/// One env var's value.
fn value(pod: &Pod, e: &EnvVar) -> String {
    let meta = &pod.metadata;
    if let Some(r) = env_meta_ref(e) {
        let labels = meta.labels.clone().unwrap_or_default();
        let annotations = meta.annotations.clone().unwrap_or_default();
        return r.resolve(&labels, &annotations).to_string();
    }
    let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
    match field.map(|f| f.field_path.as_str()) {
        Some("metadata.name") => meta.name.clone().unwrap_or_default(),
        Some("metadata.namespace") => meta.namespace.clone().unwrap_or_default(),
        Some("metadata.uid") => meta.uid.clone().unwrap_or_default(),
        Some("spec.nodeName") => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        // host network: the pod's IPs are the node's
        Some("status.hostIP" | "status.podIP") => super::status::POD_IP.into(),
        _ => e.value.clone().unwrap_or_default(),
    }
}
