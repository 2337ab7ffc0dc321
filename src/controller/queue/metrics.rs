//! The work queue metrics client-go exports and controller-runtime registers (kruise-daemon's
//! `/metrics`, spec §6.2: `pkg/internal/metrics/workqueue.go@v0.20.2`), under the same names and
//! labels so dashboards and alerts built on kruise-daemon keep working: `workqueue_depth`,
//! `workqueue_adds_total`, `workqueue_retries_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_unfinished_work_seconds` and
//! `workqueue_longest_running_processor_seconds`, each labelled `{name, controller}` with both set
//! to the queue's name, as controller-runtime sets them.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::sync::lock;

/// The queue name of container meta's pod queue (kruise-daemon's
/// `containermeta/container_meta_controller.go`).
pub const CONTAINER_META_QUEUE: &str = "runtime_container_meta";
/// The queue name of the recreate request controller (kruise-daemon's
/// `crr_daemon_controller.go`).
pub const RECREATE_QUEUE: &str = "crr";

/// The labels of every family: controller-runtime sets both to the queue's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueLabels {
    name: &'static str,
    controller: &'static str,
}

/// client-go's buckets for both durations: `ExponentialBuckets(10e-9, 10, 12)`, 10 ns .. 1000 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 12))
}

/// A queue's work in progress: the seconds its keys in work have been in work, summed, and the
/// longest of them.
type InWorkReading = (f64, f64);
/// What a queue reports at scrape time (`None` once the queue is gone).
type InWork = Box<dyn Fn() -> Option<InWorkReading> + Send + Sync>;
/// Which number of a reading a family reports.
type Pick = fn(&InWorkReading) -> f64;

/// The work queue families, registered once on the unprefixed registry and shared by every
/// queue (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct QueueMetrics {
    depth: Family<QueueLabels, Gauge>,
    adds: Family<QueueLabels, Counter>,
    retries: Family<QueueLabels, Counter>,
    queue_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabels, Histogram, fn() -> Histogram>,
    in_work: Arc<Mutex<Vec<(QueueLabels, InWork)>>>,
}

impl QueueMetrics {
    /// Creates the families and registers them on `registry`, which must be unprefixed for the
    /// names to be client-go's.
    pub fn register(registry: &mut Registry) -> Self {
        let m = QueueMetrics {
            depth: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            work_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            in_work: Arc::new(Mutex::new(Vec::new())),
        };
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            m.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            m.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            m.retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            m.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            m.work_duration.clone(),
        );
        registry.register_collector(Box::new(InWorkCollector(m.in_work.clone())));
        m
    }

    /// The series of the queue `name`; `in_work` is asked at every scrape.
    pub(super) fn queue(&self, name: &'static str, in_work: InWork) -> QueueSeries {
        let labels = QueueLabels {
            name,
            controller: name,
        };
        lock(&self.in_work).push((labels.clone(), in_work));
        QueueSeries {
            depth: self.depth.get_or_create(&labels).clone(),
            adds: self.adds.get_or_create(&labels).clone(),
            retries: self.retries.get_or_create(&labels).clone(),
            queue_duration: self.queue_duration.get_or_create(&labels).clone(),
            work_duration: self.work_duration.get_or_create(&labels).clone(),
        }
    }
}

/// One queue's series (handles to the families' values).
#[derive(Clone)]
pub(super) struct QueueSeries {
    pub(super) depth: Gauge,
    pub(super) adds: Counter,
    pub(super) retries: Counter,
    pub(super) queue_duration: Histogram,
    pub(super) work_duration: Histogram,
}

/// `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`, read
/// from the queues at scrape time (client-go samples them every 500 ms; a scrape-time reading is
/// never older).
struct InWorkCollector(Arc<Mutex<Vec<(QueueLabels, InWork)>>>);

impl std::fmt::Debug for InWorkCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InWorkCollector").finish_non_exhaustive()
    }
}

impl Collector for InWorkCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let readings: Vec<(QueueLabels, InWorkReading)> = lock(&self.0)
            .iter()
            .filter_map(|(labels, read)| read().map(|r| (labels.clone(), r)))
            .collect();
        let families: [(&str, &str, Pick); 2] = [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been \
                 observed by work_duration. Large values indicate stuck threads. One can deduce \
                 the number of stuck threads by observing the rate at which this increases.",
                |r| r.0,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                |r| r.1,
            ),
        ];
        for (name, help, pick) in families {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (labels, reading) in &readings {
                ConstGauge::new(pick(reading)).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}
