//! The image puller's tunables: the daemon's from its config, shorter waits in tests.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::DaemonConfig;

/// Tunables of the image puller. [`Settings::from_config`] gives the daemon's; tests shorten
/// the waits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Pause after the first failed attempt; doubles after each (kruise: 1 s).
    pub backoff_base: Duration,
    /// Longest pause between attempts (kruise: 30 s).
    pub backoff_cap: Duration,
    /// Delay of the first status write after a quiet period, to batch a burst.
    pub status_coalesce: Duration,
    /// Least time between two status writes while tasks are still running.
    pub status_min_interval: Duration,
    /// Least time between two status writes that change only tags' `progress`.
    pub progress_min_interval: Duration,
    /// A pull that lands nothing for this long fails (`--image-pull-stall-timeout`), where the
    /// runtime shows what pulls land; `None`: never.
    pub stall_timeout: Option<Duration>,
    /// Least free bytes on the image filesystem before a pull; 0: no check (and no admission
    /// by size).
    pub image_fs_min_free: u64,
    /// The kubelet's image GC high threshold, percent: the admission by size keeps the image
    /// filesystem's use below it.
    pub image_gc_high_percent: u8,
    /// The image filesystem's path as seen by the daemon; `None`: the runtime's mount point.
    pub image_fs_path: Option<PathBuf>,
    /// Most pulls at once; `None`: unlimited.
    pub max_workers: Option<usize>,
    /// Most pre-pulls (NodeImage tags, next batch) at once; `None`: unlimited.
    pub max_prepulls: Option<usize>,
    /// Pre-pull the images of pods' next in-place batches.
    pub prepull_next_batch: bool,
    /// Pull the images of pods' in-place updates under way (grace annotation, spec change).
    pub prepull_in_place_update: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(30),
            status_coalesce: Duration::from_millis(50),
            status_min_interval: Duration::from_millis(500),
            progress_min_interval: Duration::from_secs(1),
            stall_timeout: Some(crate::config::DEFAULT_IMAGE_PULL_STALL_TIMEOUT),
            image_fs_min_free: 0,
            image_gc_high_percent: super::admit::DEFAULT_GC_HIGH_PERCENT,
            image_fs_path: None,
            max_workers: None,
            max_prepulls: Some(super::turn::DEFAULT_MAX_PREPULLS),
            prepull_next_batch: true,
            prepull_in_place_update: true,
        }
    }
}

impl Settings {
    /// The daemon's settings.
    pub fn from_config(config: &DaemonConfig) -> Self {
        Settings {
            image_fs_min_free: config.image_fs_min_free,
            image_gc_high_percent: config.image_gc_high_threshold_percent,
            image_fs_path: config.image_fs_path.clone(),
            max_workers: config.max_pull_workers,
            max_prepulls: config.max_prepulls,
            stall_timeout: config.image_pull_stall_timeout,
            prepull_next_batch: config.gates.prepull_next_batch,
            prepull_in_place_update: config.gates.prepull_in_place_update,
            ..Settings::default()
        }
    }
}
