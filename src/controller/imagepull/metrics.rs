//! Metrics of the image puller, registered under `kruised_imagepull_`. Labels are bounded: a
//! source and a result, never an image name.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `pulls_total` | counter | `source` (`nodeimage`, `next_batch`, `in_place`), `result` (`succeeded`, `failed`, `present`, `shared`) |
//! | `pull_duration_seconds` | histogram | `source`, `result` (`succeeded`, `failed`): CRI `PullImage` calls |
//! | `image_fs_used_bytes` | gauge | - (from `ImageFsInfo`) |
//! | `image_fs_free_bytes` | gauge | - (statvfs of the image filesystem, when visible) |
//! | `queue_length` | gauge | - (tags `Waiting` for a pull slot) |
//! | `tasks` | gauge | `phase` (`Waiting`, `Pulling`, `Succeeded`, `Failed`) |
//! | `next_batch_images` | gauge | - (distinct images the next-batch pre-pull works on) |
//! | `next_batch_skipped` | gauge | `reason` (`not_kruise_owned`, `invalid`, `over_pod_bound`, `over_node_bound`) |
//! | `in_place_images` | gauge | - (distinct images the in-place pull works on: grace annotations, spec changes) |
//! | `in_place_skipped` | gauge | `reason` (as `next_batch_skipped`) |

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Who asked for a pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A NodeImage tag.
    NodeImage,
    /// A pod's next in-place batch (`nextContainerImages`).
    NextBatch,
    /// A pod's in-place update under way: its grace annotation or its spec's changed image.
    InPlace,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::NodeImage => "nodeimage",
            Source::NextBatch => "next_batch",
            Source::InPlace => "in_place",
        }
    }
}

/// How one pull attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The runtime pulled the image.
    Succeeded,
    /// The pull failed (or was refused before the runtime was asked).
    Failed,
    /// The image was already present (`IfNotPresent`): no pull.
    Present,
    /// Another request's pull of the same reference was joined: no second pull.
    Shared,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Present => "present",
            Outcome::Shared => "shared",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PullLabels {
    source: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SkipLabels {
    reason: &'static str,
}

/// What the next-batch pre-pull (or the in-place pull) leaves out now, by reason (see
/// `prepull::plan`, `inplace::plan`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Pods with an in-place update state but no kruise workload as controller.
    pub not_kruise_owned: usize,
    /// Annotations that cannot be read or are too long, and image names that do not parse.
    pub invalid: usize,
    /// Images past a pod's share.
    pub over_pod_bound: usize,
    /// Images past the node's bound.
    pub over_node_bound: usize,
}

/// The puller's metrics (cheap to clone: handles to shared values).
#[derive(Clone, Debug)]
pub struct Metrics {
    pulls: Family<PullLabels, Counter>,
    durations: Family<PullLabels, Histogram>,
    fs_used: Gauge,
    fs_free: Gauge,
    queue: Gauge,
    tasks: Family<PhaseLabels, Gauge>,
    next_batch: Gauge,
    next_batch_skipped: Family<SkipLabels, Gauge>,
    in_place: Gauge,
    in_place_skipped: Family<SkipLabels, Gauge>,
}

fn duration_histogram() -> Histogram {
    // 50 ms .. ~55 min
    Histogram::new(exponential_buckets(0.05, 3.0, 12))
}

/// Sets a plan's gauges: images worked on, and what was left out by reason.
fn set_plan(
    images_gauge: &Gauge,
    skipped_gauge: &Family<SkipLabels, Gauge>,
    images: usize,
    skipped: Skipped,
) {
    let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    images_gauge.set(g(images));
    for (reason, n) in [
        ("not_kruise_owned", skipped.not_kruise_owned),
        ("invalid", skipped.invalid),
        ("over_pod_bound", skipped.over_pod_bound),
        ("over_node_bound", skipped.over_node_bound),
    ] {
        skipped_gauge
            .get_or_create(&SkipLabels { reason })
            .set(g(n));
    }
}

impl Metrics {
    /// Metrics that no registry exports (tests, benchmarks).
    pub fn unregistered() -> Self {
        Metrics {
            pulls: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            fs_used: Gauge::default(),
            fs_free: Gauge::default(),
            queue: Gauge::default(),
            tasks: Family::default(),
            next_batch: Gauge::default(),
            next_batch_skipped: Family::default(),
            in_place: Gauge::default(),
            in_place_skipped: Family::default(),
        }
    }

    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::unregistered();
        registry.register(
            "pulls",
            "Image pull attempts by source and result (present: already on the node; shared: \
             joined an identical pull in flight)",
            m.pulls.clone(),
        );
        registry.register(
            "pull_duration_seconds",
            "Duration of CRI PullImage calls by source and result",
            m.durations.clone(),
        );
        registry.register(
            "image_fs_used_bytes",
            "Bytes used by images on the image filesystem, as the runtime reports (ImageFsInfo)",
            m.fs_used.clone(),
        );
        registry.register(
            "image_fs_free_bytes",
            "Bytes free on the image filesystem (statvfs), when the daemon can see it",
            m.fs_free.clone(),
        );
        registry.register(
            "queue_length",
            "NodeImage pull tasks waiting for a pull slot",
            m.queue.clone(),
        );
        registry.register("tasks", "NodeImage pull tasks by phase", m.tasks.clone());
        registry.register(
            "next_batch_images",
            "Distinct images of pods' next in-place batches the pre-pull works on",
            m.next_batch.clone(),
        );
        registry.register(
            "next_batch_skipped",
            "What the next-batch pre-pull leaves out now: pods not controlled by a kruise \
             workload, unreadable annotations and image names, images past a pod's or the \
             node's bound",
            m.next_batch_skipped.clone(),
        );
        registry.register(
            "in_place_images",
            "Distinct images of pods' in-place updates under way (grace annotations, changed \
             spec images) the in-place pull works on",
            m.in_place.clone(),
        );
        registry.register(
            "in_place_skipped",
            "What the in-place pull leaves out now: pods not controlled by a kruise workload, \
             unreadable grace annotations and image names, images past a pod's or the node's \
             bound",
            m.in_place_skipped.clone(),
        );
        m
    }

    /// Sets what the next-batch pre-pull works on and leaves out now.
    pub fn next_batch(&self, images: usize, skipped: Skipped) {
        set_plan(&self.next_batch, &self.next_batch_skipped, images, skipped);
    }

    /// Sets what the in-place pull works on and leaves out now.
    pub fn in_place(&self, images: usize, skipped: Skipped) {
        set_plan(&self.in_place, &self.in_place_skipped, images, skipped);
    }

    /// Counts one pull attempt.
    pub fn pulled(&self, source: Source, outcome: Outcome) {
        self.pulls
            .get_or_create(&PullLabels {
                source: source.label(),
                result: outcome.label(),
            })
            .inc();
    }

    /// Records the duration of one CRI `PullImage` call.
    pub fn pull_took(&self, source: Source, ok: bool, took: Duration) {
        let result = if ok {
            Outcome::Succeeded
        } else {
            Outcome::Failed
        };
        self.durations
            .get_or_create(&PullLabels {
                source: source.label(),
                result: result.label(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records the image filesystem's usage.
    pub fn image_fs(&self, used: Option<u64>, free: Option<u64>) {
        if let Some(u) = used {
            self.fs_used.set(i64::try_from(u).unwrap_or(i64::MAX));
        }
        if let Some(f) = free {
            self.fs_free.set(i64::try_from(f).unwrap_or(i64::MAX));
        }
    }

    /// Sets the task counts by phase (and the queue length, the `Waiting` count).
    pub fn phases(&self, waiting: usize, pulling: usize, succeeded: usize, failed: usize) {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.queue.set(g(waiting));
        for (phase, n) in [
            ("Waiting", waiting),
            ("Pulling", pulling),
            ("Succeeded", succeeded),
            ("Failed", failed),
        ] {
            self.tasks.get_or_create(&PhaseLabels { phase }).set(g(n));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_encode_with_bounded_labels() {
        let mut registry = Registry::with_prefix("kruised_imagepull");
        let m = Metrics::register(&mut registry);
        m.pulled(Source::NodeImage, Outcome::Succeeded);
        m.pulled(Source::NextBatch, Outcome::Present);
        m.pull_took(Source::NodeImage, true, Duration::from_millis(200));
        m.image_fs(Some(1024), None);
        m.phases(2, 1, 0, 0);
        m.next_batch(
            4,
            Skipped {
                over_pod_bound: 996,
                ..Skipped::default()
            },
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for want in [
            r#"kruised_imagepull_pulls_total{source="nodeimage",result="succeeded"} 1"#,
            r#"kruised_imagepull_pulls_total{source="next_batch",result="present"} 1"#,
            r#"kruised_imagepull_pull_duration_seconds_count{source="nodeimage",result="succeeded"} 1"#,
            "kruised_imagepull_image_fs_used_bytes 1024",
            "kruised_imagepull_queue_length 2",
            r#"kruised_imagepull_tasks{phase="Pulling"} 1"#,
            "kruised_imagepull_next_batch_images 4",
            r#"kruised_imagepull_next_batch_skipped{reason="over_pod_bound"} 996"#,
            r#"kruised_imagepull_next_batch_skipped{reason="not_kruise_owned"} 0"#,
        ] {
            assert!(out.contains(want), "{want} missing from\n{out}");
        }
    }
}
