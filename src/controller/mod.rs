//! The capability controllers, one per folder or file: container meta, image pull, recreate
//! requests, pod probes. Each reads the daemon's watches and runtime and writes through
//! `k8s::write`.

pub mod containermeta;
pub mod imagepull;
pub mod kill;
pub mod queue;

use prometheus_client::registry::Registry;

use crate::daemon::Context;

/// Starts every enabled controller on the daemon's tasks.
pub fn start(ctx: &Context, registry: &mut Registry) {
    containermeta::start(ctx, registry.sub_registry_with_prefix("containermeta"));
    imagepull::start(ctx, registry.sub_registry_with_prefix("imagepull"));
}
