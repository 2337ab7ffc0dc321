//! Whose turn it is to pull (kruised's own; kruise-daemon starts every tag at once): the node's
//! own pods first, then pre-pulls in a stated order, a bounded number at once.
//!
//! - **Yield.** A pre-pull (a NodeImage tag, a next-batch image) does not start while a pod on
//!   the node waits for its own image ([`super::waiting`]) or an in-place pull of kruised runs
//!   ([`super::inplace`]); it starts once none does (the pod's container started, or the pod
//!   left the node). A pre-pull already running is **called off** when one begins
//!   ([`Turn::called_off`]): its CRI `PullImage` call is cancelled (the puller's, unless another
//!   caller shares it), it gives back its places and queues again by its rank, and it starts
//!   again once nothing is waited for. Being called off is no failed attempt: no backoff, no
//!   failure in its status or events (a NodeImage tag stays `Pulling`, with its progress).
//!
//!   What it fetched is lost: containerd (1.6 and 2.x) writes each blob into an ingest named by
//!   its ref (`layer-sha256:…`, `ctr content active`), and a client whose pull stops without
//!   ending its lease (`ctr images pull` killed) finds it again and fetches only the rest; but
//!   a CRI `PullImage` call that is cancelled ends its lease, and its ingests go with it, so the
//!   next pull fetches the blobs from their first byte. Checked on the lab (`cri-lab.sh`,
//!   containerd 1.6.20 and 2.1.9): `tests/e2e/pull_turn.rs` calls off a pre-pull 4 MiB into
//!   its 16 MiB layer, through a relay slowed to 4 MiB/s; `ctr content active`, polled by hand
//!   meanwhile, showed its ingest gone as the call was cancelled and begun again at 0 B after,
//!   and the registry sends the whole 16 MiB again (whereas a `ctr images pull` killed 7.3 MB
//!   in left its ingest, and the next one moved 9.4 of the 16.8 MB). So a call-off costs what the pre-pull had fetched, and the node's
//!   pods come first anyway: no pull is let finish for being close to its end (its percent counts
//!   only the blobs begun, `progress.rs`, and says little of what is left).
//!
//!   **The bound.** A pre-pull is called off at most [`MAX_CALL_OFFS`] times ([`CallOffs`]: per
//!   pull task of a NodeImage tag, reset when the tag's task starts anew; per image of the next
//!   batch, reset once it is on the node or no pod asks for it); after that it runs alongside the pod's pull until it
//!   ends (pulled, failed, or its deadline), and the log says so once ("called off 3 times
//!   already: let finish"). Without it a large pre-pull on a node where pods keep starting
//!   would start again from 0 B each time and never finish (starvation); with it, call-offs
//!   cost a pre-pull at most three partial fetches, less than three times its size. The cost: a pod that begins to wait after the third
//!   call-off shares the runtime and the link with that pre-pull, as every pod did with every
//!   pre-pull before kruised yielded.
//! - **Order.** Pre-pulls waiting for their turn start in this order: first the tags of images a
//!   pod on the node names (its containers or init containers), then by the tag's `createdAt`
//!   (oldest first; kruise-manager sets it from the ImagePullJob; none: last), then by image
//!   and tag. kruise's NodeImage and ImagePullJob have no priority field. The order decides who
//!   takes a freed place (a pre-pull called off takes its place again by its rank); a pull that
//!   runs is never stopped for a later pre-pull of higher rank.
//! - **Cap.** At most `--max-concurrent-prepulls` pre-pulls run at once (default
//!   [`DEFAULT_MAX_PREPULLS`]; 0: no cap). `--max-workers-for-pull-image` keeps its meaning:
//!   the most pulls of every kind at once, the in-place pull served first from it
//!   ([`super::slots`]); the in-place pull does not count against the pre-pull cap. Bytes in
//!   flight are not capped: an image's size is not known before its pull.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::reference::Reference;
use super::slots::{Permit, Priority, Rank, Slots};
use crate::k8s::crd::ImageTagSpec;
use crate::k8s::watch::Watched;

/// Default of `--max-concurrent-prepulls`.
pub const DEFAULT_MAX_PREPULLS: usize = 4;

/// The most times one pre-pull is called off ([module docs](self)); after that it is let
/// finish. 3: a pod waiting for its image now and then (a rollout's few pods, a restart) costs
/// a pre-pull at most three fresh starts, each from 0 B, so it ends within four times its time
/// alone however many pods start meanwhile; and the node's pods still come first through the
/// first three, which is all a node that is not busy all the time ever needs.
pub const MAX_CALL_OFFS: u32 = 3;

/// How often one pre-pull was called off, counted by [`Turn::called_off_within`]: past
/// [`MAX_CALL_OFFS`] it is let finish.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallOffs {
    count: u32,
    /// The log said it is let finish.
    told: bool,
}

impl CallOffs {
    /// Times called off so far.
    pub fn count(self) -> u32 {
        self.count
    }
}

/// Whose turn it is: the pre-pulls' queue (their cap, held while something is yielded to), what
/// they yield to, and the pods that rank them.
#[derive(Clone)]
pub struct Turn {
    /// The pre-pulls' places: the cap (or no bound), held while a pod waits.
    queue: Arc<Slots>,
    /// Pods on the node waiting for their own image.
    own: watch::Receiver<usize>,
    /// In-place pulls under way.
    in_place: watch::Receiver<usize>,
    pods: Option<Watched<Pod>>,
}

/// A pre-pull's places: one under the cap, one of the shared slots; given back when dropped.
#[derive(Debug)]
pub struct Turned {
    _cap: Permit,
    _slot: Option<Permit>,
}

/// The count of a channel; 0 once its sender is gone (nothing to yield to).
fn count(rx: &watch::Receiver<usize>) -> usize {
    if rx.has_changed().is_err() {
        0
    } else {
        *rx.borrow()
    }
}

impl Default for Turn {
    /// Nothing to yield to, no cap, no ranking.
    fn default() -> Self {
        Turn::new(None, watch::channel(0).1, watch::channel(0).1, None)
    }
}

impl Turn {
    /// At most `cap` pre-pulls at once (`None`: no cap), yielding while `own` (pods waiting for
    /// their image) or `in_place` (in-place pulls) is above 0 once [`gate`](Self::gate) runs,
    /// ranked by the images of `pods`.
    pub fn new(
        cap: Option<usize>,
        own: watch::Receiver<usize>,
        in_place: watch::Receiver<usize>,
        pods: Option<Watched<Pod>>,
    ) -> Self {
        Turn {
            queue: Slots::new(cap.unwrap_or(usize::MAX)),
            own,
            in_place,
            pods,
        }
    }

    /// Whether nothing is yielded to now.
    pub fn is_clear(&self) -> bool {
        count(&self.own) == 0 && count(&self.in_place) == 0
    }

    /// Returns once no pod waits for its own image and no in-place pull runs.
    pub async fn clear(&self) {
        let (mut own, mut in_place) = (self.own.clone(), self.in_place.clone());
        while !self.is_clear() {
            // an error: the sender is gone, and `count` reads 0 from now on
            let _ = own.wait_for(|n| *n == 0).await;
            let _ = in_place.wait_for(|n| *n == 0).await;
        }
    }

    /// Returns once a pod on the node waits for its own image or an in-place pull runs (at
    /// once if one does now): a running pre-pull is called off then ([module docs](self)).
    pub async fn called_off(&self) {
        let (mut own, mut in_place) = (self.own.clone(), self.in_place.clone());
        let (mut own_open, mut in_place_open) = (true, true);
        while self.is_clear() {
            // both senders gone: nothing will be yielded to
            if !own_open && !in_place_open {
                std::future::pending::<()>().await;
            }
            tokio::select! {
                r = own.changed(), if own_open => own_open = r.is_ok(),
                r = in_place.changed(), if in_place_open => in_place_open = r.is_ok(),
            }
        }
    }

    /// [`called_off`](Self::called_off) for a pre-pull called off `offs` times so far: counts
    /// the call-off when it returns. Once it was called off [`MAX_CALL_OFFS`] times it never
    /// returns: the pre-pull is let finish, and the first time it would have been called off
    /// the log says so (once per `offs`).
    pub async fn called_off_within(&self, offs: &mut CallOffs) {
        self.called_off().await;
        if offs.count < MAX_CALL_OFFS {
            offs.count += 1;
            return;
        }
        if !offs.told {
            offs.told = true;
            tracing::info!(
                called_off = offs.count,
                "called off {MAX_CALL_OFFS} times already: let finish, alongside the pod's pull"
            );
        }
        std::future::pending::<()>().await;
    }

    /// Holds the pre-pulls' queue while something is yielded to, until `cancel`.
    pub async fn gate(self, cancel: CancellationToken) {
        let (mut own, mut in_place) = (self.own.clone(), self.in_place.clone());
        let (mut own_open, mut in_place_open) = (true, true);
        loop {
            self.queue.hold(!self.is_clear());
            tokio::select! {
                () = cancel.cancelled() => return,
                r = own.changed(), if own_open => own_open = r.is_ok(),
                r = in_place.changed(), if in_place_open => in_place_open = r.is_ok(),
            }
        }
    }

    /// The turn of a pre-pull of `rank`: its place in the queue is taken now (so pre-pulls
    /// asked for in rank order queue in that order), and the future waits until nothing is
    /// yielded to, a place under the cap is free and one of `slots` is. Dropping the future
    /// leaves the queues.
    pub fn pre_pull(
        &self,
        slots: Option<&Arc<Slots>>,
        rank: Rank,
    ) -> impl Future<Output = Turned> + Send + use<> {
        let mut ticket = self.queue.enqueue(Priority::Normal, rank.clone());
        let slots = slots.cloned();
        let turn = self.clone();
        async move {
            loop {
                let cap = ticket.wait().await;
                let slot = match &slots {
                    Some(s) => Some(s.acquire_ranked(Priority::Normal, rank.clone()).await),
                    None => None,
                };
                if turn.is_clear() {
                    return Turned {
                        _cap: cap,
                        _slot: slot,
                    };
                }
                // a pod began to wait while this one waited for a shared slot: back in line
                // once it no longer does
                drop((slot, cap));
                turn.clear().await;
                ticket = turn.queue.enqueue(Priority::Normal, rank.clone());
            }
        }
    }

    /// The rank of a NodeImage tag ([module docs](self)).
    pub fn rank_of(&self, image: &str, spec: &ImageTagSpec) -> Rank {
        let key = Reference::from_name_tag(image, &spec.tag)
            .map(|r| r.pull_key())
            .ok();
        let named = match (&self.pods, &key) {
            (Some(pods), Some(key)) => pods.state().iter().any(|p| names(p, key)),
            _ => false,
        };
        Rank {
            class: u8::from(!named),
            created: spec
                .created_at
                .as_ref()
                .map_or(i64::MAX, |t| t.0.as_second()),
            name: format!("{image}:{}", spec.tag),
        }
    }
}

/// Whether a container or init container of `pod` runs the image of `key` (a pull key).
fn names(pod: &Pod, key: &str) -> bool {
    let Some(spec) = &pod.spec else { return false };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.image.as_deref())
        .any(|i| Reference::parse(i).is_ok_and(|r| r.pull_key() == key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll<F: Future>(f: std::pin::Pin<&mut F>) -> Option<F::Output> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match f.poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }

    /// Lets the gate see the latest counts.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_pre_pull_waits_while_a_pod_waits_for_its_image_and_starts_after() {
        let (own_tx, own) = watch::channel(1);
        let (_in_place_tx, in_place) = watch::channel(0);
        let turn = Turn::new(Some(2), own, in_place, None);
        let cancel = CancellationToken::new();
        let gate = tokio::spawn(turn.clone().gate(cancel.clone()));
        settle().await;
        let mut pre = std::pin::pin!(turn.pre_pull(None, Rank::default()));
        assert!(poll(pre.as_mut()).is_none(), "a pod waits");
        own_tx.send_replace(0);
        settle().await;
        assert!(poll(pre.as_mut()).is_some(), "no pod waits any more");
        cancel.cancel();
        gate.await.expect("the gate ends");
    }

    #[tokio::test]
    async fn a_pre_pull_that_got_its_place_under_the_cap_but_not_a_shared_slot_yields_too() {
        let (own_tx, own) = watch::channel(0);
        let turn = Turn::new(Some(2), own, watch::channel(0).1, None);
        let cancel = CancellationToken::new();
        let gate = tokio::spawn(turn.clone().gate(cancel.clone()));
        let shared = Slots::new(1);
        let busy = shared.acquire(Priority::Normal).await;
        let mut pre = std::pin::pin!(turn.pre_pull(Some(&shared), Rank::default()));
        assert!(poll(pre.as_mut()).is_none(), "the shared slot is taken");
        own_tx.send_replace(1);
        settle().await;
        drop(busy);
        assert!(poll(pre.as_mut()).is_none(), "a pod waits");
        own_tx.send_replace(0);
        settle().await;
        assert!(poll(pre.as_mut()).is_some(), "no pod waits any more");
        cancel.cancel();
        gate.await.expect("the gate ends");
    }

    #[tokio::test]
    async fn a_pre_pull_waits_while_an_in_place_pull_runs() {
        let (_own_tx, own) = watch::channel(0);
        let (in_place_tx, in_place) = watch::channel(1);
        let turn = Turn::new(None, own, in_place, None);
        assert!(!turn.is_clear());
        in_place_tx.send_replace(0);
        assert!(turn.is_clear());
        in_place_tx.send_replace(1);
        drop(in_place_tx);
        assert!(turn.is_clear(), "a sender gone leaves nothing to wait for");
    }

    #[tokio::test]
    async fn a_running_pre_pull_is_called_off_once_a_pod_begins_to_wait_or_an_in_place_pull_starts()
    {
        let (own_tx, own) = watch::channel(0);
        let (in_place_tx, in_place) = watch::channel(0);
        let turn = Turn::new(None, own, in_place, None);
        let mut off = std::pin::pin!(turn.called_off());
        assert!(poll(off.as_mut()).is_none(), "nothing waited for");
        own_tx.send_replace(1);
        assert!(poll(off.as_mut()).is_some(), "a pod waits");
        own_tx.send_replace(0);
        let mut off = std::pin::pin!(turn.called_off());
        assert!(poll(off.as_mut()).is_none(), "nothing waited for");
        in_place_tx.send_replace(1);
        assert!(poll(off.as_mut()).is_some(), "an in-place pull runs");
        assert!(
            poll(std::pin::pin!(turn.called_off())).is_some(),
            "at once while one runs"
        );
        drop((own_tx, in_place_tx));
        let mut off = std::pin::pin!(turn.called_off());
        assert!(poll(off.as_mut()).is_none(), "senders gone: never");
        assert!(poll(off.as_mut()).is_none(), "senders gone: never");
    }

    #[tokio::test]
    async fn a_pre_pull_called_off_max_call_offs_times_is_not_called_off_again() {
        let (_own_tx, own) = watch::channel(1);
        let turn = Turn::new(None, own, watch::channel(0).1, None);
        let mut offs = CallOffs::default();
        for n in 1..=MAX_CALL_OFFS {
            let off = std::pin::pin!(turn.called_off_within(&mut offs));
            assert!(poll(off).is_some(), "call-off {n}: a pod waits");
        }
        assert_eq!(offs.count(), MAX_CALL_OFFS);
        {
            let mut off = std::pin::pin!(turn.called_off_within(&mut offs));
            assert!(poll(off.as_mut()).is_none(), "let finish");
            assert!(poll(off.as_mut()).is_none(), "let finish");
        }
        assert_eq!((offs.count(), offs.told), (MAX_CALL_OFFS, true));
    }

    #[tokio::test]
    async fn at_most_the_cap_of_pre_pulls_hold_their_turn() {
        let turn = Turn::new(Some(2), watch::channel(0).1, watch::channel(0).1, None);
        let a = turn.pre_pull(None, Rank::default()).await;
        let _b = turn.pre_pull(None, Rank::default()).await;
        let mut third = std::pin::pin!(turn.pre_pull(None, Rank::default()));
        assert!(poll(third.as_mut()).is_none(), "two hold theirs");
        drop(a);
        assert!(poll(third.as_mut()).is_some(), "one gave it back");
    }
}
