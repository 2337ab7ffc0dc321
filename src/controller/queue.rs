//! A work queue with client-go's guarantees: a key waits in the queue at most once, is never
//! processed by two workers at once, and a key added while it is being processed is processed
//! again afterwards. Delayed adds share one timer per queue, and a key waiting for its time is
//! waiting once (the earlier time wins, as in client-go's delaying queue): a retry storm adds no
//! task per retry. [`WorkQueue::run_worker`] survives a pass that panics: the key is released,
//! retried later, and the worker goes on; the key worked on longest is what liveness checks.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

struct Inner<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    /// Keys being processed, since when.
    active: HashMap<K, Instant>,
    dirty: HashSet<K>,
    /// Keys added for later, and when.
    waiting: HashMap<K, Instant>,
    /// Whether the timer task runs.
    timer: bool,
}

/// A deduplicating work queue shared by the event handlers and the workers.
pub struct WorkQueue<K> {
    inner: Arc<Mutex<Inner<K>>>,
    notify: Arc<Notify>,
    /// Wakes the timer task when a delayed key comes due earlier than it sleeps.
    wake_timer: Arc<Notify>,
    /// Passes that panicked.
    panics: Arc<AtomicU64>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
            notify: self.notify.clone(),
            wake_timer: self.wake_timer.clone(),
            panics: self.panics.clone(),
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
    /// Again after this long.
    After(Duration),
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        WorkQueue {
            inner: Arc::new(Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                active: HashMap::new(),
                dirty: HashSet::new(),
                waiting: HashMap::new(),
                timer: false,
            })),
            notify: Arc::new(Notify::new()),
            wake_timer: Arc::new(Notify::new()),
            panics: Arc::new(AtomicU64::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        crate::sync::lock(&self.inner)
    }

    /// Adds `key` unless it is already waiting; a key being processed is marked to run again.
    pub fn add(&self, key: K) {
        let mut q = self.lock();
        if q.active.contains_key(&key) {
            q.dirty.insert(key);
            return;
        }
        if q.queued.insert(key.clone()) {
            q.queue.push_back(key);
            drop(q);
            self.notify.notify_one();
        }
    }

    /// Adds `key` after `delay` (for retries and planned passes), unless `cancel` fires first.
    /// A key already waiting for its time keeps the earlier of the two times.
    pub fn add_after(&self, key: K, delay: Duration, cancel: &CancellationToken) {
        let at = super::later(Instant::now(), delay);
        let mut q = self.lock();
        match q.waiting.get(&key) {
            Some(t) if *t <= at => return,
            _ => {}
        }
        q.waiting.insert(key, at);
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
                let due: Vec<K> = q
                    .waiting
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in &due {
                    q.waiting.remove(k);
                }
                let next = q.waiting.values().min().copied();
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
                    q.active.insert(key.clone(), Instant::now());
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
        q.active.remove(key);
        if q.dirty.remove(key) && q.queued.insert(key.clone()) {
            q.queue.push_back(key.clone());
            drop(q);
            self.notify.notify_one();
        }
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
    /// its key: it is released, logged and tried again after `after_panic`, and the worker takes
    /// the next key (a panic is a bug; another pass may still get the key's work done).
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
                Ok(Pass::Done) => {}
                Ok(Pass::After(delay)) => self.add_after(key.clone(), delay, &cancel),
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(queue = what, key = ?key, panic = %message, retry_in = ?after_panic,
                        "a pass panicked (a bug): its key is released and tried again later");
                    self.panics.fetch_add(1, Ordering::Relaxed);
                    self.add_after(key.clone(), after_panic, &cancel);
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
}
