//! Image pre-pull: the NodeImage named after the node (being written).

use prometheus_client::registry::Registry;

use crate::daemon::Context;

/// Starts the image puller.
pub fn start(ctx: &Context, registry: &mut Registry) {
    let _ = (ctx, registry);
}
