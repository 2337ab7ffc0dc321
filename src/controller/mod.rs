//! The capability controllers, one per folder or file: container meta, image pull, recreate
//! requests, pod probes. Each reads the daemon's watches and runtime and writes through
//! `k8s::write`. This file is the folder's face: it names the files and starts the
//! controllers; what they share lives in files of its own, which they import by name
//! (`context`, `containers`, `kill`, `queue`, ...), never from here.
//!
//! | file | what |
//! |---|---|
//! | `context.rs` | [`Context`]: the daemon's handles each controller gets, and its task machinery |
//! | `containers.rs` | a pod's containers in the runtime, and the newest of each name |
//! | `kill.rs` | the one way a container is stopped: preStop hook, grace, events |
//! | `target.rs` | where probes and hooks may go (the pod's IPs), host and port resolved |
//! | `httpget.rs` | the kubelet's HTTP GET, shared by hooks and probes |
//! | `provenance.rs` | the record of each stop on its pod |
//! | `queue.rs` | the work queue |
//! | `text.rs` | program text made fit for logs, events and statuses |
//! | `timeline/` | the timelines of in-place updates on the node (observation only) |

pub mod containermeta;
pub mod containers;
pub mod context;
#[cfg(feature = "test-util")]
pub mod failpoint;
pub mod httpget;
pub mod imagepull;
pub mod kill;
pub mod podprobe;
pub mod provenance;
pub mod queue;
pub mod recreate;
pub mod target;
pub mod text;
pub mod timeline;

use prometheus_client::registry::Registry;

pub use self::context::Context;

/// Starts every enabled controller on the daemon's tasks: their metrics on `registry`
/// (kruised's, `kruised_` prefixed), their queues' on `queues` (client-go's work queue families,
/// which the caller registered on its unprefixed root: [`queue::QueueMetrics::register`]).
/// Returns the in-place update timelines, for the admin endpoint.
pub fn start(
    ctx: &Context,
    registry: &mut Registry,
    queues: &queue::QueueMetrics,
) -> timeline::Timelines {
    #[cfg(feature = "test-util")]
    failpoint::announce();
    let stops = provenance::Book::register(registry);
    let timelines = timeline::start(ctx, registry.sub_registry_with_prefix("inplace_update"));
    containermeta::start(
        ctx,
        registry.sub_registry_with_prefix("containermeta"),
        queues,
        &stops,
    );
    let present: imagepull::PresentHook = {
        let timelines = timelines.clone();
        std::sync::Arc::new(move |namespace: &str, name: &str, image: &str, at: i64| {
            timelines.image_present(namespace, name, image, at);
        })
    };
    imagepull::start(
        ctx,
        registry.sub_registry_with_prefix("imagepull"),
        Some(present),
    );
    recreate::start(
        ctx,
        registry.sub_registry_with_prefix("recreate"),
        queues,
        &stops,
    );
    podprobe::start(ctx, registry.sub_registry_with_prefix("podprobe"));
    timelines
}
