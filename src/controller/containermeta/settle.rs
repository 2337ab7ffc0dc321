//! When stopping a container for stale env from metadata is safe: when the kubelet will
//! recreate it from a pod that already carries the new metadata.
//!
//! Why it is not at once (measured on a real v1.36 kubelet, see the cluster tests): the
//! kubelet's pod worker takes the pod object when a sync *starts*, then waits in
//! `podCache.GetNewerThan` for the next PLEG relist (every 1 s, plus the relist's own time)
//! before acting. A sync that started before the kubelet took the metadata change (one
//! triggered by the manager's `InPlaceUpdateReady=False`, by another writer, by our own
//! annotation patch) still holds the old pod; if the container dies before that relist, that
//! sync recreates it with the old values, and a second restart follows (kruise-daemon's fixed
//! 1 s delay hides most of this race; reacting in milliseconds exposes it).
//!
//! So a stop waits until one of these shows that no sync holding the old pod can see the
//! container die:
//!
//! 1. the pod had no event for [`KUBELET_SETTLE`] before the change: no sync was waiting, and
//!    [`UPDATE_MARGIN`] covers the kubelet taking the change later than we did;
//! 2. the kubelet wrote the pod's status (a field only it writes changed) at least
//!    [`UPDATE_MARGIN`] after the change: the status is written from inside a sync after its
//!    relist snapshot, so that sync will not see a container we stop now die, and the sync
//!    after it takes the new pod;
//! 3. [`KUBELET_SETTLE`] passed since the change: any sync that held the old pod has run.
//!
//! A fixed delay (kruise's behaviour is 1 s) can be configured instead.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

pub use crate::config::RestartDelay;
use crate::hash::env::expected_env_hash;

/// The longest a kubelet sync holds a pod before acting: the PLEG relist period (1 s) plus the
/// relist's and the sync's own time on a loaded node.
pub const KUBELET_SETTLE: Duration = Duration::from_millis(1500);

/// How much later than this daemon the kubelet may take a pod change from its own watch.
pub const UPDATE_MARGIN: Duration = Duration::from_millis(250);

/// A fingerprint of the env-from-metadata values the pod's metadata gives its containers.
pub fn env_signature(pod: &Pod) -> u64 {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        c.name.hash(&mut h);
        expected_env_hash(c, &labels, &annotations).hash(&mut h);
    }
    h.finish()
}

/// The pod condition types only the kubelet writes.
const KUBELET_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "DisruptionTarget",
];

/// A fingerprint of the status fields only the kubelet writes: phase, its conditions, the
/// container statuses, IPs, the observed generation.
pub fn kubelet_signature(pod: &Pod) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let Some(s) = pod.status.as_ref() else {
        return 0;
    };
    s.phase.hash(&mut h);
    s.pod_ip.hash(&mut h);
    s.observed_generation.hash(&mut h);
    for c in s.conditions.iter().flatten() {
        if KUBELET_CONDITIONS.contains(&c.type_.as_str()) {
            (&c.type_, &c.status, &c.reason).hash(&mut h);
        }
    }
    for c in s
        .container_statuses
        .iter()
        .chain(s.init_container_statuses.iter())
        .flatten()
    {
        (
            &c.name,
            &c.container_id,
            c.ready,
            c.restart_count,
            c.started,
        )
            .hash(&mut h);
        let state = c.state.as_ref();
        (
            state.is_some_and(|s| s.running.is_some()),
            state.is_some_and(|s| s.terminated.is_some()),
            state.is_some_and(|s| s.waiting.is_some()),
        )
            .hash(&mut h);
    }
    h.finish()
}

/// What this daemon saw of one pod, for deciding when a stop is safe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeline {
    last_event: Instant,
    env: u64,
    kubelet: u64,
    changed_at: Instant,
    quiet_before_change: bool,
    kubelet_wrote_after_change: Option<Instant>,
}

impl Timeline {
    /// The first sight of a pod (at start, or when it appears): nothing is known of what came
    /// before, so it counts as just changed.
    pub fn new(now: Instant, env: u64, kubelet: u64) -> Self {
        Timeline {
            last_event: now,
            env,
            kubelet,
            changed_at: now,
            quiet_before_change: false,
            kubelet_wrote_after_change: None,
        }
    }

    /// Records a new version of the pod seen at `now`.
    pub fn observe(&mut self, now: Instant, env: u64, kubelet: u64) {
        if env != self.env {
            self.quiet_before_change = now.duration_since(self.last_event) >= KUBELET_SETTLE;
            self.changed_at = now;
            self.env = env;
            self.kubelet_wrote_after_change = None;
        } else if kubelet != self.kubelet
            && self.kubelet_wrote_after_change.is_none()
            && now >= self.changed_at + UPDATE_MARGIN
        {
            self.kubelet_wrote_after_change = Some(now);
        }
        self.kubelet = kubelet;
        self.last_event = now;
    }

    /// When the current metadata was first seen.
    pub fn changed_at(&self) -> Instant {
        self.changed_at
    }

    /// The earliest moment a container of the pod may be stopped for its env.
    pub fn stop_allowed_at(&self, delay: RestartDelay) -> Instant {
        match delay {
            RestartDelay::Fixed(d) => self.changed_at + d,
            RestartDelay::Auto => {
                let mut at = self.changed_at + KUBELET_SETTLE;
                if self.quiet_before_change {
                    at = at.min(self.changed_at + UPDATE_MARGIN);
                }
                if let Some(w) = self.kubelet_wrote_after_change {
                    at = at.min(w);
                }
                at
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn a_change_after_a_quiet_pod_may_stop_after_the_update_margin() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, 1, 1);
        let change = t0 + Duration::from_secs(5);
        t.observe(change, 2, 1);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto),
            change + UPDATE_MARGIN
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_right_after_another_event_waits_a_whole_relist() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, 1, 1);
        t.observe(t0 + Duration::from_secs(5), 1, 1); // e.g. InPlaceUpdateReady=False
        let change = t0 + Duration::from_secs(5) + 10 * MS;
        t.observe(change, 2, 1);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto),
            change + KUBELET_SETTLE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kubelet_status_write_after_the_margin_makes_the_stop_safe_then() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, 1, 1);
        let change = t0 + Duration::from_secs(5);
        t.observe(change - 10 * MS, 1, 1);
        t.observe(change, 2, 1);
        // a kubelet write within the margin says nothing: its sync may predate the change
        t.observe(change + 100 * MS, 2, 2);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto),
            change + KUBELET_SETTLE
        );
        // one after the margin does
        t.observe(change + 600 * MS, 2, 3);
        assert_eq!(t.stop_allowed_at(RestartDelay::Auto), change + 600 * MS);
        // later writes do not move it
        t.observe(change + 900 * MS, 2, 4);
        assert_eq!(t.stop_allowed_at(RestartDelay::Auto), change + 600 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_by_others_than_the_kubelet_do_not_count() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, 1, 1);
        let change = t0 + Duration::from_secs(5);
        t.observe(change - 10 * MS, 1, 1);
        t.observe(change, 2, 1);
        t.observe(change + 600 * MS, 2, 1);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto),
            change + KUBELET_SETTLE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_first_seen_counts_as_just_changed() {
        let t0 = Instant::now();
        let t = Timeline::new(t0, 1, 1);
        assert_eq!(t.stop_allowed_at(RestartDelay::Auto), t0 + KUBELET_SETTLE);
        assert_eq!(t.stop_allowed_at(RestartDelay::Fixed(Duration::ZERO)), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_delay_counts_from_the_change() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, 1, 1);
        let change = t0 + Duration::from_secs(5);
        t.observe(change, 2, 1);
        let second = Duration::from_secs(1);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Fixed(second)),
            change + second
        );
    }

    #[test]
    fn restart_delay_parses_auto_and_durations() {
        assert_eq!("auto".parse(), Ok(RestartDelay::Auto));
        assert_eq!(
            "1s".parse(),
            Ok(RestartDelay::Fixed(Duration::from_secs(1)))
        );
        assert_eq!("0s".parse(), Ok(RestartDelay::Fixed(Duration::ZERO)));
        assert!("soon".parse::<RestartDelay>().is_err());
    }
}
