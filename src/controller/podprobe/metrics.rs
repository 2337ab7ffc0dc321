//! Metrics of the pod probes. Labels are bounded: handler and result, no pod or probe names.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::prober::{Handler, Outcome};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Run {
    handler: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByHandler {
    handler: &'static str,
}

/// The controller's metrics (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct Metrics {
    runs: Family<Run, Counter>,
    duration: Family<ByHandler, Histogram>,
    held: Gauge,
    refused: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            runs: Family::default(),
            duration: Family::new_with_constructor(|| {
                // 100 µs .. ~6.5 s
                Histogram::new(exponential_buckets(0.0001, 3.0, 11))
            }),
            held: Gauge::default(),
            refused: Gauge::default(),
        };
        registry.register(
            "runs",
            "Probe runs, by handler and result (succeeded, failed, error: could not run)",
            m.runs.clone(),
        );
        registry.register(
            "duration_seconds",
            "Time one probe run took, by handler",
            m.duration.clone(),
        );
        registry.register(
            "probes",
            "Probes held: each a task running its probe on its period",
            m.held.clone(),
        );
        registry.register(
            "refused_probes",
            "Probes the NodePodProbe lists over kruised's caps (PROBES_PER_POD, PROBES_PER_NODE), not run",
            m.refused.clone(),
        );
        m
    }

    /// `held` probes run, `refused` are over the caps.
    pub(super) fn probes(&self, held: usize, refused: usize) {
        self.held.set(i64::try_from(held).unwrap_or(i64::MAX));
        self.refused.set(i64::try_from(refused).unwrap_or(i64::MAX));
    }

    pub(super) fn probed(&self, handler: Handler, outcome: &Outcome, took: Duration) {
        let result = match outcome {
            Outcome::Success(_) => "succeeded",
            Outcome::Failure(_) => "failed",
            Outcome::Error(_) => "error",
        };
        let handler = handler.as_str();
        self.runs.get_or_create(&Run { handler, result }).inc();
        self.duration
            .get_or_create(&ByHandler { handler })
            .observe(took.as_secs_f64());
    }
}
