//! Reaching the runtime: found the way the daemon finds it, within crictl's `--timeout`.

use std::time::Duration;

use anyhow::Context;

use super::args::GlobalArgs;
use crate::cri::{RemoteRuntime, Timeouts};

/// crictl's default `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Finds the runtime the way the daemon does (flags, environment, crictl.yaml, detection) and
/// checks that it answers, within `--timeout` (default 2 s).
pub(crate) async fn connect(g: &GlobalArgs) -> anyhow::Result<RemoteRuntime> {
    let cfg = g.runtime.resolve_with(Timeouts {
        connect: DEFAULT_TIMEOUT,
        call: DEFAULT_TIMEOUT,
    })?;
    tracing::debug!(source = ?cfg.source, image = ?cfg.image_endpoint, timeouts = ?cfg.timeouts, "connecting");
    let runtimes = cfg
        .discover()
        .await
        .context("connect to the container runtime")?;
    Ok(runtimes.primary().clone())
}
