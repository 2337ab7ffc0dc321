//! A work queue with client-go's guarantees: a key waits in the queue at most once, is never
//! processed by two workers at once, and a key added while it is being processed is processed
//! again afterwards. Delayed adds share one timer per queue, and a key waiting for its time is
//! waiting once (the earlier time wins, as in client-go's delaying queue): a retry storm adds no
//! task per retry. A key's retries back off as client-go's per-item failure limiter does: the
//! pause asked for doubles with each failure in a row, up to [`RETRY_DELAY_LIMIT`], and a pass
//! that succeeds starts the key over (the daemon's one exponential back-off,
//! [`crate::backoff::exponential`], without jitter: client-go's limiter has none). [`WorkQueue::run_worker`] survives a pass that panics: the key is released,
//! retried later, and the worker goes on; the key worked on longest is what liveness checks.
//! The timer takes due keys from a heap ordered by time, and [`WorkQueue::remove`] forgets a
//! key whose object is gone, however long it was to wait.
//! A queue made [`WorkQueue::with_metrics`] reports client-go's work queue metrics
//! ([`metrics`]), counted as client-go counts them.

mod metrics;

pub use self::metrics::{CONTAINER_META_QUEUE, QueueMetrics, RECREATE_QUEUE};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::metrics::QueueSeries;

/// The longest pause before a key's retry, however many of its passes failed in a row. client-go
/// allows 1000 s; a key here is one pod on this node, whose pass should come soon after what
/// failed it (an API server, a runtime) is back, and a minute bounds the calls of a node's pods
/// during an outage (one per pod a minute).
pub const RETRY_DELAY_LIMIT: Duration = Duration::from_secs(60);

struct Inner<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    /// Keys being processed, since when.
    active: HashMap<K, Instant>,
    dirty: HashSet<K>,
    /// Keys added for later: when, and the number of their entry in `due`.
    waiting: HashMap<K, (Instant, u64)>,
    /// The times of `waiting`, soonest first, each with its entry's number; an entry whose
    /// number `waiting` no longer has (the key came due earlier, or was removed) is stale and
    /// skipped. The timer takes what is due from its top, never walking every waiting key.
    due: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The key of each entry of `due`.
    due_keys: HashMap<u64, K>,
    /// The number of the next entry.
    next_entry: u64,
    /// Whether the timer task runs.
    timer: bool,
    /// When each key waiting to be taken (queued, or added while in work) was added, for
    /// `workqueue_queue_duration_seconds`; kept only where the queue has metrics.
    added_at: HashMap<K, Instant>,
    /// Keys whose last passes failed, and how many in a row.
    failures: HashMap<K, u32>,
}

impl<K> Inner<K> {
    /// Drops the stale entries of `due` once they outnumber the live ones (plus a margin), so a
    /// key moved earlier again and again, or many keys removed, cannot grow it without bound.
    fn compact_due(&mut self) {
        if self.due.len() > 2 * self.due_keys.len() + 64 {
            let live = &self.due_keys;
            self.due
                .retain(|Reverse((_, entry))| live.contains_key(entry));
        }
    }
}

/// A deduplicating work queue shared by the event handlers and the workers.
pub struct WorkQueue<K> {
    inner: Arc<Mutex<Inner<K>>>,
    notify: Arc<Notify>,
    /// Wakes the timer task when a delayed key comes due earlier than it sleeps.
    wake_timer: Arc<Notify>,
    /// Passes that panicked.
    panics: Arc<AtomicU64>,
    /// The queue's series of client-go's work queue metrics, if it reports them.
    series: Option<Arc<QueueSeries>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
            notify: self.notify.clone(),
            wake_timer: self.wake_timer.clone(),
            panics: self.panics.clone(),
            series: self.series.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// What a pass over a key asks of the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Done until the key is added again.
    Done,
    /// Again after this long, as planned (a poll, a grace period running out): not a retry.
    After(Duration),
    /// The pass failed: again after the pause of [`Retry`], counted in `workqueue_retries_total`
    /// (as controller-runtime counts a reconcile that returned an error).
    Retry(Retry),
}

/// The longer of `a` and `b` (in a `const fn`).
const fn longer(a: Duration, b: Duration) -> Duration {
    if a.as_nanos() >= b.as_nanos() { a } else { b }
}

/// How a key's retries back off: the first pause, doubled with each failure in a row, up to a
/// limit ([`RETRY_DELAY_LIMIT`] unless said otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    first: Duration,
    limit: Duration,
}

impl Retry {
    /// First after `first`, then doubling up to [`RETRY_DELAY_LIMIT`] (or `first`, if longer).
    pub const fn after(first: Duration) -> Self {
        Retry {
            first,
            limit: longer(RETRY_DELAY_LIMIT, first),
        }
    }

    /// Doubling up to `limit` only (a failure that costs nothing to retry and should be retried
    /// soon after it ends, such as a runtime restarting).
    #[must_use]
    pub const fn at_most(self, limit: Duration) -> Self {
        Retry {
            first: self.first,
            limit: longer(limit, self.first),
        }
    }

    /// The first pause.
    pub const fn first(self) -> Duration {
        self.first
    }

    /// The pause after `failures` failed passes in a row (the first is 1).
    pub fn pause(self, failures: u32) -> Duration {
        crate::backoff::exponential(failures.saturating_sub(1), self.first, self.limit)
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue that reports no metrics.
    pub fn new() -> Self {
        WorkQueue {
            inner: Arc::new(Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                active: HashMap::new(),
                dirty: HashSet::new(),
                waiting: HashMap::new(),
                due: BinaryHeap::new(),
                due_keys: HashMap::new(),
                next_entry: 0,
                timer: false,
                added_at: HashMap::new(),
                failures: HashMap::new(),
            })),
            notify: Arc::new(Notify::new()),
            wake_timer: Arc::new(Notify::new()),
            panics: Arc::new(AtomicU64::new(0)),
            series: None,
        }
    }

    /// An empty queue reporting client-go's work queue metrics as the queue `name` (kruise-daemon's
    /// queue names: [`CONTAINER_META_QUEUE`], [`RECREATE_QUEUE`]).
    pub fn with_metrics(name: &'static str, metrics: &QueueMetrics) -> Self {
        let mut q = Self::new();
        let inner: Weak<Mutex<Inner<K>>> = Arc::downgrade(&q.inner);
        let in_work = Box::new(move || {
            let inner = inner.upgrade()?;
            let q = crate::sync::lock(&inner);
            let now = Instant::now();
            Some(q.active.values().fold((0.0, 0.0), |(sum, longest), since| {
                let secs = now.saturating_duration_since(*since).as_secs_f64();
                (sum + secs, f64::max(longest, secs))
            }))
        });
        q.series = Some(Arc::new(metrics.queue(name, in_work)));
        q
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        crate::sync::lock(&self.inner)
    }

    /// Adds `key` unless it is already waiting; a key being processed is marked to run again.
    pub fn add(&self, key: K) {
        let mut q = self.lock();
        if q.active.contains_key(&key) {
            if q.dirty.insert(key.clone()) {
                self.count_add(&mut q, key);
            }
            return;
        }
        if q.queued.insert(key.clone()) {
            self.count_add(&mut q, key.clone());
            q.queue.push_back(key);
            drop(q);
            self.notify.notify_one();
        }
    }

    /// Counts a key that now waits to be taken (client-go's `metrics.add`: the adds, the depth,
    /// and the time it was added unless it waits already).
    fn count_add(&self, q: &mut Inner<K>, key: K) {
        if let Some(s) = &self.series {
            s.adds.inc();
            s.depth.inc();
            q.added_at.entry(key).or_insert_with(Instant::now);
        }
    }

    /// Adds `key` again as the retry of a failed pass, counted in `workqueue_retries_total`
    /// (client-go's `AddRateLimited`): after the pause of `retry` for the failures of `key` in a
    /// row, until [`WorkQueue::forget`].
    pub fn retry_after(&self, key: K, retry: Retry, cancel: &CancellationToken) {
        if let Some(s) = &self.series {
            s.retries.inc();
        }
        let failures = {
            let mut q = self.lock();
            let n = q.failures.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        self.add_after(key, retry.pause(failures), cancel);
    }

    /// Starts `key`'s retries over: its pass succeeded (client-go's `Forget`).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// The pause [`WorkQueue::retry_after`] would give `key` now: for logs.
    pub fn next_retry(&self, key: &K, retry: Retry) -> Duration {
        let failed = self.lock().failures.get(key).copied().unwrap_or(0);
        retry.pause(failed.saturating_add(1))
    }

    /// Adds `key` after `delay` (for retries and planned passes), unless `cancel` fires first.
    /// A key already waiting for its time keeps the earlier of the two times.
    pub fn add_after(&self, key: K, delay: Duration, cancel: &CancellationToken) {
        let at = crate::k8s::time::later(Instant::now(), delay);
        let mut q = self.lock();
        match q.waiting.get(&key) {
            Some((t, _)) if *t <= at => return,
            _ => {}
        }
        let entry = q.next_entry;
        q.next_entry += 1;
        if let Some((_, stale)) = q.waiting.insert(key.clone(), (at, entry)) {
            q.due_keys.remove(&stale);
        }
        q.due_keys.insert(entry, key);
        q.due.push(Reverse((at, entry)));
        q.compact_due();
        let start = !std::mem::replace(&mut q.timer, true);
        drop(q);
        if start {
            tokio::spawn(self.clone().timer(cancel.clone()));
        }
        self.wake_timer.notify_one();
    }

    /// Moves delayed keys into the queue when their time comes; one task per queue.
    async fn timer(self, cancel: CancellationToken) {
        loop {
            let woken = self.wake_timer.notified();
            let next = {
                let mut q = self.lock();
                let now = Instant::now();
                let mut due = Vec::new();
                let mut next = None;
                while let Some(Reverse((at, entry))) = q.due.peek().copied() {
                    let Some(key) = q.due_keys.get(&entry).cloned() else {
                        q.due.pop(); // stale
                        continue;
                    };
                    if at > now {
                        next = Some(at);
                        break;
                    }
                    q.due.pop();
                    q.due_keys.remove(&entry);
                    q.waiting.remove(&key);
                    due.push(key);
                }
                drop(q);
                for k in due {
                    self.add(k);
                }
                next
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = woken => {}
                () = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Waits for the next key and marks it active. `None` once `cancel` fires.
    pub async fn next(&self, cancel: &CancellationToken) -> Option<K> {
        loop {
            // register interest before checking, so an add between the check and the wait is
            // not lost
            let notified = self.notify.notified();
            {
                let mut q = self.lock();
                if let Some(key) = q.queue.pop_front() {
                    q.queued.remove(&key);
                    let now = Instant::now();
                    if let Some(s) = &self.series {
                        s.depth.dec();
                        if let Some(added) = q.added_at.remove(&key) {
                            s.queue_duration
                                .observe(now.saturating_duration_since(added).as_secs_f64());
                        }
                    }
                    q.active.insert(key.clone(), now);
                    let more = !q.queue.is_empty();
                    drop(q);
                    if more {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = notified => {}
            }
        }
    }

    /// Marks `key` done; if it was added meanwhile, queues it again.
    pub fn done(&self, key: &K) {
        let mut q = self.lock();
        if let (Some(since), Some(s)) = (q.active.remove(key), &self.series) {
            s.work_duration.observe(since.elapsed().as_secs_f64());
        }
        if q.dirty.remove(key) && q.queued.insert(key.clone()) {
            q.queue.push_back(key.clone());
            drop(q);
            self.notify.notify_one();
        }
    }

    /// Forgets `key` (its object is gone): its wait for a later time, its place in the queue
    /// and its failures. A pass already running ends as it will; nothing brings the key back
    /// but a new add.
    pub fn remove(&self, key: &K) {
        let mut q = self.lock();
        if let Some((_, entry)) = q.waiting.remove(key) {
            q.due_keys.remove(&entry);
        }
        q.failures.remove(key);
        // a key waiting to be taken (queued, or added again while in work) counts in the depth
        let dirty = q.dirty.remove(key);
        let queued = q.queued.remove(key);
        if queued {
            q.queue.retain(|k| k != key);
        }
        if let (true, Some(s)) = (dirty || queued, &self.series) {
            s.depth.dec();
        }
        q.added_at.remove(key);
        q.compact_due();
    }

    /// Keys waiting (not counting those being processed or waiting for their time).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys waiting for their time (delayed adds).
    pub fn delayed(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Passes that panicked so far.
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// The key worked on longest, and for how long.
    pub fn longest_active(&self) -> Option<(K, Duration)> {
        let q = self.lock();
        q.active
            .iter()
            .min_by_key(|(_, since)| **since)
            .map(|(k, since)| (k.clone(), since.elapsed()))
    }

    /// One worker: takes keys until `cancel`, runs `pass` on each (never two passes of one key
    /// at once), marks it done and requeues it as the pass asks. A pass that panics costs only
    /// its key: it is released, logged and tried again after `after_panic` (a retry), and the
    /// worker takes the next key (a panic is a bug; another pass may still get the key's work
    /// done).
    pub async fn run_worker<F, Fut>(
        &self,
        what: &'static str,
        cancel: CancellationToken,
        after_panic: Duration,
        pass: F,
    ) where
        K: Debug,
        F: Fn(K) -> Fut,
        Fut: Future<Output = Pass>,
    {
        while let Some(key) = self.next(&cancel).await {
            let outcome = std::panic::AssertUnwindSafe(pass(key.clone()))
                .catch_unwind()
                .await;
            match outcome {
                Ok(Pass::Done) => self.forget(&key),
                Ok(Pass::After(delay)) => {
                    self.forget(&key);
                    self.add_after(key.clone(), delay, &cancel);
                }
                Ok(Pass::Retry(delay)) => self.retry_after(key.clone(), delay, &cancel),
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(queue = what, key = ?key, panic = %message, retry_in = ?after_panic,
                        "a pass panicked (a bug): its key is released and tried again later");
                    self.panics.fetch_add(1, Ordering::Relaxed);
                    self.retry_after(key.clone(), Retry::after(after_panic), &cancel);
                }
            }
            self.done(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_key_waits_in_the_queue_once() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let cancel = CancellationToken::new();
        assert_eq!(q.next(&cancel).await, Some("a"));
        assert_eq!(q.next(&cancel).await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_active_runs_again_after_done_and_not_concurrently() {
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        q.add("a");
        let k = q.next(&cancel).await.unwrap();
        q.add("a");
        assert!(q.is_empty(), "not handed to a second worker while active");
        q.done(&k);
        let again = tokio::time::timeout(LIMIT, q.next(&cancel))
            .await
            .expect("re-queued key was not delivered");
        assert_eq!(again, Some("a"));
    }

    #[tokio::test]
    async fn next_wakes_when_a_key_arrives_and_ends_on_cancel() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let cancel = CancellationToken::new();
        let waiter = {
            let q = q.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move { q.next(&cancel).await })
        };
        q.add(7);
        let got = tokio::time::timeout(LIMIT, waiter)
            .await
            .expect("worker never woke")
            .unwrap();
        assert_eq!(got, Some(7));
        cancel.cancel();
        assert_eq!(
            tokio::time::timeout(LIMIT, q.next(&cancel)).await.unwrap(),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_storm_on_one_key_is_one_timer_and_the_earliest_time_wins() {
        // 2c6dc4e spawned a sleeping task per add_after: a key retried in a loop piled them up
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        for _ in 0..10_000 {
            q.add_after("k", Duration::from_secs(60), &cancel);
        }
        q.add_after("k", Duration::from_secs(5), &cancel);
        q.add_after("k", Duration::from_secs(30), &cancel);
        assert_eq!(q.delayed(), 1);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            tokio::time::timeout(LIMIT, q.next(&cancel)).await.unwrap(),
            Some("k")
        );
        assert_eq!(q.delayed(), 0, "the later times went with the earlier");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_panics_releases_its_key_and_the_worker_goes_on() {
        // 2c6dc4e kept a panicking pass's key active for ever and lost the worker: four such
        // pods and no container meta worker was left
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let worker = {
            let (q, cancel, seen) = (q.clone(), cancel.clone(), seen.clone());
            tokio::spawn(async move {
                q.run_worker("test", cancel, Duration::from_secs(1), |k: &'static str| {
                    let seen = seen.clone();
                    async move {
                        let first = {
                            let mut s = crate::sync::lock(&seen);
                            s.push(k);
                            s.iter().filter(|x| **x == k).count() == 1
                        };
                        assert!(!(k == "bad" && first), "boom");
                        Pass::Done
                    }
                })
                .await;
            })
        };
        q.add("bad");
        q.add("good");
        let deadline = Instant::now() + LIMIT;
        while crate::sync::lock(&seen).len() < 3 {
            assert!(
                Instant::now() < deadline,
                "the worker stopped: {:?}",
                crate::sync::lock(&seen)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*crate::sync::lock(&seen), vec!["bad", "good", "bad"]);
        assert!(q.longest_active().is_none(), "no key held");
        cancel.cancel();
        tokio::time::timeout(LIMIT, worker).await.unwrap().unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_double_the_pause_up_to_a_minute_and_a_success_starts_over() {
        // the 5-minute outage test of 9805b61 failed in CI: three pods whose annotation write
        // failed were retried every 3 s, 273 writes while the API server was away
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        let passes: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let worker = {
            let (q, cancel, passes, fail) =
                (q.clone(), cancel.clone(), passes.clone(), fail.clone());
            tokio::spawn(async move {
                q.run_worker(
                    "test",
                    cancel,
                    Duration::from_secs(1),
                    |_k: &'static str| {
                        let (passes, fail) = (passes.clone(), fail.clone());
                        async move {
                            crate::sync::lock(&passes).push(Instant::now());
                            if fail.load(Ordering::Relaxed) {
                                Pass::Retry(Retry::after(Duration::from_secs(3)))
                            } else {
                                Pass::Done
                            }
                        }
                    },
                )
                .await;
            })
        };
        let passes_after = |n: usize| {
            let passes = passes.clone();
            async move {
                let deadline = Instant::now() + Duration::from_secs(600);
                while crate::sync::lock(&passes).len() < n {
                    assert!(Instant::now() < deadline, "pass {n} never came");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let pauses = |from: usize| -> Vec<u64> {
            let p = crate::sync::lock(&passes);
            p[from..]
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).as_secs_f64().round() as u64)
                .collect()
        };
        q.add("k");
        passes_after(9).await;
        assert_eq!(pauses(0), vec![3, 6, 12, 24, 48, 60, 60, 60]);
        // a pass that succeeds forgets the failures: the next failure waits 3 s again
        fail.store(false, Ordering::Relaxed);
        passes_after(10).await;
        fail.store(true, Ordering::Relaxed);
        q.add("k");
        passes_after(12).await;
        assert_eq!(pauses(10), vec![3]);
        cancel.cancel();
        tokio::time::timeout(LIMIT, worker).await.unwrap().unwrap();
    }

    #[test]
    fn a_pause_longer_than_the_limit_is_kept_a_lower_limit_holds_and_doubling_never_overflows() {
        let secs = Duration::from_secs;
        assert_eq!(Retry::after(secs(600)).pause(5), secs(600));
        let soon = Retry::after(Duration::from_millis(250));
        assert_eq!(soon.pause(1), Duration::from_millis(250));
        assert_eq!(soon.pause(3), secs(1));
        assert_eq!(soon.pause(u32::MAX), RETRY_DELAY_LIMIT);
        assert_eq!(soon.at_most(secs(2)).pause(100), secs(2));
        assert_eq!(Retry::after(secs(3)).at_most(secs(1)).pause(2), secs(3));
    }

    #[test]
    fn a_keys_pauses_are_the_daemons_exponential_backoff_of_its_failures_without_jitter() {
        let first = Duration::from_secs(3);
        for failures in 1..12 {
            assert_eq!(
                Retry::after(first).pause(failures),
                crate::backoff::exponential(failures - 1, first, RETRY_DELAY_LIMIT),
                "after {failures} failures"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_key_worked_on_longest_is_known() {
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        q.add("a");
        let k = q.next(&cancel).await.unwrap();
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(q.longest_active(), Some(("a", Duration::from_secs(7))));
        q.done(&k);
        assert_eq!(q.longest_active(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_delivers_after_the_delay() {
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        q.add_after("x", Duration::from_secs(3), &cancel);
        tokio::task::yield_now().await;
        assert!(q.is_empty());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            tokio::time::timeout(LIMIT, q.next(&cancel)).await.unwrap(),
            Some("x")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_due_in_time_order_whatever_order_they_were_added_in() {
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        for (key, secs) in [("c", 30), ("a", 10), ("b", 20), ("a", 40)] {
            q.add_after(key, Duration::from_secs(secs), &cancel);
        }
        assert_eq!(q.delayed(), 3, "a keeps its earlier time");
        for (key, secs) in [("a", 10), ("b", 10), ("c", 10)] {
            tokio::time::advance(Duration::from_secs(secs)).await;
            let got = tokio::time::timeout(LIMIT, q.next(&cancel)).await;
            assert_eq!(got.expect("a due key was not delivered"), Some(key));
            q.done(&key);
        }
        assert_eq!(q.delayed(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_key_waiting_a_year_is_gone_at_once_and_never_delivered() {
        // issue 43, row 11: a deleted object's key stayed for its whole long add_after
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        q.add_after("gone", Duration::from_secs(365 * 24 * 3600), &cancel);
        q.add_after("kept", Duration::from_secs(5), &cancel);
        q.add("queued-gone");
        q.retry_after("gone", Retry::after(Duration::from_secs(1)), &cancel);
        q.remove(&"gone");
        q.remove(&"queued-gone");
        assert_eq!((q.delayed(), q.len()), (1, 0));
        assert_eq!(
            q.next_retry(&"gone", Retry::after(Duration::from_secs(1))),
            Duration::from_secs(1)
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        let got = tokio::time::timeout(LIMIT, q.next(&cancel)).await;
        assert_eq!(got.expect("the kept key was not delivered"), Some("kept"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_moved_earlier_again_and_again_keeps_the_timer_heap_bounded() {
        let q = WorkQueue::new();
        let cancel = CancellationToken::new();
        for i in 0..10_000u64 {
            q.add_after("k", Duration::from_secs(1_000_000 - i), &cancel);
        }
        let heap = q.lock().due.len();
        assert!(heap <= 2 + 64, "{heap} timer entries for one waiting key");
        assert_eq!(q.delayed(), 1);
    }

    // === the work queue metrics ===

    /// The exposition of `registry`, and the value of the series `series` in it.
    fn scrape(registry: &prometheus_client::registry::Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.parse().unwrap())
    }

    const CRR: &str = r#"{name="crr",controller="crr"}"#;

    #[tokio::test(start_paused = true)]
    async fn client_gos_work_queue_families_are_exported_under_its_names_labelled_by_queue() {
        // the names and labels kruise-daemon's /metrics has (controller-runtime v0.20.2
        // pkg/internal/metrics/workqueue.go; spec 6.2), so its dashboards keep working
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let crr = WorkQueue::with_metrics(RECREATE_QUEUE, &metrics);
        let meta = WorkQueue::with_metrics(CONTAINER_META_QUEUE, &metrics);
        crr.add("a");
        crr.add("b");
        crr.add("a");
        meta.add("p");
        let text = scrape(&registry);
        assert_eq!(
            value(&text, &format!("workqueue_depth{CRR}")),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, &format!("workqueue_adds_total{CRR}")),
            Some(2.0)
        );
        assert_eq!(
            value(&text, &format!("workqueue_retries_total{CRR}")),
            Some(0.0)
        );
        let meta_labels = r#"{name="runtime_container_meta",controller="runtime_container_meta"}"#;
        assert_eq!(
            value(&text, &format!("workqueue_depth{meta_labels}")),
            Some(1.0)
        );
        for family in [
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
        ] {
            assert!(
                value(&text, &format!("{family}{CRR}")).is_some(),
                "{family} missing: {text}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn time_is_measured_from_add_to_take_and_from_take_to_done_and_work_in_progress_is_seen()
    {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let q = WorkQueue::with_metrics(RECREATE_QUEUE, &metrics);
        let cancel = CancellationToken::new();
        q.add("a");
        tokio::time::advance(Duration::from_secs(3)).await;
        let k = q.next(&cancel).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let text = scrape(&registry);
        assert_eq!(value(&text, &format!("workqueue_depth{CRR}")), Some(0.0));
        assert_eq!(
            value(&text, &format!("workqueue_queue_duration_seconds_sum{CRR}")),
            Some(3.0),
            "{text}"
        );
        assert_eq!(
            value(&text, &format!("workqueue_unfinished_work_seconds{CRR}")),
            Some(2.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("workqueue_longest_running_processor_seconds{CRR}")
            ),
            Some(2.0)
        );
        q.done(&k);
        let text = scrape(&registry);
        assert_eq!(
            value(&text, &format!("workqueue_work_duration_seconds_sum{CRR}")),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, &format!("workqueue_unfinished_work_seconds{CRR}")),
            Some(0.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_in_work_is_one_add_and_waits_in_the_depth_until_taken_again() {
        // client-go counts a key added during its processing at once (it is dirty), and not
        // again when Done puts it back in the queue
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let q = WorkQueue::with_metrics(RECREATE_QUEUE, &metrics);
        let cancel = CancellationToken::new();
        q.add("a");
        let k = q.next(&cancel).await.unwrap();
        q.add("a");
        q.add("a");
        let text = scrape(&registry);
        assert_eq!(
            value(&text, &format!("workqueue_adds_total{CRR}")),
            Some(2.0)
        );
        assert_eq!(value(&text, &format!("workqueue_depth{CRR}")), Some(1.0));
        q.done(&k);
        assert_eq!(
            value(&scrape(&registry), &format!("workqueue_depth{CRR}")),
            Some(1.0)
        );
        assert_eq!(q.next(&cancel).await, Some("a"));
        let text = scrape(&registry);
        assert_eq!(value(&text, &format!("workqueue_depth{CRR}")), Some(0.0));
        assert_eq!(
            value(&text, &format!("workqueue_adds_total{CRR}")),
            Some(2.0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_or_panicking_pass_is_a_retry_and_a_planned_requeue_is_not() {
        // controller-runtime counts AddRateLimited (a reconcile error) as a retry, and not
        // AddAfter (RequeueAfter of a successful reconcile): containermeta's and recreate's
        // failures are Pass::Retry, recreate's polls Pass::After
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        let q = WorkQueue::with_metrics(RECREATE_QUEUE, &metrics);
        let cancel = CancellationToken::new();
        let passes = Arc::new(AtomicU64::new(0));
        let worker = {
            let (q, cancel, passes) = (q.clone(), cancel.clone(), passes.clone());
            tokio::spawn(async move {
                let stop = cancel.clone();
                q.run_worker(
                    "test",
                    cancel,
                    Duration::from_secs(600),
                    |k: &'static str| {
                        let (passes, stop) = (passes.clone(), stop.clone());
                        async move {
                            // the worker ends once the last key's outcome is handled
                            if passes.fetch_add(1, Ordering::Relaxed) == 2 {
                                stop.cancel();
                            }
                            match k {
                                "planned" => Pass::After(Duration::from_secs(600)),
                                "failed" => Pass::Retry(Retry::after(Duration::from_secs(600))),
                                _ => panic!("boom"),
                            }
                        }
                    },
                )
                .await;
            })
        };
        for k in ["planned", "failed", "panics"] {
            q.add(k);
        }
        tokio::time::timeout(LIMIT, worker)
            .await
            .expect("the worker did not pass over the three keys")
            .unwrap();
        assert_eq!(passes.load(Ordering::Relaxed), 3);
        let text = scrape(&registry);
        assert_eq!(
            value(&text, &format!("workqueue_retries_total{CRR}")),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            value(&text, &format!("workqueue_adds_total{CRR}")),
            Some(3.0)
        );
    }

    #[test]
    fn a_dropped_queue_is_no_longer_read_for_its_work_in_progress() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = QueueMetrics::register(&mut registry);
        drop(WorkQueue::<&str>::with_metrics(RECREATE_QUEUE, &metrics));
        let text = scrape(&registry);
        assert_eq!(
            value(&text, &format!("workqueue_unfinished_work_seconds{CRR}")),
            None,
            "{text}"
        );
    }
}
