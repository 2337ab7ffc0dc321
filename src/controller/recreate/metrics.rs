//! Metrics of the recreate controller. Labels are bounded: no request, pod or container names.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    result: &'static str,
}

/// The controller's metrics (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct Metrics {
    requests: Family<Outcome, Counter>,
    kills: Counter,
    duration: Histogram,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            requests: Family::default(),
            kills: Counter::default(),
            // 0.5 s .. ~15 min
            duration: Histogram::new(exponential_buckets(0.5, 2.0, 12)),
        };
        registry.register(
            "requests",
            "Recreate requests completed by this daemon, by result (succeeded: every container recreated; failed: one or more failed)",
            m.requests.clone(),
        );
        registry.register(
            "kills",
            "Containers stopped for recreate requests",
            m.kills.clone(),
        );
        registry.register(
            "duration_seconds",
            "Time from a recreate request's creation to its completion",
            m.duration.clone(),
        );
        m
    }

    pub(super) fn killed(&self) {
        self.kills.inc();
    }

    pub(super) fn completed(&self, succeeded: bool, took: Option<Duration>) {
        let result = if succeeded { "succeeded" } else { "failed" };
        self.requests.get_or_create(&Outcome { result }).inc();
        if let Some(t) = took {
            self.duration.observe(t.as_secs_f64());
        }
    }
}
