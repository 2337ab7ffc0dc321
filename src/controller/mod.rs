//! The capability controllers, one per folder or file: container meta, image pull, recreate
//! requests, pod probes. Each reads the daemon's watches and runtime and writes through
//! `k8s::write`.

pub mod containermeta;
pub mod imagepull;
pub mod kill;
pub mod podprobe;
pub mod queue;
pub mod recreate;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DaemonConfig;
use crate::cri::Runtimes;
use crate::k8s::crd::{ContainerRecreateRequest, NodeImage, NodePodProbe};
use crate::k8s::watch as kwatch;

/// Starts every enabled controller on the daemon's tasks.
pub fn start(ctx: &Context, registry: &mut Registry) {
    containermeta::start(ctx, registry.sub_registry_with_prefix("containermeta"));
    imagepull::start(ctx, registry.sub_registry_with_prefix("imagepull"));
    recreate::start(ctx, registry.sub_registry_with_prefix("recreate"));
    podprobe::start(ctx, registry.sub_registry_with_prefix("podprobe"));
}

/// The daemon's shared handles, passed to each capability controller.
#[derive(Clone)]
pub struct Context {
    /// Validated settings.
    pub config: Arc<DaemonConfig>,
    /// The API client.
    pub client: kube::Client,
    /// The runtimes, once found (`None` until then).
    pub runtimes: watch::Receiver<Option<Runtimes>>,
    /// The node's pods, if pods are watched.
    pub pods: Option<kwatch::Watched<Pod>>,
    /// The NodeImage named after the node.
    pub node_images: kwatch::Watched<NodeImage>,
    /// The node's active recreate requests.
    pub recreate_requests: kwatch::Watched<ContainerRecreateRequest>,
    /// The NodePodProbe named after the node, if probes are enabled.
    pub pod_probes: Option<kwatch::Watched<NodePodProbe>>,
    /// Ends every task when cancelled.
    pub cancel: CancellationToken,
    /// Tracks every task, for the drain.
    pub tracker: TaskTracker,
}

/// `d` ± 20 %, so many nodes do not retry in step.
pub fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.8..1.2))
}
