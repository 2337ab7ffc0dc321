//! What the kubelet writes on what it creates through CRI: the labels of a pod's sandbox and
//! containers, and a container's annotations (kuberuntime_labels.go).

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::StringMap;
use kruised::k8s::keys;

/// The pod a sandbox or container belongs to.
#[derive(Clone, Copy, Debug)]
pub struct PodRef<'a> {
    /// Pod name.
    pub name: &'a str,
    /// Pod namespace.
    pub namespace: &'a str,
    /// Pod UID.
    pub uid: &'a str,
}

impl<'a> PodRef<'a> {
    /// The identity of `pod` (namespace `default` when it has none).
    pub fn of(pod: &'a Pod) -> Self {
        let m = &pod.metadata;
        PodRef {
            name: m.name.as_deref().unwrap_or_default(),
            namespace: m.namespace.as_deref().unwrap_or("default"),
            uid: m.uid.as_deref().unwrap_or_default(),
        }
    }

    fn insert_identity(&self, labels: &mut StringMap) {
        labels.insert(keys::KUBELET_POD_NAME.into(), self.name.into());
        labels.insert(keys::KUBELET_POD_NAMESPACE.into(), self.namespace.into());
        labels.insert(keys::KUBELET_POD_UID.into(), self.uid.into());
    }
}

/// A sandbox's labels: the pod's own, then the kubelet's.
pub fn sandbox_labels(pod: PodRef<'_>, pod_labels: &StringMap) -> StringMap {
    let mut labels = pod_labels.clone();
    pod.insert_identity(&mut labels);
    labels.insert(keys::KUBELET_CONTAINER_TYPE.into(), "podsandbox".into());
    labels
}

/// A container's labels: `extra` (a real kubelet adds none), then the kubelet's.
pub fn container_labels(pod: PodRef<'_>, container: &str, extra: &StringMap) -> StringMap {
    let mut labels = extra.clone();
    pod.insert_identity(&mut labels);
    labels.insert(keys::KUBELET_CONTAINER_NAME.into(), container.into());
    labels
}

/// A container's annotations (kuberuntime_container.go newContainerAnnotations): its spec's
/// hash (lowercase hex), restart count (the attempt), the pod's grace period, the default
/// termination message settings, and its preStop handler and ports (JSON) if it has them.
pub fn container_annotations(
    hash: &str,
    attempt: u32,
    grace_seconds: i64,
    pre_stop: Option<&str>,
    ports: Option<&str>,
) -> StringMap {
    let mut annotations: StringMap = [
        (keys::KUBELET_CONTAINER_HASH, hash.to_string()),
        (keys::KUBELET_CONTAINER_RESTART_COUNT, attempt.to_string()),
        (
            keys::KUBELET_TERMINATION_MESSAGE_PATH,
            "/dev/termination-log".into(),
        ),
        (keys::KUBELET_TERMINATION_MESSAGE_POLICY, "File".into()),
        (
            keys::KUBELET_POD_TERMINATION_GRACE,
            grace_seconds.to_string(),
        ),
        (keys::KUBELET_CONTAINER_TYPE, "container".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in [
        (keys::KUBELET_PRESTOP_HANDLER, pre_stop),
        (keys::KUBELET_CONTAINER_PORTS, ports),
    ] {
        if let Some(v) = v {
            annotations.insert(k.into(), v.into());
        }
    }
    annotations
}
