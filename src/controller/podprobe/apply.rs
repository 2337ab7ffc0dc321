//! What the probes do with their results: each kept in the memory, with an event on the pod
//! when it is news, and the NodePodProbe's status written when results changed.

use std::sync::Arc;

use kube::Api;
use tokio::time::Instant;

use super::controller::{ProbeController, STATUS_COALESCE, STATUS_WRITE_INTERVAL};
use super::decide::{self, ProbeKey, ProbeSpec};
use super::observe;
use crate::backoff::Backoff;
use crate::k8s::crd::{NodePodProbe, ProbeState};
use crate::k8s::time::now_seconds;
use crate::k8s::write::{self, EventSpec};

/// Keeps a result if it differs from the current one, with an event when it is news, and asks
/// for a status write.
pub fn set_result(
    shared: &ProbeController,
    key: &ProbeKey,
    spec: &ProbeSpec,
    state: ProbeState,
    message: String,
) {
    let now = now_seconds();
    let Some(event) = shared
        .memory
        .record(key, state.clone(), message.clone(), now)
    else {
        return;
    };
    if event {
        // the message is the container's output: one clean, bounded line in a text log
        let logged = decide::log_message(&message);
        tracing::info!(pod = %key.0, probe = %key.1, state = %state.as_str(), message = %logged, "probe result changed");
        shared.events.record(EventSpec {
            regarding: spec.pod.clone(),
            warning: false,
            reason: decide::reason(&state).into(),
            note: message,
            action: "Probe".into(),
        });
    }
    shared.memory.changed();
}

/// Writes the status when results changed: one merge patch for all changes within
/// [`STATUS_COALESCE`], at most one a [`STATUS_WRITE_INTERVAL`] (however many probes change
/// how often: what changes meanwhile waits for the next), and only when the status differs from
/// the stored one.
pub async fn write_status(shared: Arc<ProbeController>) {
    let api: Api<NodePodProbe> = Api::all(shared.client.clone());
    let mut retry = Backoff::status_write();
    let mut last_write: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = shared.memory.changes() => {}
        }
        let coalesced = Instant::now() + STATUS_COALESCE;
        let next = last_write.map_or(coalesced, |w| (w + STATUS_WRITE_INTERVAL).max(coalesced));
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let Some(npp) = observe::node_probes(&shared) else {
            continue;
        };
        let Some(status) = shared.memory.status_for(&npp) else {
            continue;
        };
        let body = serde_json::json!({"podProbeStatuses": status.pod_probe_statuses});
        last_write = Some(Instant::now());
        match write::patch_status_unread(&api, &shared.node, &body).await {
            Ok(()) => {
                retry.reset();
                tracing::debug!("NodePodProbe status written");
            }
            Err(e) => {
                let pause = retry.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "writing the NodePodProbe status failed; retrying");
                tokio::select! {
                    () = shared.cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                shared.memory.changed();
            }
        }
    }
}
