//! The timelines' metrics (`kruised_inplace_update_*`). Labels are bounded: the step, what
//! showed the update, how it ended; no pod or container names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::track::{End, Step, Update};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SeenByLabel {
    seen_by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabel {
    seen_by: &'static str,
    result: &'static str,
}

/// 100 ms .. ~410 s, doubling: an update without a pull (a second or two) to a slow pull.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 13))
}

/// The metrics (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct Metrics {
    steps: Family<StepLabel, Histogram, fn() -> Histogram>,
    unready: Family<SeenByLabel, Histogram, fn() -> Histogram>,
    updates: Family<EndLabel, Counter>,
    slow_events: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them on `registry` (kruised's: `kruised_` prefixed).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            steps: Family::new_with_constructor(buckets),
            unready: Family::new_with_constructor(buckets),
            updates: Family::default(),
            slow_events: Counter::default(),
        };
        registry.register(
            "step_seconds",
            "Seconds from an in-place update seen on the node (grace annotation, \
             InPlaceUpdateReady False, or the spec's change) to each step: image_present, \
             container_stopped, container_started, ready, meta_written",
            m.steps.clone(),
        );
        registry.register(
            "unready_seconds",
            "The unready window of an in-place update: from InPlaceUpdateReady False (or the \
             update seen, for a pod without the gate) to Ready True again, by what showed the \
             update first",
            m.unready.clone(),
        );
        registry.register(
            "timelines",
            "In-place updates followed on the node, by what showed them first and how they \
             ended (finished, superseded, abandoned, unfinished)",
            m.updates.clone(),
        );
        registry.register(
            "slow_events",
            "Events recorded on a pod because its unready window passed \
             --slow-in-place-update-threshold",
            m.slow_events.clone(),
        );
        m
    }

    /// Records an update that ended: counted always; its steps and window only when it
    /// finished and was followed from its start.
    pub fn ended(&self, u: &Update) {
        let Some((how, _)) = u.end else {
            return;
        };
        let seen_by = u.seen_by.as_str();
        self.updates
            .get_or_create(&EndLabel {
                seen_by,
                result: how.as_str(),
            })
            .inc();
        if how != End::Finished || u.joined_late {
            return;
        }
        for step in Step::ALL {
            if let Some(d) = u.after_seen(step) {
                self.steps
                    .get_or_create(&StepLabel {
                        step: step.as_str(),
                    })
                    .observe(d.as_secs_f64());
            }
        }
        if let Some(w) = u.unready() {
            self.unready
                .get_or_create(&SeenByLabel { seen_by })
                .observe(w.as_secs_f64());
        }
    }

    /// Counts an event about a slow update.
    pub fn slow_event(&self) {
        self.slow_events.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::timeline::track::example;

    fn encoded(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).expect("encodes");
        out
    }

    #[test]
    fn a_finished_update_is_measured_and_one_joined_late_or_superseded_only_counted() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.ended(&example(false));
        m.ended(&example(true));
        let mut superseded = example(false);
        superseded.end = superseded.end.map(|(_, at)| (End::Superseded, at));
        m.ended(&superseded);
        let text = encoded(&registry);
        for line in [
            "step_seconds_count{step=\"image_present\"} 1",
            "step_seconds_sum{step=\"image_present\"} 1.0",
            "step_seconds_sum{step=\"container_stopped\"} 2.0",
            "step_seconds_sum{step=\"container_started\"} 3.0",
            "step_seconds_sum{step=\"ready\"} 4.0",
            "step_seconds_sum{step=\"meta_written\"} 5.0",
            "unready_seconds_sum{seen_by=\"gate\"} 4.0",
            "unready_seconds_count{seen_by=\"gate\"} 1",
            "timelines_total{seen_by=\"gate\",result=\"finished\"} 2",
            "timelines_total{seen_by=\"gate\",result=\"superseded\"} 1",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }
}
