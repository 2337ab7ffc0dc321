//! The recreate request controller as its watch, workers and kill tasks hold it: the daemon's
//! handles, the controller's settings, and its memory ([`Memory`], the one owner of what it
//! remembers).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::decide::Key;
use super::memory::Memory;
use super::metrics::Metrics;
use crate::controller::provenance::Book;
use crate::controller::queue::{Retry, WorkQueue};
use crate::cri::RuntimeHandle;
use crate::k8s::crd::ContainerRecreateRequest;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;

/// Pods worked on at once (kruise: 32 workers).
pub const WORKERS: usize = 8;
/// How a pod whose pass failed is retried: after 2 s, doubling up to a minute.
pub const RETRY: Retry = Retry::after(Duration::from_secs(2));
/// Pause before retrying a pod whose pass failed because the runtime did not answer: short, so
/// the work resumes soon after a restarted runtime answers again (a call to a missing socket
/// costs nothing): 250 ms, doubling up to the 2 s of other failures' first pause.
pub const RUNTIME_RETRY: Retry = Retry::after(Duration::from_millis(250)).at_most(RETRY.first());
/// The event component (kruise's).
pub const EVENT_COMPONENT: &str = "kruise-daemon-crr";

/// The recreate request controller: what its watch, its workers and its kill tasks share.
pub struct RecreateController {
    /// The node's active requests.
    pub requests: Watched<ContainerRecreateRequest>,
    /// The API client.
    pub client: kube::Client,
    /// The node's runtimes.
    pub runtimes: RuntimeHandle,
    /// The pods to look at.
    pub queue: WorkQueue<Key>,
    /// Events about the pods' containers.
    pub events: EventSink,
    /// The controller's metrics.
    pub metrics: Metrics,
    /// The node's pods, where watched: a host-network pod's IP for its hooks.
    pub pods: Option<Watched<Pod>>,
    /// What the controller remembers of the requests between passes.
    pub memory: Memory,
    /// The stops this daemon made lately (shared with container meta), for the pods'
    /// annotation (`record.rs`).
    pub book: Book,
    /// Ends every task when cancelled.
    pub cancel: CancellationToken,
    /// Where the kills run.
    pub tracker: TaskTracker,
}
