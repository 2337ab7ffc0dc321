//! ContainerRecreateRequest: recreates the named containers of a pod on request, the way
//! kruise-daemon does (docs/kruise-wire.md): the node's active requests (labels
//! `crr.apps.kruise.io/node-name=<node>` and `active=true`), one pod at a time (the work queue
//! key is the pod, so requests for one pod run one after the other and the others wait in
//! phase Pending), phase `Recreating` first, the unready grace, one kill per pass through the
//! shared kill path (`controller/kill.rs`), per-container states, and `Completed` at the end.
//! Each stop is recorded on the pod with the request's name (`record.rs`,
//! `controller/provenance.rs`).
//!
//! Status writes are JSON merge patches of the changed fields only. What was done is read back
//! from the request's status and the runtime: a container about to be killed is recorded as
//! killed first, so a daemon restart in the middle never kills it twice. The daemon also
//! remembers its own kills until the request ends, because the watched copy of a request can be
//! older than its last write, and a status written from that copy must not take `isKilled`
//! back. For the same reason it remembers the requests it completed until the watch shows them
//! completed or gone: a pass on a copy older than the completion would complete (and count) it
//! again. When the manager ends a request (completion, deletion), a kill in progress for it is
//! called off.
//!
//! Laid out as container meta is: what is remembered between passes has one owner,
//! `memory::Memory`, the only place that locks; a pass observes, decides without I/O, and
//! applies.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this map, and [`start`]: the tasks below |
//! | `controller.rs` | what every task holds: the daemon's handles, the settings, the memory |
//! | `memory.rs` | what is remembered of the requests between passes: its one owner, the only file that locks |
//! | `requests.rs` | the request watch: each change brings its pod's pass, and the memory follows the requests |
//! | `reconcile.rs` | the workers, and one pass over a pod: observe, decide, apply, in stages |
//! | `observe.rs` | what a pass observes: the pod's requests, their runtime, the containers' states, the pod's IPs |
//! | `decide.rs` | the decisions, pure: which request runs, whether it is ready, each container's state, the plan |
//! | `apply.rs` | the status writes, the completion, and a kill on a task of its own |
//! | `record.rs` | the stops written on their pods |
//! | `metrics.rs` | the controller's metrics |
//!
//! Following a request to its kill: the watch sees it (`requests.rs`: its pod queued); a
//! worker's pass picks it and sets it `Recreating` (`reconcile.rs`, `decide.rs`); the next pass
//! observes its containers (`observe.rs`), the plan writes their states, then kills the first
//! (`apply.rs`, recorded killed first); the kill's end brings the pass that waits for the
//! kubelet and the manager, and completes the request.

mod apply;
mod controller;
pub mod decide;
mod memory;
mod metrics;
mod observe;
mod reconcile;
mod record;
mod requests;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing::Instrument;

pub use self::controller::EVENT_COMPONENT;
use self::controller::{RecreateController, WORKERS};
use self::memory::Memory;
pub use self::metrics::Metrics;
use super::context::Context;
use super::provenance::Book;
use super::queue::{QueueMetrics, RECREATE_QUEUE, WorkQueue};

/// Starts the controller (kruise runs it always: no gate): its own metrics on `registry`, its
/// queue's on `queues` (kruise-daemon's queue name), its stops recorded in `book`.
pub fn start(ctx: &Context, registry: &mut Registry, queues: &QueueMetrics, book: &Book) {
    let events = ctx.event_sink(EVENT_COMPONENT);
    let shared = Arc::new(RecreateController {
        requests: ctx.recreate_requests.clone(),
        client: ctx.client.clone(),
        runtimes: ctx.runtimes.clone(),
        queue: WorkQueue::with_metrics(RECREATE_QUEUE, queues),
        events,
        metrics: Metrics::register(registry),
        pods: ctx.pods.clone(),
        memory: Memory::default(),
        book: book.clone(),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let span = tracing::info_span!("recreate");
    ctx.spawn(
        "recreate request watch",
        requests::watch_requests(shared.clone()).instrument(span.clone()),
    );
    ctx.watch_queue("recreate", &shared.queue);
    for _ in 0..WORKERS {
        ctx.spawn(
            "recreate worker",
            reconcile::worker(shared.clone()).instrument(span.clone()),
        );
    }
}
