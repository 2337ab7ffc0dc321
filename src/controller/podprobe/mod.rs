//! NodePodProbe: runs the custom probes kruise-manager lists for the node's pods (from
//! PodProbeMarkers) and reports their results in the NodePodProbe's status, which the manager
//! turns into pod conditions, labels and annotations (docs/kruise-wire.md).
//!
//! - One task per (pod, probe): kubelet semantics (initial delay, period, timeout, success and
//!   failure thresholds, each at least 1), started, updated in place or stopped as the spec
//!   changes; a handler change resets the result to Unknown. No thread per probe: thousands of
//!   probes are thousands of sleeping tasks.
//! - The containers are looked up in one shared listing of the runtime, refreshed once a second
//!   while probes exist (one CRI call whatever their number); exec probes run through a bounded
//!   number of concurrent `ExecSync` calls.
//! - Results are keyed by (pod UID, probe name) (kruise keys by container ID, so two probes of
//!   one container overwrite each other). The status is written only when a result changes,
//!   coalesced across probes into one merge patch; stale entries of pods and probes gone from
//!   the spec are dropped. The manager needs no heartbeat (it reacts to changes only).
//! - Events `KruiseProbeSucceeded` / `KruiseProbeFailed` on the pod when a result changes, and
//!   for a first result only when it is a failure (kruise emits one per result on every status
//!   pass).
//!
//! Laid out as container meta is: what is remembered between runs has one owner,
//! `memory::Memory`, the only place that locks; a probe task observes, decides without I/O, and
//! applies.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this map, and [`start`]: the tasks below |
//! | `controller.rs` | what every task holds: the daemon's handles, the node's exec slots, the memory |
//! | `memory.rs` | the containers listed, the results, the namespaces' exec slots: their one owner, the only file that locks |
//! | `tasks.rs` | the probe tasks following the spec, and one probe's loop: observe, decide, run, keep |
//! | `observe.rs` | the node's NodePodProbe, the container listing, a pod's IPs |
//! | `decide.rs` | the decisions, pure: the probes wanted, whether one runs, thresholds, results, the status |
//! | `apply.rs` | a result kept with its event, and the status writer |
//! | `prober.rs` | running one probe: exec, HTTP GET, TCP, gRPC (`grpc.rs`) |
//! | `metrics.rs` | the controller's metrics |
//!
//! Following a probe to the status: the spec lists it (`tasks.rs`: a task started); on each
//! tick the task finds its container in the listing (`observe.rs`, `memory.rs`), runs the probe
//! when it is due (`decide.rs`, `prober.rs`), and a result the thresholds let through is kept
//! (`apply.rs`), which wakes the status writer (`apply.rs`).

mod apply;
mod controller;
pub mod decide;
pub mod grpc;
mod memory;
mod metrics;
mod observe;
pub mod prober;
mod tasks;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Instrument;

pub use self::controller::EVENT_COMPONENT;
use self::controller::{EXEC_CONCURRENCY, ProbeController};
pub use self::decide::{PROBE_TIMEOUT_MAX, REASON_FAILED, REASON_SUCCEEDED};
use self::memory::Memory;
pub use self::metrics::Metrics;
use super::context::Context;

/// Starts the controller when probes are enabled (`PodProbeMarkerGate`).
pub fn start(ctx: &Context, registry: &mut Registry) {
    let Some(probes) = ctx.pod_probes.clone() else {
        return;
    };
    let events = ctx.event_sink(EVENT_COMPONENT);
    let shared = Arc::new(ProbeController {
        probes,
        client: ctx.client.clone(),
        node: ctx.config.node_name.clone(),
        memory: Memory::default(),
        exec_slots: Semaphore::new(EXEC_CONCURRENCY),
        events,
        metrics: Metrics::register(registry),
        started: Instant::now(),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let runtimes = ctx.runtimes.clone();
    let span = tracing::info_span!("podprobe");
    let writer_alive = ctx.liveness.task("podprobe status writer", &ctx.cancel);
    ctx.spawn(
        "podprobe",
        async move {
            let Some(runtime) = runtimes.wait_primary(&shared.cancel).await else {
                return;
            };
            let writer = apply::write_status(shared.clone());
            shared.tracker.spawn(
                async move {
                    let _alive = writer_alive;
                    writer.await;
                }
                .in_current_span(),
            );
            tasks::sync_workers(shared, runtime).await;
        }
        .instrument(span),
    );
}
