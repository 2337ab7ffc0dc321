//! Failpoints for tests: ways to make a controller misbehave on purpose, compiled only with the
//! crate's `test-util` feature (every test build has it; `cargo build` and the shipped `dist`
//! binary do not, so no variable can make a node's kruised misbehave). Each is read once, from
//! the environment, when the daemon starts its controllers, and the start log says which are
//! armed.
//!
//! - `KRUISED_FAILPOINT_STUCK_ANNOTATION=<key>`: container meta's pass over a pod that carries
//!   the annotation `<key>` never ends (it waits until the daemon stops): a loop stuck on a
//!   call that never returns, in a process that still runs. Liveness fails once the pass is
//!   older than [`super::context::STUCK_PASS`], naming the queue and the pod, and systemd's watchdog
//!   restarts the daemon (`tests/e2e/systemd.rs`).
//! - `KRUISED_FAILPOINT_STUCK_PASS_SECS=<n>`: [`super::context::STUCK_PASS`] is `n` seconds instead of
//!   300, so a test sees a stuck pass fail liveness in seconds.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The failpoints armed in this process.
#[derive(Debug, Default)]
struct Armed {
    stuck_annotation: Option<String>,
    stuck_pass: Option<Duration>,
}

fn armed() -> &'static Armed {
    static ARMED: OnceLock<Armed> = OnceLock::new();
    ARMED.get_or_init(|| Armed {
        stuck_annotation: std::env::var("KRUISED_FAILPOINT_STUCK_ANNOTATION")
            .ok()
            .filter(|k| !k.is_empty()),
        stuck_pass: std::env::var("KRUISED_FAILPOINT_STUCK_PASS_SECS")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs),
    })
}

/// Reads the failpoints from the environment and says in the log which are armed.
pub fn announce() {
    let a = armed();
    if a.stuck_annotation.is_some() || a.stuck_pass.is_some() {
        tracing::warn!(
            stuck_annotation = ?a.stuck_annotation,
            stuck_pass_secs = ?a.stuck_pass.map(|d| d.as_secs()),
            "test failpoints armed (a test build of kruised)"
        );
    }
}

/// [`super::context::STUCK_PASS`] as `KRUISED_FAILPOINT_STUCK_PASS_SECS` sets it, if it does.
pub fn stuck_pass() -> Option<Duration> {
    armed().stuck_pass
}

/// Whether a pass over `pod` is to never end (`KRUISED_FAILPOINT_STUCK_ANNOTATION`).
pub fn pass_is_stuck(pod: &Pod) -> bool {
    armed().stuck_annotation.as_ref().is_some_and(|key| {
        pod.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(key))
    })
}
