//! `kruised run`: starts the runtime client, the watches, the admin server and the capability
//! controllers that are enabled, and drains them on SIGTERM.
//!
//! Nothing here crash-loops: an unreachable API server or runtime is retried with backoff while
//! `/readyz` says what is missing. Only a configuration error (no node name, a port in use, no
//! kubeconfig at all) ends the process.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admin::{self, AdminState};
use crate::backoff::Backoff;
use crate::config::DaemonConfig;
use crate::controller::Context;
use crate::cri::{NodeRuntime, RuntimeHandle, RuntimeService, Runtimes};
use crate::health::{Liveness, Readiness, ReadinessCondition};
use crate::k8s::crd::{ContainerRecreateRequest, NodeImage, NodePodProbe};
use crate::k8s::{client, keys, watch as kwatch};
use crate::metrics;

/// The largest `ExecSync` answer the daemon takes from a container (probes, hooks and `env`
/// are what its author writes; a probe keeps 10 KiB of it): far less than the 16 MiB a gRPC
/// message may be, which a node's few exec slots would otherwise hold in memory at once.
const EXEC_OUTPUT_LIMIT: usize = 1024 * 1024;
/// How often the runtime is asked `Version` to keep readiness honest.
const RUNTIME_PROBE_INTERVAL: Duration = Duration::from_secs(30);
/// First pause after a failed runtime discovery; doubles up to [`RUNTIME_RETRY_MAX`].
const RUNTIME_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest pause between runtime discovery attempts: short, so a runtime that comes back is
/// found again within seconds.
const RUNTIME_RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs the daemon until SIGTERM/SIGINT (drain, then exit 0) or a second signal (exit now).
pub async fn run(config: DaemonConfig) -> anyhow::Result<ExitCode> {
    // first: a SIGTERM that comes while the tasks start must drain them, not kill the process
    let signals = Signals::install()?;
    let config = Arc::new(config);
    tracing::info!(
        node = %config.node_name,
        addr = %config.addr,
        gates = ?config.gates,
        version = crate::build_info::VERSION,
        "starting kruised"
    );
    for w in &config.runtime.warnings {
        tracing::warn!("{w}");
    }
    if !config.ignored.is_empty() {
        tracing::info!(
            ignored = ?config.ignored,
            "kruise-daemon flags and arguments accepted for compatibility; they have no effect here"
        );
    }
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    let readiness = Readiness::new();
    let liveness = Liveness::new();
    let mut registry = metrics::new_registry();
    if !config.unknown_flags.is_empty() {
        tracing::warn!(
            unknown = ?config.unknown_flags,
            "flags unknown to kruised accepted because it runs as kruise-daemon (a newer kruise \
             chart's, or a typo); they have no effect"
        );
    }
    let unknown_flags = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    unknown_flags.set(i64::try_from(config.unknown_flags.len()).unwrap_or(i64::MAX));
    metrics::kruised(&mut registry).register(
        "unknown_flags",
        "Flags unknown to kruised given on its command line, accepted because it runs as \
         kruise-daemon (see the start log's warning for their names)",
        unknown_flags,
    );

    // bound early, like kruise-daemon: a taken port is a configuration error, reported at once
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| anyhow::anyhow!("--addr {}: cannot listen: {e}", config.addr))?;
    let runtime_ready = readiness.condition("runtime");
    let (runtimes_tx, runtimes) = watch::channel(None);

    let versions = client::ServedVersions::new();
    let client = client::build_with_metrics(
        &client::ClientSettings {
            kubeconfig: config.kubeconfig.clone(),
            qps: config.qps,
            burst: config.burst,
            versions: versions.clone(),
        },
        &client::RestClientMetrics::register(&mut registry),
        config.api_request_timeout,
    )
    .await?;
    tracing::info!(api = %client.default_namespace(), "Kubernetes client ready");
    tracker.spawn(
        runtime_loop(
            config.clone(),
            client.clone(),
            runtime_ready,
            runtimes_tx,
            liveness.clone(),
            cancel.clone(),
        )
        .instrument(tracing::info_span!("runtime")),
    );
    tracker.spawn(
        discover_versions(client.clone(), versions.clone(), cancel.clone())
            .instrument(tracing::info_span!("discovery")),
    );
    let discovered = || {
        let v = versions.clone();
        async move { v.wait().await }
    };
    let node = config.node_name.as_str();
    let pods = config.gates.daemon_watching_pod.then(|| {
        kwatch::spawn(
            kwatch::WatchSpec::new(
                "pods",
                Api::<Pod>::all(client.clone()),
                kwatch::pods_of_node(node),
                kwatch::prune_pod,
            ),
            readiness.condition("pods"),
            cancel.clone(),
            &tracker,
            &liveness,
            std::future::ready(()),
        )
    });
    let node_images = kwatch::spawn(
        kwatch::WatchSpec::new(
            "nodeimages",
            Api::<NodeImage>::all(client.clone()),
            kwatch::named(node),
            kwatch::prune_managed_fields,
        ),
        readiness.condition("nodeimage"),
        cancel.clone(),
        &tracker,
        &liveness,
        discovered(),
    );
    let recreate_requests = kwatch::spawn(
        kwatch::WatchSpec::new(
            "containerrecreaterequests",
            Api::<ContainerRecreateRequest>::all(client.clone()),
            kube::runtime::watcher::Config::default().labels(&keys::crr_label_selector(node)),
            kwatch::prune_recreate_request,
        )
        .paged(kwatch::RECREATE_LIST_PAGE),
        readiness.condition("containerrecreaterequests"),
        cancel.clone(),
        &tracker,
        &liveness,
        discovered(),
    );
    let pod_probes = config.gates.pod_probe_marker.then(|| {
        kwatch::spawn(
            kwatch::WatchSpec::new(
                "nodepodprobes",
                Api::<NodePodProbe>::all(client.clone()),
                kwatch::named(node),
                kwatch::prune_managed_fields,
            ),
            readiness.condition("nodepodprobe"),
            cancel.clone(),
            &tracker,
            &liveness,
            discovered(),
        )
    });
    let ctx = Context {
        config: config.clone(),
        client,
        runtimes: RuntimeHandle::new(runtimes),
        pods,
        node_images,
        recreate_requests,
        pod_probes,
        cancel: cancel.clone(),
        tracker: tracker.clone(),
        liveness: liveness.clone(),
        readiness: readiness.clone(),
    };
    // client-go's work queue families under client-go's names, on the unprefixed root
    let queues = crate::controller::queue::QueueMetrics::register(&mut registry);
    let timelines = crate::controller::start(&ctx, metrics::kruised(&mut registry), &queues);

    let admin_state = AdminState {
        readiness: readiness.clone(),
        liveness: liveness.clone(),
        registry: Arc::new(registry),
        node_ips: config.node_ips.clone(),
        timelines: Some(admin::TimelineSource(Arc::new(move |namespace, name| {
            let view = timelines.view(namespace, name)?;
            serde_json::to_string(&view).ok()
        }))),
    };
    tracker.spawn(
        admin::serve(listener, admin_state, cancel.clone())
            .instrument(tracing::info_span!("admin")),
    );

    // ready or not, wait for the signal; readiness is reported by /readyz
    // start-up is over: systemd's READY means that, not "caches synced" (an unreachable API
    // server must not fail the unit's start); STATUS says what the daemon still waits for
    crate::sdnotify::notify("READY=1\nSTATUS=started; waiting for the caches and the runtime");
    let ready_log = {
        let readiness = readiness.clone();
        let cancel = cancel.clone();
        async move {
            tokio::select! {
                () = readiness.wait_ready() => {
                    tracing::info!("daemon ready: caches synced, runtime reachable");
                    crate::sdnotify::notify("STATUS=ready: caches synced, runtime reachable");
                }
                () = cancel.cancelled() => {}
            }
        }
    };
    tracker.spawn(ready_log);
    if let Some(every) = crate::sdnotify::watchdog_interval() {
        tracker.spawn(
            watchdog(liveness.clone(), every, cancel.clone())
                .instrument(tracing::info_span!("watchdog")),
        );
    }
    drain(signals, cancel, tracker, config.drain_timeout).await
}

/// Pings systemd's watchdog every `every` while the loops beat (`/healthz` would answer 200);
/// a stalled loop stops the pings, so systemd restarts the daemon after `WatchdogSec=`.
async fn watchdog(liveness: Liveness, every: Duration, cancel: CancellationToken) {
    tracing::info!(?every, "systemd watchdog on");
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match liveness.check() {
            Ok(()) => {
                crate::sdnotify::notify("WATCHDOG=1");
                if std::mem::take(&mut stalled) {
                    tracing::info!("loops beat again; watchdog pings resumed");
                }
            }
            Err(e) if !stalled => {
                tracing::error!(error = %e, "a loop stalled; no watchdog ping until it beats");
                stalled = true;
            }
            Err(_) => {}
        }
    }
}

/// Waits for the first signal, cancels everything, and waits for the tasks at most `deadline`;
/// a second signal exits at once.
async fn drain(
    mut signals: Signals,
    cancel: CancellationToken,
    tracker: TaskTracker,
    deadline: Duration,
) -> anyhow::Result<ExitCode> {
    let which = signals.next().await;
    tracing::info!(
        signal = which,
        ?deadline,
        "shutting down: draining in-flight work"
    );
    crate::sdnotify::notify("STOPPING=1");
    cancel.cancel();
    tracker.close();
    tokio::select! {
        () = tracker.wait() => {
            tracing::info!("drained; exiting");
            Ok(ExitCode::SUCCESS)
        }
        () = tokio::time::sleep(deadline) => {
            tracing::warn!(?deadline, "drain deadline passed; exiting with work unfinished");
            Ok(ExitCode::SUCCESS)
        }
        which = signals.next() => {
            tracing::warn!(signal = which, "second signal: exiting now");
            Ok(ExitCode::from(130))
        }
    }
}

/// SIGTERM and SIGINT.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Finds out which versions of kruise's resources the server serves (retrying with backoff
/// until the API server answers), so the CR watches start at the right one.
async fn discover_versions(
    client: kube::Client,
    versions: client::ServedVersions,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::new(RUNTIME_RETRY_MIN, RUNTIME_RETRY_MAX);
    loop {
        match versions.discover(&client).await {
            Ok(newer) => {
                tracing::info!(
                    v1beta1 = ?newer,
                    "kruise resources: using apps.kruise.io/v1beta1 for these, v1alpha1 for the rest"
                );
                return;
            }
            Err(e) => tracing::warn!(error = %e, "API discovery failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(backoff.pause()) => {}
        }
    }
}

/// Finds the runtimes (retrying with jittered backoff, logging each distinct failure once), makes
/// the kubelet's the primary one where several answer ([`kubelets_runtime`]), publishes them,
/// and keeps readiness honest with a `Version` probe. `/readyz?verbose` says which runtime is
/// primary, and why.
async fn runtime_loop(
    config: Arc<DaemonConfig>,
    client: kube::Client,
    ready: ReadinessCondition,
    publish: watch::Sender<Option<Runtimes>>,
    liveness: Liveness,
    cancel: CancellationToken,
) {
    let heartbeat = liveness.register("runtime", RUNTIME_PROBE_INTERVAL * 3 + RUNTIME_RETRY_MAX);
    let rt = &config.runtime;
    ready.set_not_ready("looking for the container runtime");
    let mut backoff = Backoff::new(RUNTIME_RETRY_MIN, RUNTIME_RETRY_MAX);
    let mut last_error = String::new();
    let runtimes = loop {
        heartbeat.beat();
        match rt.discover().await {
            Ok(r) if !r.ambiguous() => break r.with_exec_output_limit(EXEC_OUTPUT_LIMIT),
            Ok(mut r) => {
                // which is the kubelet's takes its Node; while the one it names is silent
                // (restarting), wait for it rather than settle on another for good
                let asked =
                    kubelets_runtime(&client, &config.node_name, &ready, &heartbeat, &cancel);
                let Some(node) = asked.await else { return };
                match r.kubelets_is_silent(&node) {
                    None => {
                        r.choose_primary(node);
                        break r.with_exec_output_limit(EXEC_OUTPUT_LIMIT);
                    }
                    Some(text) => {
                        ready.set_not_ready(text.clone());
                        if text != last_error {
                            tracing::warn!("{text}; waiting for it");
                            last_error = text;
                        }
                    }
                }
            }
            Err(e) => {
                let text = e.to_string();
                // readiness first: what the log says is already what /readyz says
                ready.set_not_ready(text.clone());
                if text != last_error {
                    tracing::error!(error = %text, "container runtime not found; retrying");
                    last_error = text;
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(backoff.pause()) => {}
        }
    };
    let primary = runtimes.primary().clone();
    let name = runtimes.primary_version().runtime_name.clone();
    let reason = runtimes.primary_reason().clone();
    let pinning = crate::cri::containerd::pinning(runtimes.primary_version());
    let note = format!(
        "{name} at {}, {reason}; image pinning {pinning}",
        primary.endpoint()
    );
    ready.set_ready_noting(note.clone());
    if reason.is_fallback() {
        tracing::warn!(runtime = %name, endpoint = %primary.endpoint(), %reason, "primary container runtime: the first found, not known to be the kubelet's");
    } else {
        tracing::info!(runtime = %name, endpoint = %primary.endpoint(), %reason, "primary container runtime");
    }
    let _ = publish.send(Some(runtimes));
    let mut was_up = true;
    loop {
        heartbeat.beat();
        let every = if was_up {
            RUNTIME_PROBE_INTERVAL
        } else {
            RUNTIME_RETRY_MAX
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(crate::backoff::jitter(every)) => {}
        }
        match primary.version().await {
            // readiness first, then the log, here and below
            Ok(_) if !was_up => {
                ready.set_ready_noting(note.clone());
                tracing::info!(endpoint = %primary.endpoint(), "container runtime is back");
                was_up = true;
            }
            Ok(_) => {}
            Err(e) => {
                ready.set_not_ready(e.to_string());
                if was_up {
                    tracing::error!(error = %e, "container runtime stopped answering");
                }
                was_up = false;
            }
        }
    }
}

/// What the node's Node says of the kubelet's runtime (`status.nodeInfo.
/// containerRuntimeVersion`), asked where more than one runtime answers. Retries (not ready
/// meanwhile) while the API server does not answer; a refusal (kruise's chart grants no `get`
/// on nodes), a missing Node or an empty field is an answer: the first runtime found then.
/// `None`: cancelled.
async fn kubelets_runtime(
    client: &kube::Client,
    node: &str,
    ready: &ReadinessCondition,
    heartbeat: &crate::health::Heartbeat,
    cancel: &CancellationToken,
) -> Option<NodeRuntime> {
    let mut backoff = Backoff::new(RUNTIME_RETRY_MIN, RUNTIME_RETRY_MAX);
    let mut last_error = String::new();
    loop {
        heartbeat.beat();
        match crate::k8s::node::kubelets_runtime(client, node).await {
            Ok(answer) => return Some(answer.into()),
            Err(e) => {
                let text = format!(
                    "several container runtimes answer; asking Node {node} which the kubelet uses: {e}"
                );
                ready.set_not_ready(text.clone());
                if text != last_error {
                    tracing::warn!("{text}; retrying");
                    last_error = text;
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(backoff.pause()) => {}
        }
    }
}
