//! The runtime's "now": the one clock that runtime timestamps (`created_at`, `started_at`,
//! `finished_at`, an event's `created_at`: nanoseconds since the epoch on the node's wall
//! clock) are compared with, by the daemon, `kruised crictl` and the tests alike.
//!
//! It is the wall clock, moved by as much as tokio's clock runs ahead of real time. In the
//! daemon the two run together (tokio's clock is the monotonic one), so this is the wall
//! clock, and a step of the wall clock (NTP) is followed as the runtimes follow it. A test
//! that pauses tokio's clock and advances it moves this "now" by as much, so a container's age
//! as the code reads it is what the test made it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Now, in nanoseconds since the epoch, as the runtimes stamp their times.
pub fn now_ns() -> i64 {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    // how far tokio's clock is ahead of the real one: nothing unless a test moved it
    let (virtual_now, real_now) = (Instant::now().into_std(), std::time::Instant::now());
    let ahead = match virtual_now.checked_duration_since(real_now) {
        Some(d) => nanos(d),
        None => -nanos(real_now.saturating_duration_since(virtual_now)),
    };
    wall.saturating_add(ahead)
}

/// How long ago runtime time `ns` was (nothing for a time not reached yet).
pub fn since(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(now_ns().saturating_sub(ns)).unwrap_or(0))
}

/// Runtime time `ns` on tokio's clock (now for a time not reached yet; the earliest instant
/// tokio holds for one before it).
pub fn instant_of(ns: i64) -> Instant {
    let now = Instant::now();
    let ago = since(ns);
    now.checked_sub(ago).unwrap_or(now)
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a` is `b` within the real time a test's few calls take.
    fn near(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_millis(500)
    }

    #[tokio::test(start_paused = true)]
    async fn advancing_a_paused_tokio_clock_ages_runtime_times_by_as_much() {
        let created = now_ns();
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert!(
            near(since(created), Duration::from_secs(90)),
            "{:?}",
            since(created)
        );
        let at = instant_of(created);
        assert!(
            near(at.duration_since(started), Duration::ZERO)
                && near(started.duration_since(at), Duration::ZERO),
            "created at {at:?}, the test began at {started:?}"
        );
    }

    #[tokio::test]
    async fn on_a_running_tokio_clock_it_is_the_wall_clock() {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch");
        let now = Duration::from_nanos(u64::try_from(now_ns()).expect("after the epoch"));
        assert!(near(now, wall), "{now:?} against the wall clock's {wall:?}");
    }

    #[test]
    fn a_time_not_reached_yet_is_no_time_ago_and_now() {
        let later = now_ns() + 3_600_000_000_000;
        assert_eq!(since(later), Duration::ZERO);
        let before = Instant::now();
        assert!(instant_of(later) >= before);
    }
}
