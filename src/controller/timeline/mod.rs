//! In-place update timelines: for each kruise-managed pod of the node, the steps of its
//! in-place updates (seen, image present, container stopped, container started, ready, meta
//! written), measured in `/metrics`, served to `kruised explain` by the admin endpoint, and
//! told in an event on the pod when the unready window passes `--slow-in-place-update-threshold`
//! (the timelines' only API write). Observation only: nothing here changes what the daemon
//! does to a pod.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this map, and [`start`] |
//! | `facts.rs` | what one version of a pod says of an update, pure |
//! | `track.rs` | one pod's updates and their steps, pure: any order, duplicates, a restart |
//! | `book.rs` | the node's timelines, one per pod, and their handle [`Timelines`] (the puller's entry point: [`Timelines::image_present`]) |
//! | `view.rs` | a timeline as JSON (the admin endpoint, explain) and as text |
//! | `watch.rs` | the task: the pod watch, the runtime, the sweep, the event |
//! | `metrics.rs` | `kruised_inplace_update_*` |
//!
//! Memory is bounded: one entry per managed pod on the node (the update in flight and the
//! last one ended, at most `facts::MAX_CONTAINERS` containers each, long image names kept
//! short), forgotten when the pod leaves; a pod updated a thousand times holds what it held
//! after the first.

mod book;
mod facts;
mod metrics;
mod track;
pub mod view;
mod watch;

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tracing::Instrument;

pub use self::book::Timelines;
use self::metrics::Metrics;
pub use self::watch::SLOW_REASON;
use self::watch::Watcher;
use super::context::Context;

/// Starts following the node's in-place updates when pods are watched (metrics on `registry`);
/// returns the timelines (empty, and staying so, when pods are not watched).
pub fn start(ctx: &Context, registry: &mut Registry) -> Timelines {
    let book = Timelines::default();
    let Some(pods) = ctx.pods.clone() else {
        return book;
    };
    let w = Arc::new(Watcher {
        pods,
        runtimes: ctx.runtimes.clone(),
        book: book.clone(),
        metrics: Metrics::register(registry),
        events: ctx.event_sink("kruised-inplace-update"),
        slow: ctx.config.slow_in_place_update,
        cancel: ctx.cancel.clone(),
        times: Default::default(),
    });
    let changes = w.pods.subscribe();
    ctx.spawn(
        "in-place update timelines",
        watch::run(w, changes).instrument(tracing::info_span!("timeline")),
    );
    book
}
