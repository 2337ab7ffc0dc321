//! Admission of an optional pull by the image's size (issue 42, item 2; kruise #1995, #2071).
//!
//! Before a NodeImage tag or a next-batch image is pulled, kruised reads the image's compressed
//! size from its registry manifest ([`super::registry`], with the pull's own credentials),
//! estimates its size on disk as that times a ratio learned on this node, and admits the pull
//! only if the image filesystem's free space minus that estimate stays at or above the floor
//! (`--image-fs-min-free`) and its use stays below the kubelet's GC high threshold
//! (`--image-gc-high-threshold-percent`, the kubelet's `imageGCHighThresholdPercent`, 85 %).
//! Otherwise the attempt is refused with a message naming every number: retried later when the
//! image would fit on this filesystem once the kubelet's GC made room, failed at once when it
//! would not fit even on an empty one.
//!
//! The in-place update's pull is on a pod's critical path: the kubelet would pull the image
//! anyway, so it keeps the floor check only ([`super::task::disk_refusal`]).
//!
//! The ratio: containerd reports an image's size (CRI `Image.size`) as its compressed content,
//! while its disk cost is that content plus the unpacked snapshots. So the ratio learns from
//! what a pull took from the filesystem (free space before minus after, over the manifest's
//! size), bounded below by CRI's size over the manifest's; concurrent pulls make it larger,
//! never smaller. It starts at [`DEFAULT_RATIO`] and is clamped to
//! [[`MIN_RATIO`], [`MAX_RATIO`]].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

use super::disk::{self, Space};
use super::keyring::Credential;
use super::reference::Reference;
use crate::health::ReadinessCondition;

/// The ratio of disk use to compressed size before any pull on this node taught one: layers
/// compress 2-3x, and containerd keeps the compressed blobs beside the unpacked snapshots.
pub const DEFAULT_RATIO: f64 = 2.5;
/// The least ratio: an image never takes less than its compressed content.
pub const MIN_RATIO: f64 = 1.0;
/// The largest ratio learned (a filesystem that shrank for other reasons during a pull).
pub const MAX_RATIO: f64 = 20.0;
/// The weight of a new observation in the learned ratio.
const LEARN_WEIGHT: f64 = 0.5;
/// The kubelet's `imageGCHighThresholdPercent` default.
pub const DEFAULT_GC_HIGH_PERCENT: u8 = 85;

/// What the decision needs: all numbers, no I/O.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inputs {
    /// The image's compressed size (manifest: config + layers), bytes.
    pub compressed: u64,
    /// The ratio of disk use to compressed size.
    pub ratio: f64,
    /// The image filesystem now.
    pub space: Space,
    /// Bytes to keep free (`--image-fs-min-free`).
    pub floor: u64,
    /// The kubelet's GC high threshold, percent of the filesystem in use.
    pub high_percent: u8,
}

impl Inputs {
    /// The estimated disk use of the image: `compressed × ratio`, rounded up.
    pub fn unpacked(&self) -> u64 {
        let est = (self.compressed as f64 * self.ratio.max(MIN_RATIO)).ceil();
        if est >= u64::MAX as f64 {
            u64::MAX
        } else {
            est as u64
        }
    }
}

/// The decision on one pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Pull: `free_after` bytes stay free, by the estimate.
    Admit {
        /// The estimated disk use of the image.
        unpacked: u64,
        /// Free bytes after the pull, by the estimate.
        free_after: u64,
    },
    /// Not now: the image would fit once the kubelet's GC made room. The message names the
    /// numbers.
    Wait(String),
    /// Never on this filesystem: even empty it would not hold the image within the limits.
    Refuse(String),
}

/// The least free bytes the limits allow: the floor, and what keeps use below the threshold
/// (use must stay strictly below `high_percent` of the capacity).
pub(super) fn least_free(capacity: u64, floor: u64, high_percent: u8) -> u64 {
    let high = u128::from(high_percent.min(100));
    // used < capacity × high / 100  ⇔  free > capacity × (100 − high) / 100
    let by_threshold = if high >= 100 {
        0
    } else {
        u64::try_from(u128::from(capacity) * (100 - high) / 100 + 1).unwrap_or(u64::MAX)
    };
    floor.max(by_threshold)
}

/// Admits a pull of an image of `inputs.compressed` bytes, or says why not.
pub fn decide(image: &str, inputs: &Inputs) -> Verdict {
    let unpacked = inputs.unpacked();
    let Space { free, capacity } = inputs.space;
    let least = least_free(capacity, inputs.floor, inputs.high_percent);
    let free_after = free.checked_sub(unpacked);
    if let Some(after) = free_after
        && after >= least
    {
        return Verdict::Admit {
            unpacked,
            free_after: after,
        };
    }
    let limit = match free_after {
        Some(after) if after >= inputs.floor => format!(
            "its use above the kubelet's image GC high threshold of {} % \
             (--image-gc-high-threshold-percent)",
            inputs.high_percent
        ),
        _ => format!(
            "below the {} the daemon keeps free (--image-fs-min-free)",
            disk::human(inputs.floor)
        ),
    };
    let after = match free_after {
        Some(a) => disk::human(a),
        None => format!("-{}", disk::human(unpacked - free)),
    };
    let message = format!(
        "not pulling {image}: it needs about {} on disk ({} compressed × ratio {:.2}), which \
         would leave {after} free of the image filesystem's {} (free now {}), {limit}",
        disk::human(unpacked),
        disk::human(inputs.compressed),
        inputs.ratio,
        disk::human(capacity),
        disk::human(free),
    );
    if capacity.saturating_sub(unpacked) < least {
        Verdict::Refuse(format!(
            "{message}; it would not fit even on the empty filesystem"
        ))
    } else {
        Verdict::Wait(message)
    }
}

/// The ratio learned from this node's pulls.
#[derive(Debug)]
pub struct Ratio {
    value: Mutex<Option<f64>>,
}

impl Default for Ratio {
    fn default() -> Self {
        Ratio {
            value: Mutex::new(None),
        }
    }
}

impl Ratio {
    /// The ratio now: [`DEFAULT_RATIO`] until a pull taught one.
    pub fn get(&self) -> f64 {
        crate::sync::lock(&self.value).unwrap_or(DEFAULT_RATIO)
    }

    /// Learns from a pull of `compressed` bytes after which the runtime reports
    /// `reported` bytes and the filesystem had `taken` bytes less free. `None` when there is
    /// nothing to learn (a size of 0).
    pub fn learn(&self, compressed: u64, reported: u64, taken: u64) -> Option<f64> {
        if compressed == 0 {
            return None;
        }
        let observed = (reported.max(taken) as f64 / compressed as f64).clamp(MIN_RATIO, MAX_RATIO);
        let mut value = crate::sync::lock(&self.value);
        let next = match *value {
            None => observed,
            Some(v) => v + LEARN_WEIGHT * (observed - v),
        };
        *value = Some(next);
        Some(next)
    }
}

/// Where an image's compressed size comes from: the registry, or a double in tests.
pub trait SizeSource: Send + Sync {
    /// The compressed size of `reference` for this node's platform, read with `credentials`
    /// (tried in turn; none: anonymously).
    fn compressed_size<'a>(
        &'a self,
        reference: &'a Reference,
        credentials: &'a [Credential],
    ) -> BoxFuture<'a, Result<u64, String>>;
}

/// Admission by size of the optional pulls; off (`None` in the pull tools) when the daemon
/// keeps no floor.
pub struct Admission {
    /// The kubelet's GC high threshold, percent.
    pub high_percent: u8,
    /// The image filesystem's path as seen here, when set (`--image-fs-path`); otherwise the
    /// mount point the runtime reports (`ImageFsInfo`).
    pub fs_path: Option<PathBuf>,
    /// Free and total bytes of a path (statvfs; replaced in tests).
    pub space: fn(&Path) -> Option<Space>,
    /// The images' sizes.
    pub sizes: Arc<dyn SizeSource>,
    /// The ratio learned so far.
    pub ratio: Ratio,
    /// `/readyz?verbose`'s line on whether the image filesystem is visible (always ready).
    pub visible: Option<ReadinessCondition>,
    /// Bytes admitted pulls under way may still take.
    pub reserved: Mutex<u64>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("high_percent", &self.high_percent)
            .field("fs_path", &self.fs_path)
            .field("ratio", &self.ratio.get())
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// Says on `/readyz?verbose` what the check sees (the daemon stays ready either way).
    pub fn note(&self, note: String) {
        if let Some(c) = &self.visible {
            c.set_ready_noting(note);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;

    fn inputs(compressed: u64, free: u64, capacity: u64, floor: u64) -> Inputs {
        Inputs {
            compressed,
            ratio: 2.5,
            space: Space { free, capacity },
            floor,
            high_percent: 85,
        }
    }

    #[test]
    fn an_image_that_leaves_the_floor_and_the_threshold_is_admitted() {
        // 100 MiB compressed × 2.5 = 250 MiB of 10 GiB with 5 GiB free
        let v = decide("a:1", &inputs(100 * MI, 5 * GI, 10 * GI, GI));
        assert_eq!(
            v,
            Verdict::Admit {
                unpacked: 250 * MI,
                free_after: 5 * GI - 250 * MI
            }
        );
    }

    #[test]
    fn an_image_that_would_pass_the_floor_free_space_alone_is_refused_with_the_numbers() {
        // 1.5 GiB free is above the 1 GiB floor, but 400 MiB × 2.5 = 1000 MiB would leave 524 MiB
        let v = decide("reg/big:1", &inputs(400 * MI, 1536 * MI, 10 * GI, GI));
        let Verdict::Wait(m) = v else {
            panic!("expected a wait, got {v:?}")
        };
        for part in [
            "reg/big:1",
            "1000.0 MiB on disk",
            "400.0 MiB compressed",
            "ratio 2.50",
            "leave 536.0 MiB free",
            "10.0 GiB",
            "free now 1.5 GiB",
            "below the 1.0 GiB",
            "--image-fs-min-free",
        ] {
            assert!(m.contains(part), "{part:?} missing from {m}");
        }
    }

    #[test]
    fn an_image_that_takes_use_past_the_gc_threshold_waits_naming_the_threshold() {
        // 10 GiB, 2 GiB free: 1 GiB more in use makes 90 % > 85 %; the floor (100 MiB) holds
        let v = decide("a:1", &inputs(400 * MI, 2 * GI, 10 * GI, 100 * MI));
        let Verdict::Wait(m) = v else {
            panic!("expected a wait, got {v:?}")
        };
        assert!(m.contains("GC high threshold of 85 %"), "{m}");
    }

    #[test]
    fn use_must_stay_strictly_below_the_threshold() {
        // 100 B filesystem, 85 %: at most 84 B used, so 16 B must stay free
        assert_eq!(least_free(100, 0, 85), 16);
        assert_eq!(least_free(100, 20, 85), 20, "the floor when it is higher");
        assert_eq!(least_free(100, 0, 100), 0, "100 % bounds nothing");
        let ok = Inputs {
            ratio: 1.0,
            ..inputs(84, 100, 100, 0)
        };
        assert!(matches!(decide("a", &ok), Verdict::Admit { .. }));
        let over = Inputs {
            ratio: 1.0,
            ..inputs(85, 100, 100, 0)
        };
        assert!(
            matches!(decide("a", &over), Verdict::Refuse(_)),
            "85 of 100 B is past the threshold even on the empty filesystem"
        );
        let later = Inputs {
            ratio: 1.0,
            ..inputs(40, 50, 100, 0)
        };
        assert!(
            matches!(decide("a", &later), Verdict::Wait(_)),
            "10 B would stay free: not now, but once the GC made room"
        );
    }

    #[test]
    fn an_image_larger_than_the_whole_filesystem_fails_at_once() {
        let v = decide("huge:1", &inputs(20 * GI, 10 * GI, 10 * GI, GI));
        let Verdict::Refuse(m) = v else {
            panic!("expected a refusal, got {v:?}")
        };
        assert!(m.contains("leave -40.0 GiB free"), "{m}");
        assert!(m.contains("not fit even on the empty filesystem"), "{m}");
    }

    #[test]
    fn huge_sizes_and_ratios_do_not_overflow() {
        let i = Inputs {
            compressed: u64::MAX,
            ratio: MAX_RATIO,
            ..inputs(0, u64::MAX, u64::MAX, u64::MAX)
        };
        assert_eq!(i.unpacked(), u64::MAX);
        assert!(matches!(decide("x", &i), Verdict::Refuse(_)));
        assert!(matches!(
            decide("x", &inputs(0, 0, 0, 0)),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn the_ratio_starts_at_the_default_and_learns_from_what_pulls_took() {
        let r = Ratio::default();
        assert_eq!(r.get(), DEFAULT_RATIO);
        assert_eq!(
            r.learn(0, 10, 10),
            None,
            "nothing to learn from a size of 0"
        );
        // containerd reports the compressed size; the filesystem lost 3x
        assert_eq!(r.learn(100, 100, 300), Some(3.0));
        assert_eq!(r.learn(100, 100, 100), Some(2.0));
        // a filesystem that gained space (a GC ran) teaches no ratio below 1
        assert_eq!(r.learn(100, 0, 0), Some(1.5));
        assert_eq!(r.learn(1, u64::MAX, 0), Some(1.5 + 0.5 * (MAX_RATIO - 1.5)));
    }
}
