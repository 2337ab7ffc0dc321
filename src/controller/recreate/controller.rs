//! The recreate request controller as its watch, workers and kill tasks hold it: the daemon's
//! handles, what it remembers of the requests, and how it reacts to a request's change.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use crate::controller::provenance::Book;
use crate::controller::queue::{Retry, WorkQueue};
use crate::cri::RuntimeHandle;
use crate::k8s::crd::ContainerRecreateRequest;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;
use crate::sync::lock;

/// How a pod whose pass failed is retried: after 2 s, doubling up to a minute.
pub const RETRY: Retry = Retry::after(Duration::from_secs(2));

/// A pod: namespace and name.
pub type Key = (String, String);

/// The recreate request controller: what its watch, its workers and its kill tasks share.
pub struct RecreateController {
    pub requests: Watched<ContainerRecreateRequest>,
    pub client: kube::Client,
    pub runtimes: RuntimeHandle,
    pub queue: WorkQueue<Key>,
    pub events: EventSink,
    pub metrics: Metrics,
    /// Kills in progress, by request UID, to call off when the request ends.
    pub inflight: Mutex<HashMap<String, CancellationToken>>,
    /// The containers recorded as killed, by request UID, until the request ends: the watched
    /// copy of a request can be older than the daemon's own last write to it.
    pub killed: Mutex<HashMap<String, BTreeSet<String>>>,
    /// The node's pods, where watched: a host-network pod's IP for its hooks.
    pub pods: Option<Watched<Pod>>,
    /// The pod of each request seen active, by request UID: a request that leaves the watch
    /// is gone from the store, and its pod must still be looked at again.
    pub pod_of: Mutex<HashMap<String, Key>>,
    /// The requests this daemon completed, by UID, until the watch shows them completed or
    /// gone: a pass on a watched copy older than the completion skips them. Without it such a
    /// pass completed a request twice, counted twice (seen on CRI-O in CI: the e2e ordered
    /// recreate counted `result="succeeded"` 2 for one request).
    pub completed: Mutex<HashSet<String>>,
    /// The stops this daemon made lately (shared with container meta), for the pods'
    /// annotation ([`record`]).
    pub book: Book,
    pub cancel: CancellationToken,
    pub tracker: tokio_util::task::TaskTracker,
}

pub fn key_of(r: &ContainerRecreateRequest) -> Key {
    (r.namespace().unwrap_or_default(), r.spec.pod_name.clone())
}

impl RecreateController {
    /// Calls off a kill in progress for a request that ended, and forgets its kills.
    pub fn call_off(&self, uid: &str) {
        lock(&self.killed).remove(uid);
        if let Some(t) = lock(&self.inflight).remove(uid) {
            tracing::info!(
                request = uid,
                "the request ended: calling off its kill in progress"
            );
            t.cancel();
        }
    }

    /// A request changed: its pod is looked at again. One that ended calls off its kill, and
    /// its pod is looked at too, so that the pod's next request starts: kruise-daemon does not,
    /// and a second request stays Pending for ever (kruise #1058, #1626; PR #2485).
    pub fn on_change(&self, r: &ContainerRecreateRequest) {
        let uid = r.uid().unwrap_or_default();
        if r.metadata.deletion_timestamp.is_some() || r.is_completed() {
            self.call_off(&uid);
            lock(&self.pod_of).remove(&uid);
            self.forget_completion(&uid);
        } else {
            lock(&self.pod_of).insert(uid, key_of(r));
        }
        self.queue.add(key_of(r));
    }

    /// A request left the watch (deleted, or no longer `active`: the manager takes the label
    /// off a completed one): its pod is looked at again, for the same reason.
    pub fn on_gone(&self, uid: &str) {
        self.call_off(uid);
        self.forget_completion(uid);
        if let Some(key) = lock(&self.pod_of).remove(uid) {
            self.queue.add(key);
        }
    }

    /// The watch shows a request this daemon completed as completed (or gone): its copies are
    /// no longer older than the completion.
    pub fn forget_completion(&self, uid: &str) {
        if lock(&self.completed).remove(uid) {
            tracing::debug!(request = uid, "the watch shows the completion");
        }
    }

    /// Whether this daemon completed the request and the watch does not show it yet.
    pub fn completed_here(&self, r: &ContainerRecreateRequest) -> bool {
        r.uid()
            .is_some_and(|uid| lock(&self.completed).contains(&uid))
    }
}
