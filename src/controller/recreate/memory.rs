//! What the recreate controller remembers of the requests between passes, in one place.
//! [`Memory`] is the one owner of every change to it (as in container meta's memory): each
//! method says what happened or what is asked, and this is the only file of the controller that
//! locks.
//!
//! Remembered, by request UID, until the request ends:
//!
//! - the kill in progress, to call off when the request ends;
//! - the containers recorded as killed: the watched copy of a request can be older than the
//!   daemon's own last write to it, and a status written from that copy must not take
//!   `isKilled` back;
//! - the pod of each request seen active: a request that leaves the watch is gone from the
//!   store, and its pod must still be looked at again;
//! - when the pod of each request in its unready grace went out of service, on the monotonic
//!   clock ([`UnreadyClock`]): a step of the wall clock does not move the grace's end;
//! - the requests this daemon completed, until the watch shows them completed or gone: a pass
//!   on a watched copy older than the completion skips them. Without it such a pass completed a
//!   request twice, counted twice (seen on CRI-O in CI: the e2e ordered recreate counted
//!   `result="succeeded"` 2 for one request).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::decide::{Key, UnreadyClock};
use crate::sync::lock;

/// The controller's memory; see the module.
#[derive(Debug, Default)]
pub struct Memory {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Kills in progress, by request UID, to call off when the request ends.
    inflight: HashMap<String, CancellationToken>,
    /// The containers recorded as killed, by request UID, until the request ends.
    killed: HashMap<String, BTreeSet<String>>,
    /// The pod of each request seen active, by request UID.
    pod_of: HashMap<String, Key>,
    /// The requests this daemon completed, by UID, until the watch shows them completed or
    /// gone.
    completed: HashSet<String>,
    /// Since when each request's pod is out of service, by request UID, on the monotonic clock.
    unready: HashMap<String, UnreadyClock>,
}

impl Memory {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Request `uid` is active, for pod `pod`.
    pub fn active(&self, uid: String, pod: Key) {
        self.state().pod_of.insert(uid, pod);
    }

    /// Request `uid` ended (completed, deleting, or gone from the watch): a kill in progress
    /// for it is called off, and its kills, its completion here and its pod forgotten. The pod
    /// it was seen for, if it was seen active.
    pub fn ended(&self, uid: &str) -> Option<Key> {
        let (kill, completion_seen, pod) = {
            let mut s = self.state();
            s.killed.remove(uid);
            s.unready.remove(uid);
            (
                s.inflight.remove(uid),
                s.completed.remove(uid),
                s.pod_of.remove(uid),
            )
        };
        if let Some(t) = kill {
            tracing::info!(
                request = uid,
                "the request ended: calling off its kill in progress"
            );
            t.cancel();
        }
        if completion_seen {
            tracing::debug!(request = uid, "the watch shows the completion");
        }
        pod
    }

    /// Ends every request the memory holds whose UID is not in `live` (the requests the
    /// watch's store holds after a relist, or when this subscriber lagged): their deletions
    /// were never told, so a kill in flight for one is called off here. The pods they were
    /// seen for, to look at again.
    pub fn end_all_but(&self, live: &HashSet<String>) -> Vec<Key> {
        let stale: BTreeSet<String> = {
            let s = self.state();
            s.pod_of
                .keys()
                .chain(s.inflight.keys())
                .chain(s.killed.keys())
                .chain(s.completed.iter())
                .chain(s.unready.keys())
                .filter(|uid| !live.contains(*uid))
                .cloned()
                .collect()
        };
        stale.iter().filter_map(|uid| self.ended(uid)).collect()
    }

    /// How long the pod of request `uid` has been out of service at `now` (monotonic), its
    /// manager's unready time being `since`: read against the wall clock (`wall`) the first
    /// time `since` is seen for the request, on the monotonic clock from then on.
    pub fn out_of_service(
        &self,
        uid: &str,
        since: Timestamp,
        wall: Timestamp,
        now: Instant,
    ) -> Duration {
        let mut s = self.state();
        let clock = match s.unready.get(uid) {
            Some(c) if c.since() == since => *c,
            _ => {
                let c = UnreadyClock::first_seen(since, wall, now);
                s.unready.insert(uid.to_string(), c);
                c
            }
        };
        clock.elapsed_at(now)
    }

    /// Whether a kill for request `uid` is under way.
    pub fn kill_under_way(&self, uid: &str) -> bool {
        self.state().inflight.contains_key(uid)
    }

    /// The containers recorded as killed for request `uid`.
    pub fn killed(&self, uid: &str) -> BTreeSet<String> {
        self.state().killed.get(uid).cloned().unwrap_or_default()
    }

    /// The kill of `container` for request `uid` is recorded in its status and starts: `token`
    /// calls it off.
    pub fn kill_started(&self, uid: &str, container: &str, token: CancellationToken) {
        let mut s = self.state();
        s.killed
            .entry(uid.to_string())
            .or_default()
            .insert(container.to_string());
        s.inflight.insert(uid.to_string(), token);
    }

    /// The kill for request `uid` ended.
    pub fn kill_ended(&self, uid: &str) {
        self.state().inflight.remove(uid);
    }

    /// Request `uid` is being completed (before the write: its watch event may come before its
    /// answer, and forgets it then).
    pub fn completing(&self, uid: &str) {
        self.state().completed.insert(uid.to_string());
    }

    /// The write that was to complete request `uid` failed.
    pub fn completion_failed(&self, uid: &str) {
        self.state().completed.remove(uid);
    }

    /// Request `uid` is completed: its kills are no longer needed.
    pub fn completed(&self, uid: &str) {
        self.state().killed.remove(uid);
    }

    /// Whether this daemon completed request `uid` and the watch does not show it yet.
    pub fn completed_here(&self, uid: &str) -> bool {
        self.state().completed.contains(uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Key {
        ("ns".to_string(), "p".to_string())
    }

    #[test]
    fn a_request_that_ends_calls_off_its_kill_and_forgets_everything_of_it() {
        let m = Memory::default();
        m.active("r1".into(), pod());
        let token = CancellationToken::new();
        m.kill_started("r1", "a", token.clone());
        assert!(m.kill_under_way("r1"));
        assert_eq!(m.killed("r1"), BTreeSet::from(["a".to_string()]));
        m.completing("r1");
        assert!(m.completed_here("r1"));
        assert_eq!(m.ended("r1"), Some(pod()), "its pod is looked at again");
        assert!(token.is_cancelled());
        assert!(!m.kill_under_way("r1"));
        assert!(m.killed("r1").is_empty());
        assert!(!m.completed_here("r1"));
        assert_eq!(m.ended("r1"), None, "forgotten");
    }

    /// Issue 43, row 10: a request deleted while the watch was down (or while this subscriber
    /// lagged) was never told deleted: its kill ran on and its state was kept for ever.
    #[test]
    fn a_request_a_relist_no_longer_holds_has_its_kill_called_off_and_is_forgotten() {
        let m = Memory::default();
        m.active("gone".into(), pod());
        m.active("kept".into(), ("ns".to_string(), "q".to_string()));
        let gone_kill = CancellationToken::new();
        let kept_kill = CancellationToken::new();
        m.kill_started("gone", "a", gone_kill.clone());
        m.kill_started("kept", "a", kept_kill.clone());
        m.kill_started("never-seen-active", "a", CancellationToken::new());
        let live = HashSet::from(["kept".to_string()]);
        assert_eq!(
            m.end_all_but(&live),
            vec![pod()],
            "the gone one's pod looked at again"
        );
        assert!(gone_kill.is_cancelled(), "its kill called off");
        assert!(!kept_kill.is_cancelled());
        assert!(!m.kill_under_way("gone") && !m.kill_under_way("never-seen-active"));
        assert!(m.kill_under_way("kept"));
        assert!(m.end_all_but(&live).is_empty(), "nothing more to end");
    }

    #[test]
    fn a_kill_that_ends_stays_recorded_until_the_request_completes() {
        let m = Memory::default();
        m.kill_started("r1", "a", CancellationToken::new());
        m.kill_ended("r1");
        assert!(!m.kill_under_way("r1"));
        assert_eq!(
            m.killed("r1").len(),
            1,
            "a later pass must not take it back"
        );
        m.completing("r1");
        m.completion_failed("r1");
        assert!(!m.completed_here("r1"), "a failed write completed nothing");
        m.completing("r1");
        m.completed("r1");
        assert!(m.killed("r1").is_empty());
        assert!(m.completed_here("r1"), "until the watch shows it");
    }
}
