//! The pin logic over an in-memory store: what is pinned, when it is unpinned, and that what
//! others pinned is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;

use super::*;
use crate::health::Readiness;

fn id(n: u8) -> String {
    format!("sha256:{}", format!("{n:02x}").repeat(32))
}

/// Seconds since the epoch, as the loop reads the clock.
fn now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_secs()).expect("fits")
}

#[derive(Default)]
struct Store {
    /// image ID -> (pulled at, size, pinned by kruised, pinned by others)
    images: Mutex<BTreeMap<String, (i64, u64, bool, bool)>>,
    used: Mutex<BTreeSet<String>>,
    unpins: Mutex<Vec<String>>,
    /// Woken at every unpin, for [`until_unpinned`].
    unpinned: tokio::sync::Notify,
    /// The image filesystem as statvfs would show it; `None`: not visible.
    space: Mutex<Option<Space>>,
}

impl Store {
    fn add(&self, id: &str, at: i64, size: u64) {
        self.images
            .lock()
            .expect("lock")
            .insert(id.to_string(), (at, size, false, false));
    }
    fn pinned_by_kruised(&self, id: &str) -> bool {
        self.images
            .lock()
            .expect("lock")
            .get(id)
            .is_some_and(|i| i.2)
    }
}

impl PinStore for Store {
    fn pin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<PinOutcome, CriError>> {
        Box::pin(async move {
            let mut images = self.images.lock().expect("lock");
            Ok(match images.get_mut(id) {
                None => PinOutcome::Absent,
                Some((_, _, false, true)) => PinOutcome::PinnedByOthers,
                Some((at, size, ours, _)) => {
                    *ours = true;
                    PinOutcome::Pinned {
                        since: *at,
                        size: *size,
                    }
                }
            })
        })
    }
    fn unpin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), CriError>> {
        Box::pin(async move {
            if let Some(i) = self.images.lock().expect("lock").get_mut(id) {
                i.2 = false;
            }
            self.unpins.lock().expect("lock").push(id.to_string());
            self.unpinned.notify_waiters();
            Ok(())
        })
    }
    fn pinned(&self) -> BoxFuture<'_, Result<Vec<PinnedImage>, CriError>> {
        Box::pin(async move {
            Ok(self
                .images
                .lock()
                .expect("lock")
                .iter()
                .filter(|(_, i)| i.2)
                .map(|(id, i)| PinnedImage {
                    id: id.clone(),
                    since: i.0,
                    size: i.1,
                })
                .collect())
        })
    }
    fn in_use(&self) -> BoxFuture<'_, Result<Vec<String>, CriError>> {
        Box::pin(async move { Ok(self.used.lock().expect("lock").iter().cloned().collect()) })
    }
    fn space(&self) -> BoxFuture<'_, Option<Space>> {
        Box::pin(async move { *self.space.lock().expect("lock") })
    }
}

fn pins() -> (Arc<Store>, Arc<Pins>) {
    let store = Arc::new(Store::default());
    let pins = Pins::new(store.clone(), Duration::from_millis(10), None);
    (store, pins)
}

/// Waits until `image` is no longer pinned by kruised in `store`, looking again at each unpin
/// the store is told of; fails after 10 s saying what `pins` held and what was unpinned last.
async fn until_unpinned(store: &Store, pins: &Pins, image: &str) {
    let unpinned = async {
        loop {
            // listening before the look: an unpin between the two still wakes the wait
            let next = store.unpinned.notified();
            tokio::pin!(next);
            next.as_mut().enable();
            if !store.pinned_by_kruised(image) {
                return;
            }
            next.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), unpinned)
        .await
        .is_err()
    {
        panic!(
            "{image} still pinned after 10 s; held: {:?}, unpinned so far: {:?}",
            pins.held(),
            store.unpins.lock().expect("lock")
        );
    }
}

#[tokio::test]
async fn a_pulled_image_is_pinned_until_a_container_runs_it() {
    let (store, pins) = pins();
    store.add(&id(1), 100, 10);
    pins.pin(&id(1)).await;
    assert!(store.pinned_by_kruised(&id(1)));
    assert_eq!(
        pins.unpin_used().await.expect("unpin"),
        0,
        "nothing runs it yet"
    );
    assert!(store.pinned_by_kruised(&id(1)));
    // CRI-O names images without the prefix: the same image
    store
        .used
        .lock()
        .expect("lock")
        .insert(id(1).trim_start_matches("sha256:").to_string());
    assert_eq!(pins.unpin_used().await.expect("unpin"), 1);
    assert!(!store.pinned_by_kruised(&id(1)));
    assert!(pins.held().is_empty());
}

#[tokio::test]
async fn an_image_someone_else_pinned_is_neither_claimed_nor_unpinned() {
    let (store, pins) = pins();
    store
        .images
        .lock()
        .expect("lock")
        .insert(id(2), (100, 10, false, true));
    pins.pin(&id(2)).await;
    store.used.lock().expect("lock").insert(id(2));
    pins.unpin_used().await.expect("unpin");
    pins.release(&[id(2)]).await;
    assert!(store.unpins.lock().expect("lock").is_empty());
    assert_eq!(
        store.images.lock().expect("lock")[&id(2)],
        (100, 10, false, true)
    );
}

#[tokio::test]
async fn a_reference_that_is_no_image_id_or_an_image_gone_is_not_pinned() {
    let (store, pins) = pins();
    pins.pin("127.0.0.1:5000/test/busybox:v1").await;
    pins.pin(&id(3)).await;
    assert!(pins.held().is_empty());
    assert!(store.images.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn a_removed_tags_images_are_unpinned_oldest_first_and_others_kept() {
    let (store, pins) = pins();
    for (n, at) in [(4, 300), (5, 100), (6, 200)] {
        store.add(&id(n), at, 10);
        pins.pin(&id(n)).await;
    }
    // a NodeImage status names the image as name@sha256:..., the controller passes the ID
    pins.release(&[id(4), id(5)]).await;
    assert_eq!(*store.unpins.lock().expect("lock"), [id(5), id(4)]);
    assert_eq!(pins.held(), [id(6)]);
}

#[tokio::test]
async fn a_shrinking_budget_unpins_the_oldest_until_enough_bytes_are_unpinned() {
    let (store, pins) = pins();
    for (n, at, size) in [(7, 300, 30), (8, 100, 10), (9, 200, 20)] {
        store.add(&id(n), at, size);
        pins.pin(&id(n)).await;
    }
    assert_eq!(pins.unpin_oldest(25, "the budget shrank").await, 30);
    assert_eq!(*store.unpins.lock().expect("lock"), [id(8), id(9)]);
    assert_eq!(pins.held(), [id(7)]);
}

#[tokio::test]
async fn a_restarted_kruised_takes_up_its_pins_and_unpins_them_at_first_use() {
    let (store, pins) = pins();
    // pulled now: the loop's unpinning of old pins (`MAX_AGE`) does not take it
    store.add(&id(10), now(), 10);
    pins.pin(&id(10)).await;
    // a new process: nothing in memory, the label in the runtime
    let again = Pins::new(store.clone(), Duration::from_millis(10), None);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(again.clone().run(cancel.clone()));
    store.used.lock().expect("lock").insert(id(10));
    until_unpinned(&store, &again, &id(10)).await;
    cancel.cancel();
    task.await.expect("the loop ends");
}

#[tokio::test]
async fn pinning_more_than_the_bound_unpins_the_oldest_and_old_pins_expire() {
    let (store, pins) = pins();
    let n = u8::try_from(MAX_HELD).expect("small") + 1;
    for i in 0..n {
        store.add(&id(100 + i), 1000 + i64::from(i), 1);
        pins.pin(&id(100 + i)).await;
    }
    assert_eq!(pins.held().len(), MAX_HELD);
    assert_eq!(*store.unpins.lock().expect("lock"), [id(100)], "the oldest");
    let max = i64::try_from(MAX_AGE.as_secs()).expect("fits");
    // at the second oldest's bound: nothing yet; a second later: only it
    pins.unpin_expired(1001 + max).await;
    assert_eq!(pins.held().len(), MAX_HELD);
    pins.unpin_expired(1002 + max).await;
    assert_eq!(pins.held().len(), MAX_HELD - 1);
    assert!(!pins.held().contains(&id(101)));
}

/// A runtime that answers containerd's version but not its images service (the tests' fake).
struct Unserved;

impl PinStore for Unserved {
    fn pin<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<PinOutcome, CriError>> {
        Box::pin(async { Err(unsupported()) })
    }
    fn unpin<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), CriError>> {
        Box::pin(async { Err(unsupported()) })
    }
    fn pinned(&self) -> BoxFuture<'_, Result<Vec<PinnedImage>, CriError>> {
        Box::pin(async { Err(unsupported()) })
    }
    fn in_use(&self) -> BoxFuture<'_, Result<Vec<String>, CriError>> {
        Box::pin(async { Ok(vec![]) })
    }
}

fn unsupported() -> CriError {
    CriError::Unsupported {
        endpoint: "unix:///run/fake.sock".into(),
        call: "images.Get",
        message: "unknown service containerd.services.images.v1.Images".into(),
    }
}

#[tokio::test]
async fn a_runtime_without_containerds_images_service_turns_pinning_off_at_once() {
    let pins = Pins::new(Arc::new(Unserved), Duration::from_millis(10), None);
    pins.pin(&id(1)).await;
    assert!(pins.off.load(std::sync::atomic::Ordering::Relaxed));
    assert!(pins.held().is_empty());
    // the loop, a task of the daemon's, ends with the daemon and not before
    let cancel = CancellationToken::new();
    let task = tokio::spawn(pins.clone().run(cancel.clone()));
    tokio::task::yield_now().await;
    assert!(!task.is_finished());
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the loop ends at its cancel")
        .expect("no panic");
}

/// Pins over a store whose image filesystem is `capacity` bytes with `free` free, giving way
/// below the kubelet's default threshold (85 %) and a `floor`, noting on `/readyz?verbose`.
fn pins_within(capacity: u64, free: u64, floor: u64) -> (Arc<Store>, Arc<Pins>, Readiness) {
    let store = Arc::new(Store::default());
    *store.space.lock().expect("lock") = Some(Space { free, capacity });
    let readiness = Readiness::new();
    let limits = Limits {
        high_percent: 85,
        floor,
        note: Some(readiness.condition("image-pins")),
    };
    let pins = Pins::new(store.clone(), Duration::from_millis(10), Some(limits));
    (store, pins, readiness)
}

fn set_free(store: &Store, free: u64) {
    if let Some(s) = store.space.lock().expect("lock").as_mut() {
        s.free = free;
    }
}

#[tokio::test]
async fn past_the_kubelets_threshold_the_oldest_pins_give_way_for_the_missing_bytes_once() {
    // 1000 B at 85 %: use must stay below 850 B, so at least 151 B free; 100 B free: 51 missing
    let (store, pins, readiness) = pins_within(1000, 100, 0);
    for (n, at, size) in [(11, 300, 30), (12, 100, 40), (13, 200, 20), (14, 400, 50)] {
        store.add(&id(n), at, size);
        pins.pin(&id(n)).await;
    }
    assert_eq!(pins.give_way().await, 60, "the two oldest: 40 + 20 >= 51");
    assert_eq!(*store.unpins.lock().expect("lock"), [id(12), id(13)]);
    assert_eq!(pins.held(), [id(11), id(14)]);
    assert_eq!(
        pins.give_way().await,
        0,
        "the kubelet's GC has not run yet: what was unpinned still counts"
    );
    // the GC reclaims 40 B (11 B missing, 20 B still to reclaim), then a pull takes 30 B
    set_free(&store, 140);
    assert_eq!(pins.give_way().await, 0, "11 missing, 20 to come");
    set_free(&store, 110);
    assert_eq!(
        pins.give_way().await,
        30,
        "41 missing, 20 to come: the next oldest"
    );
    assert_eq!(pins.held(), [id(14)]);
    let report = readiness.report();
    assert!(readiness.is_ready(), "{report:?}");
    let note = &report[0].detail;
    for part in [
        "below 151 B free",
        "85 %",
        "110 B free of 1000 B",
        "90 B unpinned",
    ] {
        assert!(note.contains(part), "{part:?} missing from {note:?}");
    }
}

#[tokio::test]
async fn within_the_limits_or_where_the_filesystem_is_not_visible_no_pin_gives_way() {
    let (store, pins, readiness) = pins_within(1000, 151, 0);
    assert!(readiness.is_ready(), "ready before any look");
    store.add(&id(15), 100, 10);
    pins.pin(&id(15)).await;
    assert_eq!(pins.give_way().await, 0, "151 B free: use stays below 85 %");
    *store.space.lock().expect("lock") = None;
    assert_eq!(pins.give_way().await, 0, "nothing known, nothing unpinned");
    let note = readiness.report()[0].detail.clone();
    assert!(note.contains("not visible"), "{note}");
    let (store, pins) = self::pins();
    *store.space.lock().expect("lock") = Some(Space {
        free: 0,
        capacity: 1000,
    });
    store.add(&id(16), 100, 10);
    pins.pin(&id(16)).await;
    assert_eq!(pins.give_way().await, 0, "no limits: pins never give way");
    assert_eq!(pins.held(), [id(16)]);
}

#[tokio::test]
async fn below_the_floor_pins_give_way_even_under_the_threshold() {
    // 50 % in use, but 500 B free is less than the 600 B floor
    let (store, pins, _readiness) = pins_within(1000, 500, 600);
    for (n, at) in [(17, 200), (18, 100)] {
        store.add(&id(n), at, 100);
        pins.pin(&id(n)).await;
    }
    assert_eq!(pins.give_way().await, 100);
    assert_eq!(pins.held(), [id(17)]);
}

#[tokio::test]
async fn the_loop_gives_way_while_it_holds_pins() {
    let (store, pins, _readiness) = pins_within(1000, 0, 0);
    // pulled now: the loop's unpinning of old pins (`MAX_AGE`) does not take it
    store.add(&id(19), now(), 10);
    pins.pin(&id(19)).await;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(pins.clone().run(cancel.clone()));
    until_unpinned(&store, &pins, &id(19)).await;
    cancel.cancel();
    task.await.expect("the loop ends");
}
