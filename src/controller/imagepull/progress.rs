//! A pull's real progress and its stall, from what the runtime has landed: on containerd, the
//! ingests of its content service (`cri::containerd::content`), polled every [`POLL`] while a
//! pull runs. CRI itself has no progress (its `PullImage` is one unary call); kruise-daemon
//! reports 0 until the end (kruise #804).
//!
//! What a pull has landed ([`Ingests`]): the ingests that appear while it runs (or that were
//! there when it began and move), each counted by its bytes so far and its size; an ingest that
//! leaves the list was committed, and counts whole. Approximate, and said so where operators
//! read it:
//!
//! - the ingests are the node's, not the pull's: pulls in flight at the same time each count
//!   every new ingest (the refs name blobs, `layer-sha256:…`, and only the image's manifest
//!   says which are whose, which the daemon does not read). One pull at a time is exact;
//! - the image's size is the sum of the sizes seen so far: a layer whose fetch has not begun
//!   (containerd fetches three at a time) is not in it yet, so the percent can stand still or
//!   fall back when one begins; what is reported never goes down ([`Percent`]), stays below
//!   100 until the pull ends, and is not reported while no ingest is open (between one blob
//!   and the next, every blob seen has landed: that is not 99 %);
//! - blobs already in the content store are not fetched, and not counted.
//!
//! The stall ([`StallClock`]): a pull whose landed bytes do not grow for the stall timeout fails,
//! whatever its overall timeout. The clock runs from the pull's start (a registry silent from
//! the first byte stalls too) and is set back whenever bytes land; while no ingest of the pull
//! is open after some were (every blob fetched: containerd unpacks), it does not run: unpacking
//! lands nothing, and a large image's unpack is not a stall. A runtime without the content
//! service (CRI-O, or containerd's socket not reachable) gives no progress: 0 until the end and
//! no stall, as before.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cri::containerd::content::{Content, Ingest};
use crate::cri::{CriError, Result};

/// How often the ingests are asked for while a pull runs: progress reaches the status within
/// this plus the status write's pace (`Settings::progress_min_interval`).
pub const POLL: Duration = Duration::from_millis(200);

/// Where the ingests in flight come from (containerd's content service; scripted in tests).
pub trait IngestSource: Send + Sync {
    /// The ingests in flight; [`CriError::Unsupported`] from a runtime without the service.
    fn ingests(&self) -> BoxFuture<'_, Result<Vec<Ingest>>>;
}

impl IngestSource for Content {
    fn ingests(&self) -> BoxFuture<'_, Result<Vec<Ingest>>> {
        Box::pin(Content::ingests(self))
    }
}

/// A source of ingests, shared.
pub type Source = Arc<dyn IngestSource>;

/// What a pull has landed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Landed {
    /// Bytes landed (committed blobs whole, open ingests up to their offset).
    pub bytes: u64,
    /// The size of every blob seen so far (not of the whole image: see the module docs).
    pub total: u64,
    /// Whether an ingest of the pull is open (it is fetching), or none was seen yet.
    pub fetching: bool,
}

impl Landed {
    /// The integer percent landed, 0 to 99: 100 is for a pull that ended.
    pub fn percent(&self) -> i32 {
        if self.total == 0 {
            return 0;
        }
        let p = u128::from(self.bytes.min(self.total)) * 100 / u128::from(self.total);
        i32::try_from(p).unwrap_or(100).min(99)
    }
}

/// The `<digest>` of an ingest ref (`layer-sha256:…`, `k8s.io/1/layer-sha256:…`), or the ref.
fn blob_of(reference: &str) -> &str {
    reference
        .rfind("sha256:")
        .map_or(reference, |i| &reference[i..])
}

/// The ingests of one pull: what was there when it began, and what it has landed since.
#[derive(Clone, Debug, Default)]
pub struct Ingests {
    /// Offsets of the ingests open when the pull began, by blob: someone else's until they move.
    before: BTreeMap<String, u64>,
    /// The pull's open ingests: blob to (offset, total).
    open: BTreeMap<String, (u64, u64)>,
    /// Blobs whose ingest ended (committed), and their bytes.
    done: BTreeSet<String>,
    done_bytes: u64,
}

impl Ingests {
    /// The ingests of a pull that begins with `open` in flight.
    pub fn new(open: &[Ingest]) -> Self {
        Ingests {
            before: open
                .iter()
                .map(|i| (blob_of(&i.reference).to_string(), i.offset))
                .collect(),
            ..Default::default()
        }
    }

    /// Takes in the ingests in flight now; what the pull has landed.
    pub fn observe(&mut self, now: &[Ingest]) -> Landed {
        let mut open = BTreeMap::new();
        for i in now {
            let blob = blob_of(&i.reference);
            if self.done.contains(blob) {
                continue;
            }
            // an ingest that was open before the pull is counted once it moves (this pull, or a
            // merged one, resumes it)
            if let Some(&at) = self.before.get(blob)
                && i.offset == at
                && !self.open.contains_key(blob)
            {
                continue;
            }
            open.insert(blob.to_string(), (i.offset, i.total.max(i.offset)));
        }
        // an ingest of the pull that left the list was committed: its blob landed whole
        for (blob, (offset, total)) in std::mem::take(&mut self.open) {
            if !open.contains_key(&blob) {
                self.done_bytes = self.done_bytes.saturating_add(total.max(offset));
                self.done.insert(blob);
            }
        }
        self.open = open;
        let (bytes, total) = self
            .open
            .values()
            .fold((self.done_bytes, self.done_bytes), |(b, t), &(o, s)| {
                (b.saturating_add(o), t.saturating_add(s))
            });
        Landed {
            bytes,
            total,
            fetching: !self.open.is_empty() || self.done.is_empty(),
        }
    }
}

/// A pull cut off because nothing landed for its stall timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stalled {
    /// What had landed.
    pub landed: Landed,
    /// How long nothing landed.
    pub after: Duration,
}

/// The stall decision of one pull, fed samples of what it landed.
#[derive(Clone, Debug)]
pub struct StallClock {
    stall: Duration,
    bytes: u64,
    since: Instant,
}

impl StallClock {
    /// A clock for a pull that began at `start`, stalled after `stall` without a byte.
    pub fn new(stall: Duration, start: Instant) -> Self {
        StallClock {
            stall,
            bytes: 0,
            since: start,
        }
    }

    /// Takes in what had landed `at`; `Some` when the pull stalled.
    pub fn observe(&mut self, at: Instant, landed: Landed) -> Option<Stalled> {
        if landed.bytes > self.bytes || !landed.fetching {
            // bytes landed, or nothing is being fetched (unpacking): the clock starts again
            self.bytes = self.bytes.max(landed.bytes);
            self.since = at;
            return None;
        }
        let after = at.saturating_duration_since(self.since);
        (after >= self.stall).then_some(Stalled { landed, after })
    }
}

/// The percent a status shows: the landed percent, never going down.
#[derive(Clone, Copy, Debug, Default)]
pub struct Percent(i32);

impl Percent {
    /// The percent to show after `landed`, when it differs from the one shown (only a change
    /// of the integer percent is written). Nothing while no ingest is open: every blob seen
    /// has landed, and whether more are to come (the next layer) is not known.
    pub fn next(&mut self, landed: Landed) -> Option<i32> {
        if !landed.fetching {
            return None;
        }
        let p = landed.percent();
        (p > self.0).then(|| {
            self.0 = p;
            p
        })
    }
}

/// Why a pull with progress was cut off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutOff {
    /// Nothing landed for the stall timeout.
    Stalled(Stalled),
    /// Nothing landed for the pull's timeout (the stall timeout is off, or the pull was
    /// unpacking all that time).
    Quiet(Duration),
}

/// Follows a pull that began with `before` in flight: publishes what it landed on `landed`
/// every [`POLL`], and returns when it must be cut off: nothing landed for `stall` (when
/// set) while fetching, or for `quiet` at all. A poll that fails says nothing new: the clocks
/// run on from the last answer.
pub async fn follow(
    source: &dyn IngestSource,
    before: &[Ingest],
    stall: Option<Duration>,
    quiet: Duration,
    landed: &watch::Sender<Option<Landed>>,
) -> CutOff {
    let start = Instant::now();
    let mut ingests = Ingests::new(before);
    let mut stall_clock = stall.map(|s| StallClock::new(s, start));
    let mut quiet_clock = StallClock::new(quiet, start);
    let mut last = Landed {
        fetching: true,
        ..Landed::default()
    };
    let mut tick = tokio::time::interval_at(start + POLL, POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let sample = match source.ingests().await {
            Ok(open) => {
                let l = ingests.observe(&open);
                landed.send_if_modified(|old| {
                    let changed = *old != Some(l);
                    *old = Some(l);
                    changed
                });
                last = l;
                l
            }
            Err(e) => {
                // nothing new is known: as the last answer
                tracing::debug!(error = %e, "the runtime's ingests are unknown for now");
                last
            }
        };
        if let Some(clock) = &mut stall_clock
            && let Some(s) = clock.observe(now, sample)
        {
            return CutOff::Stalled(s);
        }
        // the quiet clock runs through unpacking too
        let quiet_sample = Landed {
            fetching: true,
            ..sample
        };
        if quiet_clock.observe(now, quiet_sample).is_some() {
            return CutOff::Quiet(quiet);
        }
    }
}

/// Runs `work`, cut off (`None`) when `quiet` passes without `landed` growing (from the start,
/// when nothing lands: then a wall clock, as where progress is unknown) or when `hard` passes.
pub async fn until_quiet<T>(
    quiet: Duration,
    hard: Option<Duration>,
    mut landed: watch::Receiver<Option<Landed>>,
    work: impl Future<Output = T>,
) -> Option<T> {
    let now = Instant::now();
    let hard = hard.map(|h| crate::k8s::time::later(now, h));
    let mut until = crate::k8s::time::later(now, quiet);
    let mut bytes = landed.borrow_and_update().map_or(0, |l| l.bytes);
    let mut following = true;
    tokio::pin!(work);
    loop {
        let at = hard.map_or(until, |h| h.min(until));
        tokio::select! {
            out = &mut work => return Some(out),
            () = tokio::time::sleep_until(at) => return None,
            changed = landed.changed(), if following => match changed {
                Err(_) => following = false,
                Ok(()) => {
                    if let Some(l) = *landed.borrow_and_update()
                        && l.bytes > bytes
                    {
                        bytes = l.bytes;
                        until = crate::k8s::time::later(Instant::now(), quiet);
                    }
                }
            },
        }
    }
}

/// Shows what lands through `set`, called with each new integer percent (rising only; see
/// [`Percent`]). Runs until dropped.
pub async fn show(
    mut landed: watch::Receiver<Option<Landed>>,
    mut set: impl FnMut(i32),
) -> std::convert::Infallible {
    let mut shown = Percent::default();
    loop {
        if landed.changed().await.is_err() {
            return std::future::pending().await;
        }
        let now = *landed.borrow_and_update();
        if let Some(p) = now.and_then(|l| shown.next(l)) {
            set(p);
        }
    }
}

/// Whether `e` says the runtime has no content service (not containerd).
pub fn unsupported(e: &CriError) -> bool {
    matches!(e, CriError::Unsupported { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingest(reference: &str, offset: u64, total: u64) -> Ingest {
        Ingest {
            reference: reference.into(),
            offset,
            total,
        }
    }

    #[test]
    fn the_percent_is_the_landed_share_of_what_was_seen_and_below_100_until_the_end() {
        let l = |bytes, total| Landed {
            bytes,
            total,
            fetching: true,
        };
        assert_eq!(l(0, 0).percent(), 0);
        assert_eq!(l(1, 3).percent(), 33);
        assert_eq!(l(16 << 20, 32 << 20).percent(), 50);
        assert_eq!(l(99, 100).percent(), 99);
        assert_eq!(l(100, 100).percent(), 99, "100 is for the pull's end");
        assert_eq!(l(u64::MAX, u64::MAX).percent(), 99, "no overflow");
    }

    #[test]
    fn landed_bytes_count_open_ingests_by_offset_and_committed_ones_whole() {
        let mut p = Ingests::new(&[]);
        let l = p.observe(&[ingest("manifest-sha256:m", 0, 500)]);
        assert_eq!((l.bytes, l.total, l.fetching), (0, 500, true));
        // the manifest committed, two layers open
        let l = p.observe(&[
            ingest("layer-sha256:a", 1000, 4000),
            ingest("layer-sha256:b", 0, 6000),
        ]);
        assert_eq!((l.bytes, l.total), (1500, 10_500));
        let l = p.observe(&[ingest("layer-sha256:b", 3000, 6000)]);
        assert_eq!((l.bytes, l.total), (7500, 10_500), "a committed whole");
        let l = p.observe(&[]);
        assert_eq!((l.bytes, l.total, l.fetching), (10_500, 10_500, false));
    }

    #[test]
    fn an_ingest_open_before_the_pull_counts_only_once_it_moves() {
        let mut p = Ingests::new(&[ingest("layer-sha256:old", 700, 1000)]);
        let l = p.observe(&[ingest("layer-sha256:old", 700, 1000)]);
        assert_eq!((l.bytes, l.total), (0, 0), "someone else's, standing");
        let l = p.observe(&[ingest("layer-sha256:old", 800, 1000)]);
        assert_eq!(
            (l.bytes, l.total),
            (800, 1000),
            "resumed: counted from its start"
        );
        // a blob whose ingest ended is not counted again under another ref
        p.observe(&[]);
        let l = p.observe(&[ingest("k8s.io/2/layer-sha256:old", 10, 1000)]);
        assert_eq!((l.bytes, l.total), (1000, 1000));
    }

    #[test]
    fn the_shown_percent_only_rises_and_only_by_whole_points() {
        let mut shown = Percent::default();
        let l = |bytes, total| Landed {
            bytes,
            total,
            fetching: true,
        };
        assert_eq!(shown.next(l(0, 100)), None, "0 is what is shown already");
        assert_eq!(shown.next(l(10, 100)), Some(10));
        assert_eq!(shown.next(l(105, 1000)), None, "10.5 %: no new integer");
        assert_eq!(
            shown.next(l(10, 200)),
            None,
            "a new layer's size: no step back"
        );
        assert_eq!(shown.next(l(110, 200)), Some(55));
        // every blob seen has landed (the base layer before the next one began): not 99 %
        let landed = Landed {
            bytes: 200,
            total: 200,
            fetching: false,
        };
        assert_eq!(shown.next(landed), None);
        assert_eq!(shown.next(l(300, 1200)), None, "25 %: no step back");
        assert_eq!(shown.next(l(900, 1200)), Some(75));
    }

    fn sample(bytes: u64, fetching: bool) -> Landed {
        Landed {
            bytes,
            total: 1000,
            fetching,
        }
    }

    #[test]
    fn a_pull_whose_bytes_stop_growing_stalls_after_the_stall_timeout_and_not_before() {
        let t0 = Instant::now();
        let s = Duration::from_secs(10);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = StallClock::new(s, t0);
        assert_eq!(c.observe(at(1_000), sample(100, true)), None);
        assert_eq!(c.observe(at(5_000), sample(400, true)), None);
        // nothing lands from 5 s on
        assert_eq!(c.observe(at(14_999), sample(400, true)), None);
        let stalled = c.observe(at(15_000), sample(400, true));
        assert_eq!(
            stalled,
            Some(Stalled {
                landed: sample(400, true),
                after: s
            })
        );
    }

    #[test]
    fn a_pull_that_keeps_landing_bytes_never_stalls_however_long_it_takes() {
        let t0 = Instant::now();
        let mut c = StallClock::new(Duration::from_secs(10), t0);
        for i in 1..=1000u64 {
            // a byte every 9 s: 2.5 hours
            let at = t0 + Duration::from_secs(9 * i);
            assert_eq!(c.observe(at, sample(i, true)), None, "at {i}");
        }
    }

    #[test]
    fn a_pull_silent_from_the_start_stalls_with_nothing_landed() {
        let t0 = Instant::now();
        let mut c = StallClock::new(Duration::from_secs(10), t0);
        let l = Landed {
            bytes: 0,
            total: 0,
            fetching: true,
        };
        assert_eq!(c.observe(t0 + Duration::from_secs(9), l), None);
        assert!(c.observe(t0 + Duration::from_secs(10), l).is_some());
    }

    #[test]
    fn unpacking_after_every_blob_landed_is_not_a_stall() {
        let t0 = Instant::now();
        let mut c = StallClock::new(Duration::from_secs(10), t0);
        assert_eq!(
            c.observe(t0 + Duration::from_secs(1), sample(1000, true)),
            None
        );
        for s in 2..100 {
            assert_eq!(
                c.observe(t0 + Duration::from_secs(s), sample(1000, false)),
                None
            );
        }
        // fetching again (another blob) and then silent: the clock counts from the last moment
        // nothing was being fetched (99 s)
        assert_eq!(
            c.observe(t0 + Duration::from_secs(100), sample(1000, true)),
            None
        );
        assert!(
            c.observe(t0 + Duration::from_secs(108), sample(1000, true))
                .is_none()
        );
        assert!(
            c.observe(t0 + Duration::from_secs(109), sample(1000, true))
                .is_some()
        );
    }

    /// Ingests scripted by poll: each poll takes the next list (the last one repeats).
    struct Scripted(std::sync::Mutex<Vec<Result<Vec<Ingest>>>>);

    impl IngestSource for Scripted {
        fn ingests(&self) -> BoxFuture<'_, Result<Vec<Ingest>>> {
            let mut v = crate::sync::lock(&self.0);
            let next = if v.len() > 1 {
                v.remove(0)
            } else {
                v[0].clone()
            };
            Box::pin(async move { next })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn following_a_pull_publishes_what_landed_and_cuts_it_off_at_the_stall() {
        let source = Scripted(std::sync::Mutex::new(vec![
            Ok(vec![ingest("layer-sha256:a", 100, 1000)]),
            Err(CriError::Timeout {
                call: "ListStatuses",
                after: Duration::from_secs(1),
            }),
            Ok(vec![ingest("layer-sha256:a", 600, 1000)]),
        ]));
        let (tx, rx) = watch::channel(None);
        let start = Instant::now();
        let cut = follow(
            &source,
            &[],
            Some(Duration::from_secs(5)),
            Duration::from_secs(600),
            &tx,
        )
        .await;
        let CutOff::Stalled(s) = cut else {
            panic!("{cut:?}")
        };
        assert_eq!((s.landed.bytes, s.landed.total), (600, 1000));
        assert!(s.after >= Duration::from_secs(5));
        // the last growth was seen at the third poll; the stall 5 s after it, within a poll
        let took = start.elapsed();
        assert!(
            took >= POLL * 3 + Duration::from_secs(5) && took <= POLL * 4 + Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(
            *rx.borrow(),
            Some(Landed {
                bytes: 600,
                total: 1000,
                fetching: true
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_keeps_landing_bytes_outlives_its_timeout_and_a_silent_one_does_not() {
        let quiet = Duration::from_secs(10);
        // bytes land every 5 s for a minute, then the work ends
        let (tx, rx) = watch::channel(None);
        let work = async {
            for i in 1..=12u64 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                tx.send_replace(Some(Landed {
                    bytes: i,
                    total: 12,
                    fetching: true,
                }));
            }
            "done"
        };
        assert_eq!(
            until_quiet(quiet, None, rx.clone(), work).await,
            Some("done")
        );
        // the same without bytes landing: cut off at the timeout, as a wall clock
        let start = Instant::now();
        let silent = tokio::time::sleep(Duration::from_secs(60));
        assert_eq!(until_quiet(quiet, None, rx.clone(), silent).await, None);
        assert_eq!(start.elapsed(), quiet);
        // and the hard bound (the deadline) cuts off even a progressing one
        let (tx, rx) = watch::channel(None);
        let start = Instant::now();
        let work = async {
            for i in 1..=12u64 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                tx.send_replace(Some(Landed {
                    bytes: i,
                    total: 12,
                    fetching: true,
                }));
            }
        };
        assert_eq!(
            until_quiet(quiet, Some(Duration::from_secs(30)), rx, work).await,
            None
        );
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_stall_timeout_a_silent_pull_is_cut_off_by_its_quiet_timeout() {
        let source = Scripted(std::sync::Mutex::new(vec![Ok(vec![])]));
        let (tx, _rx) = watch::channel(None);
        let cut = follow(&source, &[], None, Duration::from_secs(30), &tx).await;
        assert_eq!(cut, CutOff::Quiet(Duration::from_secs(30)));
    }
}
