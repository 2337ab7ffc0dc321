//! Readiness conditions and loop heartbeats, the state behind `/readyz` and `/healthz`.
//!
//! Readiness says whether the daemon can do its work now (caches synced, runtime reachable);
//! liveness says whether its loops still make progress, so a restart would help: every loop that
//! beats has a heartbeat, every long-lived task a [`TaskGuard`] (a task that ends before the
//! daemon stops, by a panic or a return, is dead for good), and every work queue a check of the
//! key it has worked on longest ([`Liveness::register_check`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

// === Readiness ===

/// Named readiness conditions; ready iff at least one is registered and all are ready.
///
/// Cloning shares the conditions. Built on a `watch` channel so [`Readiness::wait_ready`] wakes on
/// change instead of polling.
#[derive(Debug, Clone)]
pub struct Readiness {
    tx: Arc<watch::Sender<Vec<ConditionReport>>>,
}

/// Handle to one readiness condition, returned by [`Readiness::condition`]. Dropping it leaves the
/// condition as it was (a dead component must not make the daemon ready by going away).
#[derive(Debug, Clone)]
pub struct ReadinessCondition {
    tx: Arc<watch::Sender<Vec<ConditionReport>>>,
    index: usize,
}

/// The state of one readiness condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionReport {
    /// The name given to [`Readiness::condition`].
    pub name: &'static str,
    /// Whether the condition holds.
    pub ready: bool,
    /// Why it does not hold; when it holds, a note on how (or empty).
    pub detail: String,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// No conditions yet, hence not ready.
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(Vec::new())),
        }
    }

    /// Registers a condition, initially not ready with detail `not started`. Names should be
    /// unique; a repeated name is a second, independent condition.
    pub fn condition(&self, name: &'static str) -> ReadinessCondition {
        let mut index = 0;
        self.tx.send_modify(|conditions| {
            index = conditions.len();
            conditions.push(ConditionReport {
                name,
                ready: false,
                detail: "not started".to_owned(),
            });
        });
        ReadinessCondition {
            tx: Arc::clone(&self.tx),
            index,
        }
    }

    /// Whether at least one condition is registered and all are ready.
    pub fn is_ready(&self) -> bool {
        all_ready(&self.tx.borrow())
    }

    /// A snapshot of every condition, in registration order.
    pub fn report(&self) -> Vec<ConditionReport> {
        self.tx.borrow().clone()
    }

    /// Resolves once [`Readiness::is_ready`] holds (immediately if it already does).
    pub async fn wait_ready(&self) {
        let mut rx = self.tx.subscribe();
        // `self` keeps the sender alive, so `wait_for` cannot see a closed channel.
        let _ = rx.wait_for(|conditions| all_ready(conditions)).await;
    }
}

pub(super) fn all_ready(conditions: &[ConditionReport]) -> bool {
    !conditions.is_empty() && conditions.iter().all(|c| c.ready)
}

impl ReadinessCondition {
    /// Marks the condition ready; wakes waiters only if that changed something.
    pub fn set_ready(&self) {
        self.update(true, String::new());
    }

    /// Marks the condition ready with a note on how it holds (shown by `/readyz?verbose`).
    pub fn set_ready_noting(&self, note: impl Into<String>) {
        self.update(true, note.into());
    }

    /// Marks the condition not ready, saying why (shown by `/readyz`).
    pub fn set_not_ready(&self, detail: impl Into<String>) {
        self.update(false, detail.into());
    }

    fn update(&self, ready: bool, detail: String) {
        self.tx.send_if_modified(|conditions| {
            // Conditions are never removed, so the index stays valid.
            let Some(c) = conditions.get_mut(self.index) else {
                return false;
            };
            if c.ready == ready && c.detail == detail {
                return false;
            }
            c.ready = ready;
            c.detail = detail;
            true
        });
    }
}

// === Liveness ===

/// Heartbeats of the long-lived loops; healthy iff every registered loop beat within its limit.
///
/// Uses `tokio::time::Instant`, so tests can drive it with paused time.
#[derive(Debug, Clone)]
pub struct Liveness {
    inner: Arc<LivenessInner>,
}

struct LivenessInner {
    base: Instant,
    next_id: AtomicU64,
    loops: Mutex<Vec<LoopEntry>>,
    checks: Mutex<Vec<CheckEntry>>,
}

impl fmt::Debug for LivenessInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LivenessInner")
            .field("loops", &self.loops)
            .field("checks", &crate::sync::lock(&self.checks).len())
            .finish_non_exhaustive()
    }
}

/// A check that says what is wrong, if anything (`None`: fine).
type CheckFn = Box<dyn Fn() -> Option<String> + Send + Sync>;

struct CheckEntry {
    name: &'static str,
    check: CheckFn,
}

#[derive(Debug)]
struct LoopEntry {
    id: u64,
    name: &'static str,
    max_silence: Duration,
    last_beat: Arc<AtomicU64>,
}

/// One loop's heartbeat, returned by [`Liveness::register`]. Dropping it unregisters the loop.
#[derive(Debug)]
pub struct Heartbeat {
    id: u64,
    last_beat: Arc<AtomicU64>,
    liveness: Arc<LivenessInner>,
}

/// A loop that has not beaten within its limit, a task that ended, a key worked on for too
/// long: the `/healthz` error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Stalled {
    /// The name given to [`Liveness::register`] or [`Liveness::register_check`].
    pub name: &'static str,
    /// What is wrong (`no heartbeat for 31s (limit 30s)`).
    pub detail: String,
}

/// Formats whole seconds as `31s`, anything finer as `0.5s`.
struct Secs(Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}s", self.0.as_secs())
        } else {
            write!(f, "{:.1}s", self.0.as_secs_f64())
        }
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    /// No loops registered, hence healthy.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(LivenessInner {
                base: Instant::now(),
                next_id: AtomicU64::new(0),
                loops: Mutex::new(Vec::new()),
                checks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Registers a loop that must call [`Heartbeat::beat`] at least every `max_silence`.
    /// Registering counts as the first beat.
    pub fn register(&self, name: &'static str, max_silence: Duration) -> Heartbeat {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let last_beat = Arc::new(AtomicU64::new(self.inner.now_millis()));
        self.inner.lock().push(LoopEntry {
            id,
            name,
            max_silence,
            last_beat: Arc::clone(&last_beat),
        });
        Heartbeat {
            id,
            last_beat,
            liveness: Arc::clone(&self.inner),
        }
    }

    /// Registers a check that says what is wrong, if anything, whenever liveness is asked
    /// (keep it cheap: `/healthz` and the systemd watchdog ask every few seconds).
    pub fn register_check(
        &self,
        name: &'static str,
        check: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) {
        crate::sync::lock(&self.inner.checks).push(CheckEntry {
            name,
            check: Box::new(check),
        });
    }

    /// A guard for the long-lived task `name`: the task must keep it until `cancel` fires;
    /// dropped before (the task returned or panicked), it fails liveness for good, saying so.
    pub fn task(&self, name: &'static str, cancel: &CancellationToken) -> TaskGuard {
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&ended);
        self.register_check(name, move || {
            seen.load(Ordering::Relaxed).then(|| {
                format!("the {name} task ended while the daemon runs (a panic or a return)")
            })
        });
        TaskGuard {
            ended,
            cancel: cancel.clone(),
            name,
        }
    }

    /// The first registered loop that has been silent for longer than its limit, or check that
    /// failed, if any.
    pub fn check(&self) -> Result<(), Stalled> {
        let now = self.inner.now_millis();
        {
            let loops = self.inner.lock();
            for entry in loops.iter() {
                let silent_for = Duration::from_millis(
                    now.saturating_sub(entry.last_beat.load(Ordering::Relaxed)),
                );
                if silent_for > entry.max_silence {
                    return Err(Stalled {
                        name: entry.name,
                        detail: format!(
                            "no heartbeat for {} (limit {})",
                            Secs(silent_for),
                            Secs(entry.max_silence)
                        ),
                    });
                }
            }
        }
        for entry in crate::sync::lock(&self.inner.checks).iter() {
            if let Some(detail) = (entry.check)() {
                return Err(Stalled {
                    name: entry.name,
                    detail,
                });
            }
        }
        Ok(())
    }

    /// Whether [`Liveness::check`] passes.
    pub fn is_healthy(&self) -> bool {
        self.check().is_ok()
    }
}

impl LivenessInner {
    fn now_millis(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.base);
        u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LoopEntry>> {
        // The list is consistent after every statement, so a panic elsewhere cannot corrupt it.
        crate::sync::lock(&self.loops)
    }
}

impl Heartbeat {
    /// Records that the loop is making progress. Cheap: one atomic store.
    pub fn beat(&self) {
        self.last_beat
            .store(self.liveness.now_millis(), Ordering::Relaxed);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.liveness.lock().retain(|entry| entry.id != self.id);
    }
}

/// Held by a long-lived task for its whole life ([`Liveness::task`]).
#[derive(Debug)]
pub struct TaskGuard {
    ended: Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
    name: &'static str,
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if !self.cancel.is_cancelled() {
            tracing::error!(
                task = self.name,
                panicking = std::thread::panicking(),
                "a long-lived task ended while the daemon runs; liveness fails from now on"
            );
            self.ended.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use tokio::time::{advance, timeout};

    const DEADLINE: Duration = Duration::from_secs(10);

    fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        fut.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn readiness_flips_only_when_every_condition_is_ready() {
        let readiness = Readiness::new();
        assert!(!readiness.is_ready(), "no conditions means not ready");

        let informers = readiness.condition("informers");
        let cri = readiness.condition("cri");
        assert!(!readiness.is_ready());

        informers.set_ready();
        assert!(!readiness.is_ready(), "cri is still not started");
        cri.set_ready();
        assert!(readiness.is_ready());

        cri.set_not_ready("runtime unreachable");
        assert!(!readiness.is_ready());
        assert_eq!(
            readiness.report(),
            vec![
                ConditionReport {
                    name: "informers",
                    ready: true,
                    detail: String::new()
                },
                ConditionReport {
                    name: "cri",
                    ready: false,
                    detail: "runtime unreachable".to_owned()
                },
            ]
        );
    }

    #[tokio::test]
    async fn wait_ready_resolves_when_the_last_condition_becomes_ready() {
        let readiness = Readiness::new();
        let first = readiness.condition("first");
        let last = readiness.condition("last");

        let mut waiting = std::pin::pin!(readiness.wait_ready());
        assert!(poll_once(waiting.as_mut()).is_pending());
        first.set_ready();
        assert!(
            poll_once(waiting.as_mut()).is_pending(),
            "one condition left"
        );

        last.set_ready();
        timeout(DEADLINE, waiting)
            .await
            .expect("wait_ready did not resolve after the last condition became ready");
    }

    #[tokio::test]
    async fn a_task_that_ends_while_the_daemon_runs_fails_liveness_for_good() {
        let liveness = Liveness::new();
        let cancel = CancellationToken::new();
        let guard = liveness.task("nodeimage watch", &cancel);
        let panicked = tokio::spawn(async move {
            let _alive = guard;
            panic!("a bug in the watch");
        })
        .await;
        assert!(panicked.is_err());
        let stalled = liveness.check().expect_err("a dead task");
        assert_eq!(stalled.name, "nodeimage watch");
        assert!(stalled.detail.contains("ended"), "{stalled}");

        // at the drain, tasks end because they were told to: that is no failure
        let calm = Liveness::new();
        let stopping = CancellationToken::new();
        let guard = calm.task("pods watch", &stopping);
        stopping.cancel();
        drop(guard);
        assert_eq!(calm.check(), Ok(()));
    }

    #[test]
    fn a_check_that_finds_something_wrong_fails_liveness_with_its_words() {
        let liveness = Liveness::new();
        let wrong = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = Arc::clone(&wrong);
        liveness.register_check("recreate", move || {
            seen.load(Ordering::Relaxed)
                .then(|| "recreate: (\"ns\", \"p\") in work for 301s (limit 300s)".to_string())
        });
        assert_eq!(liveness.check(), Ok(()));
        wrong.store(true, Ordering::Relaxed);
        assert_eq!(
            liveness.check().expect_err("stuck").to_string(),
            "recreate: (\"ns\", \"p\") in work for 301s (limit 300s)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_heartbeat_no_longer_counts() {
        let liveness = Liveness::new();
        let kept = liveness.register("kept", Duration::from_secs(10));
        let dropped = liveness.register("dropped", Duration::from_millis(500));

        advance(Duration::from_millis(1500)).await;
        assert_eq!(
            liveness.check(),
            Err(Stalled {
                name: "dropped",
                detail: "no heartbeat for 1.5s (limit 0.5s)".into(),
            })
        );
        assert_eq!(
            liveness.check().expect_err("stalled").to_string(),
            "no heartbeat for 1.5s (limit 0.5s)"
        );

        drop(dropped);
        assert_eq!(liveness.check(), Ok(()));

        kept.beat();
        advance(Duration::from_secs(10)).await;
        assert_eq!(liveness.check(), Ok(()), "exactly at the limit is healthy");
        advance(Duration::from_millis(1)).await;
        assert_eq!(
            liveness.check().map_err(|s| s.name),
            Err("kept"),
            "the remaining heartbeat still counts"
        );
    }
}
