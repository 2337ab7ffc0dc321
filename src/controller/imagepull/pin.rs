//! Pin until first use: the images kruised pre-pulls (NodeImage tags, the next batch, the
//! in-place pull) are kept from the kubelet's image garbage collector until a container on the
//! node runs them. The kubelet removes unused images oldest first once the image filesystem
//! passes its high threshold, and an image pulled ahead of its pod is unused by definition.
//!
//! - After each successful pull, [`Pins::pin`] labels the image pinned
//!   (`io.cri-containerd.pinned=pinned`, which containerd 1.7 and later report as CRI
//!   `Image.pinned`, skipped by the kubelet's collector) and records that kruised did
//!   (`kruised.io/pinned-by=kruised`): an image someone else pinned (the sandbox image, an
//!   operator) is left as it is and never unpinned by kruised. The record is the label itself, so
//!   a restarted kruised takes up its pins from the runtime ([`Pins::run`] reads them at start);
//!   what it keeps in memory is the IDs and sizes of the images it pinned.
//! - [`Pins::run`] unpins an image once a container on the node runs it (CRI `ListContainers`,
//!   every [`CHECK_INTERVAL`] while kruised holds a pin, never otherwise).
//! - When a NodeImage tag leaves the spec, its images are unpinned ([`Pins::release`], oldest
//!   first), unless another tag still names them.
//! - Pins give way to a full disk ([`Pins::give_way`], at the same checks): once the image
//!   filesystem's free space is below what the kubelet's GC high threshold
//!   (`--image-gc-high-threshold-percent`) or the floor (`--image-fs-min-free`) leave, kruised
//!   unpins its unused images oldest first, as many bytes (the sizes the runtime reports) as are
//!   missing, so that the kubelet's collector may reclaim them; what it unpinned counts until the
//!   free space rises by as much (the collector ran) or is within the limits again.
//! - Bounded: at most [`MAX_HELD`] images (the oldest unpinned first), none longer than
//!   [`MAX_AGE`] unused.
//!
//! Only where the runtime offers it ([`crate::cri::containerd::pinning`]): on containerd 1.6 and
//! CRI-O kruised pins nothing and says so (`kruised version`, `/readyz?verbose`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::disk::{self, Space};
use crate::cri::containerd::images::{self, Images};
use crate::cri::{ContainerFilter, CriError, ImageService, RemoteRuntime, RuntimeService, dialect};
use crate::health::ReadinessCondition;

/// How often the containers are listed while kruised holds a pin.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// The most images kruised keeps pinned; pinning one more unpins the oldest. A pinned image is
/// out of the kubelet's reach when the disk fills, and a tenant's pods choose what the in-place
/// and next-batch pulls fetch: what they can keep on the node is bounded.
pub const MAX_HELD: usize = 64;

/// How long an image stays pinned without being used; then it is unpinned (and the kubelet may
/// remove it again). Counted from its pull.
pub const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// What pinning an image did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinOutcome {
    /// kruised pinned it (or had already): when it was pulled (seconds since the epoch) and its
    /// size.
    Pinned {
        /// When its record was made (its pull), seconds since the epoch.
        since: i64,
        /// Its size in bytes.
        size: u64,
    },
    /// Someone else pinned it: kruised leaves it as it is.
    PinnedByOthers,
    /// The runtime does not have it (removed since its pull).
    Absent,
}

/// An image kruised pinned, as the runtime records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedImage {
    /// Its ID (`sha256:<hex>`).
    pub id: String,
    /// When it was pulled (seconds since the epoch).
    pub since: i64,
    /// Its size in bytes.
    pub size: u64,
}

/// Where the pins are kept: the runtime's image labels (containerd's images service), and the
/// containers that use images (CRI). A trait so the logic is tested without a runtime.
pub trait PinStore: Send + Sync + 'static {
    /// Pins image `id` (`sha256:<hex>`) for kruised.
    fn pin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<PinOutcome, CriError>>;
    /// Unpins image `id` if kruised pinned it; an image that is gone is no error.
    fn unpin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), CriError>>;
    /// The images kruised pinned: their IDs, when each was pulled (seconds since the epoch) and
    /// its size.
    fn pinned(&self) -> BoxFuture<'_, Result<Vec<PinnedImage>, CriError>>;
    /// The IDs of the images the node's containers run (in any state).
    fn in_use(&self) -> BoxFuture<'_, Result<Vec<String>, CriError>>;
    /// Free and total bytes of the image filesystem; `None` when it cannot be read.
    fn space(&self) -> BoxFuture<'_, Option<Space>> {
        Box::pin(async { None })
    }
}

/// The pin store of containerd: image labels through its images service, sizes and containers
/// through the CRI.
pub struct ContainerdPins {
    images: Images,
    runtime: RemoteRuntime,
    /// The image filesystem's path: `--image-fs-path`, else the runtime's mount point.
    mount: std::sync::OnceLock<std::path::PathBuf>,
}

impl ContainerdPins {
    /// The store of the containerd behind `runtime`, its image filesystem seen at `fs_path`
    /// (`None`: where the runtime says).
    pub fn new(runtime: RemoteRuntime, fs_path: Option<std::path::PathBuf>) -> Self {
        ContainerdPins {
            images: Images::of(&runtime),
            runtime,
            mount: fs_path.map(std::sync::OnceLock::from).unwrap_or_default(),
        }
    }

    async fn size(&self, id: &str) -> Result<u64, CriError> {
        Ok(self.runtime.image_status(id).await?.map_or(0, |i| i.size))
    }

    /// Waits until the CRI reports image `id` pinned (the CRI plugin learns of a label from
    /// containerd's event, a moment after the update), at most [`CONFIRM_WITHIN`]: once a pull
    /// is reported done, the kubelet's collector already sees the pin. Its size.
    async fn confirmed(&self, id: &str) -> Result<u64, CriError> {
        let deadline = tokio::time::Instant::now() + CONFIRM_WITHIN;
        loop {
            match self.runtime.image_status(id).await? {
                Some(i) if i.pinned => return Ok(i.size),
                None => return Ok(0),
                Some(i) if tokio::time::Instant::now() >= deadline => {
                    tracing::warn!(image = %id, "labelled pinned, but the runtime does not report it pinned after {CONFIRM_WITHIN:?}");
                    return Ok(i.size);
                }
                Some(_) => tokio::time::sleep(CONFIRM_STEP).await,
            }
        }
    }
}

/// How long a pin may take to show in the CRI's image status.
const CONFIRM_WITHIN: Duration = Duration::from_secs(2);
/// How often the CRI is asked meanwhile.
const CONFIRM_STEP: Duration = Duration::from_millis(20);

impl PinStore for ContainerdPins {
    fn pin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<PinOutcome, CriError>> {
        Box::pin(async move {
            let Some(record) = self.images.get(id).await? else {
                return Ok(PinOutcome::Absent);
            };
            if record.pinned() && !record.pinned_by_kruised() {
                return Ok(PinOutcome::PinnedByOthers);
            }
            if !record.pinned() {
                let labels = [
                    (images::PINNED_LABEL, Some(images::PINNED)),
                    (images::PINNED_BY_LABEL, Some(images::PINNED_BY)),
                ];
                match self.images.set_labels(&record, &labels).await {
                    Err(CriError::NotFound { .. }) => return Ok(PinOutcome::Absent),
                    r => r?,
                }
            }
            Ok(PinOutcome::Pinned {
                since: record.created_at,
                size: self.confirmed(id).await?,
            })
        })
    }

    fn unpin<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), CriError>> {
        Box::pin(async move {
            let record = match self.images.get(id).await? {
                Some(r) if r.pinned_by_kruised() => r,
                _ => return Ok(()),
            };
            let labels = [
                (images::PINNED_LABEL, None),
                (images::PINNED_BY_LABEL, None),
            ];
            match self.images.set_labels(&record, &labels).await {
                Err(CriError::NotFound { .. }) => Ok(()),
                r => r,
            }
        })
    }

    fn pinned(&self) -> BoxFuture<'_, Result<Vec<PinnedImage>, CriError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for r in self.images.pinned_by_kruised().await? {
                if dialect::is_image_id(&r.name) {
                    let size = self.size(&r.name).await?;
                    out.push(PinnedImage {
                        id: r.name,
                        since: r.created_at,
                        size,
                    });
                }
            }
            Ok(out)
        })
    }

    fn in_use(&self) -> BoxFuture<'_, Result<Vec<String>, CriError>> {
        Box::pin(async move {
            let containers = self
                .runtime
                .list_containers(ContainerFilter::default())
                .await?;
            Ok(containers
                .iter()
                .filter_map(dialect::container_image_id)
                .collect())
        })
    }

    fn space(&self) -> BoxFuture<'_, Option<Space>> {
        Box::pin(async move {
            if self.mount.get().is_none() {
                let usage = self.runtime.image_fs_info().await.ok()?;
                let fs = usage.first().filter(|f| !f.mountpoint.is_empty())?;
                let _ = self.mount.set(fs.mountpoint.clone().into());
            }
            disk::space(self.mount.get()?)
        })
    }
}

/// The limits of the image filesystem that pins give way to.
#[derive(Debug)]
pub struct Limits {
    /// The kubelet's image GC high threshold, percent (`--image-gc-high-threshold-percent`).
    pub high_percent: u8,
    /// Bytes kept free (`--image-fs-min-free`).
    pub floor: u64,
    /// `/readyz?verbose`'s line on it (always ready).
    pub note: Option<ReadinessCondition>,
}

/// What the pins gave way so far.
#[derive(Debug, Default)]
struct GaveWay {
    /// The free bytes at the last look.
    free: Option<u64>,
    /// Bytes unpinned for the limits that the free space does not show yet.
    pending: u64,
    /// Bytes unpinned for the limits since the start.
    total: u64,
}

/// One image kruised pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    since: i64,
    size: u64,
}

/// The images kruised holds pinned, and the loop that unpins them at their first use.
pub struct Pins {
    store: Arc<dyn PinStore>,
    held: Mutex<BTreeMap<String, Held>>,
    wake: Notify,
    interval: Duration,
    /// Set when the runtime does not serve the calls pinning needs: nothing is tried again.
    off: std::sync::atomic::AtomicBool,
    /// The image filesystem's limits pins give way to; `None`: they do not.
    limits: Option<Limits>,
    gave: Mutex<GaveWay>,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("held", &self.lock().len())
            .finish()
    }
}

impl Pins {
    /// Pins kept in `store`, checked for use (and against `limits`) every `interval` while any
    /// is held.
    pub fn new(store: Arc<dyn PinStore>, interval: Duration, limits: Option<Limits>) -> Arc<Self> {
        if let Some(note) = limits.as_ref().and_then(|l| l.note.as_ref()) {
            note.set_ready_noting(
                "pinned images give way to a full image filesystem: not examined yet",
            );
        }
        Arc::new(Pins {
            store,
            held: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            interval,
            off: std::sync::atomic::AtomicBool::new(false),
            limits,
            gave: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Held>> {
        crate::sync::lock(&self.held)
    }

    /// The IDs of the images kruised holds pinned, oldest first.
    pub fn held(&self) -> Vec<String> {
        let mut v: Vec<_> = self
            .lock()
            .iter()
            .map(|(id, h)| (h.since, id.clone()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, id)| id).collect()
    }

    /// Pins `image` (the runtime's reference a pull returned) until its first use. A failure is
    /// logged, never the pull's: the image is there, only not kept.
    pub async fn pin(&self, image: &str) {
        if !dialect::is_image_id(image) {
            tracing::debug!(%image, "not an image ID: not pinned");
            return;
        }
        if self.off.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let id = format!("sha256:{}", image.trim_start_matches("sha256:"));
        match self.store.pin(&id).await {
            Ok(PinOutcome::Pinned { since, size }) => {
                let (new, over) = {
                    let mut held = self.lock();
                    let new = held.insert(id.clone(), Held { since, size }).is_none();
                    (new, held.len().saturating_sub(MAX_HELD))
                };
                if new {
                    tracing::info!(image = %id, size, "image pinned until its first use");
                    self.wake.notify_one();
                }
                for old in self.held().into_iter().take(over) {
                    self.unpin(&old, "more images are pinned than kruised keeps")
                        .await;
                }
            }
            Ok(PinOutcome::PinnedByOthers) => {
                tracing::debug!(image = %id, "image pinned by someone else: left as it is");
            }
            Ok(PinOutcome::Absent) => {
                tracing::debug!(image = %id, "image gone since its pull: not pinned");
            }
            Err(e @ CriError::Unsupported { .. }) => self.turn_off(&e),
            Err(e) => tracing::warn!(image = %id, error = %e, "pinning the image failed"),
        }
    }

    /// Unpins `ids` (image IDs; others and those kruised does not hold are skipped), oldest
    /// first: a NodeImage tag that left the spec, whose images another tag does not name.
    pub async fn release(&self, ids: &[String]) {
        let wanted: Vec<String> = self
            .held()
            .into_iter()
            .filter(|h| ids.iter().any(|i| dialect::same_image_id(i, h)))
            .collect();
        for id in wanted {
            self.unpin(&id, "its NodeImage tag was removed").await;
        }
    }

    /// Unpins the oldest images kruised holds until at least `bytes` of them are unpinned,
    /// saying `why`; returns the bytes unpinned.
    pub async fn unpin_oldest(&self, bytes: u64, why: &str) -> u64 {
        let mut done = 0;
        for id in self.held() {
            if done >= bytes {
                break;
            }
            let size = self.lock().get(&id).map_or(0, |h| h.size);
            if self.unpin(&id, why).await {
                done += size;
            }
        }
        done
    }

    /// Gives way to a full image filesystem: when its free space is below what the kubelet's GC
    /// high threshold and the floor leave ([`Limits`]), unpins the oldest images kruised holds,
    /// as many bytes as are missing and not already unpinned for it; returns the bytes unpinned.
    pub async fn give_way(&self) -> u64 {
        let Some(limits) = &self.limits else { return 0 };
        if self.lock().is_empty() {
            return 0;
        }
        let Some(Space { free, capacity }) = self.store.space().await else {
            if let Some(note) = &limits.note {
                note.set_ready_noting(
                    "the image filesystem is not visible to kruised: pinned images do not give \
                     way to a full disk (set --image-fs-path)",
                );
            }
            return 0;
        };
        let least = super::admit::least_free(capacity, limits.floor, limits.high_percent);
        let missing = {
            let mut gave = crate::sync::lock(&self.gave);
            // what the free space gained since the last look, the collector reclaimed
            let gained = gave.free.map_or(0, |f| free.saturating_sub(f));
            gave.pending = gave.pending.saturating_sub(gained);
            if free >= least {
                gave.pending = 0;
            }
            gave.free = Some(free);
            least.saturating_sub(free).saturating_sub(gave.pending)
        };
        let done = if missing > 0 {
            let why = format!(
                "the image filesystem has {} free of {}, less than the {} the kubelet's image GC \
                 high threshold ({} %) and the floor ({}) leave; {} unpinned, oldest first, for \
                 the kubelet's GC to reclaim",
                disk::human(free),
                disk::human(capacity),
                disk::human(least),
                limits.high_percent,
                disk::human(limits.floor),
                disk::human(missing),
            );
            self.unpin_oldest(missing, &why).await
        } else {
            0
        };
        let total = {
            let mut gave = crate::sync::lock(&self.gave);
            gave.pending = gave.pending.saturating_add(done);
            gave.total = gave.total.saturating_add(done);
            gave.total
        };
        if let Some(note) = &limits.note {
            note.set_ready_noting(format!(
                "pinned images give way below {} free (GC high threshold {} %, floor {}): {} \
                 free of {} at the last look, {} unpinned for it since the start",
                disk::human(least),
                limits.high_percent,
                disk::human(limits.floor),
                disk::human(free),
                disk::human(capacity),
                disk::human(total),
            ));
        }
        done
    }

    /// Unpins one image; whether it was.
    async fn unpin(&self, id: &str, why: &str) -> bool {
        match self.store.unpin(id).await {
            Ok(()) => {
                let size = self.lock().remove(id).map_or(0, |h| h.size);
                tracing::info!(image = %id, size, "image unpinned: {why}");
                true
            }
            Err(e) => {
                tracing::warn!(image = %id, error = %e, "unpinning the image failed ({why}); trying again later");
                false
            }
        }
    }

    /// Unpins the held images pulled more than [`MAX_AGE`] before `now` (seconds since the
    /// epoch).
    pub async fn unpin_expired(&self, now: i64) {
        let max = i64::try_from(MAX_AGE.as_secs()).unwrap_or(i64::MAX);
        let expired: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, h)| now.saturating_sub(h.since) > max)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.unpin(&id, "unused for longer than kruised keeps an image pinned")
                .await;
        }
    }

    /// Unpins the held images that containers run now; how many.
    pub async fn unpin_used(&self) -> Result<usize, CriError> {
        if self.lock().is_empty() {
            return Ok(0);
        }
        let used = self.store.in_use().await?;
        let mut n = 0;
        for id in self.held() {
            if used.iter().any(|u| dialect::same_image_id(u, &id))
                && self.unpin(&id, "a container runs it").await
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Stops pinning for good: the runtime does not serve containerd's images service.
    fn turn_off(&self, e: &CriError) {
        if !self.off.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(error = %e, "the runtime does not serve containerd's images service: pre-pulled images are not pinned");
        }
    }

    /// Takes up the pins kruised made before (its labels), then unpins each image at its first
    /// use, until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        match self.store.pinned().await {
            Err(e @ CriError::Unsupported { .. }) => {
                self.turn_off(&e);
                // a long-lived task of the daemon: it ends with the daemon, not before
                cancel.cancelled().await;
                return;
            }
            Ok(pinned) => {
                let n = pinned.len();
                let mut held = self.lock();
                for PinnedImage { id, since, size } in pinned {
                    held.entry(id).or_insert(Held { since, size });
                }
                drop(held);
                if n > 0 {
                    tracing::info!(
                        images = n,
                        "images kruised pinned before, held until their first use"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the images kruised pinned before failed; they stay pinned until a NodeImage tag that names them is removed")
            }
        }
        loop {
            let idle = self.lock().is_empty();
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.wake.notified(), if idle => continue,
                () = tokio::time::sleep(crate::backoff::jitter(self.interval)), if !idle => {}
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            self.unpin_expired(now).await;
            if let Err(e) = self.unpin_used().await {
                tracing::warn!(error = %e, "listing the containers to unpin used images failed");
            }
            self.give_way().await;
        }
    }
}

#[cfg(test)]
mod tests;
