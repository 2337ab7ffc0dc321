//! What the probes do with their results: each kept in the memory, with an event on the pod
//! when it is news, and the NodePodProbe's status written when results changed.

use std::sync::Arc;

use kube::Api;

use super::controller::{ProbeController, STATUS_COALESCE};
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
        tracing::info!(pod = %key.0, probe = %key.1, state = %state.as_str(), %message, "probe result changed");
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
/// [`STATUS_COALESCE`], and only when the status differs from the stored one.
pub async fn write_status(shared: Arc<ProbeController>) {
    let api: Api<NodePodProbe> = Api::all(shared.client.clone());
    let mut retry = Backoff::status_write();
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = shared.memory.changes() => {}
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(STATUS_COALESCE) => {}
        }
        let Some(npp) = observe::node_probes(&shared) else {
            continue;
        };
        let Some(status) = shared.memory.status_for(&npp) else {
            continue;
        };
        let body = serde_json::json!({"podProbeStatuses": status.pod_probe_statuses});
        match write::patch_status(&api, &shared.node, &body).await {
            Ok(_) => {
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
