//! The capability controllers, one per folder or file: container meta, image pull, recreate
//! requests, pod probes. Each reads the daemon's watches and runtime and writes through
//! `k8s::write`.

use prometheus_client::registry::Registry;

use crate::daemon::Context;

/// Starts every enabled controller on the daemon's tasks.
pub fn start(ctx: &Context, registry: &mut Registry) {
    // capabilities arrive issue by issue; until then the daemon keeps its caches and runtime
    // connection ready for them
    let _ = (ctx, registry);
}
