//! The pod side of the triggers: the pod watch's changes (with kruise's rule against a patch
//! storm on start) and the periodic relist.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use super::{STOPPED_MEMORY, Shared, decide, lock};
use crate::k8s::keys;
use crate::k8s::watch::Change;

/// The resourceVersions the first list found the pods without the annotation at: such a pod
/// is left alone until it changes (kruise's rule against a patch storm on daemon start).
#[derive(Debug, Default)]
pub(super) struct StartVersions(HashMap<String, String>);

impl StartVersions {
    /// Whether pod `uid`, now at `rv`, is as the first list found it; `start` says what this
    /// version tells of that. A pod seen changed is forgotten: from then on it is followed.
    pub(super) fn unchanged_since_start(&mut self, uid: &str, rv: &str, start: Start<'_>) -> bool {
        match start {
            Start::Listed(listed) => {
                self.0.insert(uid.to_string(), listed.to_string());
            }
            Start::Snapshot => {
                self.0.insert(uid.to_string(), rv.to_string());
            }
            Start::No => {}
        }
        if self.0.get(uid).is_some_and(|v| v == rv) {
            return true;
        }
        self.0.remove(uid);
        false
    }

    pub(super) fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// What a pod version given to [`Shared::wants`] says of the pods as they were at start.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start<'a> {
    /// Nothing: a change after the first list.
    No,
    /// The first list found the pod at this resourceVersion (the store may be newer already).
    Listed(&'a str),
    /// The first list is known only through the store: take its versions as the start.
    Snapshot,
}

/// Follows the pods' changes. `changes` was subscribed when the controller started, usually
/// before the pod watch's first list, whose entries then come with the versions they were
/// listed at; `listed_before` says the list was already done then, and only the store tells
/// what it found.
pub(super) async fn watch_pods(
    shared: Arc<Shared>,
    mut changes: broadcast::Receiver<Change<Pod>>,
    listed_before: bool,
) {
    let mut synced_once = listed_before;
    if listed_before {
        shared.enqueue_all(Start::Snapshot);
    }
    // whether the first list came entirely through its own events
    let mut listed_whole = true;
    loop {
        let change = tokio::select! {
            () = shared.cancel.cancelled() => return,
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Applied(key)) => {
                if let Some(pod) = shared.pods.store().get(&key) {
                    shared.consider(&pod, Start::No);
                }
            }
            Ok(Change::Listed(key, rv)) => {
                // a change that reached the store before this entry of the first list was read
                // is a change, not the state at start
                let start = match &rv {
                    Some(rv) if !synced_once => Start::Listed(rv),
                    _ => Start::No,
                };
                if let Some(pod) = shared.pods.store().get(&key) {
                    shared.consider(&pod, start);
                }
            }
            Ok(Change::Deleted(key)) => {
                if let Some(uid) = key.extra.uid.as_ref() {
                    shared.forget(uid);
                }
            }
            Ok(Change::Resynced) => {
                let start = if synced_once || listed_whole {
                    Start::No
                } else {
                    Start::Snapshot
                };
                synced_once = true;
                shared.enqueue_all(start);
            }
            Err(RecvError::Lagged(_)) => {
                // changes were lost: the store stands in for them
                if synced_once {
                    shared.enqueue_all(Start::No);
                } else {
                    listed_whole = false;
                    // the first list may be done, its Resynced among the lost
                    if shared.pods.store().wait_until_ready().now_or_never_ready() {
                        synced_once = true;
                        shared.enqueue_all(Start::Snapshot);
                    }
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Whether the store's first list is in, without waiting.
pub(super) trait NowOrNever {
    fn now_or_never_ready(self) -> bool;
}

impl<F: std::future::Future> NowOrNever for F {
    fn now_or_never_ready(self) -> bool {
        futures::FutureExt::now_or_never(self).is_some()
    }
}

pub(super) async fn relist(shared: Arc<Shared>, every: Duration) {
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(crate::controller::jitter(every)) => {}
        }
        let now = Instant::now();
        lock(&shared.stopped).retain(|_, at| now.duration_since(*at) < STOPPED_MEMORY);
        lock(&shared.kubelet_expected).retain(|_, at| now.duration_since(*at) < STOPPED_MEMORY);
        // the relist catches what no event reported: runtime-side changes on runtimes without
        // container events
        enqueue_annotated(&shared);
    }
}

/// Queues every kruise-managed pod that carries the annotation: a relist of the runtime's
/// side of them.
pub(super) fn enqueue_annotated(shared: &Shared) {
    for pod in shared.pods.state() {
        if pod.metadata.deletion_timestamp.is_none()
            && decide::is_managed(&pod)
            && pod
                .annotations()
                .contains_key(keys::RUNTIME_CONTAINERS_META)
        {
            shared.queue.add(ObjectRef::from_obj(pod.as_ref()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_as_the_first_list_found_it_is_left_alone_until_it_changes() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "5", Start::Listed("5")));
        // a later event of the same version (a relist, a resync) is still the state at start
        assert!(v.unchanged_since_start("a", "5", Start::No));
        assert!(!v.unchanged_since_start("a", "6", Start::No));
        // once changed, it is followed even if a version repeats
        assert!(!v.unchanged_since_start("a", "5", Start::No));
    }

    #[test]
    fn a_change_the_store_took_before_the_list_entry_was_read_is_a_change() {
        // the first list found the pod at 5; its change to 6 reached the store before this
        // daemon read the list's entry (the race that missed an env change right after start)
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("a", "6", Start::Listed("5")));
        // and the resync that ends the first list does not take 6 for the state at start
        assert!(!v.unchanged_since_start("a", "6", Start::No));
    }

    #[test]
    fn without_the_lists_own_entries_the_store_stands_in_for_the_start() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "6", Start::Snapshot));
        assert!(!v.unchanged_since_start("a", "7", Start::No));
    }

    #[test]
    fn a_pod_never_listed_is_followed_from_its_first_event() {
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("new", "9", Start::No));
    }
}
