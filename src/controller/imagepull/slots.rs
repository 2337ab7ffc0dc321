//! The pull slots (`--max-workers-for-pull-image`): at most that many pulls at once, handed out
//! in two priorities. A freed slot goes to the longest-waiting [`Priority::Urgent`] request (an
//! in-place update's image, on a pod's critical path), else to the longest-waiting
//! [`Priority::Normal`] one (NodeImage tags, the next batch). A slot taken is never taken back:
//! a pull already running is not interrupted.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Which queue a request for a slot waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Served first: a pull the kubelet is about to need.
    Urgent,
    /// Served when no urgent request waits.
    Normal,
}

#[derive(Debug, Default)]
struct Queues {
    free: usize,
    urgent: VecDeque<oneshot::Sender<Permit>>,
    normal: VecDeque<oneshot::Sender<Permit>>,
}

/// A fixed number of slots, shared.
#[derive(Debug)]
pub struct Slots {
    queues: Mutex<Queues>,
}

/// One slot, given back when dropped.
#[derive(Debug)]
pub struct Permit {
    slots: Option<Arc<Slots>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl Slots {
    /// `n` slots.
    pub fn new(n: usize) -> Arc<Self> {
        Arc::new(Slots {
            queues: Mutex::new(Queues {
                free: n,
                ..Queues::default()
            }),
        })
    }

    /// Free slots now.
    pub fn available(&self) -> usize {
        crate::sync::lock(&self.queues).free
    }

    /// Takes a slot, waiting in the queue of `priority` while there is none. Dropping the future
    /// leaves the queue.
    pub async fn acquire(self: &Arc<Self>, priority: Priority) -> Permit {
        loop {
            let rx = {
                let mut q = crate::sync::lock(&self.queues);
                // nobody of the same or a higher priority is ahead
                let ahead = match priority {
                    Priority::Urgent => !q.urgent.is_empty(),
                    Priority::Normal => !q.urgent.is_empty() || !q.normal.is_empty(),
                };
                if q.free > 0 && !ahead {
                    q.free -= 1;
                    return Permit {
                        slots: Some(self.clone()),
                    };
                }
                let (tx, rx) = oneshot::channel();
                match priority {
                    Priority::Urgent => q.urgent.push_back(tx),
                    Priority::Normal => q.normal.push_back(tx),
                }
                rx
            };
            // a sender is dropped unsent only when its slots are: nothing is waited for then
            if let Ok(p) = rx.await {
                return p;
            }
        }
    }

    /// Hands a freed slot to the first waiter still waiting, urgent ones first, or frees it.
    fn release(self: &Arc<Self>) {
        let mut permit = Permit {
            slots: Some(self.clone()),
        };
        loop {
            // the lock is not held while sending: a permit dropped on the way comes back here
            let next = {
                let mut q = crate::sync::lock(&self.queues);
                match q.urgent.pop_front().or_else(|| q.normal.pop_front()) {
                    Some(tx) => tx,
                    None => {
                        q.free += 1;
                        permit.slots = None;
                        return;
                    }
                }
            };
            match next.send(permit) {
                Ok(()) => return,
                // that waiter left: the next one
                Err(back) => permit = back,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Polls `f` once: whether it is ready.
    fn ready<F: std::future::Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_an_urgent_request_before_normal_ones_that_waited_longer() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Normal).await;
        assert_eq!(slots.available(), 0);
        let mut normal = std::pin::pin!(slots.acquire(Priority::Normal));
        let mut urgent = std::pin::pin!(slots.acquire(Priority::Urgent));
        assert!(ready(normal.as_mut()).is_none(), "no slot free");
        assert!(ready(urgent.as_mut()).is_none(), "no slot free");
        // a running pull is not interrupted: the urgent one waits for the slot to be freed
        drop(held);
        let got = ready(urgent.as_mut()).expect("the urgent request gets the slot");
        assert!(
            ready(normal.as_mut()).is_none(),
            "the normal one still waits"
        );
        drop(got);
        let got = ready(normal.as_mut()).expect("then the normal one");
        drop(got);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn a_request_that_left_the_queue_does_not_keep_a_slot() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Normal).await;
        {
            let mut gone = std::pin::pin!(slots.acquire(Priority::Urgent));
            assert!(ready(gone.as_mut()).is_none());
        }
        let mut normal = std::pin::pin!(slots.acquire(Priority::Normal));
        assert!(ready(normal.as_mut()).is_none());
        drop(held);
        let got = ready(normal.as_mut()).expect("the slot skips the request that left");
        drop(got);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_request_dropped_before_it_looked_is_given_on() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Normal).await;
        let mut first = Box::pin(slots.acquire(Priority::Urgent));
        assert!(ready(first.as_mut()).is_none());
        let mut second = std::pin::pin!(slots.acquire(Priority::Normal));
        assert!(ready(second.as_mut()).is_none());
        // the slot is sent to `first`, which goes away without taking it
        drop(held);
        drop(first);
        let got = ready(second.as_mut()).expect("given on to the next waiter");
        drop(got);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn at_most_n_slots_are_out_at_once_under_contention() {
        let slots = Slots::new(3);
        let out = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let (slots, out, most) = (slots.clone(), out.clone(), most.clone());
                tokio::spawn(async move {
                    let p = if i % 3 == 0 {
                        Priority::Urgent
                    } else {
                        Priority::Normal
                    };
                    let _permit = slots.acquire(p).await;
                    let now = out.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    out.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("a task");
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(slots.available(), 3);
    }
}
