//! Every label and annotation key the daemon reads or writes, in one place.
//!
//! Kubelet keys are what the kubelet puts on CRI sandboxes and containers
//! (`k8s.io/kubelet/pkg/types` and `pkg/kubelet/kuberuntime/labels.go`).

/// Kubelet label on sandboxes and containers: the pod's name.
pub const KUBELET_POD_NAME: &str = "io.kubernetes.pod.name";
/// Kubelet label on sandboxes and containers: the pod's namespace.
pub const KUBELET_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Kubelet label on sandboxes and containers: the pod's uid (the daemon's CRI filter).
pub const KUBELET_POD_UID: &str = "io.kubernetes.pod.uid";
/// Kubelet label on containers: the container's name in the pod spec.
pub const KUBELET_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Kubelet annotation: the container hash, lowercase hex (formula depends on the kubelet version).
pub const KUBELET_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Kubelet annotation: the restart count when the container was created (decimal).
pub const KUBELET_CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Kubelet annotation: where the termination message is written.
pub const KUBELET_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Kubelet annotation: `File` or `FallbackToLogsOnError`.
pub const KUBELET_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Kubelet annotation: the pod's deletion grace period in seconds, once it is being deleted.
pub const KUBELET_POD_DELETION_GRACE: &str = "io.kubernetes.pod.deletionGracePeriod";
/// Kubelet annotation: the pod's `terminationGracePeriodSeconds`.
pub const KUBELET_POD_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Kubelet annotation: the container's preStop handler as JSON (`LifecycleHandler`).
pub const KUBELET_PRESTOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Kubelet annotation: the container's ports as JSON (`[]ContainerPort`).
pub const KUBELET_CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Kubelet label on sandboxes: `podsandbox`; on containers the annotation of the same name says
/// `container`, `init` or `ephemeral`.
pub const KUBELET_CONTAINER_TYPE: &str = "io.kubernetes.container.type";
