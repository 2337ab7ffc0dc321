//! Container meta: keeps `apps.kruise.io/runtime-containers-meta` true for the node's
//! kruise-managed pods, and stops containers whose env from metadata went stale during an
//! in-place update so the kubelet recreates them with the new values.
//!
//! Triggers are the pod watch (no fixed enqueue delay, unlike kruise-daemon's 1 s), the
//! runtime's container events where it offers them, and a relist as fallback. Every stop is
//! recorded on the pod with its reason (`controller/provenance.rs`), in the patch that writes
//! the annotation.
//!
//! In the manner of kube-rs's `reflector::store` (one writer owns every change, readers get a
//! view): what the controller remembers between passes has one owner, `memory::Memory`,
//! the only place that locks; a pass reads a view of it, decides without it, and tells it what
//! was done.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this map, and [`start`]: the tasks below |
//! | `controller.rs` | what every task holds: the daemon's handles, the settings, the memory |
//! | `memory.rs` | what is remembered between passes: its one owner, the only file that locks |
//! | `pods.rs` | the pod watch and its event filter (kruise's rule against a patch storm on start), the relist |
//! | `events.rs` | the runtime's container events, where it sends them |
//! | `reconcile.rs` | one pass over a pod: observe, plan, apply |
//! | `observe.rs` | what a pass sees of a pod, the step `kruised explain` takes too |
//! | `decide.rs` | the plan, pure: the annotation, whether and when to stop a container |
//! | `settle.rs` | when a stop is safe: what a pod's history says of the kubelet (`docs/RELIABILITY.md`, "When a stale-env stop is safe") |
//! | `lag.rs` | how late this node's kubelet reports container changes |
//! | `restart.rs` | the stop itself, on a task of its own, and the image checks the plan asks for |
//! | `env.rs` | reading a running container's env |
//! | `metrics.rs` | the controller's metrics |
//!
//! Following an env change to its stop: the pod watch sees the new version (`pods.rs`: the
//! memory records it, the filter queues the pod); a worker's pass observes the pod and its
//! containers (`reconcile.rs`), the plan finds the env stale and the stop safe (`decide.rs`,
//! `settle.rs`), and `restart.rs` stops the container.

mod controller;
pub mod decide;
pub mod env;
mod events;
mod lag;
mod memory;
mod metrics;
mod observe;
mod pods;
mod reconcile;
mod restart;
pub mod settle;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing::Instrument;

use self::controller::ContainerMeta;
use self::memory::Memory;
pub use self::metrics::Metrics;
pub use self::observe::{Observed, observe_as_started};
use self::pods::NowOrNever;
pub use self::reconcile::{Planned, plan};
pub use self::restart::{image_id_matches, image_matches};
use super::context::Context;
use super::provenance::Book;
use super::queue::{CONTAINER_META_QUEUE, QueueMetrics, WorkQueue};

/// Starts the controller when pods are watched: its own metrics on `registry`, its queue's on
/// `queues` (kruise-daemon's queue name), its stops recorded in `book`.
pub fn start(ctx: &Context, registry: &mut Registry, queues: &QueueMetrics, book: &Book) {
    let Some(pods) = ctx.pods.clone() else {
        return;
    };
    let c = Arc::new(ContainerMeta {
        pods,
        client: ctx.client.clone(),
        runtimes: ctx.runtimes.clone(),
        queue: WorkQueue::with_metrics(CONTAINER_META_QUEUE, queues),
        with_env: ctx.config.gates.in_place_update_env_from_metadata,
        restart_delay: ctx.config.env_restart_delay,
        memory: Arc::new(Memory::default()),
        book: book.clone(),
        events: ctx.event_sink("kruise-daemon-containermeta"),
        metrics: Metrics::register(registry),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let span = tracing::info_span!("containermeta");
    let changes = c.pods.subscribe();
    let listed_before = c.pods.store().wait_until_ready().now_or_never_ready();
    ctx.spawn(
        "containermeta pod watch",
        pods::watch_pods(c.clone(), changes, listed_before).instrument(span.clone()),
    );
    ctx.spawn(
        "containermeta relist",
        pods::relist(c.clone(), ctx.config.relist_interval).instrument(span.clone()),
    );
    ctx.spawn(
        "containermeta runtime events",
        events::runtime_events(c.clone(), ctx.config.relist_interval).instrument(span.clone()),
    );
    ctx.watch_queue("containermeta", &c.queue);
    // `--containermeta-workers` (kruise PR #2423's flag), 4 unless given
    for _ in 0..ctx.config.containermeta_workers {
        ctx.spawn(
            "containermeta worker",
            reconcile::worker(c.clone()).instrument(span.clone()),
        );
    }
}
