//! How late the node's kubelet reports container changes, which stretches the wait before a
//! stop (see [`super::settle`]): from a container's start (the runtime's event says when) or
//! the end of a stop this daemon made, to the first version of its pod whose status shows it.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;

use super::settle::KubeletLag;
use crate::cri::{ContainerEvent, clock};

/// What happened to a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerChange {
    /// It started: the kubelet reports its ID.
    Started,
    /// This daemon stopped it: the kubelet reports it terminated, or another in its place.
    Stopped,
}

impl std::fmt::Display for ContainerChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContainerChange::Started => "start",
            ContainerChange::Stopped => "stop",
        })
    }
}

/// The changes the kubelet has yet to report, and the lags it took for the others (kept in
/// the controller's memory, `memory.rs`).
#[derive(Debug, Default)]
pub struct LagMeter {
    /// By runtime container ID.
    unreported: HashMap<String, Unreported>,
    lag: KubeletLag,
}

/// A change the kubelet is to report.
#[derive(Debug)]
struct Unreported {
    uid: String,
    name: String,
    change: ContainerChange,
    at: Instant,
}

impl LagMeter {
    /// Waits for the kubelet to report `change` of container `id` (`name` of pod `uid`), made
    /// at `at`: the lag is measured when a pod version first shows it ([`LagMeter::measure`]).
    pub fn await_report(
        &mut self,
        id: &str,
        uid: &str,
        name: &str,
        change: ContainerChange,
        at: Instant,
    ) {
        self.unreported.retain(|_, u| {
            // what the kubelet never reported (a container that died before its relist saw it)
            at.saturating_duration_since(u.at) < KubeletLag::WINDOW
            // the kubelet starts a pod's containers one after another and reports them
            // together: only the last start measures its lag
                && !(change == ContainerChange::Started && u.change == ContainerChange::Started && u.uid == uid)
        });
        let u = Unreported {
            uid: uid.to_string(),
            name: name.to_string(),
            change,
            at,
        };
        self.unreported.insert(id.to_string(), u);
    }

    /// Expects the report of the start that the runtime's event `e` announces, in `pod`.
    pub fn started(&mut self, pod: &Pod, e: &ContainerEvent) {
        let Some(status) = e.container_statuses.iter().find(|c| c.id == e.container_id) else {
            return;
        };
        // the runtime's time of the event, on this node's clock
        self.await_report(
            &e.container_id,
            &pod.uid().unwrap_or_default(),
            &status.metadata.name,
            ContainerChange::Started,
            clock::instant_of(e.created_at),
        );
    }

    /// Records the lag of each change that this version of pod `uid`, seen at `now`, is the
    /// first to report; returns them (container name, change, lag).
    pub fn measure(
        &mut self,
        pod: &Pod,
        uid: &str,
        now: Instant,
    ) -> Vec<(String, ContainerChange, Duration)> {
        if self.unreported.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for id in reported(pod, uid, &self.unreported) {
            if let Some(u) = self.unreported.remove(&id) {
                let lag = now.duration_since(u.at);
                self.lag.record(now, lag);
                out.push((u.name, u.change, lag));
            }
        }
        out
    }

    /// What the recent worst lag exceeds a healthy kubelet's by ([`KubeletLag::excess`]).
    pub fn excess(&self, now: Instant) -> Duration {
        self.lag.excess(now)
    }

    /// Forgets the changes of a deleted pod.
    pub fn forget(&mut self, uid: &str) {
        self.unreported.retain(|_, u| u.uid != uid);
    }
}

/// Which of the changes `unreported` (by runtime ID) the pod `uid` reports: a stopped
/// container terminated or replaced by another of the name, a started one by its ID.
fn reported(pod: &Pod, uid: &str, unreported: &HashMap<String, Unreported>) -> Vec<String> {
    let statuses = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten());
    let mut out = Vec::new();
    for status in statuses {
        // `<runtime>://<id>`
        let current = status
            .container_id
            .as_deref()
            .map(|c| crate::cri::split_container_id(c).1);
        let terminated = status
            .state
            .as_ref()
            .is_some_and(|s| s.terminated.is_some());
        out.extend(
            unreported
                .iter()
                .filter(|(id, u)| {
                    let shown = current == Some(id.as_str());
                    u.uid == uid
                        && u.name == status.name
                        && match u.change {
                            ContainerChange::Started => shown,
                            ContainerChange::Stopped => !shown || terminated,
                        }
                })
                .map(|(id, _)| id.clone()),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(main: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u1"},
            "status": {"containerStatuses": [
                main,
                {"name": "side", "containerID": "containerd://s1", "image": "i", "imageID": "",
                 "ready": true, "restartCount": 0, "state": {"running": {}}},
            ]}
        }))
        .unwrap()
    }

    fn main(id: &str, state: serde_json::Value) -> Pod {
        pod(
            json!({"name": "main", "containerID": format!("containerd://{id}"),
            "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": state}),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_is_reported_once_the_kubelet_shows_the_container_ended_or_replaced() {
        let t0 = Instant::now();
        let mut meter = LagMeter::default();
        meter.await_report("c1", "u1", "main", ContainerChange::Stopped, t0);
        meter.await_report("s1", "u1", "side", ContainerChange::Stopped, t0);
        meter.await_report("o1", "u2", "main", ContainerChange::Stopped, t0);
        let running = main("c1", json!({"running": {}}));
        assert!(meter.measure(&running, "u1", t0).is_empty());
        let later = t0 + Duration::from_millis(1800);
        let ended = main("c1", json!({"terminated": {"exitCode": 0}}));
        assert_eq!(
            meter.measure(&ended, "u1", later),
            [(
                "main".to_string(),
                ContainerChange::Stopped,
                Duration::from_millis(1800)
            )]
        );
        assert_eq!(meter.excess(later), Duration::from_millis(550));
        assert!(
            meter.measure(&ended, "u1", later).is_empty(),
            "measured once"
        );

        meter.await_report("c2", "u1", "main", ContainerChange::Stopped, t0);
        let replaced = main("c3", json!({"waiting": {}}));
        assert_eq!(meter.measure(&replaced, "u1", t0).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_is_reported_by_its_id_and_only_a_pods_last_start_counts() {
        let t0 = Instant::now();
        let mut meter = LagMeter::default();
        meter.await_report("c1", "u1", "main", ContainerChange::Started, t0);
        meter.await_report(
            "s1",
            "u1",
            "side",
            ContainerChange::Started,
            t0 + Duration::from_secs(1),
        );
        let at = t0 + Duration::from_secs(2);
        let running = main("c1", json!({"running": {}}));
        assert_eq!(
            meter.measure(&running, "u1", at),
            [(
                "side".to_string(),
                ContainerChange::Started,
                Duration::from_secs(1)
            )],
            "main's start was reported with side's, later than its own lag"
        );
        meter.await_report("c2", "u1", "main", ContainerChange::Started, at);
        assert!(meter.measure(&running, "u1", at).is_empty());
        meter.forget("u1");
        assert!(
            meter
                .measure(&main("c2", json!({"running": {}})), "u1", at)
                .is_empty()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_starts_lag_runs_from_the_runtimes_time_on_the_clock_the_test_advances() {
        // the runtime stamps the start, the kubelet reports it 3 s later on tokio's clock
        let status = crate::cri::ContainerStatus {
            id: "c1".into(),
            metadata: crate::cri::ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            },
            state: crate::cri::ContainerState::Running,
            created_at: clock::now_ns(),
            started_at: clock::now_ns(),
            finished_at: 0,
            exit_code: 0,
            image: "i".into(),
            image_ref: String::new(),
            image_id: String::new(),
            reason: String::new(),
            message: String::new(),
            labels: Default::default(),
            annotations: Default::default(),
            log_path: String::new(),
            info: Default::default(),
            detail: Default::default(),
        };
        let event = ContainerEvent {
            container_id: "c1".into(),
            kind: crate::cri::ContainerEventKind::Started,
            created_at: status.created_at,
            pod_sandbox_id: None,
            sandbox_status: None,
            container_statuses: vec![status],
        };
        tokio::time::advance(Duration::from_secs(3)).await;
        let mut meter = LagMeter::default();
        let shown = main("c1", json!({"running": {}}));
        meter.started(&shown, &event);
        let measured = meter.measure(&shown, "u1", Instant::now());
        let [(name, ContainerChange::Started, lag)] = measured.as_slice() else {
            panic!("one start measured, not {measured:?}");
        };
        assert_eq!(name, "main");
        assert!(
            *lag >= Duration::from_secs(3) && *lag < Duration::from_millis(3500),
            "the 3 s the test advanced, not {lag:?}"
        );
    }
}
