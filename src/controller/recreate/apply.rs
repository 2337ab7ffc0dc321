//! What a pass does: the request's status written (JSON merge patches of the changed fields
//! only, never the manager's snapshot), its completion, and a container's kill on a task of its
//! own through the shared kill path ([`crate::controller::kill`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LifecycleHandler, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::controller::{RETRY, RUNTIME_RETRY, RecreateController};
use super::decide::{self, key_of};
use super::observe;
use crate::controller::kill::{self, KillSpec};
use crate::controller::provenance::{PodId, RECREATE_REQUEST, Restart};
use crate::cri::{Container, RemoteRuntime};
use crate::k8s::crd::{
    ContainerRecreateRequest, ContainerRecreateRequestContainerRecreateState as State,
    ContainerRecreateRequestPhase as Phase,
};
use crate::k8s::write;

fn api_of(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
) -> Api<ContainerRecreateRequest> {
    Api::namespaced(shared.client.clone(), &r.namespace().unwrap_or_default())
}

/// A merge patch of the status fields the daemon owns (never the manager's snapshot); the
/// fields left `None` are not touched.
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusPatch<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_time: Option<String>,
    /// `Some(None)` clears the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_recreate_states: Option<&'a [State]>,
}

impl<'a> StatusPatch<'a> {
    /// The phase.
    pub fn phase(phase: Phase) -> Self {
        StatusPatch {
            phase: Some(phase),
            ..Default::default()
        }
    }

    /// The containers' states.
    pub fn states(states: &'a [State]) -> Self {
        StatusPatch {
            container_recreate_states: Some(states),
            ..Default::default()
        }
    }

    /// `Completed` now, with `message` (cleared when `None`).
    fn completed(message: Option<&'a str>) -> Self {
        StatusPatch {
            phase: Some(Phase::Completed),
            completion_time: Some(crate::k8s::time::now_rfc3339()),
            message: Some(message),
            ..Default::default()
        }
    }
}

/// Writes `status` on request `r`.
pub async fn patch(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
    status: StatusPatch<'_>,
) -> Result<(), kube::Error> {
    let status = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    write::patch_status_unread(&api_of(shared, r), &r.name_any(), &status).await
}

/// Completes the request: phase `Completed`, `completionTime` now, `message` (cleared when
/// empty); `states` are its containers' last.
pub async fn complete(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
    message: &str,
    states: &[State],
) -> Result<(), kube::Error> {
    let message = (!message.is_empty()).then_some(message);
    let uid = r.uid().unwrap_or_default();
    shared.memory.completing(&uid);
    if let Err(e) = patch(shared, r, StatusPatch::completed(message)).await {
        shared.memory.completion_failed(&uid);
        return Err(e);
    }
    shared.memory.completed(&uid);
    let failed = message.is_some() || states.iter().any(|s| s.phase == Phase::Failed);
    let took = r
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| decide::elapsed(t.0, Timestamp::now()));
    shared.metrics.completed(!failed, took);
    tracing::info!(request = %r.name_any(), message = message.unwrap_or(""), failed, "request completed");
    Ok(())
}

/// Writes `states` (which record `container` killed) first, then kills the container on a task
/// of its own: a preStop hook runs for as long as the request's grace (its creator's), and on a
/// worker it would hold one of the node's few for that long (2c6dc4e ran it inline: 8 hanging
/// hooks and no other pod's request moved). When the kill ends, the pod is looked at again; a
/// failed kill marks the container Failed. `newest` is the pod's newest container of each name.
pub async fn kill(
    shared: &Arc<RecreateController>,
    r: &Arc<ContainerRecreateRequest>,
    (runtime, runtime_name): (&RemoteRuntime, &str),
    container: &str,
    pod_uid: &str,
    states: Vec<State>,
    newest: &BTreeMap<&str, &Container>,
) -> Result<(), kube::Error> {
    let Some(running) = newest.get(container) else {
        return Ok(());
    };
    patch(shared, r, StatusPatch::states(&states[..])).await?;

    let spec_container = r.spec.containers.iter().find(|c| c.name == container);
    let spec = KillSpec {
        pre_stop: spec_container
            .and_then(|c| c.pre_stop.clone())
            .map(|h| LifecycleHandler {
                exec: h.exec,
                http_get: h.http_get,
                tcp_socket: h.tcp_socket,
                ..Default::default()
            }),
        grace: r.spec.termination_grace_period(),
        ports: spec_container.map(|c| c.ports.clone()).unwrap_or_default(),
    };
    let token = shared.cancel.child_token();
    shared
        .memory
        .kill_started(&r.uid().unwrap_or_default(), container, token.clone());
    let pod = PodId {
        namespace: r.namespace().unwrap_or_default(),
        name: r.spec.pod_name.clone(),
        uid: pod_uid.to_string(),
    };
    let regarding = kill::container_ref(
        &write::pod_ref(&pod.namespace, &pod.name, &pod.uid),
        container,
    );
    let status_ips = observe::status_ips(shared, r, pod_uid);
    let task = KillTask {
        shared: shared.clone(),
        request: r.clone(),
        runtime: runtime.clone(),
        running: (*running).clone(),
        container: container.to_string(),
        states,
        spec,
        regarding,
        token,
        status_ips,
        pod,
        kubelet_id: format!("{runtime_name}://{}", running.id),
    };
    shared.tracker.spawn(task.run().in_current_span());
    Ok(())
}

/// One container's kill for a request, on a task of its own.
struct KillTask {
    shared: Arc<RecreateController>,
    request: Arc<ContainerRecreateRequest>,
    runtime: RemoteRuntime,
    running: Container,
    container: String,
    states: Vec<State>,
    spec: KillSpec,
    regarding: ObjectReference,
    token: CancellationToken,
    status_ips: Vec<String>,
    /// The pod, for the record of the stop.
    pod: PodId,
    /// The container stopped, as the kubelet writes its ID.
    kubelet_id: String,
}

impl KillTask {
    async fn run(mut self) {
        let (shared, r, container) = (&self.shared, &self.request, self.container.as_str());
        let key = key_of(r);
        let uid = r.uid().unwrap_or_default();
        tracing::info!(request = %r.name_any(), %container, id = %self.running.id, "stopping container for the recreate request");
        let announcement = kill::Announcement {
            regarding: self.regarding.clone(),
            container: container.to_string(),
            note: format!(
                "Stopping container {container} by ContainerRecreateRequest {}",
                r.name_any()
            ),
            warning: false,
            action: "Recreate",
        };
        let outcome = kill::kill_announced(
            &self.runtime,
            &self.running,
            &self.spec,
            &self.status_ips,
            &self.token,
            &shared.events,
            announcement,
        )
        .await;
        shared.memory.kill_ended(&uid);
        let again = match outcome {
            Ok(_) => {
                shared.metrics.killed();
                // written on the pod by its next pass, which the add below brings at once
                shared.book.record(
                    self.pod.clone(),
                    Restart::now(
                        container,
                        self.kubelet_id.clone(),
                        RECREATE_REQUEST,
                        &r.name_any(),
                    ),
                );
                None
            }
            Err(kill::KillError::Cancelled) => {
                tracing::info!(request = %r.name_any(), %container, "kill called off: the request ended");
                None
            }
            // the runtime went away under the call, called it off, or failed inside
            // (containerd answers Unknown "ttrpc: closed" when its shim connection breaks in a
            // restart): whether the container stopped is unknown, and a later pass finds out
            // and stops it again if not, as the kubelet retries a kill; the manager ends the
            // request at its activeDeadlineSeconds. Only a final error (not found, not
            // supported) fails it.
            Err(kill::KillError::Cri(e)) if e.is_retryable() => {
                tracing::warn!(request = %r.name_any(), %container, error = %e, "stopping the container failed; trying again");
                Some(RUNTIME_RETRY)
            }
            Err(kill::KillError::Cri(e)) => {
                tracing::warn!(request = %r.name_any(), %container, error = %e, "could not stop the container");
                decide::set_state(
                    &mut self.states,
                    container,
                    Phase::Failed,
                    format!("kill container error: {e}"),
                    true,
                );
                match patch(shared, r, StatusPatch::states(&self.states[..])).await {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!(request = %r.name_any(), error = %e, "writing the failed kill; trying again");
                        Some(RETRY)
                    }
                }
            }
        };
        match again {
            Some(after) => shared.queue.retry_after(key, after, &shared.cancel),
            None => shared.queue.add(key),
        }
    }
}
