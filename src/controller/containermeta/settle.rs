//! When stopping a container for stale env from metadata is safe: when the kubelet will
//! recreate it from a pod that already carries the new metadata. Why a stop is not made at
//! once, the three signs that make it safe, how a slow kubelet stretches them and what the
//! `InPlaceUpdateReady` gate adds: `docs/RELIABILITY.md`, "When a stale-env stop is safe".
//! Here: [`Timeline`] (what was seen of a pod), [`KubeletLag`] (the stretch), [`Gate`].

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

pub use crate::config::RestartDelay;
use crate::hash::env::expected_env_hash;
use crate::k8s::keys;

/// The longest a healthy kubelet's sync holds a pod before acting: the PLEG relist period (1 s)
/// plus the relist's and the sync's own time (stretched on a slow kubelet, see [`KubeletLag`]).
pub const KUBELET_SETTLE: Duration = Duration::from_millis(1500);

/// How much later than this daemon the kubelet may take a pod change from its own watch.
pub const UPDATE_MARGIN: Duration = Duration::from_millis(250);

/// The kubelet's report of a stopped container up to this late is a healthy kubelet's: a
/// relist period (1 s) plus a quick relist, sync and status write.
pub const HEALTHY_REPORT_LAG: Duration = Duration::from_millis(1250);

/// The kubelet's lag as measured on this node: from a container's start (the runtime's event)
/// or the end of a stop this daemon made, to the first pod version that reports it. The recent worst (the last
/// [`KubeletLag::KEEP`] stops within [`KubeletLag::WINDOW`]) stretches the timings: a report
/// lag `L` is at least a relist period plus one relist, and a sync holds a pod for at most a
/// relist period plus two relists, so the timings grow by twice what `L` exceeds the healthy
/// lag (the margin by once), capped at [`GATE_LIMIT`].
#[derive(Debug, Default)]
pub struct KubeletLag {
    samples: VecDeque<(Instant, Duration)>,
}

impl KubeletLag {
    pub const KEEP: usize = 16;
    pub const WINDOW: Duration = Duration::from_secs(600);

    pub fn record(&mut self, now: Instant, lag: Duration) {
        self.samples.push_back((now, lag));
        while self.samples.len() > Self::KEEP {
            self.samples.pop_front();
        }
    }

    /// What the recent worst lag exceeds the healthy one by.
    pub fn excess(&self, now: Instant) -> Duration {
        self.samples
            .iter()
            .filter(|(at, _)| now.duration_since(*at) <= Self::WINDOW)
            .map(|(_, lag)| lag.saturating_sub(HEALTHY_REPORT_LAG))
            .max()
            .unwrap_or_default()
            .min(GATE_LIMIT)
    }
}

/// The longest a stop waits for the kubelet to show it took `InPlaceUpdateReady=False` (see
/// [`Gate`]) before the timings decide alone: a kubelet that never writes it is stuck, and
/// would not recreate the container sooner either.
pub const GATE_LIMIT: Duration = Duration::from_secs(10);

/// What the pod's status says of the kubelet and the `InPlaceUpdateReady` readiness gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// No gate, the gate is not False, or the kubelet's `Ready` says nothing of it (not ready
    /// for another reason): the timings decide.
    Silent,
    /// The gate is False but the pod is `Ready=True`: a kubelet sync that took the pod before
    /// the gate went False wrote it back (or, where the manager wrote only the gate, no sync
    /// has run since).
    Awaiting,
    /// `Ready=False` for the readiness gates: where it follows [`Gate::Awaiting`], the kubelet
    /// wrote it from a sync that holds the pod with the gate False, past its snapshot.
    Reflected,
}

impl Gate {
    pub fn of(pod: &Pod) -> Gate {
        let gated = pod
            .spec
            .iter()
            .flat_map(|s| s.readiness_gates.iter().flatten())
            .any(|g| g.condition_type == keys::INPLACE_UPDATE_READY);
        let conditions = || {
            pod.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
        };
        let gate_false =
            conditions().any(|c| c.type_ == keys::INPLACE_UPDATE_READY && c.status == "False");
        if !gated || !gate_false {
            return Gate::Silent;
        }
        match conditions().find(|c| c.type_ == "Ready") {
            Some(c) if c.status == "True" => Gate::Awaiting,
            Some(c)
                if c.status == "False" && c.reason.as_deref() == Some("ReadinessGatesNotReady") =>
            {
                Gate::Reflected
            }
            _ => Gate::Silent,
        }
    }
}

/// One version of a pod as [`Timeline`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub env: u64,
    pub kubelet: u64,
    pub gate: Gate,
}

impl Sighting {
    pub fn of(pod: &Pod) -> Sighting {
        Sighting {
            env: env_signature(pod),
            kubelet: kubelet_signature(pod),
            gate: Gate::of(pod),
        }
    }
}

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
    seen: Sighting,
    changed_at: Instant,
    quiet_before_change: bool,
    kubelet_wrote_after_change: Option<Instant>,
    gate_reflected_after_change: Option<Instant>,
}

impl Timeline {
    /// The first sight of a pod (at start, or when it appears): nothing is known of what came
    /// before, so it counts as just changed.
    pub fn new(now: Instant, seen: Sighting) -> Self {
        Timeline {
            last_event: now,
            seen,
            changed_at: now,
            quiet_before_change: false,
            kubelet_wrote_after_change: None,
            gate_reflected_after_change: None,
        }
    }

    /// Records a new version of the pod seen at `now`.
    pub fn observe(&mut self, now: Instant, seen: Sighting) {
        if seen.env != self.seen.env {
            self.quiet_before_change = now.duration_since(self.last_event) >= KUBELET_SETTLE;
            self.changed_at = now;
            self.kubelet_wrote_after_change = None;
            self.gate_reflected_after_change = None;
        } else {
            if seen.kubelet != self.seen.kubelet
                && self.kubelet_wrote_after_change.is_none()
                && now >= self.changed_at + UPDATE_MARGIN
            {
                self.kubelet_wrote_after_change = Some(now);
            }
            if seen.gate == Gate::Reflected
                && self.seen.gate != Gate::Reflected
                && self.gate_reflected_after_change.is_none()
            {
                self.gate_reflected_after_change = Some(now);
            }
        }
        self.seen = seen;
        self.last_event = now;
    }

    /// When the current metadata was first seen.
    pub fn changed_at(&self) -> Instant {
        self.changed_at
    }

    /// The earliest moment a container of the pod may be stopped for its env; `excess` is
    /// [`KubeletLag::excess`].
    pub fn stop_allowed_at(&self, delay: RestartDelay, excess: Duration) -> Instant {
        match delay {
            RestartDelay::Fixed(d) => self.changed_at + d,
            RestartDelay::Auto => {
                if let Some(at) = self.gate_reflected_after_change {
                    return at;
                }
                if self.seen.gate == Gate::Awaiting {
                    return self.changed_at + GATE_LIMIT;
                }
                let margin = UPDATE_MARGIN + excess;
                let mut at = self.changed_at + (KUBELET_SETTLE + 2 * excess).min(GATE_LIMIT);
                if self.quiet_before_change {
                    at = at.min(self.changed_at + margin);
                }
                if let Some(w) = self.kubelet_wrote_after_change
                    && w >= self.changed_at + margin
                {
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

    fn seen(env: u64, kubelet: u64) -> Sighting {
        Sighting {
            env,
            kubelet,
            gate: Gate::Silent,
        }
    }

    fn gated(env: u64, kubelet: u64, gate: Gate) -> Sighting {
        Sighting { env, kubelet, gate }
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_after_a_quiet_pod_may_stop_after_the_update_margin() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        let change = t0 + Duration::from_secs(5);
        t.observe(change, seen(2, 1));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + UPDATE_MARGIN
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_right_after_another_event_waits_a_whole_relist() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        t.observe(t0 + Duration::from_secs(5), seen(1, 1)); // e.g. InPlaceUpdateReady=False
        let change = t0 + Duration::from_secs(5) + 10 * MS;
        t.observe(change, seen(2, 1));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + KUBELET_SETTLE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kubelet_status_write_after_the_margin_makes_the_stop_safe_then() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        let change = t0 + Duration::from_secs(5);
        t.observe(change - 10 * MS, seen(1, 1));
        t.observe(change, seen(2, 1));
        // a kubelet write within the margin says nothing: its sync may predate the change
        t.observe(change + 100 * MS, seen(2, 2));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + KUBELET_SETTLE
        );
        // one after the margin does
        t.observe(change + 600 * MS, seen(2, 3));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + 600 * MS
        );
        // later writes do not move it
        t.observe(change + 900 * MS, seen(2, 4));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + 600 * MS
        );
    }

    #[tokio::test(start_paused = true)]
    async fn writes_by_others_than_the_kubelet_do_not_count() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        let change = t0 + Duration::from_secs(5);
        t.observe(change - 10 * MS, seen(1, 1));
        t.observe(change, seen(2, 1));
        t.observe(change + 600 * MS, seen(2, 1));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + KUBELET_SETTLE
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_first_seen_counts_as_just_changed() {
        let t0 = Instant::now();
        let t = Timeline::new(t0, seen(1, 1));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            t0 + KUBELET_SETTLE
        );
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Fixed(Duration::ZERO), Duration::ZERO),
            t0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_delay_counts_from_the_change() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        let change = t0 + Duration::from_secs(5);
        t.observe(change, seen(2, 1));
        let second = Duration::from_secs(1);
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Fixed(second), Duration::from_secs(3)),
            change + second
        );
    }

    /// The manager's update: the gate False, then (a few ms later) the new metadata.
    fn managers_update(t0: Instant) -> (Timeline, Instant) {
        let mut t = Timeline::new(t0, seen(1, 1));
        t.observe(t0 + Duration::from_secs(5), gated(1, 1, Gate::Awaiting));
        let change = t0 + Duration::from_secs(5) + 5 * MS;
        t.observe(change, gated(2, 1, Gate::Awaiting));
        (t, change)
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_kubelet_still_reports_ready_no_timing_allows_the_stop() {
        let (mut t, change) = managers_update(Instant::now());
        // a status write of a sync that began before the gate went False
        t.observe(change + 600 * MS, gated(2, 2, Gate::Awaiting));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + GATE_LIMIT
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_kubelets_ready_false_for_the_gate_allows_the_stop_at_once_however_late() {
        let (mut t, change) = managers_update(Instant::now());
        let reflected = change + 3 * KUBELET_SETTLE;
        t.observe(reflected, gated(2, 2, Gate::Reflected));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            reflected
        );
        // and early too, before any margin
        let (mut t, change) = managers_update(Instant::now());
        t.observe(change + 20 * MS, gated(2, 2, Gate::Reflected));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + 20 * MS
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_reflected_before_the_change_leaves_it_to_the_timings() {
        let t0 = Instant::now();
        let mut t = Timeline::new(t0, seen(1, 1));
        t.observe(t0 + Duration::from_secs(5), gated(1, 1, Gate::Awaiting));
        t.observe(t0 + Duration::from_secs(6), gated(1, 2, Gate::Reflected));
        let change = t0 + Duration::from_secs(6) + 100 * MS;
        t.observe(change, gated(2, 2, Gate::Reflected));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, Duration::ZERO),
            change + KUBELET_SETTLE
        );
    }

    fn gate_pod(gates: bool, in_place_ready: &str, ready: &str, reason: &str) -> Pod {
        let gates = if gates {
            serde_json::json!([{"conditionType": "InPlaceUpdateReady"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"readinessGates": gates, "containers": []},
            "status": {"conditions": [
                {"type": "InPlaceUpdateReady", "status": in_place_ready},
                {"type": "Ready", "status": ready, "reason": reason},
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn the_gate_is_read_from_the_readiness_gate_and_the_kubelets_ready_condition() {
        assert_eq!(
            Gate::of(&gate_pod(true, "False", "True", "")),
            Gate::Awaiting
        );
        assert_eq!(
            Gate::of(&gate_pod(true, "False", "False", "ReadinessGatesNotReady")),
            Gate::Reflected
        );
        // not ready for its containers: the kubelet's Ready says nothing of the gate
        assert_eq!(
            Gate::of(&gate_pod(true, "False", "False", "ContainersNotReady")),
            Gate::Silent
        );
        assert_eq!(Gate::of(&gate_pod(true, "True", "True", "")), Gate::Silent);
        assert_eq!(
            Gate::of(&gate_pod(false, "False", "True", "")),
            Gate::Silent
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_kubelet_stretches_the_settle_by_twice_and_the_margin_by_once_its_excess() {
        let t0 = Instant::now();
        let mut lag = KubeletLag::default();
        assert_eq!(lag.excess(t0), Duration::ZERO, "nothing measured yet");
        lag.record(t0, Duration::from_millis(900));
        assert_eq!(lag.excess(t0), Duration::ZERO, "a healthy kubelet's lag");
        lag.record(t0, HEALTHY_REPORT_LAG + 500 * MS);
        let excess = lag.excess(t0);
        assert_eq!(excess, 500 * MS);

        let mut t = Timeline::new(t0, seen(1, 1));
        t.observe(t0 + Duration::from_secs(5), seen(1, 1));
        let change = t0 + Duration::from_secs(5) + 10 * MS;
        t.observe(change, seen(2, 1));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, excess),
            change + KUBELET_SETTLE + Duration::from_secs(1)
        );
        // a kubelet write within the stretched margin says nothing any more
        t.observe(change + 600 * MS, seen(2, 2));
        assert_eq!(
            t.stop_allowed_at(RestartDelay::Auto, excess),
            change + KUBELET_SETTLE + Duration::from_secs(1)
        );
        let mut quiet = Timeline::new(t0, seen(1, 1));
        quiet.observe(change, seen(2, 1));
        assert_eq!(
            quiet.stop_allowed_at(RestartDelay::Auto, excess),
            change + UPDATE_MARGIN + excess
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_kubelets_lag_is_its_recent_worst_and_is_forgotten_after_the_window() {
        let t0 = Instant::now();
        let mut lag = KubeletLag::default();
        lag.record(t0, Duration::from_secs(4));
        for i in 0..KubeletLag::KEEP as u64 {
            lag.record(t0 + Duration::from_secs(i), Duration::from_secs(2));
        }
        assert_eq!(
            lag.excess(t0 + Duration::from_secs(20)),
            Duration::from_secs(2) - HEALTHY_REPORT_LAG,
            "the 4 s lag was pushed out by newer stops"
        );
        assert_eq!(
            lag.excess(t0 + KubeletLag::WINDOW + Duration::from_secs(20)),
            Duration::ZERO
        );
        lag.record(t0, Duration::from_secs(60));
        assert_eq!(lag.excess(t0), GATE_LIMIT, "capped");
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
