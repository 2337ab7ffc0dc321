//! The pod probe controller as its probe tasks, the container listing and the status writer
//! hold it: the daemon's handles, the node's exec and network slots ([`Slots`]), and its memory
//! ([`Memory`], the one owner of what it remembers).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::memory::Memory;
use super::metrics::Metrics;
use super::slots::Slots;
use crate::k8s::crd::NodePodProbe;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;

/// The event component (kruise's).
pub const EVENT_COMPONENT: &str = "kruise-daemon-podprobe";
/// How often the runtime's containers are listed while probes exist.
pub const CONTAINER_REFRESH: Duration = Duration::from_secs(1);
/// How long results are gathered before one status write.
pub const STATUS_COALESCE: Duration = Duration::from_millis(100);
/// The least time between two writes of the node's NodePodProbe status: however many probes
/// change how often, it is written at most once in this interval (what changed meanwhile goes
/// in the next write).
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// The pod probe controller: what its probe tasks, the container listing and the status
/// writer share.
pub struct ProbeController {
    /// The NodePodProbes (the node's one is named after it).
    pub probes: Watched<NodePodProbe>,
    /// The API client.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
    /// What the controller remembers: the containers, the results.
    pub memory: Memory,
    /// The node's exec slots ([`super::slots::EXEC`]).
    pub exec_slots: Slots,
    /// The node's network probe slots ([`super::slots::NETWORK`]).
    pub network_slots: Slots,
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
