//! What the probes observe: the node's NodePodProbe as the watch has it, the node's containers
//! (one listing of the runtime for every probe, into the memory), and a pod's IPs.

use std::sync::Arc;

use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use super::controller::{CONTAINER_REFRESH, ProbeController};
use crate::controller::target::PodIps;
use crate::cri::{Container, ContainerFilter, RemoteRuntime, RuntimeService};
use crate::k8s::crd::NodePodProbe;

/// The node's NodePodProbe (named after it), if the watch has one.
pub fn node_probes(shared: &ProbeController) -> Option<Arc<NodePodProbe>> {
    shared
        .probes
        .state()
        .into_iter()
        .find(|n| n.name_any() == shared.node)
}

/// Lists the node's containers once a second into the memory, until `cancel`.
pub async fn refresh_containers(
    shared: Arc<ProbeController>,
    runtime: RemoteRuntime,
    cancel: CancellationToken,
) {
    loop {
        match runtime.list_containers(ContainerFilter::default()).await {
            Ok(cs) => shared.memory.containers_listed(cs),
            Err(e) => tracing::debug!(error = %e, "listing containers for the probes failed"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CONTAINER_REFRESH) => {}
        }
    }
}

/// Where network probes of container `c` may go: the pod's IPs, asked of the runtime (the
/// sandbox's) beside `ip`, the one kruise-manager wrote from the pod's status.
pub async fn pod_ips(runtime: &RemoteRuntime, c: &Container, ip: &str) -> PodIps {
    let sandbox = runtime
        .pod_sandbox_status(&c.pod_sandbox_id, false)
        .await
        .ok();
    PodIps::of(sandbox.as_ref(), [ip])
}
