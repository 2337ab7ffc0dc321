//! The task that feeds the timelines: every version of a kruise-managed pod of the node from
//! the pod watch; the runtime, asked only while an update is in flight and the kubelet shows
//! a changed container replaced or ended (its list of the pod's containers, and the status of
//! at most the two newest of each name: when the old one finished, when the new one started;
//! each container's status asked once it started and once it exited, not at every look),
//! and once per new image whether it is already on the node; a sweep that ends what waited
//! too long and forgets the pods that left. What ends is measured (`metrics.rs`), logged, and,
//! when its unready window passed the threshold, told in one event on the pod: the only API
//! write of the timelines.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use super::book::{PodKey, Timelines};
use super::facts::PodFacts;
use super::metrics::Metrics;
use super::track::{End, RuntimeContainer, Step, Update};
use crate::controller::containermeta::decide;
use crate::controller::containers::containers_of_pod;
use crate::cri::{
    ContainerState, ImageService, RemoteRuntime, RuntimeHandle, RuntimeService, clock,
};
use crate::k8s::watch::{Change, Watched};
use crate::k8s::write::{EventSink, EventSpec, object_ref};

/// How often the sweep runs.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The longest one look at the runtime for a pod may take (each call has its own limit too).
const RUNTIME_LOOK_LIMIT: Duration = Duration::from_secs(10);

/// The reason of the event about a slow update.
pub const SLOW_REASON: &str = "InPlaceUpdateSlow";

/// What the task holds.
pub struct Watcher {
    /// The node's pods.
    pub pods: Watched<Pod>,
    /// The node's runtimes.
    pub runtimes: RuntimeHandle,
    /// The timelines.
    pub book: Timelines,
    /// Their metrics.
    pub metrics: Metrics,
    /// Events about the pods.
    pub events: EventSink,
    /// An unready window longer than this gets an event; `None`: never.
    pub slow: Option<Duration>,
    /// Ends the task.
    pub cancel: CancellationToken,
    /// The runtime's times of containers already asked, by pod UID and container ID
    /// ([`Times`]): each container's status is asked once it started and once it exited,
    /// not at every look.
    pub times: Mutex<HashMap<String, Times>>,
}

/// A pod's containers' start and end times as the runtime gave them (ns; 0: not yet), by
/// container ID. A container's start does not change once it started, nor its end once it
/// exited.
pub type Times = HashMap<String, (i64, i64)>;

/// Follows the pods until the daemon stops.
pub async fn run(w: Arc<Watcher>, mut changes: broadcast::Receiver<Change<Pod>>) {
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // what the store holds already (its first list may be done before this task subscribed)
    for pod in w.pods.state() {
        w.consider(&pod).await;
    }
    loop {
        tokio::select! {
            () = w.cancel.cancelled() => return,
            _ = sweep.tick() => w.sweep(),
            change = changes.recv() => match change {
                Ok(Change::Applied(key) | Change::Listed(key, _)) => {
                    if let Some(pod) = w.pods.store().get(&key) {
                        w.consider(&pod).await;
                    }
                }
                Ok(Change::Deleted(key)) => {
                    if let Some(uid) = key.extra.uid.as_ref() {
                        w.book.forget(uid);
                    }
                }
                // changes were lost, or a relist: the store stands in for them
                Ok(Change::Resynced) | Err(RecvError::Lagged(_)) => {
                    for pod in w.pods.state() {
                        w.consider(&pod).await;
                    }
                }
                Err(RecvError::Closed) => return,
            },
        }
    }
}

fn key_of(pod: &Pod) -> PodKey {
    PodKey {
        uid: pod.uid().unwrap_or_default(),
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }
}

impl Watcher {
    /// Takes in a version of `pod`, asks the runtime what it is to tell, and ends the update
    /// if it is done.
    async fn consider(&self, pod: &Pod) {
        if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(pod) {
            return;
        }
        let key = key_of(pod);
        if key.uid.is_empty() {
            return;
        }
        let facts = PodFacts::of(pod);
        let seen = self.book.observe_pod(&key, &facts, clock::now_ns());
        for u in &seen.ended {
            self.ended(&key, u, Some(pod));
        }
        if seen.wants_runtime || !seen.image_checks.is_empty() {
            let look = self.look(pod, &key, seen.wants_runtime, &seen.image_checks);
            if tokio::time::timeout(RUNTIME_LOOK_LIMIT, look)
                .await
                .is_err()
            {
                tracing::debug!(pod = %key, "the runtime did not answer in time; the timeline waits for the next change");
            }
        }
        if let Some(u) = self.book.finish_if_done(&key.uid, clock::now_ns()) {
            self.ended(&key, &u, Some(pod));
        }
    }

    /// Asks the runtime of `pod` for its containers (`containers`) and `images`.
    async fn look(&self, pod: &Pod, key: &PodKey, containers: bool, images: &[String]) {
        let Ok((runtime, _)) = self.runtimes.for_containers(decide::container_ids(pod)) else {
            return;
        };
        for image in images {
            let at = clock::now_ns();
            match runtime.image_status(image).await {
                Ok(Some(_)) => self.book.image_already_present(&key.uid, image, at),
                Ok(None) => {}
                Err(e) => tracing::debug!(pod = %key, %image, error = %e, "image status failed"),
            }
        }
        if containers {
            let mut known = self.times().remove(&key.uid).unwrap_or_default();
            let found = runtime_containers(&runtime, &key.uid, &mut known).await;
            self.times().insert(key.uid.clone(), known);
            match found {
                Ok(found) => self.book.observe_runtime(&key.uid, &found),
                Err(e) => {
                    tracing::debug!(pod = %key, error = %e, "listing the pod's containers failed")
                }
            }
        }
    }

    fn times(&self) -> std::sync::MutexGuard<'_, HashMap<String, Times>> {
        self.times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends what waited too long, and forgets the pods the store no longer holds.
    fn sweep(&self) {
        let present: HashSet<String> = self.pods.state().iter().filter_map(|p| p.uid()).collect();
        self.book.retain(&present);
        self.times().retain(|uid, _| present.contains(uid));
        for (key, u) in self.book.sweep(clock::now_ns()) {
            self.ended(&key, &u, None);
        }
    }

    /// Measures, logs and (when slow) tells an update that ended.
    fn ended(&self, key: &PodKey, u: &Update, pod: Option<&Pod>) {
        self.metrics.ended(u);
        let Some((how, _)) = u.end else {
            return;
        };
        let summary = summary(u);
        // a superseded or abandoned update is what a pod's author can make at will: not
        // worth a line of the log each
        if matches!(how, End::Finished | End::Unfinished) {
            tracing::info!(pod = %key, result = how.as_str(), seen_by = u.seen_by.as_str(), joined_late = u.joined_late, "in-place update {}: {summary}", how.as_str());
        } else {
            tracing::debug!(pod = %key, result = how.as_str(), seen_by = u.seen_by.as_str(), "in-place update {}: {summary}", how.as_str());
        }
        let (Some(slow), Some(window)) = (self.slow, u.unready()) else {
            return;
        };
        if how != End::Finished || u.joined_late || window <= slow {
            return;
        }
        let regarding = match pod {
            Some(p) => object_ref(p),
            None => crate::k8s::write::pod_ref(&key.namespace, &key.name, &key.uid),
        };
        self.metrics.slow_event();
        self.events.record(EventSpec {
            regarding,
            warning: true,
            reason: SLOW_REASON.to_string(),
            note: format!(
                "in-place update unready for {:.1}s (threshold {slow:?}): {summary}",
                window.as_secs_f64()
            ),
            action: "InPlaceUpdate".to_string(),
        });
    }
}

/// The steps of `u` on one line: `seen by gate; image present +0.0s (already on the node),
/// container stopped +5.1s, ...`.
pub fn summary(u: &Update) -> String {
    let steps: Vec<String> = Step::ALL
        .iter()
        .map(|step| {
            let name = step.as_str().replace('_', " ");
            let after = u
                .after_seen(*step)
                .map_or_else(|| "-".to_string(), |d| format!("+{:.1}s", d.as_secs_f64()));
            let by = match (step, u.present_by()) {
                (Step::ImagePresent, Some(by)) if u.at(*step).is_some() => {
                    format!(" ({})", by.as_str())
                }
                _ => String::new(),
            };
            format!("{name} {after}{by}")
        })
        .collect();
    format!("seen by {}; {}", u.seen_by.as_str(), steps.join(", "))
}

/// The pod's containers as the runtime holds them, with the times of the two newest of each
/// name (the others cannot be an update's old or new container). `known` holds the times
/// asked before; a container's status is asked only for a time not known yet, and `known`
/// keeps only the containers listed now.
async fn runtime_containers(
    runtime: &RemoteRuntime,
    uid: &str,
    known: &mut Times,
) -> Result<Vec<RuntimeContainer>, crate::cri::CriError> {
    let mut listed = containers_of_pod(runtime, uid).await?;
    known.retain(|id, _| listed.iter().any(|c| c.id == *id));
    listed.sort_by_key(|c| {
        (
            c.metadata.name.clone(),
            std::cmp::Reverse((c.metadata.attempt, c.created_at)),
        )
    });
    let mut out = Vec::new();
    let mut per_name: Option<(String, usize)> = None;
    for c in listed {
        let n = match &per_name {
            Some((name, n)) if *name == c.metadata.name => n + 1,
            _ => 1,
        };
        per_name = Some((c.metadata.name.clone(), n));
        if n > 2 {
            continue;
        }
        let had = known.get(&c.id).copied();
        let (started_at, finished_at) = match (c.state, had) {
            (ContainerState::Running, Some(t)) if t.0 > 0 => t,
            (ContainerState::Exited, Some(t)) if t.1 > 0 => t,
            (ContainerState::Running | ContainerState::Exited, _) => {
                match runtime.container_status(&c.id, false).await {
                    Ok(s) => (s.started_at, s.finished_at),
                    Err(_) => (0, 0),
                }
            }
            (ContainerState::Created | ContainerState::Unknown, _) => (0, 0),
        };
        if started_at > 0 {
            known.insert(c.id.clone(), (started_at, finished_at));
        }
        out.push(RuntimeContainer {
            id: c.id,
            name: c.metadata.name,
            attempt: c.metadata.attempt,
            created_at: c.created_at,
            started_at,
            finished_at,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::timeline::track::example;

    #[test]
    fn the_event_and_log_line_give_each_step_after_the_update_seen() {
        assert_eq!(
            summary(&example(false)),
            "seen by gate; image present +1.0s (pulled by kruised), container stopped +2.0s, \
             container started +3.0s, ready +4.0s, meta written +5.0s"
        );
    }
}
