//! `ContainerRecreateRequest` (namespaced, short name `crr`): a request to recreate some
//! containers of one pod, executed by the daemon on the pod's node.
//!
//! Go source: `apis/apps/v1alpha1/containerrecreaterequest_types.go`; semantics in
//! docs/kruise-wire.md. The v1alpha1 annotations that carry the manager's container-status
//! snapshot and unready time are parsed in [`crate::k8s::keys`].

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, HTTPGetAction, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use serde::{Deserialize, Serialize};

use super::{is_false, is_zero_i32, null_as_default, string_enum};

/// Grace period of the containers' termination when the strategy gives none (the webhook
/// normally copies the pod's).
pub const DEFAULT_TERMINATION_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// ContainerRecreateRequestSpec defines the desired state of ContainerRecreateRequest.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[cfg_attr(not(feature = "test-util"), kube(schema = "disabled"))]
#[kube(
    group = "apps.kruise.io",
    version = "v1alpha1",
    kind = "ContainerRecreateRequest",
    namespaced,
    shortname = "crr",
    status = "ContainerRecreateRequestStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "ContainerRecreateRequest is the Schema for the containerrecreaterequests API",
    printcolumn = r#"{"name": "PHASE", "type": "string", "jsonPath": ".status.phase", "description": "Phase of this ContainerRecreateRequest."}"#,
    printcolumn = r#"{"name": "POD", "type": "string", "jsonPath": ".spec.podName", "description": "Pod name of this ContainerRecreateRequest."}"#,
    printcolumn = r#"{"name": "NODE", "type": "string", "jsonPath": ".metadata.labels.crr\\.apps\\.kruise\\.io/node-name", "description": "Pod name of this ContainerRecreateRequest."}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC."}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestSpec {
    /// PodName is name of the Pod that owns the recreated containers.
    #[serde(default)]
    pub pod_name: String,
    /// Containers contains the containers that need to recreate in the Pod.
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<ContainerRecreateRequestContainer>,
    /// Strategy defines strategies for containers recreation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ContainerRecreateRequestStrategy>,
    /// ActiveDeadlineSeconds is the deadline duration of this ContainerRecreateRequest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// TTLSecondsAfterFinished is the TTL duration after this ContainerRecreateRequest has
    /// completed.
    #[serde(
        default,
        rename = "ttlSecondsAfterFinished",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_seconds_after_finished: Option<i32>,
}

/// ContainerRecreateRequestContainer defines the container that need to recreate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestContainer {
    /// Name of the container that need to recreate.
    #[serde(default)]
    pub name: String,
    /// PreStop is synced from the real container in Pod spec during creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<ProbeHandler>,
    /// Ports is synced from the real container in Pod spec during creation.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ports: Vec<ContainerPort>,
    /// StatusContext is synced from the real Pod status during creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_context: Option<ContainerRecreateRequestContainerContext>,
}

/// ProbeHandler defines a specific action that should be taken (kruise's own type, with exactly
/// the three core handlers; v1beta1 calls it `CRRProbeHandler`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProbeHandler {
    /// Exec specifies the action to take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// HTTPGet specifies the http request to perform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HTTPGetAction>,
    /// TCPSocket specifies an action involving a TCP port (not supported as a preStop hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TCPSocketAction>,
}

/// ContainerRecreateRequestContainerContext contains the context status of the container that
/// needs to recreate, as it was when the request was created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestContainerContext {
    /// Container's ID in the format `<runtime>://<container_id>`.
    #[serde(default, rename = "containerID")]
    pub container_id: String,
    /// The restart count of the container.
    #[serde(default)]
    pub restart_count: i32,
}

/// ContainerRecreateRequestStrategy contains the strategies for containers recreation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStrategy {
    /// FailurePolicy decides whether to continue if one container fails to recreate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// Whether to recreate the next container only once the previous one has recreated.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ordered_recreate: bool,
    /// Whether to kill the container even if the previous container is starting.
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_recreate: bool,
    /// Time to wait for the container to terminate gracefully, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Time to keep the Pod not-ready before running preStop and stopping the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_grace_period_seconds: Option<i64>,
    /// Seconds a new container must run (and be ready) to count as Succeeded.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub min_started_seconds: i32,
}

string_enum! {
    /// What to do when one container fails to recreate.
    pub enum FailurePolicy {
        /// Complete the request (the default, set by the webhook).
        Fail = "Fail",
        /// Continue with the next container.
        Ignore = "Ignore",
    }
}

/// ContainerRecreateRequestStatus defines the observed state of ContainerRecreateRequest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestStatus {
    /// Phase of this ContainerRecreateRequest (always written, `""` before the daemon saw it).
    #[serde(default)]
    pub phase: ContainerRecreateRequestPhase,
    /// When the ContainerRecreateRequest was completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// A human readable message indicating details about this ContainerRecreateRequest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The recreation states of the containers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub container_recreate_states: Vec<ContainerRecreateRequestContainerRecreateState>,
    /// The manager's snapshot of the pod's container statuses (`v1beta1`, kruise HEAD; in
    /// `v1alpha1` the annotation `crr.apps.kruise.io/sync-container-statuses`). Read, never
    /// written by the daemon.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub container_status_snapshot: Vec<ContainerStatusSnapshot>,
    /// Conditions (`v1beta1`, kruise HEAD): `PreRecreateGrace` says since when the pod is not
    /// ready (in `v1alpha1` the annotation `crr.apps.kruise.io/unready-acquired`). Read, never
    /// written by the daemon.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<CrrCondition>,
}

/// One container in the manager's snapshot of the pod's statuses: `status.containerStatusSnapshot`
/// (`v1beta1`), or the `sync-container-statuses` annotation (`v1alpha1`, kruise's
/// `ContainerRecreateRequestSyncContainerStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatusSnapshot {
    /// Container name.
    #[serde(default)]
    pub name: String,
    /// Whether the kubelet reports it ready.
    #[serde(default)]
    pub ready: bool,
    /// Its restart count.
    #[serde(default)]
    pub restart_count: i32,
    /// `<runtime>://<id>`.
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "String::is_empty"
    )]
    pub container_id: String,
}

/// A `metav1.Condition`, read leniently (missing fields take their zero value).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CrrCondition {
    /// Condition type, e.g. `PreRecreateGrace`.
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

string_enum! {
    /// Phase of a request, and of each container in it.
    pub enum ContainerRecreateRequestPhase {
        /// Not picked up yet (Go's zero value).
        Unset = "",
        /// Waiting (behind another request of the pod, or for a kill).
        Pending = "Pending",
        /// Being recreated.
        Recreating = "Recreating",
        /// A container was recreated (container-level only).
        Succeeded = "Succeeded",
        /// A container failed to recreate (container-level only).
        Failed = "Failed",
        /// The request is finished (request-level; the container states carry the outcome).
        Completed = "Completed",
    }
}

/// ContainerRecreateRequestContainerRecreateState contains the recreation state of a container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateRequestContainerRecreateState {
    /// Name of the container.
    #[serde(default)]
    pub name: String,
    /// Phase indicates the recreation phase of the container.
    #[serde(default)]
    pub phase: ContainerRecreateRequestPhase,
    /// A human readable message indicating details about this state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Whether the daemon has killed the container.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_killed: bool,
}

// === impl ContainerRecreateRequestPhase ===

impl ContainerRecreateRequestPhase {
    /// Sort key of the daemon's per-pod pick order (kruise `crrListByPhaseAndCreated`):
    /// Completed 1, Recreating 2, Pending 3, anything else 4; ties break on creation time.
    pub fn sort_weight(&self) -> u8 {
        match self {
            Self::Completed => 1,
            Self::Recreating => 2,
            Self::Pending => 3,
            _ => 4,
        }
    }
}

// === impl ContainerRecreateRequest ===

impl ContainerRecreateRequest {
    /// Whether the request is finished (`status.completionTime` set): the daemon ignores it.
    pub fn is_completed(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.completion_time.is_some())
    }

    /// The request's phase (`Unset` without a status).
    pub fn phase(&self) -> ContainerRecreateRequestPhase {
        self.status
            .as_ref()
            .map(|s| s.phase.clone())
            .unwrap_or_default()
    }
}

// === impl ContainerRecreateRequestSpec ===

impl ContainerRecreateRequestSpec {
    /// The termination grace period: the strategy's, or [`DEFAULT_TERMINATION_GRACE_PERIOD`]
    /// (a negative value is zero).
    pub fn termination_grace_period(&self) -> Duration {
        match self
            .strategy
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
        {
            Some(s) => super::api_seconds(s),
            None => DEFAULT_TERMINATION_GRACE_PERIOD,
        }
    }

    /// The time the pod must be not-ready before the kill, if the strategy asks for one.
    pub fn unready_grace_period(&self) -> Option<Duration> {
        self.strategy
            .as_ref()
            .and_then(|s| s.unready_grace_period_seconds)
            .map(super::api_seconds)
    }

    /// Whether a failed container ends the request (`failurePolicy` other than `Ignore`).
    pub fn fails_fast(&self) -> bool {
        self.strategy
            .as_ref()
            .and_then(|s| s.failure_policy.as_ref())
            != Some(&FailurePolicy::Ignore)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEBHOOK_CRR: &str = r#"{
      "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
      "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": "2025-01-01T00:00:00Z",
                   "labels": {"crr.apps.kruise.io/node-name": "node-1", "crr.apps.kruise.io/active": "true",
                              "crr.apps.kruise.io/pod-uid": "uid-1"}},
      "spec": {"podName": "p",
               "containers": [{"name": "app",
                               "preStop": {"exec": {"command": ["sh", "-c", "sleep 1"]}},
                               "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
                               "statusContext": {"containerID": "containerd://abc", "restartCount": 2}}],
               "strategy": {"failurePolicy": "Ignore", "orderedRecreate": true,
                            "terminationGracePeriodSeconds": 10, "unreadyGracePeriodSeconds": 3,
                            "minStartedSeconds": 5},
               "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 120},
      "status": {"phase": "Recreating",
                 "containerRecreateStates": [{"name": "app", "phase": "Pending", "isKilled": true}]}
    }"#;

    #[test]
    fn a_webhook_defaulted_crr_parses() {
        let crr: ContainerRecreateRequest = serde_json::from_str(WEBHOOK_CRR).unwrap();
        assert_eq!(crr.spec.pod_name, "p");
        let c = &crr.spec.containers[0];
        assert_eq!(
            c.status_context.as_ref().unwrap().container_id,
            "containerd://abc"
        );
        assert!(c.pre_stop.as_ref().unwrap().exec.is_some());
        assert_eq!(c.ports[0].container_port, 80);
        assert_eq!(crr.spec.termination_grace_period(), Duration::from_secs(10));
        assert_eq!(
            crr.spec.unready_grace_period(),
            Some(Duration::from_secs(3))
        );
        assert!(!crr.spec.fails_fast());
        assert_eq!(crr.phase(), ContainerRecreateRequestPhase::Recreating);
        assert!(!crr.is_completed());
        let states = &crr.status.unwrap().container_recreate_states;
        assert!(states[0].is_killed);
    }

    #[test]
    fn a_crr_with_unknown_fields_and_an_unknown_phase_parses() {
        let json = r#"{
          "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
          "metadata": {"name": "r", "namespace": "ns"},
          "spec": {"podName": "p", "containers": null, "newKnob": {"x": 1}},
          "status": {"phase": "Paused", "completionTime": "2025-01-01T00:00:00Z",
                     "containerStatusSnapshot": [{"name": "app", "ready": true, "restartCount": 1}],
                     "conditions": [{"type": "PreRecreateGrace", "status": "True"}],
                     "containerRecreateStates": [{"name": "app", "phase": "Sleeping", "hint": 1}]}
        }"#;
        let crr: ContainerRecreateRequest = serde_json::from_str(json).unwrap();
        assert!(crr.spec.containers.is_empty());
        assert!(crr.is_completed());
        assert_eq!(
            crr.phase(),
            ContainerRecreateRequestPhase::Other("Paused".into())
        );
        let status = crr.status.unwrap();
        assert_eq!(
            status.container_recreate_states[0].phase,
            ContainerRecreateRequestPhase::Other("Sleeping".into())
        );
    }

    #[test]
    fn status_phase_is_written_even_when_unset() {
        let status = ContainerRecreateRequestStatus::default();
        assert_eq!(serde_json::to_string(&status).unwrap(), r#"{"phase":""}"#);
        let parsed: ContainerRecreateRequestStatus = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed.phase, ContainerRecreateRequestPhase::Unset);
    }

    #[test]
    fn container_states_serialize_like_go_with_omitempty() {
        let state = ContainerRecreateRequestContainerRecreateState {
            name: "app".into(),
            phase: ContainerRecreateRequestPhase::Recreating,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"name":"app","phase":"Recreating"}"#
        );
        let state = ContainerRecreateRequestContainerRecreateState {
            message: "kill container error: x".into(),
            is_killed: true,
            ..state
        };
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"name":"app","phase":"Recreating","message":"kill container error: x","isKilled":true}"#
        );
    }

    #[test]
    fn a_crr_without_strategy_uses_kruise_defaults() {
        let spec = ContainerRecreateRequestSpec::default();
        assert_eq!(
            spec.termination_grace_period(),
            DEFAULT_TERMINATION_GRACE_PERIOD
        );
        assert_eq!(spec.unready_grace_period(), None);
        assert!(spec.fails_fast());
    }

    #[test]
    fn phase_weights_put_completed_first_and_unset_last() {
        use ContainerRecreateRequestPhase as P;
        let mut phases = [
            P::Unset,
            P::Pending,
            P::Other("x".into()),
            P::Recreating,
            P::Completed,
        ];
        phases.sort_by_key(P::sort_weight);
        assert_eq!(phases[..3], [P::Completed, P::Recreating, P::Pending]);
        assert_eq!(P::Succeeded.sort_weight(), 4);
    }
}
