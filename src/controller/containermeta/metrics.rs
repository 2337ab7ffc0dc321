//! Metrics of the container meta controller. Labels are bounded: no pod or container names.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::env::EnvSource;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Source {
    source: &'static str,
}

/// The controller's metrics (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct Metrics {
    restarts: Family<Reason, Counter>,
    restart_failures: Counter,
    patches: Family<Outcome, Counter>,
    env_reads: Family<Source, Counter>,
    reconcile: Histogram,
    kubelet_lag: Histogram,
}

impl Metrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            restarts: Family::default(),
            restart_failures: Counter::default(),
            patches: Family::default(),
            env_reads: Family::default(),
            // 100 µs .. ~6.5 s
            reconcile: Histogram::new(exponential_buckets(0.0001, 3.0, 11)),
            // 250 ms .. 16 s
            kubelet_lag: Histogram::new(exponential_buckets(0.25, 2.0, 7)),
        };
        registry.register(
            "restarts",
            "Containers stopped so the kubelet recreates them, by reason",
            m.restarts.clone(),
        );
        registry.register(
            "restart_failures",
            "Container stops that failed (retried on the next reconcile)",
            m.restart_failures.clone(),
        );
        registry.register(
            "annotation_patches",
            "Patches of the runtime-containers-meta annotation, by result",
            m.patches.clone(),
        );
        registry.register(
            "env_reads",
            "Reads of a running container's env, by source (runtime spec or exec)",
            m.env_reads.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time to reconcile one pod",
            m.reconcile.clone(),
        );
        registry.register(
            "kubelet_report_lag_seconds",
            "How late the kubelet reported a container's start or a stop this daemon made (a slow \
             kubelet makes env restarts wait longer)",
            m.kubelet_lag.clone(),
        );
        m
    }

    pub(super) fn restarted(&self, reason: &'static str) {
        self.restarts.get_or_create(&Reason { reason }).inc();
    }

    pub(super) fn restart_failed(&self) {
        self.restart_failures.inc();
    }

    pub(super) fn patched(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.patches.get_or_create(&Outcome { result }).inc();
    }

    pub(super) fn env_read(&self, source: EnvSource) {
        let source = match source {
            EnvSource::RuntimeSpec => "runtime-spec",
            EnvSource::Exec => "exec",
        };
        self.env_reads.get_or_create(&Source { source }).inc();
    }

    pub(super) fn kubelet_lag(&self, d: Duration) {
        self.kubelet_lag.observe(d.as_secs_f64());
    }

    pub(super) fn observe_reconcile(&self, d: Duration) {
        self.reconcile.observe(d.as_secs_f64());
    }
}
