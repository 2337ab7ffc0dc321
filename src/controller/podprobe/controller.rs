//! The pod probe controller as its probe tasks, the container listing and the status writer
//! hold it: the daemon's handles, the node's exec slots, and its memory ([`Memory`], the one
//! owner of what it remembers).

use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::memory::Memory;
use super::metrics::Metrics;
use crate::k8s::crd::NodePodProbe;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;

/// The event component (kruise's).
pub const EVENT_COMPONENT: &str = "kruise-daemon-podprobe";
/// How often the runtime's containers are listed while probes exist.
pub const CONTAINER_REFRESH: Duration = Duration::from_secs(1);
/// Exec probes running at once on the node.
pub const EXEC_CONCURRENCY: usize = 16;
/// How long results are gathered before one status write.
pub const STATUS_COALESCE: Duration = Duration::from_millis(100);

/// The pod probe controller: what its probe tasks, the container listing and the status
/// writer share.
pub struct ProbeController {
    /// The NodePodProbes (the node's one is named after it).
    pub probes: Watched<NodePodProbe>,
    /// The API client.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
    /// What the controller remembers: the containers, the results, the namespaces' slots.
    pub memory: Memory,
    /// The node's exec slots ([`EXEC_CONCURRENCY`]).
    pub exec_slots: Semaphore,
    /// Events about the pods.
    pub events: EventSink,
    /// The controller's metrics.
    pub metrics: Metrics,
    /// When the controller started: the first runs of its probes are spread over a period.
    pub started: Instant,
    /// Ends every task when cancelled.
    pub cancel: CancellationToken,
    /// Where the probe tasks run.
    pub tracker: TaskTracker,
}
