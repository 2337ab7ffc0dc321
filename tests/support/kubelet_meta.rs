//! What the kubelet writes on what it creates through CRI: the labels of a pod's sandbox and
//! containers, and a container's annotations. Shared by the tests' kubelets (`kubelet.rs`,
//! `node.rs`) and the demo's `tests/kubelet-stand-in`, which includes this file.

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

impl PodRef<'_> {
    fn insert_identity(&self, labels: &mut StringMap) {
        labels.insert(keys::KUBELET_POD_NAME.into(), self.name.to_string());
        labels.insert(
            keys::KUBELET_POD_NAMESPACE.into(),
            self.namespace.to_string(),
        );
        labels.insert(keys::KUBELET_POD_UID.into(), self.uid.to_string());
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
    labels.insert(keys::KUBELET_CONTAINER_NAME.into(), container.to_string());
    labels
}

/// A container's annotations: its spec's hash (lowercase hex), restart count (the attempt), the
/// pod's grace period, the default termination message settings, and its preStop handler (JSON)
/// if it has one.
pub fn container_annotations(
    hash: &str,
    attempt: u32,
    grace_seconds: i64,
    pre_stop: Option<&str>,
) -> StringMap {
    let mut annotations = StringMap::new();
    for (k, v) in [
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
    ] {
        annotations.insert(k.into(), v);
    }
    if let Some(h) = pre_stop {
        annotations.insert(keys::KUBELET_PRESTOP_HANDLER.into(), h.to_string());
    }
    annotations
}
