//! The pod side of the triggers: the pod watch's changes, each version recorded in the
//! memory and let through the event filter ([`wants`]: kruise's rule against a patch storm on
//! start), and the periodic relist.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use super::controller::ContainerMeta;
use super::decide;
use super::memory::Start;
use super::settle::Sighting;
use crate::controller::provenance::PodId;
use crate::k8s::keys;
use crate::k8s::watch::Change;

/// Records this version of the pod in its timeline and the kubelet's lags it shows (see
/// `settle.rs`); only where env from metadata is followed.
fn record_sighting(c: &ContainerMeta, pod: &Pod) {
    if !c.with_env || !decide::is_managed(pod) {
        return;
    }
    let uid = pod.uid().unwrap_or_default();
    let lags = c
        .memory
        .saw_pod(pod, &uid, Sighting::of(pod), Instant::now());
    for (name, change, lag) in lags {
        tracing::debug!(container = %name, lag_ms = lag.as_millis() as u64, "the kubelet reported the container's {change}");
        c.metrics.kubelet_lag(lag);
    }
}

/// Forgets what was kept of a deleted pod.
fn forget(c: &ContainerMeta, uid: &str) {
    c.memory.forget_pod(uid);
    c.book.forget(uid);
}

/// The event filter: should this version of the pod (the store's) be reconciled? A pod
/// without the annotation is left alone while it is as the first list found it (no patch
/// storm on start), unless an in-place update waits for the node: kruise-manager started it
/// while no daemon ran, and nothing else would finish it.
fn wants(c: &ContainerMeta, pod: &Pod, start: Start<'_>) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(pod) {
        return false;
    }
    // a stop of ours the pod does not show (a write from an older copy took it out)
    if c.book.update(&PodId::of(pod), pod.annotations()).is_some() {
        return true;
    }
    let annotations = pod.metadata.annotations.as_ref();
    let has_meta = annotations.is_some_and(|a| a.contains_key(keys::RUNTIME_CONTAINERS_META));
    let waits_for_node = c.with_env && decide::in_place_update_pending(pod);
    if !has_meta && !waits_for_node {
        let uid = pod.uid().unwrap_or_default();
        let rv = pod.resource_version().unwrap_or_default();
        if c.memory.unchanged_since_start(&uid, &rv, start) {
            return false;
        }
    }
    let meta = annotations
        .and_then(|a| keys::parse_runtime_containers_meta(a).ok())
        .flatten();
    decide::needs_sync(pod, meta.as_ref(), c.with_env)
}

/// Records this version of the pod and queues it if it is to be reconciled.
fn consider(c: &ContainerMeta, pod: &Pod, start: Start<'_>) {
    record_sighting(c, pod);
    if wants(c, pod, start) {
        c.queue.add(ObjectRef::from_obj(pod));
    }
}

/// Forgets every pod the store no longer holds (issue 43, row 10: a deletion hidden by a
/// relist or a lag left its state kept for ever).
fn forget_all_but_the_stores(c: &ContainerMeta) {
    let live: std::collections::HashSet<String> =
        c.pods.state().iter().filter_map(|p| p.uid()).collect();
    c.memory.forget_all_pods_but(&live);
    c.book.retain(&live);
}

fn consider_all(c: &ContainerMeta, start: Start<'_>) {
    for pod in c.pods.state() {
        consider(c, &pod, start);
    }
}

/// Follows the pods' changes. `changes` was subscribed when the controller started, usually
/// before the pod watch's first list, whose entries then come with the versions they were
/// listed at; `listed_before` says the list was already done then, and only the store tells
/// what it found.
pub async fn watch_pods(
    c: Arc<ContainerMeta>,
    mut changes: broadcast::Receiver<Change<Pod>>,
    listed_before: bool,
) {
    let mut synced_once = listed_before;
    if listed_before {
        consider_all(&c, Start::Snapshot);
    }
    loop {
        let change = tokio::select! {
            () = c.cancel.cancelled() => return,
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Applied(key)) => {
                if let Some(pod) = c.pods.store().get(&key) {
                    consider(&c, &pod, Start::No);
                }
            }
            Ok(Change::Listed(key, rv)) => {
                // a change that reached the store before this entry of the first list was read
                // is a change, not the state at start
                let start = match &rv {
                    Some(rv) if !synced_once => Start::Listed(rv),
                    _ => Start::No,
                };
                if let Some(pod) = c.pods.store().get(&key) {
                    consider(&c, &pod, start);
                }
            }
            Ok(Change::Deleted(key)) => {
                // its planned look (a settle, a grace running out) and retries go with it
                c.queue.remove(&key);
                if let Some(uid) = key.extra.uid.as_ref() {
                    forget(&c, uid);
                }
            }
            Ok(Change::Resynced) => {
                // the end of the first list: the store stands in for the pods whose list
                // entries came before this controller subscribed (Start::Snapshot keeps those
                // that came through their own entries as listed)
                let start = if synced_once {
                    // a relist: deletions it hid are deletions
                    forget_all_but_the_stores(&c);
                    Start::No
                } else {
                    Start::Snapshot
                };
                synced_once = true;
                consider_all(&c, start);
            }
            Err(RecvError::Lagged(_)) => {
                // changes were lost: the store stands in for them
                if synced_once {
                    forget_all_but_the_stores(&c);
                    consider_all(&c, Start::No);
                } else {
                    // the first list may be done, its Resynced among the lost
                    if c.pods.store().wait_until_ready().now_or_never_ready() {
                        synced_once = true;
                        consider_all(&c, Start::Snapshot);
                    }
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Whether the store's first list is in, without waiting.
pub trait NowOrNever {
    fn now_or_never_ready(self) -> bool;
}

impl<F: std::future::Future> NowOrNever for F {
    fn now_or_never_ready(self) -> bool {
        futures::FutureExt::now_or_never(self).is_some()
    }
}

/// Every `every` (jittered): forgets old stops, and queues every annotated pod.
pub async fn relist(c: Arc<ContainerMeta>, every: Duration) {
    loop {
        tokio::select! {
            () = c.cancel.cancelled() => return,
            () = tokio::time::sleep(crate::backoff::jitter(every)) => {}
        }
        c.memory.forget_old_stops(Instant::now());
        // the relist catches what no event reported: runtime-side changes on runtimes without
        // container events
        enqueue_annotated(&c);
    }
}

/// Queues every kruise-managed pod that carries the annotation: a relist of the runtime's
/// side of them.
pub fn enqueue_annotated(c: &ContainerMeta) {
    for pod in c.pods.state() {
        if pod.metadata.deletion_timestamp.is_none()
            && decide::is_managed(&pod)
            && pod
                .annotations()
                .contains_key(keys::RUNTIME_CONTAINERS_META)
        {
            c.queue.add(ObjectRef::from_obj(pod.as_ref()));
        }
    }
}
