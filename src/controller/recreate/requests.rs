//! The request watch: every change of the node's active requests brings its pod's next pass,
//! and what the memory keeps of the requests follows them.

use std::collections::HashSet;
use std::sync::Arc;

use kube::ResourceExt;
use tokio::sync::broadcast::error::RecvError;

use super::controller::RecreateController;
use super::decide::key_of;
use crate::k8s::crd::ContainerRecreateRequest;
use crate::k8s::watch::Change;

/// Follows the requests until the daemon stops.
pub async fn watch_requests(shared: Arc<RecreateController>) {
    let mut changes = shared.requests.subscribe();
    shared.requests.wait_synced().await;
    for r in shared.requests.state() {
        on_change(&shared, &r);
    }
    loop {
        let change = tokio::select! {
            () = shared.cancel.cancelled() => return,
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Applied(key) | Change::Listed(key, _)) => {
                if let Some(r) = shared.requests.store().get(&key) {
                    on_change(&shared, &r);
                }
            }
            Ok(Change::Deleted(key)) => {
                // gone from the watch: deleted, or no longer active
                if let Some(uid) = key.extra.uid.as_deref() {
                    on_gone(&shared, uid);
                }
            }
            Ok(Change::Resynced) | Err(RecvError::Lagged(_)) => {
                // deletions a relist or a lag hid: what the store no longer holds has ended
                let requests = shared.requests.state();
                let live: HashSet<String> = requests.iter().filter_map(|r| r.uid()).collect();
                for key in shared.memory.end_all_but(&live) {
                    shared.queue.add(key);
                }
                for r in requests {
                    on_change(&shared, &r);
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// A request changed: its pod is looked at again. One that ended calls off its kill, and
/// its pod is looked at too, so that the pod's next request starts: kruise-daemon does not,
/// and a second request stays Pending for ever (kruise #1058, #1626; PR #2485).
fn on_change(shared: &RecreateController, r: &ContainerRecreateRequest) {
    let uid = r.uid().unwrap_or_default();
    if r.metadata.deletion_timestamp.is_some() || r.is_completed() {
        shared.memory.ended(&uid);
    } else {
        shared.memory.active(uid, key_of(r));
    }
    shared.queue.add(key_of(r));
}

/// A request left the watch (deleted, or no longer `active`: the manager takes the label
/// off a completed one): its pod is looked at again, for the same reason.
fn on_gone(shared: &RecreateController, uid: &str) {
    if let Some(key) = shared.memory.ended(uid) {
        shared.queue.add(key);
    }
}
