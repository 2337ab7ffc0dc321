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
//! | [`admit`] / [`registry`] | admission of optional pulls by the image's size, read from its manifest |
//! | [`settings`] | the puller's tunables |
//! | [`slots`] | the pull slots, in-place pulls served first |
//! | [`turn`] / [`waiting`] | pre-pulls yield to the node's pods waiting for their image; their order and cap |
//! | [`pin`] | pre-pulled images pinned against the kubelet's image GC until their first use |
//! | [`prepull`] | pre-pulling the next in-place batch; [`prepull::plan`]: which pods and images, bounded |
//! | [`inplace`] | the in-place update's image on the node before the kubelet needs it (grace annotation, spec change); [`inplace::plan`]: which, bounded |
//! | [`metrics`] | `kruised_imagepull_*` |
//! | [`warmset`] | `--startup-taint`: the Node's startup taint removed once the NodeImage's tags at start are pulled, or at a deadline |
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
//! - the disk check ([`disk`]), the next-batch pre-pull ([`prepull`]) and the in-place pull
//!   ([`inplace`]) are kruised's own;
//! - the success event reads "elapsedTime" (kruise: "ecalpsedTime"), and both events also go to
//!   the tag's owners (kruise sends only the failure there); the activeDeadlineSeconds message
//!   keeps the last pull error;
//! - an owner's failure event names only the pull secrets' problems of the owner's own
//!   namespace (and the node's credential providers'): owners of any namespace share a tag, and
//!   another tenant's secrets are not theirs to read of (`secrets::Problem`); the NodeImage's
//!   event and the tag's status keep every one.

pub mod admit;
pub mod controller;
pub mod credprovider;
pub mod disk;
pub mod inplace;
pub mod keyring;
pub mod metrics;
pub mod pin;
pub mod prepull;
pub mod progress;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod secrets;
pub mod settings;
pub mod slots;
pub mod state;
pub mod status;
pub mod task;
pub mod turn;
pub mod waiting;
pub mod warmset;

use std::sync::Arc;

use kube::Api;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::Instrument;

use crate::controller::context::Context;
use crate::cri::ImageService;
use crate::k8s::crd::NodeImage;
use crate::k8s::write::EventSink;

pub use self::settings::Settings;
pub use self::task::PresentHook;

/// The component name of the puller's events (kruise-daemon's, so existing filters keep working).
pub const EVENT_COMPONENT: &str = "kruise-daemon-imagepuller";

/// Starts the image puller with the daemon's settings.
pub fn start(ctx: &Context, registry: &mut Registry, present: Option<task::PresentHook>) {
    start_with(ctx, registry, Settings::from_config(&ctx.config), present);
}

/// Starts the image puller with `settings`: once the runtime is found, the NodeImage controller
/// and (if enabled and pods are watched) the in-place pull and the next-batch pre-puller, on the
/// daemon's tasks.
pub fn start_with(
    ctx: &Context,
    registry: &mut Registry,
    settings: Settings,
    present: Option<task::PresentHook>,
) {
    let metrics = metrics::Metrics::register(registry);
    // before the runtime is found: its deadline holds whatever the runtime does
    if ctx.config.startup_taint.is_some() {
        warmset::start(ctx, ctx.event_sink(EVENT_COMPONENT));
    }
    // registered ready now: once the daemon is ready, no condition comes and goes
    let pins_note = ctx.readiness.condition("image-pins");
    pins_note.set_ready_noting("nothing pinned yet: the runtime is not known yet");
    let ctx = ctx.clone();
    let span = tracing::info_span!("imagepull", node = %ctx.config.node_name);
    ctx.tracker.clone().spawn(
        async move {
            let Some(runtime) = ctx.runtimes.wait_primary(&ctx.cancel).await else {
                return;
            };
            let events = ctx.event_sink(EVENT_COMPONENT);
            let providers = &ctx.config.credential_providers;
            let plugin_config = &providers.config_file;
            let plugins = match credprovider::Plugins::load(plugin_config, &providers.bin_dir) {
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
            let pinning = ctx.runtimes.primary_version().map(|v| crate::cri::containerd::pinning(&v));
            let pins = match pinning {
                Some(p) if p.offered() => {
                    tracing::info!(pinning = %p, "pre-pulled images are pinned until their first use");
                    let limits = pin::Limits {
                        high_percent: settings.image_gc_high_percent,
                        floor: settings.image_fs_min_free,
                        note: Some(pins_note),
                    };
                    let store = pin::ContainerdPins::new(runtime.clone(), settings.image_fs_path.clone());
                    let pins = pin::Pins::new(Arc::new(store), pin::CHECK_INTERVAL, Some(limits));
                    ctx.spawn("image pins", pins.clone().run(ctx.cancel.clone()));
                    Some(pins)
                }
                Some(p) => {
                    tracing::info!(pinning = %p, "pre-pulled images are not pinned");
                    pins_note.set_ready_noting(format!("nothing pinned: image pinning {p}"));
                    None
                }
                None => None,
            };
            run_pinning(&ctx, runtime, credentials, settings, metrics, Some(events), present, pins);
        }
        .instrument(span),
    );
}

/// Spawns the controller, the in-place pull and the pre-puller over `runtime` and
/// `credentials`.
pub fn run<I, C>(
    ctx: &Context,
    runtime: I,
    credentials: Arc<C>,
    settings: Settings,
    metrics: metrics::Metrics,
    events: Option<EventSink>,
    present: Option<task::PresentHook>,
) where
    I: ImageService + Clone + 'static,
    C: secrets::Credentials,
{
    run_pinning(
        ctx,
        runtime,
        credentials,
        settings,
        metrics,
        events,
        present,
        None,
    );
}

/// [`run`], pinning what is pulled with `pins` until its first use.
#[allow(clippy::too_many_arguments)]
pub fn run_pinning<I, C>(
    ctx: &Context,
    runtime: I,
    credentials: Arc<C>,
    settings: Settings,
    metrics: metrics::Metrics,
    events: Option<EventSink>,
    present: Option<task::PresentHook>,
    pins: Option<Arc<pin::Pins>>,
) where
    I: ImageService + Clone + 'static,
    C: secrets::Credentials,
{
    // in-place pulls under way and the node's pods waiting for their image: pre-pulls yield
    let (in_place_tx, in_place_busy) = watch::channel(0usize);
    let (own_tx, own_waiting) = watch::channel(0usize);
    let turn = turn::Turn::new(
        settings.max_prepulls,
        own_waiting,
        in_place_busy.clone(),
        ctx.pods.clone(),
    );
    ctx.tracker.spawn(turn.clone().gate(ctx.cancel.clone()));
    if let Some(pods) = ctx.pods.clone() {
        let node = ctx.config.node_name.clone();
        let watcher = waiting::run(runtime.clone(), pods, node, own_tx, ctx.cancel.clone());
        ctx.spawn("pods waiting for their image", watcher);
    }
    let admission = admission(ctx, &settings);
    // pulls' progress: containerd's content service, on the primary runtime's image socket
    let ingests = ctx.runtimes.primary_now().map(|r| {
        Arc::new(crate::cri::containerd::content::Content::new(
            r.image_endpoint().clone(),
            r.timeouts(),
        )) as progress::Source
    });
    let tools = Arc::new(task::PullTools {
        puller: pull::Puller::with_progress(
            runtime,
            ctx.tracker.clone(),
            metrics.clone(),
            ingests,
            settings.stall_timeout,
            pins,
        ),
        credentials,
        slots: settings.max_workers.map(slots::Slots::new),
        settings: settings.clone(),
        metrics,
        events,
        free_space: disk::free_bytes,
        tracker: ctx.tracker.clone(),
        present,
        turn,
        admission,
    });
    let (busy_tx, busy) = watch::channel(0usize);
    let node = &ctx.config.node_name;
    let controller = controller::Controller::new(
        tools.clone(),
        node,
        Api::<NodeImage>::all(ctx.client.clone()),
        ctx.node_images.clone(),
        busy_tx,
    );
    tracing::info!(
        max_workers = ?settings.max_workers,
        max_prepulls = ?settings.max_prepulls,
        image_fs_min_free = settings.image_fs_min_free,
        stall_timeout = ?settings.stall_timeout,
        next_batch = settings.prepull_next_batch && ctx.pods.is_some(),
        in_place = settings.prepull_in_place_update && ctx.pods.is_some(),
        "image puller started"
    );
    ctx.spawn(
        "nodeimage",
        controller
            .run(ctx.cancel.clone())
            .instrument(tracing::info_span!("nodeimage", name = %node)),
    );
    // in-place pulls under way (`in_place_tx`, made above): the next batch waits for them as
    // for NodeImage work
    if let (true, Some(pods)) = (settings.prepull_in_place_update, ctx.pods.clone()) {
        ctx.spawn(
            "in-place pull",
            inplace::run(
                tools.clone(),
                pods,
                ctx.node_images.clone(),
                in_place_tx,
                ctx.cancel.clone(),
            )
            .instrument(tracing::info_span!("in_place")),
        );
    }
    if let (true, Some(pods)) = (settings.prepull_next_batch, ctx.pods.clone()) {
        ctx.spawn(
            "next-batch pre-pull",
            prepull::run(
                tools,
                pods,
                ctx.node_images.clone(),
                busy,
                in_place_busy,
                ctx.cancel.clone(),
            )
            .instrument(tracing::info_span!("next_batch")),
        );
    }
}

/// The admission of optional pulls by size: on when the daemon keeps a floor
/// (`--image-fs-min-free`), with a `/readyz?verbose` line saying what it sees.
fn admission(ctx: &Context, settings: &Settings) -> Option<Arc<admit::Admission>> {
    if settings.image_fs_min_free == 0 {
        return None;
    }
    let visible = ctx.readiness.condition("image-fs");
    let sizes: Arc<dyn admit::SizeSource> = Arc::new(registry::Registry::default());
    let path = settings.image_fs_path.as_ref().map_or_else(
        || "the runtime's image filesystem".to_string(),
        |p| p.display().to_string(),
    );
    visible.set_ready_noting(format!(
        "size admission on: {path} not examined yet (GC high threshold {} %)",
        settings.image_gc_high_percent
    ));
    Some(Arc::new(admit::Admission {
        high_percent: settings.image_gc_high_percent,
        fs_path: settings.image_fs_path.clone(),
        space: disk::space,
        sizes,
        ratio: admit::Ratio::default(),
        visible: Some(visible),
        reserved: std::sync::Mutex::new(0),
    }))
}
