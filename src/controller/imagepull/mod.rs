//! Image pre-pull: the NodeImage named after the node, and the images of pods' next in-place
//! batches. Wire behaviour follows kruise-daemon's image puller (docs/kruise-wire.md); where
//! kruised does more or differs, the module that does it says so:
//!
//! | module | what |
//! |---|---|
//! | [`controller`] | the NodeImage loop: tasks per tag, coalesced status writes |
//! | [`state`] | the task state machine, version semantics, backoff (pure) |
//! | [`status`] | the status built from the tasks and its merge patch (pure) |
//! | [`task`] | one tag's attempts: presence check, disk check, secrets, pull, events |
//! | [`pull`] | CRI pulls, identical ones merged, credentials tried in order |
//! | [`reference`](mod@reference) | docker reference normalisation |
//! | [`keyring`] / [`secrets`] | pull secrets and kubelet-style registry matching |
//! | [`credprovider`] | kubelet credential provider plugins (`--plugin-config-file`) |
//! | [`disk`] | free space of the image filesystem |
//! | [`prepull`] | pre-pulling the next in-place batch; [`prepull::plan`]: which pods and images, bounded |
//! | [`metrics`] | `kruised_imagepull_*` |
//!
//! Differences from kruise-daemon, all deliberate:
//!
//! - status is written by JSON merge patch of the fields the daemon owns (kruise PUTs the whole
//!   status and drops `firstSyncStatus`), only when it differs from the stored one, within
//!   [`Settings::status_coalesce`] of a change instead of a 3–5 s resync;
//! - a tag that is a digest is pulled as `name@digest` (kruise sends `name:sha256:...`);
//! - `IfNotPresent` compares normalised names, so a key written `docker.io/library/nginx` finds
//!   `nginx` (kruise compares familiar names and misses it);
//! - a missing or unreadable pull secret is named in the tag's message (kruise skips it
//!   silently); credential strings are scrubbed from every message; a failed credential
//!   provider is named in messages and events, what it wrote goes to the log only;
//! - identical concurrent pulls are merged; a removed tag cancels its pull;
//! - the disk check ([`disk`]) and the next-batch pre-pull ([`prepull`]) are kruised's own;
//! - the success event reads "elapsedTime" (kruise: "ecalpsedTime"), and both events also go to
//!   the tag's owners (kruise sends only the failure there); the activeDeadlineSeconds message
//!   keeps the last pull error.

pub mod controller;
pub mod credprovider;
pub mod disk;
pub mod keyring;
pub mod metrics;
pub mod prepull;
pub mod pull;
pub mod reference;
pub mod secrets;
pub mod state;
pub mod status;
pub mod task;

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use prometheus_client::registry::Registry;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument;

use crate::config::DaemonConfig;
use crate::controller::Context;
use crate::cri::{ImageService, RemoteRuntime};
use crate::k8s::crd::NodeImage;
use crate::k8s::write::EventSink;

/// The component name of the puller's events (kruise-daemon's, so existing filters keep working).
pub const EVENT_COMPONENT: &str = "kruise-daemon-imagepuller";

/// Tunables of the image puller. [`Settings::from_config`] gives the daemon's; tests shorten
/// the waits.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Pause after the first failed attempt; doubles after each (kruise: 1 s).
    pub backoff_base: Duration,
    /// Longest pause between attempts (kruise: 30 s).
    pub backoff_cap: Duration,
    /// Delay of the first status write after a quiet period, to batch a burst.
    pub status_coalesce: Duration,
    /// Least time between two status writes while tasks are still running.
    pub status_min_interval: Duration,
    /// Least free bytes on the image filesystem before a pull; 0: no check.
    pub image_fs_min_free: u64,
    /// Most pulls at once; `None`: unlimited.
    pub max_workers: Option<usize>,
    /// Pre-pull the images of pods' next in-place batches.
    pub prepull_next_batch: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(30),
            status_coalesce: Duration::from_millis(50),
            status_min_interval: Duration::from_millis(500),
            image_fs_min_free: 0,
            max_workers: None,
            prepull_next_batch: true,
        }
    }
}

impl Settings {
    /// The daemon's settings.
    pub fn from_config(config: &DaemonConfig) -> Self {
        Settings {
            image_fs_min_free: config.image_fs_min_free,
            max_workers: config.max_pull_workers,
            prepull_next_batch: config.gates.prepull_next_batch,
            ..Settings::default()
        }
    }
}

/// `text` fit for one log line: control characters (newlines, escapes) and bidirectional
/// overrides each made a space, trimmed, at most `max` bytes (cut at a character boundary).
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for c in text.trim().chars() {
        let c = if c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        {
            ' '
        } else {
            c
        };
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(c);
    }
    out.trim_end().to_string()
}

/// Starts the image puller with the daemon's settings.
pub fn start(ctx: &Context, registry: &mut Registry) {
    start_with(ctx, registry, Settings::from_config(&ctx.config));
}

/// Starts the image puller with `settings`: once the runtime is found, the NodeImage controller
/// and (if enabled and pods are watched) the next-batch pre-puller, on the daemon's tasks.
pub fn start_with(ctx: &Context, registry: &mut Registry, settings: Settings) {
    let metrics = metrics::Metrics::register(registry);
    let ctx = ctx.clone();
    let span = tracing::info_span!("imagepull", node = %ctx.config.node_name);
    ctx.tracker.clone().spawn(
        async move {
            let Some(runtime) = wait_for_runtime(&ctx).await else {
                return;
            };
            let events = ctx.event_sink(EVENT_COMPONENT);
            let (plugin_config, plugin_dir) = &ctx.config.credential_providers;
            let plugins = match credprovider::Plugins::load(plugin_config, plugin_dir) {
                Ok(Some(p)) => {
                    let p = p.on_node(&ctx.config.node_name);
                    tracing::info!(providers = ?p.names(), config = %plugin_config.display(), "credential provider plugins registered");
                    Some(p)
                }
                Ok(None) => {
                    tracing::debug!(config = %plugin_config.display(), "no credential provider config; no plugins");
                    None
                }
                Err(e) => {
                    tracing::error!(error = %e, "credential provider plugins not registered; pulling without them");
                    None
                }
            };
            let credentials = Arc::new(
                secrets::SecretStore::new(ctx.client.clone(), &ctx.config.config_namespace)
                    .with_plugins(plugins),
            );
            run(&ctx, runtime, credentials, settings, metrics, Some(events));
        }
        .instrument(span),
    );
}

/// The primary runtime, once found; `None` when the daemon stops first.
async fn wait_for_runtime(ctx: &Context) -> Option<RemoteRuntime> {
    let mut runtimes = ctx.runtimes.clone();
    loop {
        if let Some(r) = runtimes.borrow_and_update().as_ref() {
            return Some(r.primary().clone());
        }
        tokio::select! {
            () = ctx.cancel.cancelled() => return None,
            r = runtimes.changed() => r.ok()?,
        }
    }
}

/// Spawns the controller and the pre-puller over `runtime` and `credentials`.
pub fn run<I, C>(
    ctx: &Context,
    runtime: I,
    credentials: Arc<C>,
    settings: Settings,
    metrics: metrics::Metrics,
    events: Option<EventSink>,
) where
    I: ImageService + Clone + 'static,
    C: secrets::Credentials,
{
    let env = Arc::new(task::Env {
        puller: pull::Puller::new(runtime, ctx.tracker.clone(), metrics.clone()),
        credentials,
        slots: settings.max_workers.map(|n| Arc::new(Semaphore::new(n))),
        settings: settings.clone(),
        metrics,
        events,
        free_space: disk::free_bytes,
        tracker: ctx.tracker.clone(),
    });
    let (busy_tx, busy) = watch::channel(0usize);
    let node = &ctx.config.node_name;
    let controller = controller::Controller::new(
        env.clone(),
        node,
        Api::<NodeImage>::all(ctx.client.clone()),
        ctx.node_images.clone(),
        busy_tx,
    );
    tracing::info!(
        max_workers = ?settings.max_workers,
        image_fs_min_free = settings.image_fs_min_free,
        next_batch = settings.prepull_next_batch && ctx.pods.is_some(),
        "image puller started"
    );
    ctx.spawn(
        "nodeimage",
        controller
            .run(ctx.cancel.clone())
            .instrument(tracing::info_span!("nodeimage", name = %node)),
    );
    if let (true, Some(pods)) = (settings.prepull_next_batch, ctx.pods.clone()) {
        ctx.spawn(
            "next-batch pre-pull",
            prepull::run(env, pods, ctx.node_images.clone(), busy, ctx.cancel.clone())
                .instrument(tracing::info_span!("next_batch")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_removes_control_and_bidi_characters_and_cuts_at_a_character() {
        assert_eq!(one_line(" a\nb\tc\u{1b}[0m\r ", 100), "a b c [0m");
        assert_eq!(one_line("x\u{202e}y\u{2066}z", 100), "x y z");
        assert_eq!(one_line("ééé", 5), "éé", "never half a character");
        assert_eq!(one_line(&"a".repeat(1000), 10).len(), 10);
    }
}
