//! The pure parts of the pod probes: the kubelet's thresholds over consecutive outcomes, and
//! the NodePodProbe status built from the spec, the old status and the current results.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::k8s::crd::{
    ContainerProbeState, NodePodProbe, NodePodProbeStatus, PodProbeStatus, ProbeState,
};

/// A probe's identity in the status: pod UID and probe name (`<marker>#<probe>`).
pub type ProbeKey = (String, String);

/// A probe's current result.
#[derive(Clone, Debug, PartialEq)]
pub struct Result {
    /// Succeeded, Failed or Unknown.
    pub state: ProbeState,
    /// What the probe said (at most 1024 bytes).
    pub message: String,
    /// When this state began.
    pub since: Time,
    /// When this state and message were first seen.
    pub observed: Time,
}

/// Consecutive outcomes of one probe, and the thresholds that turn them into results.
#[derive(Clone, Debug, Default)]
pub struct Thresholds {
    last: Option<bool>,
    run: u32,
}

impl Thresholds {
    /// Forgets the run (a new container).
    pub fn reset(&mut self) {
        self.last = None;
        self.run = 0;
    }

    /// Records an outcome (`true`: success); whether it is to be reported, given the
    /// success and failure thresholds (each at least 1).
    pub fn observe(
        &mut self,
        success: bool,
        success_threshold: i32,
        failure_threshold: i32,
    ) -> bool {
        if self.last == Some(success) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(success);
            self.run = 1;
        }
        let needed = if success {
            success_threshold
        } else {
            failure_threshold
        };
        self.run >= u32::try_from(needed.max(1)).unwrap_or(1)
    }
}

/// The status to write: the old entries of pods and probes still in the spec, each probe's
/// current result applied (new probes appended), pods and probes gone from the spec dropped.
pub fn build_status(
    npp: &NodePodProbe,
    results: &BTreeMap<ProbeKey, Result>,
) -> NodePodProbeStatus {
    let old = npp.status.clone().unwrap_or_default();
    let mut out = NodePodProbeStatus::default();
    for pod in &npp.spec.pod_probes {
        let previous = old.pod_probe_statuses.iter().find(|p| p.uid == pod.uid);
        let mut entry = PodProbeStatus {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
            probe_states: Vec::new(),
        };
        for probe in &pod.probes {
            let key = (pod.uid.clone(), probe.name.clone());
            let before =
                previous.and_then(|p| p.probe_states.iter().find(|s| s.name == probe.name));
            match results.get(&key) {
                Some(r) => entry.probe_states.push(ContainerProbeState {
                    name: probe.name.clone(),
                    state: r.state.clone(),
                    last_probe_time: Some(r.observed.clone()),
                    last_transition_time: Some(r.since.clone()),
                    message: r.message.clone(),
                }),
                None => entry.probe_states.extend(before.cloned()),
            }
        }
        if !entry.probe_states.is_empty() {
            out.pod_probe_statuses.push(entry);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thresholds_need_that_many_outcomes_in_a_row() {
        let mut t = Thresholds::default();
        assert!(!t.observe(false, 1, 3));
        assert!(!t.observe(false, 1, 3));
        assert!(t.observe(false, 1, 3));
        assert!(
            t.observe(true, 1, 3),
            "one success is enough with threshold 1"
        );
        let mut t = Thresholds::default();
        assert!(
            t.observe(true, 0, 0),
            "0 counts as 1, as kruise's manager leaves it"
        );
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn the_status_keeps_what_is_in_the_spec_applies_results_and_drops_the_rest() {
        let npp: NodePodProbe = serde_json::from_value(json!({
            "metadata": {"name": "node-a"},
            "spec": {"podProbes": [{"name": "p", "namespace": "ns", "uid": "u1", "IP": "1.2.3.4",
                "probes": [{"name": "m#a", "containerName": "c", "probe": {}},
                           {"name": "m#b", "containerName": "c", "probe": {}}]}]},
            "status": {"podProbeStatuses": [
                {"name": "p", "namespace": "ns", "uid": "u1", "probeStates": [
                    {"name": "m#a", "state": "Failed", "message": "old"},
                    {"name": "m#gone", "state": "Succeeded"}]},
                {"name": "q", "namespace": "ns", "uid": "u-gone", "probeStates": [{"name": "m#a", "state": "Succeeded"}]}]}
        }))
        .unwrap();
        let mut results = BTreeMap::new();
        results.insert(
            ("u1".to_string(), "m#b".to_string()),
            Result {
                state: ProbeState::Succeeded,
                message: "fine".into(),
                since: time(100),
                observed: time(100),
            },
        );
        let s = build_status(&npp, &results);
        assert_eq!(
            s.pod_probe_statuses.len(),
            1,
            "the pod gone from the spec is dropped"
        );
        let states = &s.pod_probe_statuses[0].probe_states;
        let names: Vec<_> = states.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["m#a", "m#b"],
            "the probe gone from the spec is dropped"
        );
        assert_eq!(
            states[0].message, "old",
            "no result yet: the old state is kept"
        );
        assert_eq!(states[1].state, ProbeState::Succeeded);
        assert_eq!(states[1].last_transition_time, Some(time(100)));
    }
}
