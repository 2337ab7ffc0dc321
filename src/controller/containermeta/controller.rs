//! The container meta controller as each of its tasks holds it: the daemon's handles, the
//! controller's settings, and its memory ([`Memory`], the one owner of what it remembers).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::memory::Memory;
use super::metrics::Metrics;
use super::settle::RestartDelay;
use crate::controller::provenance::Book;
use crate::controller::queue::WorkQueue;
use crate::cri::RuntimeHandle;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;

/// A pod, as the work queue keys it.
pub type Key = ObjectRef<Pod>;

/// The controller: what its watch, relist, event and worker tasks share.
pub struct ContainerMeta {
    /// The node's pods.
    pub pods: Watched<Pod>,
    /// The API client.
    pub client: kube::Client,
    /// The node's runtimes.
    pub runtimes: RuntimeHandle,
    /// The pods to look at.
    pub queue: WorkQueue<Key>,
    /// `InPlaceUpdateEnvironmentFromMetadata`: env hashes are read and stale env restarts.
    pub with_env: bool,
    /// When stale-env restarts happen.
    pub restart_delay: RestartDelay,
    /// What the controller remembers between passes (its stops' tasks hold it too).
    pub memory: Arc<Memory>,
    /// The stops this daemon made lately (shared with recreate requests), for the annotation.
    pub book: Book,
    /// Events about the pods.
    pub events: EventSink,
    /// The controller's metrics.
    pub metrics: Metrics,
    /// Ends every task when cancelled.
    pub cancel: CancellationToken,
    /// Where the stops run.
    pub tracker: TaskTracker,
}
