//! NodePodProbe: runs the custom probes kruise-manager lists for the node's pods (from
//! PodProbeMarkers) and reports their results in the NodePodProbe's status, which the manager
//! turns into pod conditions, labels and annotations (docs/kruise-wire.md).
//!
//! - One task per (pod, probe): kubelet semantics (initial delay, period, timeout, success and
//!   failure thresholds, each at least 1), started, updated in place or stopped as the spec
//!   changes; a handler change resets the result to Unknown. No thread per probe: thousands of
//!   probes are thousands of sleeping tasks.
//! - At most [`PROBES_PER_POD`] probes a pod and [`PROBES_PER_NODE`] a node are held (each
//!   costs memory whether it runs or waits), the node's shared by namespace then pod in turn
//!   (`decide::cap`); each probe over a cap is in the status as Unknown with why, and the
//!   count is logged at most once a minute.
//! - The containers are looked up in one shared listing of the runtime, refreshed once a second
//!   while probes exist (one CRI call whatever their number); exec probes run in a bounded
//!   number of `ExecSync` calls at once, network probes in a bounded number of connections,
//!   each shared fairly by namespace and pod (`slots.rs`).
//! - Results are keyed by (pod UID, probe name) (kruise keys by container ID, so two probes of
//!   one container overwrite each other). The status is written only when a result changes,
//!   coalesced across probes into one merge patch, at most once a `STATUS_WRITE_INTERVAL`;
//!   stale entries of pods and probes gone from the spec are dropped. The manager needs no heartbeat (it reacts to changes only).
//! - Events `KruiseProbeSucceeded` / `KruiseProbeFailed` on the pod when a result changes, and
//!   for a first result only when it is a failure (kruise emits one per result on every status
//!   pass).
//!
//! Laid out as container meta is: what is remembered between runs has one owner,
//! `memory::Memory`, the only place that locks besides the slots; a probe task observes, decides without I/O, and
//! applies.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this map, and [`start`]: the tasks below |
//! | `controller.rs` | what every task holds: the daemon's handles, the node's slots, the memory |
//! | `memory.rs` | the containers listed, the results: their one owner |
//! | `slots.rs` | the node's exec and network slots, shared fairly by namespace and pod |
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
pub mod slots;
mod tasks;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tracing::Instrument;

use self::controller::ProbeController;
pub use self::controller::{EVENT_COMPONENT, STATUS_WRITE_INTERVAL};
pub use self::decide::{
    PROBE_TIMEOUT_MAX, PROBES_PER_NODE, PROBES_PER_POD, REASON_FAILED, REASON_SUCCEEDED,
};
use self::memory::Memory;
pub use self::metrics::Metrics;
use self::slots::Slots;
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
        exec_slots: Slots::new(slots::EXEC),
        network_slots: Slots::new(slots::NETWORK),
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
