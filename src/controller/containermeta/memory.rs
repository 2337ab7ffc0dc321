//! What container meta remembers between passes, in one place. [`Memory`] is the one owner of
//! every change to it (kube-rs's `reflector::store` in this: one writer owns the state, readers
//! get a view): each method says what happened or what is asked, and this is the only file of
//! the controller that locks. A pass reads a [`View`] of what it needs, decides on it without a
//! lock, and tells the memory what it did.
//!
//! Remembered, per pod UID, container name or runtime container ID:
//!
//! - the pods the first list found without the annotation ([`StartVersions`]: not written until
//!   they change, kruise's rule against a patch storm on start);
//! - what was seen of each pod ([`Timeline`]: when a stop is safe, see `settle.rs`) and how late
//!   the kubelet reports container changes ([`LagMeter`]);
//! - the containers this daemon stopped (never stopped twice), its last stop of each container
//!   name (to recognise a stale recreation), and since when the kubelet is expected to
//!   recreate a container by itself;
//! - the pod of each sandbox a container event named (sandbox IDs never change owner).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::decide::PreviousStop;
use super::lag::{ContainerChange, LagMeter};
use super::settle::{RestartDelay, Sighting, Timeline};
use crate::cri::ContainerEvent;

/// How long a container the daemon stopped is remembered (so it is never stopped twice), and
/// a kubelet recreation expected.
pub const STOPPED_MEMORY: Duration = Duration::from_secs(600);

/// Sandboxes remembered before the map starts afresh (a node runs a few hundred at most).
pub const SANDBOX_MEMORY: usize = 4096;

/// The controller's memory; see the module.
#[derive(Debug, Default)]
pub struct Memory {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Pods without our annotation as they were at the first list.
    seen_at_start: StartVersions,
    /// What was seen of each pod, by UID.
    timelines: HashMap<String, Timeline>,
    /// How late the kubelet reports container changes.
    lag: LagMeter,
    /// Containers this daemon stopped, by runtime ID, and when.
    stopped: HashMap<String, Instant>,
    /// The last stop of each (pod UID, container name).
    last_stops: HashMap<(String, String), PreviousStop>,
    /// Since when the kubelet is expected to recreate a container (by runtime ID), and until
    /// when that is remembered: at least [`STOPPED_MEMORY`], and past the time it is overdue
    /// however long the pod's grace period (else a long grace would forget it first and the
    /// container would never be found overdue).
    kubelet_expected: HashMap<String, (Instant, Instant)>,
    /// The pod UID of each sandbox a container event named.
    sandbox_pods: HashMap<String, String>,
}

/// What a pass remembers of one pod's containers, read at once: the input of its restart plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// Per container asked for, in the order asked.
    pub containers: Vec<Remembered>,
    /// The earliest moment a container of the pod may be stopped for its env (the pod's
    /// timeline; `now` without one).
    pub stop_allowed_at: Instant,
    /// What the kubelet's recent worst report lag exceeds a healthy one by.
    pub kubelet_lag_excess: Duration,
}

/// What is remembered of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Remembered {
    /// This daemon's last stop of a container of this name in this pod.
    pub previous_stop: Option<PreviousStop>,
    /// Whether this daemon stopped this very container.
    pub already_stopped: bool,
    /// Since when the kubelet is expected to recreate it by itself.
    pub kubelet_expected_since: Option<Instant>,
}

impl Memory {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// A version of pod `uid` was seen at `now`: its timeline takes it, and each container
    /// change it is the first to report gives the kubelet's lag; returns those (container name,
    /// change, lag).
    pub fn saw_pod(
        &self,
        pod: &Pod,
        uid: &str,
        seen: Sighting,
        now: Instant,
    ) -> Vec<(String, ContainerChange, Duration)> {
        let mut state = self.state();
        let lags = state.lag.measure(pod, uid, now);
        state
            .timelines
            .entry(uid.to_string())
            .and_modify(|t| t.observe(now, seen))
            .or_insert_with(|| Timeline::new(now, seen));
        lags
    }

    /// Pod `uid` was deleted: everything kept of it goes.
    pub fn forget_pod(&self, uid: &str) {
        let mut state = self.state();
        state.seen_at_start.forget(uid);
        state.timelines.remove(uid);
        state.lag.forget(uid);
        state.last_stops.retain(|(u, _), _| u != uid);
    }

    /// Whether pod `uid`, now at `rv`, is as the first list found it ([`StartVersions`]).
    pub fn unchanged_since_start(&self, uid: &str, rv: &str, start: Start<'_>) -> bool {
        self.state()
            .seen_at_start
            .unchanged_since_start(uid, rv, start)
    }

    /// Forgets every pod not in `live` (the UIDs the pod store holds after a relist, or when
    /// the controller lagged): their deletions were never told.
    pub fn forget_all_pods_but(&self, live: &HashSet<String>) {
        let stale: HashSet<String> = {
            let s = self.state();
            s.timelines
                .keys()
                .chain(s.last_stops.keys().map(|(uid, _)| uid))
                .chain(s.sandbox_pods.values())
                .chain(s.seen_at_start.0.keys())
                .filter(|uid| !live.contains(*uid))
                .cloned()
                .collect()
        };
        for uid in &stale {
            self.forget_pod(uid);
        }
        self.state()
            .sandbox_pods
            .retain(|_, uid| live.contains(uid));
    }

    /// Forgets the stops older than [`STOPPED_MEMORY`] at `now`, and the expected recreations
    /// past their time.
    pub fn forget_old_stops(&self, now: Instant) {
        let mut state = self.state();
        state
            .stopped
            .retain(|_, at| now.duration_since(*at) < STOPPED_MEMORY);
        state.kubelet_expected.retain(|_, (_, until)| now < *until);
    }

    /// The pod UID an earlier event gave `sandbox`.
    pub fn pod_of_sandbox(&self, sandbox: &str) -> Option<String> {
        self.state().sandbox_pods.get(sandbox).cloned()
    }

    /// `sandbox` belongs to pod `uid` (kept until [`SANDBOX_MEMORY`] sandboxes are known, then
    /// all are forgotten at once).
    pub fn remember_sandbox(&self, sandbox: &str, uid: &str) {
        let mut state = self.state();
        let map = &mut state.sandbox_pods;
        if map.len() >= SANDBOX_MEMORY && !map.contains_key(sandbox) {
            map.clear();
        }
        map.insert(sandbox.to_string(), uid.to_string());
    }

    /// The runtime's event `e` says a container of `pod` started: the kubelet is to report it.
    pub fn container_started(&self, pod: &Pod, e: &ContainerEvent) {
        self.state().lag.started(pod, e);
    }

    /// What is remembered of pod `uid`'s containers `containers` (name, runtime ID) at `now`,
    /// with the stop's timing under `delay`.
    pub fn view(
        &self,
        uid: &str,
        containers: &[(&str, &str)],
        now: Instant,
        delay: RestartDelay,
    ) -> View {
        let state = self.state();
        let excess = state.lag.excess(now);
        View {
            containers: containers
                .iter()
                .map(|(name, id)| Remembered {
                    previous_stop: state
                        .last_stops
                        .get(&(uid.to_string(), (*name).to_string()))
                        .cloned(),
                    already_stopped: state.stopped.contains_key(*id),
                    kubelet_expected_since: state.kubelet_expected.get(*id).map(|(s, _)| *s),
                })
                .collect(),
            stop_allowed_at: state
                .timelines
                .get(uid)
                .map_or(now, |t| t.stop_allowed_at(delay, excess)),
            kubelet_lag_excess: excess,
        }
    }

    /// The kubelet is to recreate container `id` by itself, as of `since` (kept if known); it
    /// is overdue at `overdue_at`, and remembered [`STOPPED_MEMORY`] past the later of the two.
    pub fn expect_kubelet_recreation(&self, id: &str, since: Instant, overdue_at: Instant) {
        let until = crate::k8s::time::later(since.max(overdue_at), STOPPED_MEMORY);
        self.state()
            .kubelet_expected
            .entry(id.to_string())
            .or_insert((since, until));
    }

    /// This daemon is stopping container `name` of pod `uid` (`stop.id`) at `now`: never
    /// again, and its replacement is checked against the stop.
    pub fn stopping(&self, uid: &str, name: &str, stop: PreviousStop, now: Instant) {
        let mut state = self.state();
        state.stopped.insert(stop.id.clone(), now);
        state
            .last_stops
            .insert((uid.to_string(), name.to_string()), stop);
    }

    /// The stop of container `id` (`name` of pod `uid`) ended at `at`: the kubelet is to
    /// report it.
    pub fn stopped(&self, id: &str, uid: &str, name: &str, at: Instant) {
        self.state()
            .lag
            .await_report(id, uid, name, ContainerChange::Stopped, at);
    }

    /// The stop of container `id` failed: the next pass may try again.
    pub fn stop_failed(&self, id: &str) {
        self.state().stopped.remove(id);
    }
}

/// The resourceVersions the first list found the pods without the annotation at: such a pod
/// is left alone until it changes (kruise's rule against a patch storm on daemon start).
#[derive(Debug, Default)]
pub struct StartVersions(HashMap<String, String>);

impl StartVersions {
    /// Whether pod `uid`, now at `rv`, is as the first list found it; `start` says what this
    /// version tells of that. A pod seen changed is forgotten: from then on it is followed.
    /// A pod seen changed keeps an empty version (no real one is empty), so that a snapshot
    /// taken later (the first resync) cannot make it unchanged again.
    pub fn unchanged_since_start(&mut self, uid: &str, rv: &str, start: Start<'_>) -> bool {
        match start {
            Start::Listed(listed) => {
                self.0.insert(uid.to_string(), listed.to_string());
            }
            Start::Snapshot => {
                // only for the pods the list's own entries did not give (a controller that
                // subscribed in the middle of the first list misses its first entries)
                self.0
                    .entry(uid.to_string())
                    .or_insert_with(|| rv.to_string());
            }
            Start::No => {}
        }
        match self.0.get_mut(uid) {
            Some(v) if v == rv => true,
            Some(v) => {
                v.clear();
                false
            }
            None => false,
        }
    }

    /// Forgets pod `uid`.
    pub fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// What a pod version the event filter looks at says of the pods as they were at start.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// Nothing: a change after the first list.
    No,
    /// The first list found the pod at this resourceVersion (the store may be newer already).
    Listed(&'a str),
    /// The first list is known only through the store: take its versions as the start.
    Snapshot,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::containermeta::settle::Gate;

    fn seen(env: u64) -> Sighting {
        Sighting {
            env,
            kubelet: 1,
            gate: Gate::Silent,
        }
    }

    fn stop(id: &str) -> PreviousStop {
        PreviousStop {
            id: id.into(),
            expected: 7,
            corrective: false,
        }
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "uid": "u1"}}))
            .expect("pod")
    }

    /// Issue 43, row 10: a pod deleted while the watch was down (its deletion hidden by the
    /// relist) was remembered for ever.
    #[test]
    fn pods_a_relist_no_longer_holds_are_forgotten_and_the_others_kept() {
        let m = Memory::default();
        let now = Instant::now();
        for uid in ["gone", "kept"] {
            m.saw_pod(&pod(), uid, seen(1), now);
            m.remember_sandbox(&format!("sandbox-{uid}"), uid);
            m.stopping(uid, "main", stop(&format!("c-{uid}")), now);
        }
        m.forget_all_pods_but(&HashSet::from(["kept".to_string()]));
        let s = m.state();
        let mut timelines: Vec<&String> = s.timelines.keys().collect();
        timelines.sort();
        assert_eq!(timelines, ["kept"]);
        assert_eq!(s.sandbox_pods.values().collect::<Vec<_>>(), ["kept"]);
        assert!(s.last_stops.keys().all(|(uid, _)| uid == "kept"));
        assert_eq!(s.last_stops.len(), 1);
    }

    #[test]
    fn a_pod_as_the_first_list_found_it_is_left_alone_until_it_changes() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "5", Start::Listed("5")));
        // a later event of the same version (a relist, a resync) is still the state at start
        assert!(v.unchanged_since_start("a", "5", Start::No));
        assert!(!v.unchanged_since_start("a", "6", Start::No));
        // once changed, it is followed even if a version repeats
        assert!(!v.unchanged_since_start("a", "5", Start::No));
    }

    #[test]
    fn a_change_the_store_took_before_the_list_entry_was_read_is_a_change() {
        // the first list found the pod at 5; its change to 6 reached the store before this
        // daemon read the list's entry (the race that missed an env change right after start)
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("a", "6", Start::Listed("5")));
        // and the resync that ends the first list does not take 6 for the state at start
        assert!(!v.unchanged_since_start("a", "6", Start::No));
        assert!(!v.unchanged_since_start("a", "6", Start::Snapshot));
    }

    #[test]
    fn pods_whose_list_entries_came_before_the_subscription_are_taken_from_the_store() {
        // subscribed in the middle of the first list: "a" came through its entry, "b" did
        // not; the resync that ends the list takes the store for "b" and leaves "a" as listed
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "5", Start::Listed("5")));
        assert!(v.unchanged_since_start("b", "3", Start::Snapshot));
        assert!(v.unchanged_since_start("a", "5", Start::Snapshot));
        assert!(
            !v.unchanged_since_start("a", "7", Start::Snapshot),
            "a changed since"
        );
        assert!(
            !v.unchanged_since_start("b", "4", Start::No),
            "b changed since"
        );
    }

    #[test]
    fn without_the_lists_own_entries_the_store_stands_in_for_the_start() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "6", Start::Snapshot));
        assert!(!v.unchanged_since_start("a", "7", Start::No));
    }

    #[test]
    fn a_pod_never_listed_is_followed_from_its_first_event() {
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("new", "9", Start::No));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_is_remembered_for_its_container_and_its_name_until_the_pod_goes() {
        let memory = Memory::default();
        let now = Instant::now();
        memory.saw_pod(&pod(), "u1", seen(1), now);
        memory.stopping("u1", "main", stop("c1"), now);
        memory.expect_kubelet_recreation("c2", now, now);
        let view = memory.view(
            "u1",
            &[("main", "c1"), ("side", "c2")],
            now,
            RestartDelay::Auto,
        );
        assert_eq!(
            view.containers,
            [
                Remembered {
                    previous_stop: Some(stop("c1")),
                    already_stopped: true,
                    kubelet_expected_since: None,
                },
                Remembered {
                    previous_stop: None,
                    already_stopped: false,
                    kubelet_expected_since: Some(now),
                },
            ]
        );
        // a stop that failed may be made again; the stop of the name is still the last one
        memory.stop_failed("c1");
        let view = memory.view("u1", &[("main", "c1")], now, RestartDelay::Auto);
        assert!(!view.containers[0].already_stopped);
        assert_eq!(view.containers[0].previous_stop, Some(stop("c1")));
        memory.forget_pod("u1");
        let view = memory.view("u1", &[("main", "c1")], now, RestartDelay::Auto);
        assert_eq!(view.containers[0].previous_stop, None);
        assert_eq!(view.stop_allowed_at, now, "no timeline: now");
    }

    #[tokio::test(start_paused = true)]
    async fn stops_and_expected_recreations_are_forgotten_after_ten_minutes() {
        let memory = Memory::default();
        let t0 = Instant::now();
        memory.stopping("u1", "main", stop("c1"), t0);
        memory.expect_kubelet_recreation("c1", t0, t0);
        memory.forget_old_stops(t0 + STOPPED_MEMORY - Duration::from_secs(1));
        let kept = memory.view("u1", &[("main", "c1")], t0, RestartDelay::Auto);
        assert!(kept.containers[0].already_stopped);
        memory.forget_old_stops(t0 + STOPPED_MEMORY);
        let gone = memory.view("u1", &[("main", "c1")], t0, RestartDelay::Auto);
        assert_eq!(
            gone.containers[0],
            Remembered {
                previous_stop: Some(stop("c1")),
                ..Default::default()
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expected_recreation_is_remembered_past_its_overdue_time_however_long_the_grace() {
        // issue 43, row 15: with a grace period over about 590 s the entry was forgotten at
        // 600 s, before it was overdue, so the next pass started it over and it never was
        let memory = Memory::default();
        let t0 = Instant::now();
        let overdue = t0 + Duration::from_secs(3_600);
        memory.expect_kubelet_recreation("c1", t0, overdue);
        memory.forget_old_stops(overdue + Duration::from_secs(1));
        let view = memory.view("u1", &[("main", "c1")], t0, RestartDelay::Auto);
        assert_eq!(view.containers[0].kubelet_expected_since, Some(t0));
        memory.forget_old_stops(overdue + STOPPED_MEMORY);
        let view = memory.view("u1", &[("main", "c1")], t0, RestartDelay::Auto);
        assert_eq!(view.containers[0].kubelet_expected_since, None);
    }
    #[test]
    fn sandboxes_are_remembered_until_the_map_is_full_then_afresh() {
        let memory = Memory::default();
        for i in 0..SANDBOX_MEMORY {
            memory.remember_sandbox(&format!("s{i}"), "u");
        }
        assert_eq!(memory.pod_of_sandbox("s0").as_deref(), Some("u"));
        memory.remember_sandbox("s0", "u");
        assert_eq!(
            memory.pod_of_sandbox("s1").as_deref(),
            Some("u"),
            "a known one"
        );
        memory.remember_sandbox("new", "v");
        assert_eq!(memory.pod_of_sandbox("new").as_deref(), Some("v"));
        assert_eq!(memory.pod_of_sandbox("s1"), None, "started afresh");
    }
}
