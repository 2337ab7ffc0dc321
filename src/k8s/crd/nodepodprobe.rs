//! `NodePodProbe` (cluster-scoped, one per node, named after the node): custom container probes
//! (from PodProbeMarkers) the daemon runs on the node, and their results.
//!
//! Go source: `apis/apps/v1alpha1/node_pod_probe_types.go`; semantics in docs/kruise-wire.md.

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use serde::{Deserialize, Serialize};

use super::{null_as_default, string_enum};

/// NodePodProbeSpec defines the desired state of NodePodProbe.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[cfg_attr(not(feature = "test-util"), kube(schema = "disabled"))]
#[kube(
    group = "apps.kruise.io",
    version = "v1alpha1",
    kind = "NodePodProbe",
    status = "NodePodProbeStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "NodePodProbe is the Schema for the NodePodProbe API"
)]
#[serde(rename_all = "camelCase")]
pub struct NodePodProbeSpec {
    /// The pods on this node with custom probes.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_probes: Vec<PodProbe>,
}

/// The custom probes of one pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
pub struct PodProbe {
    /// Pod name.
    #[serde(default)]
    pub name: String,
    /// Pod namespace.
    #[serde(default)]
    pub namespace: String,
    /// Pod uid.
    #[serde(default)]
    pub uid: String,
    /// Pod IP (the JSON key is capitalised: `IP`).
    #[serde(default, rename = "IP")]
    pub ip: String,
    /// Custom container probes, supporting exec, httpGet and tcpSocket.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub probes: Vec<ContainerProbe>,
}

/// One custom probe of a container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerProbe {
    /// `<podProbeMarkerName>#<probeName>`.
    #[serde(default)]
    pub name: String,
    /// Container name.
    #[serde(default)]
    pub container_name: String,
    /// Container probe spec.
    #[serde(default)]
    pub probe: ContainerProbeSpec,
}

/// The probe of a [`ContainerProbe`]: kruise's `ContainerProbeSpec` inlines `corev1.Probe`, so the
/// JSON is exactly a core Probe (handlers, delays, thresholds).
pub type ContainerProbeSpec = Probe;

/// NodePodProbeStatus holds the probe results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodePodProbeStatus {
    /// Pod probe results.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_probe_statuses: Vec<PodProbeStatus>,
}

/// The probe results of one pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PodProbeStatus {
    /// Pod name.
    #[serde(default)]
    pub name: String,
    /// Pod namespace.
    #[serde(default)]
    pub namespace: String,
    /// Pod uid.
    #[serde(default)]
    pub uid: String,
    /// Pod probe results.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub probe_states: Vec<ContainerProbeState>,
}

/// The result of one probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ContainerProbeState {
    /// `<podProbeMarkerName>#<probeName>`.
    #[serde(default)]
    pub name: String,
    /// Probe state.
    #[serde(default)]
    pub state: ProbeState,
    /// Last time we probed the condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Last time the state transitioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Output of a successful probe or the error of a failed one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

string_enum! {
    /// Result of a probe.
    pub enum ProbeState {
        /// The probe passed.
        Succeeded = "Succeeded",
        /// The probe failed.
        Failed = "Failed",
        /// Not known yet (or the container changed).
        Unknown = "Unknown",
    }
}

// === impl NodePodProbeStatus ===

impl NodePodProbeStatus {
    /// The recorded state of probe `probe_name` of the pod with `uid`.
    pub fn probe_state(&self, uid: &str, probe_name: &str) -> Option<&ContainerProbeState> {
        self.pod_probe_statuses
            .iter()
            .filter(|p| p.uid == uid)
            .flat_map(|p| &p.probe_states)
            .find(|s| s.name == probe_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manager_written_node_pod_probe_parses_with_the_capitalised_ip() {
        let json = r#"{
          "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
          "metadata": {"name": "node-1"},
          "spec": {"podProbes": [{"name": "p", "namespace": "ns", "uid": "u", "IP": "10.0.0.5",
                                  "probes": [{"name": "ppm#healthy", "containerName": "main",
                                              "probe": {"exec": {"command": ["true"]}, "periodSeconds": 5,
                                                        "httpGet": {"port": 8080, "path": "/"}}}]}]},
          "status": {"podProbeStatuses": [{"name": "p", "namespace": "ns", "uid": "u",
                       "probeStates": [{"name": "ppm#healthy", "state": "Succeeded",
                                        "lastProbeTime": "2025-01-01T00:00:00Z", "lastTransitionTime": null}]}]}
        }"#;
        let npp: NodePodProbe = serde_json::from_str(json).unwrap();
        let pod = &npp.spec.pod_probes[0];
        assert_eq!(pod.ip, "10.0.0.5");
        let probe = &pod.probes[0].probe;
        assert_eq!(probe.period_seconds, Some(5));
        assert!(probe.exec.is_some());
        let status = npp.status.unwrap();
        let state = status.probe_state("u", "ppm#healthy").unwrap();
        assert_eq!(state.state, ProbeState::Succeeded);
        assert!(state.last_probe_time.is_some());
        assert!(state.last_transition_time.is_none());
        assert!(status.probe_state("other", "ppm#healthy").is_none());
    }

    #[test]
    fn a_node_pod_probe_with_unknown_fields_and_an_unknown_state_parses() {
        let json = r#"{
          "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
          "metadata": {"name": "node-1"},
          "spec": {"podProbes": null, "shards": 3},
          "status": {"podProbeStatuses": [{"uid": "u", "probeStates": [{"name": "x", "state": "Flapping"}]}],
                     "observedGeneration": 2}
        }"#;
        let npp: NodePodProbe = serde_json::from_str(json).unwrap();
        assert!(npp.spec.pod_probes.is_empty());
        let status = npp.status.unwrap();
        assert_eq!(
            status.probe_state("u", "x").unwrap().state,
            ProbeState::Other("Flapping".into())
        );
    }

    #[test]
    fn pod_probe_serializes_ip_capitalised() {
        let pod = PodProbe {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            ip: "10.0.0.5".into(),
            probes: vec![],
        };
        assert_eq!(
            serde_json::to_string(&pod).unwrap(),
            r#"{"name":"p","namespace":"ns","uid":"u","IP":"10.0.0.5"}"#
        );
    }
}
