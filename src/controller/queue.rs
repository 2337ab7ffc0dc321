//! A work queue with client-go's guarantees: a key waits in the queue at most once, is never
//! processed by two workers at once, and a key added while it is being processed is processed
//! again afterwards.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

struct Inner<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    dirty: HashSet<K>,
}

/// A deduplicating work queue shared by the event handlers and the workers.
pub struct WorkQueue<K> {
    inner: Arc<Mutex<Inner<K>>>,
    notify: Arc<Notify>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue {
            inner: self.inner.clone(),
            notify: self.notify.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        WorkQueue {
            inner: Arc::new(Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                dirty: HashSet::new(),
            })),
            notify: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        crate::sync::lock(&self.inner)
    }

    /// Adds `key` unless it is already waiting; a key being processed is marked to run again.
    pub fn add(&self, key: K) {
        let mut q = self.lock();
        if q.active.contains(&key) {
            q.dirty.insert(key);
            return;
        }
        if q.queued.insert(key.clone()) {
            q.queue.push_back(key);
            drop(q);
            self.notify.notify_one();
        }
    }

    /// Adds `key` after `delay` (for retries), unless `cancel` fires first.
    pub fn add_after(&self, key: K, delay: Duration, cancel: &CancellationToken) {
        let this = self.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = tokio::time::sleep(delay) => this.add(key),
            }
        });
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
                    q.active.insert(key.clone());
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

    /// Keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
