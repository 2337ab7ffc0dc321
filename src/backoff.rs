//! Pauses between attempts: the daemon's one exponential back-off ([`exponential`], walked with
//! jitter by [`Backoff`]) and the jitter that keeps a fleet's nodes from retrying in step. The
//! API watches, the runtime loop, the controllers and the work queue's retries all pause
//! through it.
//!
//! What a failed status write waits before it is tried again, by writer (they differ on
//! purpose; each is the writer's own kind of retry):
//!
//! | writer | retry | why |
//! |---|---|---|
//! | NodeImage status (`imagepull::controller`), NodePodProbe status (`podprobe`) | [`Backoff`] from 200 ms to 30 s, ± 20 % ([`STATUS_WRITE_RETRY_MIN`], [`STATUS_WRITE_RETRY_MAX`]) | one writer of one object per node, which keeps its own state: it writes again the state it holds then, and many nodes fail together when the API server does |
//! | pod annotation (`containermeta`) | the pod's key again through its work queue: 3 s, doubling with each failure in a row up to 1 min, from 3 s again after a pass that succeeds; a pass that failed because the runtime did not answer waits 250 ms, doubling up to 3 s | the write is the end of a pass, which is retried whole on fresh data (the pod may have changed); a runtime that restarts often must not push the work a minute past its return |
//! | recreate request status (`recreate`) | the pod's key again through its work queue: 2 s, doubling up to 1 min, the same way | the same; a pass that failed on a runtime that is away or restarting instead waits 250 ms, doubling up to 2 s |
//!
//! The queue-driven retries take the pass's key again rather than the write: the work queue
//! keeps one timer per key (the earliest wins), counts a key's failures in a row, and waits
//! [`exponential`] of them (`controller::queue`'s `Retry`, up to its `RETRY_DELAY_LIMIT`),
//! without jitter, as client-go's per-item limiter; the pass reads the object anew.

use std::time::Duration;

use tokio::time::Instant;

/// The first pause of a node-scoped status writer after a failed write.
pub const STATUS_WRITE_RETRY_MIN: Duration = Duration::from_millis(200);
/// The longest pause of a node-scoped status writer between failed writes.
pub const STATUS_WRITE_RETRY_MAX: Duration = Duration::from_secs(30);

/// `d` ± 20 %, so many nodes do not retry in step.
pub fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.8 + 0.4 * random_unit())
}

/// A random number uniform in [0, 1), for jitter (not for anything secret): SipHash of a counter
/// under std's per-process random keys (`RandomState`), which is all a spread of retries needs
/// and no random-number crate in the binary.
pub fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(DRAWS.fetch_add(1, Ordering::Relaxed));
    // the top 53 bits: every value a multiple of 2^-53, below 1
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A random integer uniform in `lo..=hi` (`lo` when `hi < lo`), for jitter.
pub fn random_in(lo: u32, hi: u32) -> u32 {
    let span = f64::from(hi.saturating_sub(lo)) + 1.0;
    // `as` saturates; the floor of something below `span` is at most `hi - lo`
    lo.saturating_add((random_unit() * span) as u32)
        .min(hi.max(lo))
}

/// The pause after failed attempt `attempt` (0-based): `base × 2^attempt`, at most `cap`. The
/// daemon's one exponential back-off: [`Backoff`] walks it with jitter; the image puller's tags
/// count their attempts themselves.
pub fn exponential(attempt: u32, base: Duration, cap: Duration) -> Duration {
    base.saturating_mul(2u32.saturating_pow(attempt.min(31)))
        .min(cap)
}

/// Jittered exponential back-off: `min`, doubling up to `max`, each pause ± 20 %; with
/// [`Backoff::forgetting_after`], from `min` again after a quiet time without a failure.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    /// Failures this far apart count as a first one again.
    forget_after: Option<Duration>,
    /// When the last pause was asked for.
    last: Option<Instant>,
}

impl Backoff {
    /// A back-off that starts at `min` and doubles up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            attempt: 0,
            forget_after: None,
            last: None,
        }
    }

    /// The same back-off, starting from the minimum again when a failure comes more than
    /// `quiet` after the one before (client-go's reflector: a watch that ran for a while is not
    /// punished for the failures before it).
    pub fn forgetting_after(self, quiet: Duration) -> Self {
        Backoff {
            forget_after: Some(quiet),
            ..self
        }
    }

    /// The back-off of a node-scoped status writer (see the module's table).
    pub fn status_write() -> Self {
        Backoff::new(STATUS_WRITE_RETRY_MIN, STATUS_WRITE_RETRY_MAX)
    }

    /// The next pause; each call doubles the one after it, up to the maximum.
    pub fn pause(&mut self) -> Duration {
        if let Some(quiet) = self.forget_after {
            let now = Instant::now();
            if self
                .last
                .is_some_and(|at| now.saturating_duration_since(at) > quiet)
            {
                self.attempt = 0;
            }
            self.last = Some(now);
        }
        let d = exponential(self.attempt, self.min, self.max);
        self.attempt = self.attempt.saturating_add(1);
        jitter(d)
    }

    /// Starts again from the minimum (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_draws_stay_in_their_range_and_spread_over_it() {
        let units: Vec<f64> = (0..4000).map(|_| random_unit()).collect();
        assert!(units.iter().all(|u| (0.0..1.0).contains(u)), "{units:?}");
        for quarter in 0..4 {
            let (lo, hi) = (f64::from(quarter) / 4.0, f64::from(quarter + 1) / 4.0);
            let n = units.iter().filter(|u| (lo..hi).contains(*u)).count();
            assert!(
                (700..1300).contains(&n),
                "{n} of 4000 draws in [{lo}, {hi})"
            );
        }
        let ints: Vec<u32> = (0..600).map(|_| random_in(3, 5)).collect();
        for v in 3..=5 {
            assert!(ints.contains(&v), "{v} never drawn from 3..=5: {ints:?}");
        }
        assert!(ints.iter().all(|v| (3..=5).contains(v)), "{ints:?}");
        assert_eq!(random_in(7, 7), 7);
        assert_eq!(random_in(9, 2), 9);
        let full: Vec<u32> = (0..100).map(|_| random_in(0, u32::MAX)).collect();
        assert!(full.iter().any(|v| *v > u32::MAX / 2), "{full:?}");
    }

    #[test]
    fn jitter_is_within_twenty_percent() {
        let d = Duration::from_secs(10);
        for _ in 0..1000 {
            let j = jitter(d);
            assert!(
                j >= Duration::from_secs(8) && j < Duration::from_secs(12),
                "{j:?}"
            );
        }
    }

    #[test]
    fn exponential_backoff_doubles_from_the_base_up_to_the_cap() {
        let (b, cap) = (Duration::from_secs(1), Duration::from_secs(30));
        let steps: Vec<_> = (0..7).map(|i| exponential(i, b, cap).as_secs()).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(exponential(u32::MAX, b, cap), cap);
        assert_eq!(
            exponential(2, Duration::from_millis(1), cap),
            Duration::from_millis(4)
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum_and_starts_again_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let pauses: Vec<Duration> = (0..6).map(|_| b.pause()).collect();
        let nominal = [500, 1000, 2000, 4000, 4000, 4000];
        for (got, want) in pauses.iter().zip(nominal) {
            let want = Duration::from_millis(want);
            assert!(
                *got >= want.mul_f64(0.8) && *got <= want.mul_f64(1.2),
                "{got:?} is not {want:?} ± 20 %"
            );
        }
        b.reset();
        assert!(b.pause() <= Duration::from_millis(600));
    }
}
