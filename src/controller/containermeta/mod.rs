//! Container meta: keeps `apps.kruise.io/runtime-containers-meta` true for the node's
//! kruise-managed pods, and stops containers whose env from metadata went stale during an
//! in-place update so the kubelet recreates them with the new values.
//!
//! Triggers are the pod watch (no fixed enqueue delay, unlike kruise-daemon's 1 s), the
//! runtime's container events where it offers them, and a relist as fallback. Decisions are the
//! pure functions of [`decide`]; this module does the I/O. Every stop is recorded on the pod
//! with its reason ([`super::provenance`]), in the patch that writes the annotation.

pub mod decide;
pub mod env;
mod events;
mod lag;
mod metrics;
mod pods;
mod restart;
pub mod settle;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tracing::Instrument;

use self::decide::PreviousStop;
use self::events::runtime_events;
use self::lag::LagMeter;
pub use self::metrics::Metrics;
use self::pods::{NowOrNever, Start, StartVersions, relist, watch_pods};
pub use self::restart::{image_id_matches, image_matches};
use self::restart::{restarts_due, spawn_kill};
use self::settle::{RestartDelay, Timeline};
use super::provenance::{self, Book, PodId};
use super::queue::{CONTAINER_META_QUEUE, Pass, QueueMetrics, WorkQueue};
use crate::controller::{Context, containers_of_pod};
use crate::cri::{CriError, RemoteRuntime, RuntimeLookupError, Runtimes};
use crate::hash::env::current_env_hash;
use crate::k8s::keys;
use crate::k8s::watch::Watched;
use crate::k8s::write::EventSink;
use crate::sync::lock;

/// Pause before retrying a pod whose reconcile failed.
const RETRY_DELAY: Duration = Duration::from_secs(3);
/// How long a container the daemon stopped is remembered (so it is never stopped twice).
const STOPPED_MEMORY: Duration = Duration::from_secs(600);
/// How much longer than a container's grace period the kubelet may take to recreate a
/// container whose spec changed before kruised stops it itself (kruise's rule).
const KUBELET_RECREATE_MARGIN: Duration = Duration::from_secs(10);

type Key = ObjectRef<Pod>;

struct Shared {
    pods: Watched<Pod>,
    client: kube::Client,
    runtimes: tokio::sync::watch::Receiver<Option<Runtimes>>,
    queue: WorkQueue<Key>,
    with_env: bool,
    /// Pods without our annotation as they were at the first list: not written until they
    /// change (kruise's rule against a patch storm on daemon start).
    seen_at_start: Mutex<StartVersions>,
    /// Containers this daemon stopped, by runtime ID.
    stopped: Arc<Mutex<HashMap<String, Instant>>>,
    /// The last stop of each (pod UID, container name), to recognise a stale recreation.
    last_stops: Mutex<HashMap<(String, String), PreviousStop>>,
    /// Since when the kubelet is expected to recreate a container (by runtime ID).
    kubelet_expected: Mutex<HashMap<String, Instant>>,
    /// What was seen of each pod (by UID), for deciding when a stop is safe.
    timelines: Mutex<HashMap<String, Timeline>>,
    /// How late the kubelet reports container changes.
    lag: Arc<LagMeter>,
    /// The pod UID of each sandbox a container event named (sandbox IDs never change owner),
    /// so an event costs no `ListPodSandbox` after the first of its sandbox.
    sandbox_pods: Mutex<HashMap<String, String>>,
    /// When stale-env restarts happen.
    restart_delay: RestartDelay,
    events: EventSink,
    metrics: Metrics,
    /// The stops this daemon made lately (shared with recreate requests), for the annotation.
    book: Book,
    cancel: tokio_util::sync::CancellationToken,
    tracker: tokio_util::task::TaskTracker,
}

/// Starts the controller when pods are watched: its own metrics on `registry`, its queue's on
/// `queues` (kruise-daemon's queue name), its stops recorded in `book`.
pub fn start(ctx: &Context, registry: &mut Registry, queues: &QueueMetrics, book: &Book) {
    let Some(pods) = ctx.pods.clone() else {
        return;
    };
    let events = ctx.event_sink("kruise-daemon-containermeta");
    let shared = Arc::new(Shared {
        pods,
        client: ctx.client.clone(),
        runtimes: ctx.runtimes.clone(),
        queue: WorkQueue::with_metrics(CONTAINER_META_QUEUE, queues),
        with_env: ctx.config.gates.in_place_update_env_from_metadata,
        seen_at_start: Mutex::new(StartVersions::default()),
        sandbox_pods: Mutex::new(HashMap::new()),
        stopped: Arc::new(Mutex::new(HashMap::new())),
        last_stops: Mutex::new(HashMap::new()),
        kubelet_expected: Mutex::new(HashMap::new()),
        timelines: Mutex::new(HashMap::new()),
        lag: Arc::new(LagMeter::default()),
        restart_delay: ctx.config.env_restart_delay,
        events,
        metrics: Metrics::register(registry),
        book: book.clone(),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let span = tracing::info_span!("containermeta");
    let changes = shared.pods.subscribe();
    let listed_before = shared.pods.store().wait_until_ready().now_or_never_ready();
    ctx.spawn(
        "containermeta pod watch",
        watch_pods(shared.clone(), changes, listed_before).instrument(span.clone()),
    );
    ctx.spawn(
        "containermeta relist",
        relist(shared.clone(), ctx.config.relist_interval).instrument(span.clone()),
    );
    ctx.spawn(
        "containermeta runtime events",
        runtime_events(shared.clone(), ctx.config.relist_interval).instrument(span.clone()),
    );
    ctx.watch_queue("containermeta", &shared.queue);
    // `--containermeta-workers` (kruise PR #2423's flag), 4 unless given
    for _ in 0..ctx.config.containermeta_workers {
        ctx.spawn(
            "containermeta worker",
            worker(shared.clone()).instrument(span.clone()),
        );
    }
}

impl Shared {
    /// Records this version of the pod in its timeline (see [`settle`]).
    fn observe(&self, pod: &Pod) {
        if !self.with_env || !decide::is_managed(pod) {
            return;
        }
        let now = Instant::now();
        let seen = settle::Sighting::of(pod);
        let uid = pod.uid().unwrap_or_default();
        for (name, change, lag) in self.lag.measure(pod, &uid, now) {
            tracing::debug!(container = %name, lag_ms = lag.as_millis() as u64, "the kubelet reported the container's {change}");
            self.metrics.kubelet_lag(lag);
        }
        lock(&self.timelines)
            .entry(uid)
            .and_modify(|t| t.observe(now, seen))
            .or_insert_with(|| Timeline::new(now, seen));
    }

    /// Forgets what was kept of a deleted pod.
    fn forget(&self, uid: &str) {
        lock(&self.seen_at_start).forget(uid);
        lock(&self.timelines).remove(uid);
        self.lag.forget(uid);
        lock(&self.last_stops).retain(|(u, _), _| u != uid);
        self.book.forget(uid);
    }

    /// The event filter: should this version of the pod (the store's) be reconciled? A pod
    /// without the annotation is left alone while it is as the first list found it (no patch
    /// storm on start), unless an in-place update waits for the node: kruise-manager started it
    /// while no daemon ran, and nothing else would finish it.
    fn wants(&self, pod: &Pod, start: Start<'_>) -> bool {
        if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(pod) {
            return false;
        }
        // a stop of ours the pod does not show (a write from an older copy took it out)
        if self
            .book
            .update(&PodId::of(pod), pod.annotations())
            .is_some()
        {
            return true;
        }
        let annotations = pod.metadata.annotations.as_ref();
        let has_meta = annotations.is_some_and(|a| a.contains_key(keys::RUNTIME_CONTAINERS_META));
        let waits_for_node = self.with_env && decide::in_place_update_pending(pod);
        if !has_meta && !waits_for_node {
            let uid = pod.uid().unwrap_or_default();
            let rv = pod.resource_version().unwrap_or_default();
            if lock(&self.seen_at_start).unchanged_since_start(&uid, &rv, start) {
                return false;
            }
        }
        let meta = annotations
            .and_then(|a| keys::parse_runtime_containers_meta(a).ok())
            .flatten();
        decide::needs_sync(pod, meta.as_ref(), self.with_env)
    }

    /// Records this version of the pod and queues it if it is to be reconciled.
    fn consider(&self, pod: &Pod, start: Start<'_>) {
        self.observe(pod);
        if self.wants(pod, start) {
            self.queue.add(ObjectRef::from_obj(pod));
        }
    }

    fn enqueue_all(&self, start: Start<'_>) {
        for pod in self.pods.state() {
            self.consider(&pod, start);
        }
    }
}

async fn worker(shared: Arc<Shared>) {
    let queue = shared.queue.clone();
    let cancel = shared.cancel.clone();
    queue
        .run_worker("containermeta", cancel, RETRY_DELAY, |key| {
            let shared = shared.clone();
            async move {
                let started = Instant::now();
                let result = reconcile(&shared, &key)
                    .instrument(tracing::info_span!("reconcile", pod = %key))
                    .await;
                shared.metrics.observe_reconcile(started.elapsed());
                match result {
                    Ok(_) => Pass::Done,
                    Err(e) => {
                        tracing::warn!(pod = %key, error = %e, "reconcile failed; retrying");
                        Pass::Retry(RETRY_DELAY)
                    }
                }
            }
        })
        .await;
}

/// Why a reconcile must be retried.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The pod's runtime is not known (yet).
    #[error("runtime: {0}")]
    Lookup(#[from] RuntimeLookupError),
    /// The runtime failed a call.
    #[error("runtime: {0}")]
    Runtime(#[from] CriError),
    /// The API server refused or failed the write.
    #[error("writing the annotation: {0}")]
    Api(#[from] kube::Error),
    /// A container's env could not be read.
    #[error("reading the env of {container}: {error}")]
    Env {
        /// The container.
        container: String,
        /// Why.
        error: env::EnvError,
    },
}

/// The pod's runtime and the runtime name of its container IDs; none before a container has
/// an ID.
fn runtime_of(
    shared: &Shared,
    pod: &Pod,
) -> Result<Option<(RemoteRuntime, String)>, ReconcileError> {
    let ids: Vec<&str> = decide::container_ids(pod).collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let guard = shared.runtimes.borrow();
    let runtimes = guard.as_ref().ok_or(RuntimeLookupError::NotConnected)?;
    let (runtime, name) = runtimes.for_containers(ids)?;
    Ok(Some((runtime.clone(), name)))
}

async fn reconcile(shared: &Shared, key: &Key) -> Result<(), ReconcileError> {
    let Some(pod) = shared.pods.store().get(key) else {
        return Ok(());
    };
    if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(&pod) {
        return Ok(());
    }
    // a test build's failpoint: a pass stuck on a call that never returns (until the daemon
    // stops), for the liveness check and systemd's watchdog (`controller::failpoint`)
    #[cfg(feature = "test-util")]
    if crate::controller::failpoint::pass_is_stuck(&pod) {
        tracing::warn!("failpoint: this pass never ends");
        shared.cancel.cancelled().await;
        return Ok(());
    }
    let Some((runtime, runtime_name)) = runtime_of(shared, &pod)? else {
        return Ok(());
    };
    let containers = containers_of_pod(&runtime, &pod.uid().unwrap_or_default()).await?;
    let newest = decide::newest_by_name(&containers);
    let annotations = pod.annotations();
    let old = match keys::parse_runtime_containers_meta(annotations) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a malformed annotation; it will be rewritten");
            None
        }
    };
    let (mut set, to_read) =
        decide::build_meta(&pod, &runtime_name, &newest, old.as_ref(), shared.with_env);
    let specs = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let mut env_error = None;
    for r in to_read {
        let Some(spec) = specs.iter().find(|c| c.name == r.name) else {
            continue;
        };
        match env::read_env(&runtime, &r.id).await {
            Ok((values, source)) => {
                shared.metrics.env_read(source);
                let hash = current_env_hash(spec, |n| values.get(n).cloned());
                if let Some(e) = set.containers.iter_mut().find(|e| e.name == r.name) {
                    e.hashes.extracted_env_from_metadata_hash = hash;
                }
            }
            Err(e) => {
                env_error = Some(ReconcileError::Env {
                    container: r.name.clone(),
                    error: e,
                })
            }
        }
    }

    if shared.with_env {
        for stop in restarts_due(shared, key, &runtime, &pod, &set, &newest).await {
            spawn_kill(shared, &runtime, &runtime_name, &pod, stop);
        }
    }
    let meta = (old.as_ref() != Some(&set) && !set.containers.is_empty())
        .then(|| set.to_annotation_value());
    // the stops this daemon made that the pod does not show yet ride along
    let pod_id = PodId::of(&pod);
    let stops = shared.book.update(&pod_id, annotations);
    if meta.is_some() || stops.is_some() {
        let api: Api<Pod> =
            Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
        let written: Vec<(&str, &str)> = [
            (keys::RUNTIME_CONTAINERS_META, meta.as_deref()),
            (keys::LAST_RESTARTS, stops.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        let result = provenance::patch_annotations(&api, &pod.name_any(), &written).await;
        if meta.is_some() {
            shared.metrics.patched(result.is_ok());
        }
        result?;
        if let Some(value) = &stops {
            shared.book.written(&pod_id, value);
        }
        tracing::debug!(meta = ?meta, stops = ?stops, "annotation updated");
    }
    env_error.map_or(Ok(()), Err)
}
