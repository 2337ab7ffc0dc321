//! The pull slots (`--max-workers-for-pull-image`): at most that many pulls at once, handed out
//! in two priorities. A freed slot goes to the longest-waiting [`Priority::Urgent`] request (an
//! in-place update's image, on a pod's critical path), else to the longest-waiting
//! [`Priority::Normal`] one (NodeImage tags, the next batch), normal ones in the order of their
//! [`Rank`] (then of arrival). A slot taken is never taken back (a pre-pull called off gives
//! its own back: `turn.rs`). Normal requests can be [held](Slots::hold): they queue, and are
//! served in order once let go (the pre-pulls' yield: `turn.rs`).

use std::collections::{BTreeMap, VecDeque};
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

/// Where a normal request stands in its queue: lower first, equal ones in order of arrival
/// (the order of pre-pulls: `turn.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    /// 0: an image a pod on the node runs; 1: any other.
    pub class: u8,
    /// When it was asked for (seconds since the epoch); unknown ones last.
    pub created: i64,
    /// The image, for a stable order among equals.
    pub name: String,
}

#[derive(Debug, Default)]
struct Queues {
    free: usize,
    urgent: VecDeque<oneshot::Sender<Permit>>,
    normal: BTreeMap<(Rank, u64), oneshot::Sender<Permit>>,
    /// Arrivals so far: the order among equal ranks.
    arrivals: u64,
    /// Normal requests are held back.
    held: bool,
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
        self.acquire_ranked(priority, Rank::default()).await
    }

    /// [`acquire`](Self::acquire), a normal request placed by `rank`.
    pub async fn acquire_ranked(self: &Arc<Self>, priority: Priority, rank: Rank) -> Permit {
        self.enqueue(priority, rank).wait().await
    }

    /// Takes a slot now, or a place in the queue of `priority` now (the order of calls is the
    /// order of arrival); [`Ticket::wait`] waits for the slot. Dropping the ticket leaves the
    /// queue.
    pub fn enqueue(self: &Arc<Self>, priority: Priority, rank: Rank) -> Ticket {
        let mut q = crate::sync::lock(&self.queues);
        // nobody of the same or a higher priority is ahead
        let ahead = match priority {
            Priority::Urgent => !q.urgent.is_empty(),
            Priority::Normal => !q.urgent.is_empty() || !q.normal.is_empty() || q.held,
        };
        if q.free > 0 && !ahead {
            q.free -= 1;
            return Ticket::Granted(Permit {
                slots: Some(self.clone()),
            });
        }
        let (tx, rx) = oneshot::channel();
        match priority {
            Priority::Urgent => q.urgent.push_back(tx),
            Priority::Normal => {
                q.arrivals += 1;
                let at = q.arrivals;
                q.normal.insert((rank.clone(), at), tx);
            }
        }
        Ticket::Queued {
            rx,
            slots: self.clone(),
            priority,
            rank,
        }
    }

    /// Holds normal requests back (`true`: they queue, and a freed slot goes to urgent ones
    /// only), or lets them go (`false`: free slots go to the queued ones, in order).
    pub fn hold(self: &Arc<Self>, held: bool) {
        crate::sync::lock(&self.queues).held = held;
        if held {
            return;
        }
        loop {
            let next = {
                let mut q = crate::sync::lock(&self.queues);
                if q.free == 0 || q.held {
                    return;
                }
                let Some((_, tx)) = q.normal.pop_first() else {
                    return;
                };
                q.free -= 1;
                tx
            };
            // a waiter that left gives the slot back as its permit drops, to the next one
            let _ = next.send(Permit {
                slots: Some(self.clone()),
            });
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
                let next = match q.urgent.pop_front() {
                    Some(tx) => Some(tx),
                    None if q.held => None,
                    None => q.normal.pop_first().map(|(_, tx)| tx),
                };
                match next {
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

/// A slot taken, or a place in its queue.
#[derive(Debug)]
pub enum Ticket {
    /// The slot.
    Granted(Permit),
    /// A place in the queue.
    Queued {
        /// Where the slot comes.
        rx: oneshot::Receiver<Permit>,
        /// The slots, to ask again should the sender go.
        slots: Arc<Slots>,
        /// Its queue.
        priority: Priority,
        /// Its place among normal requests.
        rank: Rank,
    },
}

impl Ticket {
    /// The slot, once it is this ticket's turn.
    pub async fn wait(self) -> Permit {
        match self {
            Ticket::Granted(p) => p,
            Ticket::Queued {
                rx,
                slots,
                priority,
                rank,
            } => match rx.await {
                Ok(p) => p,
                // a sender is dropped unsent only when its slots are: ask again
                Err(_) => Box::pin(slots.acquire_ranked(priority, rank)).await,
            },
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
    async fn a_freed_slot_goes_to_the_lowest_rank_then_to_the_longest_waiting() {
        let slots = Slots::new(1);
        let held = slots.acquire(Priority::Normal).await;
        let rank = |class, created, name: &str| Rank {
            class,
            created,
            name: name.to_string(),
        };
        let mut late = std::pin::pin!(slots.acquire_ranked(Priority::Normal, rank(1, 9, "a")));
        let mut old = std::pin::pin!(slots.acquire_ranked(Priority::Normal, rank(1, 1, "z")));
        let mut twin = std::pin::pin!(slots.acquire_ranked(Priority::Normal, rank(1, 1, "z")));
        let mut pods = std::pin::pin!(slots.acquire_ranked(Priority::Normal, rank(0, 9, "z")));
        assert!(ready(late.as_mut()).is_none());
        assert!(ready(old.as_mut()).is_none());
        assert!(ready(twin.as_mut()).is_none());
        assert!(ready(pods.as_mut()).is_none());
        drop(held);
        let got = ready(pods.as_mut()).expect("a pod's image first");
        assert!(ready(old.as_mut()).is_none() && ready(late.as_mut()).is_none());
        drop(got);
        let got = ready(old.as_mut()).expect("then the oldest, the first of two equals");
        assert!(ready(twin.as_mut()).is_none());
        drop(got);
        let got = ready(twin.as_mut()).expect("then its equal");
        drop(got);
        let got = ready(late.as_mut()).expect("then the newest");
        drop(got);
        assert_eq!(slots.available(), 1);
    }

    #[tokio::test]
    async fn held_normal_requests_queue_until_let_go_then_are_served_in_rank_order() {
        let slots = Slots::new(2);
        slots.hold(true);
        let rank = |class| Rank {
            class,
            ..Rank::default()
        };
        let mut late = std::pin::pin!(slots.enqueue(Priority::Normal, rank(1)).wait());
        let mut early = std::pin::pin!(slots.enqueue(Priority::Normal, rank(0)).wait());
        let mut last = std::pin::pin!(slots.enqueue(Priority::Normal, rank(2)).wait());
        assert!(ready(late.as_mut()).is_none(), "held, with slots free");
        let mut urgent = std::pin::pin!(slots.acquire(Priority::Urgent));
        let urgent = ready(urgent.as_mut()).expect("an urgent request is not held");
        assert!(ready(early.as_mut()).is_none());
        slots.hold(false);
        let got = ready(early.as_mut()).expect("the lower rank first");
        assert!(ready(late.as_mut()).is_none() && ready(last.as_mut()).is_none());
        drop(urgent);
        let late = ready(late.as_mut()).expect("then the next");
        slots.hold(true);
        drop(got);
        assert!(
            ready(last.as_mut()).is_none(),
            "a slot freed while held is kept"
        );
        slots.hold(false);
        let last = ready(last.as_mut()).expect("served once let go");
        drop((late, last));
        assert_eq!(slots.available(), 2);
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
