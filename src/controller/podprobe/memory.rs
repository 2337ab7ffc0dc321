//! What the pod probes remember between runs, in one place. [`Memory`] is the one owner of
//! every change to it (as in container meta's memory): each method says what happened or what
//! is asked, and this is the only file of the controller that locks.
//!
//! Remembered:
//!
//! - the node's containers by pod UID, as the last listing of the runtime found them (one
//!   listing for every probe, refreshed once a second while probes exist);
//! - each probe's current result, by (pod UID, probe name), and that they changed since the
//!   status writer last looked.
//!
//! The probes' slots, the other thing that locks, are `slots.rs`'s.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, RwLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use super::decide::{self, ProbeKey, Result as ProbeResult};
use crate::controller::containers::newest_named;
use crate::cri::Container;
use crate::k8s::crd::{NodePodProbe, NodePodProbeStatus, ProbeState};
use crate::k8s::keys;
use crate::sync::lock;

/// The controller's memory; see the module.
#[derive(Debug, Default)]
pub struct Memory {
    /// The containers of the node by pod UID (in no order: [`newest_named`] picks a name's
    /// current one).
    containers: RwLock<HashMap<String, Vec<Container>>>,
    /// Results by (pod UID, probe name).
    results: Mutex<BTreeMap<ProbeKey, ProbeResult>>,
    /// The results changed since the status writer last looked.
    changed: Notify,
}

impl Memory {
    /// The runtime listed the node's containers: `listed`.
    pub fn containers_listed(&self, listed: Vec<Container>) {
        let mut by_pod: HashMap<String, Vec<Container>> = HashMap::new();
        for c in listed {
            if let Some(uid) = c.labels.get(keys::KUBELET_POD_UID).cloned() {
                by_pod.entry(uid).or_default().push(c);
            }
        }
        *self.containers.write().unwrap_or_else(|e| e.into_inner()) = by_pod;
    }

    /// The current container named `name` of pod `pod_uid`, as last listed.
    pub fn container(&self, pod_uid: &str, name: &str) -> Option<Container> {
        self.containers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(pod_uid)
            .and_then(|cs| newest_named(cs, name).cloned())
    }

    /// A probe says `state` and `message` at `now`: `None` when its result stays the same;
    /// else the new result is kept, and whether it is news (an event) returned. The status
    /// writer is told when [`Memory::changed`] is.
    pub fn record(
        &self,
        key: &ProbeKey,
        state: ProbeState,
        message: String,
        now: Time,
    ) -> Option<bool> {
        let mut results = lock(&self.results);
        let (result, event) = decide::next_result(results.get(key), state, message, now)?;
        results.insert(key.clone(), result);
        Some(event)
    }

    /// The probe `key` left the spec: its result is forgotten.
    pub fn forget(&self, key: &ProbeKey) {
        lock(&self.results).remove(key);
        self.changed.notify_one();
    }

    /// The results changed: the status writer is to look.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// Waits until the results changed.
    pub fn changes(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// The status to write on `npp` from the current results, if it differs from its own
    /// ([`decide::status_to_write`]).
    pub fn status_for(&self, npp: &NodePodProbe) -> Option<NodePodProbeStatus> {
        decide::status_to_write(npp, &lock(&self.results))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn a_result_is_kept_once_and_a_first_success_is_no_news_but_a_later_failure_is() {
        let m = Memory::default();
        let key = ("u1".to_string(), "m#a".to_string());
        assert_eq!(
            m.record(&key, ProbeState::Succeeded, "ok".into(), time(1)),
            Some(false)
        );
        assert_eq!(
            m.record(&key, ProbeState::Succeeded, "ok".into(), time(2)),
            None,
            "the same result again is nothing"
        );
        assert_eq!(
            m.record(&key, ProbeState::Failed, "down".into(), time(3)),
            Some(true)
        );
        m.forget(&key);
        assert_eq!(
            m.record(&key, ProbeState::Failed, "down".into(), time(4)),
            Some(true),
            "forgotten: a first failure is news"
        );
    }
}
