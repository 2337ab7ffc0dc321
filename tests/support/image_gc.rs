//! The kubelet's image garbage collector, as a double over the CRI (`ListImages`,
//! `ImageFsInfo`, `ListContainers`, `RemoveImage`), following the kubelet's rule
//! (`pkg/kubelet/images/image_gc_manager.go`, as its documentation states it):
//!
//! - a pass does nothing while the image filesystem's usage is below the high threshold
//!   (`imageGCHighThresholdPercent` of its capacity);
//! - above it, it frees `usage - low threshold` bytes: it removes images oldest first by when a
//!   container last used them (else when the collector first saw them), skipping images a
//!   container uses (in any state) and images the runtime reports pinned (CRI `Image.pinned`),
//!   counting each removed image's size, until enough is freed.
//!
//! Usage is what `ImageFsInfo` reports for the first image filesystem, and never less than the
//! listed images' sizes: the kubelet reads the disk itself (cadvisor), which holds at least the
//! images, while containerd samples the usage it reports every few seconds (1.6 reports 0 for a
//! while after its start). The capacity and both thresholds are parameters, as the kubelet's are
//! configuration. A [`ImageGc::scope`] keeps a test's collector to the images of its own
//! repositories, so a pass never removes what a test running beside it uses; the kubelet's has
//! no such limit.

use std::collections::HashMap;
use std::sync::Mutex;

use kruised::cri::{ContainerFilter, Image, ImageService, RuntimeService, dialect};

/// The collector's parameters and what it remembers between passes (when it first saw each
/// image, when a container last used it), as the kubelet's image manager does.
#[derive(Debug)]
pub struct ImageGc {
    /// The image filesystem's capacity in bytes.
    pub capacity: u64,
    /// `imageGCHighThresholdPercent` (the kubelet's default 85).
    pub high_percent: u64,
    /// `imageGCLowThresholdPercent` (the kubelet's default 80).
    pub low_percent: u64,
    /// Only images with a tag or digest starting with one of these are candidates (empty: all).
    pub scope: Vec<String>,
    /// Per image ID: when first seen, when last used (a pass counter: the collector's clock).
    seen: Mutex<HashMap<String, (u64, u64)>>,
    passes: Mutex<u64>,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct GcPass {
    /// The usage it read (bytes).
    pub usage: u64,
    /// Whether it was over the high threshold (else it did nothing).
    pub over_threshold: bool,
    /// The images it removed, in order.
    pub removed: Vec<Image>,
    /// Candidates it skipped because the runtime reports them pinned.
    pub skipped_pinned: Vec<Image>,
    /// Candidates it skipped because a container uses them.
    pub skipped_in_use: Vec<Image>,
}

impl GcPass {
    /// Whether it removed an image with a tag or digest starting with `name`.
    pub fn removed_named(&self, name: &str) -> bool {
        self.removed
            .iter()
            .any(|i| names(i).any(|n| n.starts_with(name)))
    }
}

fn names(i: &Image) -> impl Iterator<Item = &String> {
    i.repo_tags.iter().chain(i.repo_digests.iter())
}

impl ImageGc {
    /// A collector for a filesystem of `capacity` bytes with the kubelet's thresholds (high,
    /// low, in percent).
    pub fn new(capacity: u64, high_percent: u64, low_percent: u64) -> Self {
        ImageGc {
            capacity,
            high_percent,
            low_percent,
            scope: Vec::new(),
            seen: Mutex::new(HashMap::new()),
            passes: Mutex::new(0),
        }
    }

    /// The same, removing only images named under one of `prefixes` (`registry/repo`).
    pub fn scope(mut self, prefixes: &[&str]) -> Self {
        self.scope = prefixes.iter().map(|p| p.to_string()).collect();
        self
    }

    fn in_scope(&self, i: &Image) -> bool {
        self.scope.is_empty() || names(i).any(|n| self.scope.iter().any(|p| n.starts_with(p)))
    }

    /// One garbage collection pass over `runtime`; panics on a CRI error (a test double).
    pub async fn pass<R: ImageService + RuntimeService>(&self, runtime: &R) -> GcPass {
        let now = {
            let mut p = self.passes.lock().expect("lock");
            *p += 1;
            *p
        };
        let images = runtime
            .list_images()
            .await
            .unwrap_or_else(|e| panic!("ListImages: {e}"));
        let containers = runtime
            .list_containers(ContainerFilter::default())
            .await
            .unwrap_or_else(|e| panic!("ListContainers: {e}"));
        let in_use = |i: &Image| containers.iter().any(|c| dialect::runs_image(i, c));
        // the image manager's records: first seen, last used
        {
            let mut seen = self.seen.lock().expect("lock");
            for i in &images {
                let e = seen.entry(i.id.clone()).or_insert((now, 0));
                if in_use(i) {
                    e.1 = now;
                }
            }
        }
        let usage = runtime
            .image_fs_info()
            .await
            .unwrap_or_else(|e| panic!("ImageFsInfo: {e}"))
            .first()
            .and_then(|f| f.used_bytes)
            .unwrap_or(0)
            .max(images.iter().map(|i| i.size).sum());
        let mut pass = GcPass {
            usage,
            over_threshold: usage * 100 >= self.high_percent * self.capacity,
            ..Default::default()
        };
        if !pass.over_threshold {
            return pass;
        }
        let to_free = usage.saturating_sub(self.low_percent * self.capacity / 100);
        let mut candidates: Vec<(u64, u64, Image)> = {
            let seen = self.seen.lock().expect("lock");
            images
                .into_iter()
                .filter(|i| self.in_scope(i))
                .map(|i| {
                    let (first, last) = seen.get(&i.id).copied().unwrap_or((now, 0));
                    (last, first, i)
                })
                .collect()
        };
        // oldest last use first, then the earliest seen
        candidates.sort_by_key(|(last, first, _)| (*last, *first));
        let mut freed = 0;
        for (_, _, image) in candidates {
            if freed >= to_free {
                break;
            }
            if in_use(&image) {
                pass.skipped_in_use.push(image);
                continue;
            }
            if image.pinned {
                pass.skipped_pinned.push(image);
                continue;
            }
            runtime
                .remove_image(&image.id)
                .await
                .unwrap_or_else(|e| panic!("RemoveImage {}: {e}", image.id));
            freed += image.size;
            pass.removed.push(image);
        }
        pass
    }
}
