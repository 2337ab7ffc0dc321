//! Container meta: keeps `apps.kruise.io/runtime-containers-meta` true for the node's
//! kruise-managed pods, and stops containers whose env from metadata went stale during an
//! in-place update so the kubelet recreates them with the new values.
//!
//! Triggers are the pod watch (no fixed enqueue delay, unlike kruise-daemon's 1 s), the
//! runtime's container events where it offers them, and a relist as fallback. Decisions are the
//! pure functions of [`decide`]; this module does the I/O.

pub mod decide;
pub mod env;
mod lag;
mod metrics;
pub mod settle;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tracing::Instrument;

use self::decide::{PreviousStop, RestartInput, RestartReason, Verdict};
use self::lag::{ContainerChange, LagMeter};
pub use self::metrics::Metrics;
use self::settle::{RestartDelay, Timeline};
use super::kill;
use super::queue::WorkQueue;
use crate::controller::Context;
use crate::cri::{
    Container, ContainerEventKind, ContainerFilter, CriError, ImageService, RemoteRuntime,
    RuntimeService, Runtimes,
};
use crate::hash::env::{current_env_hash, expected_env_hash};
use crate::k8s::keys::{self, RuntimeContainerMetaSet};
use crate::k8s::watch::{Change, Watched};
use crate::k8s::write::{self, EventSink, EventSpec};

/// Pods reconciled at once.
const WORKERS: usize = 4;
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
    cancel: tokio_util::sync::CancellationToken,
    tracker: tokio_util::task::TaskTracker,
}

/// Starts the controller when pods are watched.
pub fn start(ctx: &Context, registry: &mut Registry) {
    let Some(pods) = ctx.pods.clone() else {
        return;
    };
    let events = EventSink::spawn(
        ctx.client.clone(),
        "kruise-daemon-containermeta",
        &ctx.config.node_name,
        ctx.cancel.clone(),
        &ctx.tracker,
    );
    let shared = Arc::new(Shared {
        pods,
        client: ctx.client.clone(),
        runtimes: ctx.runtimes.clone(),
        queue: WorkQueue::new(),
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
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let span = tracing::info_span!("containermeta");
    let changes = shared.pods.subscribe();
    let listed_before = shared.pods.store().wait_until_ready().now_or_never_ready();
    ctx.tracker
        .spawn(watch_pods(shared.clone(), changes, listed_before).instrument(span.clone()));
    ctx.tracker
        .spawn(relist(shared.clone(), ctx.config.relist_interval).instrument(span.clone()));
    ctx.tracker
        .spawn(runtime_events(shared.clone(), ctx.config.relist_interval).instrument(span.clone()));
    for _ in 0..WORKERS {
        ctx.tracker
            .spawn(worker(shared.clone()).instrument(span.clone()));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the pod's annotation is out of date with what the pod itself says: a container ID
/// that differs, a container missing, or an env-from-metadata hash that the pod's metadata no
/// longer gives. Cheap (no runtime call), so every pod update can be checked.
fn needs_sync(pod: &Pod, meta: Option<&RuntimeContainerMetaSet>, with_env: bool) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let ids: Vec<(&str, &str)> = statuses
        .into_iter()
        .flatten()
        .filter_map(|s| {
            s.container_id
                .as_deref()
                .filter(|id| !id.is_empty())
                .map(|id| (s.name.as_str(), id))
        })
        .collect();
    if ids.is_empty() {
        return false;
    }
    let Some(meta) = meta else {
        return true;
    };
    if ids
        .iter()
        .any(|(name, id)| meta.container(name).is_none_or(|m| m.container_id != *id))
    {
        return true;
    }
    if !with_env {
        return false;
    }
    // a container first annotated before it ran gets its env hash as soon as it runs
    let running_without_hash = statuses.into_iter().flatten().any(|s| {
        s.state.as_ref().is_some_and(|st| st.running.is_some())
            && meta
                .container(&s.name)
                .is_some_and(|m| m.hashes.extracted_env_from_metadata_hash == 0)
    });
    if running_without_hash {
        return true;
    }
    let (labels, annotations) = decide::metadata_maps(pod);
    pod.spec.iter().flat_map(|s| s.containers.iter()).any(|c| {
        meta.container(&c.name).is_some_and(|m| {
            let current = m.hashes.extracted_env_from_metadata_hash;
            current != 0 && current != expected_env_hash(c, &labels, &annotations)
        })
    })
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
    }

    /// The event filter: should this version of the pod (the store's) be reconciled? A pod
    /// without the annotation is left alone while it is as the first list found it (no patch
    /// storm on start), unless an in-place update waits for the node: kruise-manager started it
    /// while no daemon ran, and nothing else would finish it.
    fn wants(&self, pod: &Pod, start: Start<'_>) -> bool {
        if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(pod) {
            return false;
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
        needs_sync(pod, meta.as_ref(), self.with_env)
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

/// The resourceVersions the first list found the pods without the annotation at: such a pod
/// is left alone until it changes (kruise's rule against a patch storm on daemon start).
#[derive(Debug, Default)]
struct StartVersions(HashMap<String, String>);

impl StartVersions {
    /// Whether pod `uid`, now at `rv`, is as the first list found it; `start` says what this
    /// version tells of that. A pod seen changed is forgotten: from then on it is followed.
    fn unchanged_since_start(&mut self, uid: &str, rv: &str, start: Start<'_>) -> bool {
        match start {
            Start::Listed(listed) => {
                self.0.insert(uid.to_string(), listed.to_string());
            }
            Start::Snapshot => {
                self.0.insert(uid.to_string(), rv.to_string());
            }
            Start::No => {}
        }
        if self.0.get(uid).is_some_and(|v| v == rv) {
            return true;
        }
        self.0.remove(uid);
        false
    }

    fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// What a pod version given to [`Shared::wants`] says of the pods as they were at start.
#[derive(Clone, Copy, Debug)]
enum Start<'a> {
    /// Nothing: a change after the first list.
    No,
    /// The first list found the pod at this resourceVersion (the store may be newer already).
    Listed(&'a str),
    /// The first list is known only through the store: take its versions as the start.
    Snapshot,
}

/// Follows the pods' changes. `changes` was subscribed when the controller started, usually
/// before the pod watch's first list, whose entries then come with the versions they were
/// listed at; `listed_before` says the list was already done then, and only the store tells
/// what it found.
async fn watch_pods(
    shared: Arc<Shared>,
    mut changes: broadcast::Receiver<Change<Pod>>,
    listed_before: bool,
) {
    let mut synced_once = listed_before;
    if listed_before {
        shared.enqueue_all(Start::Snapshot);
    }
    // whether the first list came entirely through its own events
    let mut listed_whole = true;
    loop {
        let change = tokio::select! {
            () = shared.cancel.cancelled() => return,
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Applied(key)) => {
                if let Some(pod) = shared.pods.store().get(&key) {
                    shared.consider(&pod, Start::No);
                }
            }
            Ok(Change::Listed(key, rv)) => {
                // a change that reached the store before this entry of the first list was read
                // is a change, not the state at start
                let start = match &rv {
                    Some(rv) if !synced_once => Start::Listed(rv),
                    _ => Start::No,
                };
                if let Some(pod) = shared.pods.store().get(&key) {
                    shared.consider(&pod, start);
                }
            }
            Ok(Change::Deleted(key)) => {
                if let Some(uid) = key.extra.uid.as_ref() {
                    shared.forget(uid);
                }
            }
            Ok(Change::Resynced) => {
                let start = if synced_once || listed_whole {
                    Start::No
                } else {
                    Start::Snapshot
                };
                synced_once = true;
                shared.enqueue_all(start);
            }
            Err(RecvError::Lagged(_)) => {
                // changes were lost: the store stands in for them
                if synced_once {
                    shared.enqueue_all(Start::No);
                } else {
                    listed_whole = false;
                    // the first list may be done, its Resynced among the lost
                    if shared.pods.store().wait_until_ready().now_or_never_ready() {
                        synced_once = true;
                        shared.enqueue_all(Start::Snapshot);
                    }
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Whether the store's first list is in, without waiting.
trait NowOrNever {
    fn now_or_never_ready(self) -> bool;
}

impl<F: std::future::Future> NowOrNever for F {
    fn now_or_never_ready(self) -> bool {
        futures::FutureExt::now_or_never(self).is_some()
    }
}

async fn relist(shared: Arc<Shared>, every: Duration) {
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(crate::controller::jitter(every)) => {}
        }
        let now = Instant::now();
        lock(&shared.stopped).retain(|_, at| now.duration_since(*at) < STOPPED_MEMORY);
        lock(&shared.kubelet_expected).retain(|_, at| now.duration_since(*at) < STOPPED_MEMORY);
        // the relist catches what no event reported: runtime-side changes on runtimes without
        // container events
        enqueue_annotated(&shared);
    }
}

/// Queues every kruise-managed pod that carries the annotation: a relist of the runtime's
/// side of them.
fn enqueue_annotated(shared: &Shared) {
    for pod in shared.pods.state() {
        if pod.metadata.deletion_timestamp.is_none()
            && decide::is_managed(&pod)
            && pod
                .annotations()
                .contains_key(keys::RUNTIME_CONTAINERS_META)
        {
            shared.queue.add(ObjectRef::from_obj(pod.as_ref()));
        }
    }
}

/// How long an event stream must stay open, without an event, to count as established (a
/// runtime sends its response headers only with its first event, so this is the only sign).
/// One that ends cleanly before, having sent nothing, means the runtime has no events for us.
const EVENTS_SETTLE: Duration = Duration::from_secs(1);
/// How often a runtime without container events is asked again (it may have been upgraded or
/// reconfigured); the relist stands in meanwhile.
const EVENTS_RETRY: Duration = Duration::from_secs(600);
/// Back-off between attempts after an event stream failed.
const EVENTS_BACKOFF_MIN: Duration = Duration::from_millis(500);
const EVENTS_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How one event stream ended.
#[derive(Debug)]
enum StreamEnd {
    /// The runtime does not implement the call (containerd 1.6).
    Unsupported(String),
    /// The call ended cleanly at once, without an event: CRI-O without `enable_pod_events`,
    /// or a runtime shutting down.
    EndedAtOnce,
    /// The stream failed, or ended after it had been established (the runtime went away).
    Broken(String),
}

/// How many streams in a row must end at once, on a runtime that sent events before, before it
/// counts as one without them (it may have been restarted with them off; more likely it was
/// shutting down for a restart).
const ENDED_AT_ONCE_LIMIT: u32 = 3;

/// Follows the runtime's container events (CRI `GetContainerEvents`) where it offers them:
/// a container that stops or starts re-checks its pod at once. A stream that breaks is
/// reconnected with back-off, and once it is back every annotated pod is re-checked, so what
/// happened in between is not lost; a runtime without events is left to the relist and asked
/// again every [`EVENTS_RETRY`].
async fn runtime_events(shared: Arc<Shared>, relist_every: Duration) {
    let mut runtimes = shared.runtimes.clone();
    let runtime = loop {
        if let Some(r) = runtimes.borrow().as_ref() {
            break r.primary().clone();
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            r = runtimes.changed() => if r.is_err() { return },
        }
    };
    let mut backoff = crate::controller::Backoff::new(EVENTS_BACKOFF_MIN, EVENTS_BACKOFF_MAX);
    // whether a stream was ever up (the first needs no catch-up: start-up looks at every pod),
    // whether "no events" was said (said once, then quietly retried), and how many streams in
    // a row ended at once
    let mut ever_up = false;
    let mut said_no_events = false;
    let mut ended_at_once = 0;
    loop {
        let Some(end) = follow_events(&shared, &runtime, ever_up).await else {
            return;
        };
        let no_events = |why: &str, said: &mut bool| {
            if *said {
                tracing::debug!(reason = %why, "still no container events");
            } else {
                *said = true;
                tracing::info!(
                    reason = %why,
                    relist_every = ?relist_every,
                    retry_in = ?EVENTS_RETRY,
                    "the runtime sends no container events; relisting instead"
                );
            }
            EVENTS_RETRY
        };
        let broke = |why: &str, pause: Duration| {
            tracing::warn!(error = %why, retry_in = ?pause, "container event stream broke; reconnecting");
            pause
        };
        let pause = match end {
            Followed::Ended(StreamEnd::Unsupported(why)) => no_events(&why, &mut said_no_events),
            Followed::Ended(StreamEnd::EndedAtOnce) => {
                ended_at_once += 1;
                let why = "the runtime ended the stream at once, without an event";
                if ever_up && ended_at_once < ENDED_AT_ONCE_LIMIT {
                    broke(why, backoff.pause())
                } else {
                    no_events(why, &mut said_no_events)
                }
            }
            Followed::Ended(StreamEnd::Broken(why)) => broke(&why, backoff.pause()),
            Followed::WasUp(end) => {
                ever_up = true;
                said_no_events = false;
                ended_at_once = 0;
                backoff.reset();
                let why = match end {
                    StreamEnd::Unsupported(why) | StreamEnd::Broken(why) => why,
                    StreamEnd::EndedAtOnce => "the runtime ended the stream".into(),
                };
                broke(&why, backoff.pause())
            }
        };
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// What became of one attempt at following the events.
enum Followed {
    /// The stream ended before it was established.
    Ended(StreamEnd),
    /// It was established, then ended.
    WasUp(StreamEnd),
}

/// Follows one event stream until it ends (`None`: shutdown). Once it is established, and it
/// is not the first ever, every annotated pod is queued: a container that died while no
/// stream was up is looked at now.
async fn follow_events(
    shared: &Shared,
    runtime: &RemoteRuntime,
    catch_up: bool,
) -> Option<Followed> {
    let mut stream = runtime.container_events();
    let settle = tokio::time::sleep(EVENTS_SETTLE);
    tokio::pin!(settle);
    let mut up = false;
    loop {
        let item = tokio::select! {
            () = shared.cancel.cancelled() => return None,
            () = &mut settle, if !up => {
                up = true;
                established(shared, catch_up);
                continue;
            }
            i = stream.next() => i,
        };
        let end = match item {
            Some(Ok(e)) => {
                if !up {
                    up = true;
                    established(shared, catch_up);
                }
                if let Some(sandbox) = &e.pod_sandbox_id {
                    let pod =
                        enqueue_sandbox(shared, runtime, sandbox, e.sandbox_status.as_deref())
                            .await;
                    if let Some(pod) = pod
                        && e.kind == ContainerEventKind::Started
                        && shared.with_env
                    {
                        shared.lag.started(&pod, &e);
                    }
                }
                continue;
            }
            Some(Err(e @ CriError::Unsupported { .. })) => StreamEnd::Unsupported(e.to_string()),
            Some(Err(e)) => StreamEnd::Broken(e.to_string()),
            None if up => StreamEnd::Broken("the runtime ended the stream".into()),
            None => StreamEnd::EndedAtOnce,
        };
        return Some(if up {
            Followed::WasUp(end)
        } else {
            Followed::Ended(end)
        });
    }
}

fn established(shared: &Shared, catch_up: bool) {
    tracing::info!("following the runtime's container events");
    if catch_up {
        enqueue_annotated(shared);
    }
}

/// Sandboxes remembered before the map starts afresh (a node runs a few hundred at most).
const SANDBOX_MEMORY: usize = 4096;

/// Queues the kruise-managed pod that owns `sandbox` (and returns it): the UID from the event
/// when the runtime sends the sandbox's status with it, else from an earlier event, else
/// `ListPodSandbox`.
async fn enqueue_sandbox(
    shared: &Shared,
    runtime: &RemoteRuntime,
    sandbox: &str,
    status: Option<&crate::cri::PodSandboxStatus>,
) -> Option<Arc<Pod>> {
    let known = status
        .map(|s| s.sandbox.metadata.uid.clone())
        .filter(|uid| !uid.is_empty())
        .or_else(|| lock(&shared.sandbox_pods).get(sandbox).cloned());
    let uid = match known {
        Some(uid) => uid,
        None => {
            let filter = crate::cri::SandboxFilter {
                id: Some(sandbox.to_string()),
                ..Default::default()
            };
            let found = runtime.list_pod_sandboxes(filter).await.ok()?;
            found.into_iter().next()?.metadata.uid
        }
    };
    {
        let mut map = lock(&shared.sandbox_pods);
        if map.len() >= SANDBOX_MEMORY && !map.contains_key(sandbox) {
            map.clear();
        }
        map.insert(sandbox.to_string(), uid.clone());
    }
    let pod = shared
        .pods
        .state()
        .into_iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        .filter(|p| decide::is_managed(p))?;
    shared.queue.add(ObjectRef::from_obj(pod.as_ref()));
    Some(pod)
}

async fn worker(shared: Arc<Shared>) {
    while let Some(key) = shared.queue.next(&shared.cancel).await {
        let started = Instant::now();
        let result = reconcile(&shared, &key)
            .instrument(tracing::info_span!("reconcile", pod = %key))
            .await;
        shared.metrics.observe_reconcile(started.elapsed());
        if let Err(e) = result {
            tracing::warn!(pod = %key, error = %e, "reconcile failed; retrying");
            shared
                .queue
                .add_after(key.clone(), RETRY_DELAY, &shared.cancel);
        }
        shared.queue.done(&key);
    }
}

/// Why a reconcile must be retried.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The runtime is not known yet or does not answer.
    #[error("runtime: {0}")]
    Runtime(String),
    /// The API server refused or failed the write.
    #[error("writing the annotation: {0}")]
    Api(#[from] kube::Error),
    /// A container's env could not be read.
    #[error("reading the env of {container}: {error}")]
    Env {
        /// The container.
        container: String,
        /// Why.
        error: String,
    },
}

/// The pod's runtime and the runtime name of its container IDs.
fn runtime_of(
    shared: &Shared,
    pod: &Pod,
) -> Result<Option<(RemoteRuntime, String)>, ReconcileError> {
    let Some(id) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|s| s.container_id.clone().filter(|id| !id.is_empty()))
    else {
        return Ok(None);
    };
    let guard = shared.runtimes.borrow();
    let runtimes = guard
        .as_ref()
        .ok_or_else(|| ReconcileError::Runtime("not connected yet".into()))?;
    let name = id.split_once("://").map_or("", |(n, _)| n).to_string();
    match runtimes.for_container_id(&id) {
        Some((rt, _)) => Ok(Some((rt.clone(), name))),
        None => Err(ReconcileError::Runtime(format!(
            "no runtime named {name:?} on this node for container {id}"
        ))),
    }
}

async fn reconcile(shared: &Shared, key: &Key) -> Result<(), ReconcileError> {
    let Some(pod) = shared.pods.store().get(key) else {
        return Ok(());
    };
    if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(&pod) {
        return Ok(());
    }
    let Some((runtime, runtime_name)) = runtime_of(shared, &pod)? else {
        return Ok(());
    };
    let uid = pod.uid().unwrap_or_default();
    let containers = runtime
        .list_containers(ContainerFilter {
            labels: [(keys::KUBELET_POD_UID.to_string(), uid)]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .await
        .map_err(|e| ReconcileError::Runtime(e.to_string()))?;
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
                    error: e.to_string(),
                })
            }
        }
    }

    if shared.with_env {
        for stop in restarts_due(shared, key, &runtime, &pod, &set, &newest).await {
            spawn_kill(shared, &runtime, &pod, stop);
        }
    }
    if old.as_ref() != Some(&set) && !set.containers.is_empty() {
        let api: Api<Pod> =
            Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
        let value = set.to_annotation_value();
        let result = write::patch_pod_annotation(
            &api,
            &pod.name_any(),
            keys::RUNTIME_CONTAINERS_META,
            Some(&value),
        )
        .await;
        shared.metrics.patched(result.is_ok());
        result?;
        tracing::debug!(meta = %value, "annotation updated");
    }
    env_error.map_or(Ok(()), Err)
}

/// A stop decided by [`restarts_due`].
struct Stop {
    container: Container,
    reason: RestartReason,
    expected: u64,
}

/// The containers to stop now for stale env from metadata. A stop that is due but not yet
/// safe (see [`settle`]) or a container the kubelet should recreate by itself is looked at
/// again when that changes.
async fn restarts_due(
    shared: &Shared,
    key: &Key,
    runtime: &RemoteRuntime,
    pod: &Pod,
    set: &RuntimeContainerMetaSet,
    newest: &std::collections::BTreeMap<&str, &Container>,
) -> Vec<Stop> {
    let uid = pod.uid().unwrap_or_default();
    let state = keys::parse_inplace_update_state(pod.annotations())
        .ok()
        .flatten();
    let (labels, annotations) = decide::metadata_maps(pod);
    let now = Instant::now();
    let mut out = Vec::new();
    let mut recheck_at: Option<Instant> = None;
    for meta in &set.containers {
        let (Some(spec), Some(running)) = (
            decide::spec_of(pod, &meta.name),
            newest.get(meta.name.as_str()),
        ) else {
            continue;
        };
        let already_stopped = lock(&shared.stopped).contains_key(&running.id);
        let previous_stop = lock(&shared.last_stops)
            .get(&(uid.clone(), meta.name.clone()))
            .cloned();
        let expected_since = lock(&shared.kubelet_expected).get(&running.id).copied();
        let overdue_at =
            expected_since.map(|t| t + kill::grace_period(running) + KUBELET_RECREATE_MARGIN);
        let image_id_matches =
            if decide::recorded_hash(spec, running) == decide::RecordedHash::Matches {
                None
            } else {
                image_matches(runtime, spec, running).await
            };
        let input = RestartInput {
            pod,
            spec,
            meta,
            running,
            image_id_matches,
            state: state.as_ref(),
            already_stopped,
            kubelet_overdue: overdue_at.is_some_and(|at| now >= at),
            previous_stop: previous_stop.as_ref(),
        };
        match decide::decide_restart(&input) {
            Verdict::Restart(reason) => {
                let excess = shared.lag.excess(now);
                let allowed_at = lock(&shared.timelines)
                    .get(&uid)
                    .map_or(now, |t| t.stop_allowed_at(shared.restart_delay, excess));
                if allowed_at > now {
                    tracing::debug!(
                        container = %meta.name,
                        in_ms = (allowed_at - now).as_millis() as u64,
                        kubelet_lag_excess_ms = excess.as_millis() as u64,
                        "stale env: stopping once the kubelet holds the change"
                    );
                    recheck_at = Some(recheck_at.map_or(allowed_at, |r| r.min(allowed_at)));
                    continue;
                }
                out.push(Stop {
                    container: (*running).clone(),
                    reason,
                    expected: expected_env_hash(spec, &labels, &annotations),
                });
            }
            Verdict::KubeletRecreates => {
                let at = *lock(&shared.kubelet_expected)
                    .entry(running.id.clone())
                    .or_insert(now);
                let overdue = at + kill::grace_period(running) + KUBELET_RECREATE_MARGIN;
                recheck_at = Some(recheck_at.map_or(overdue, |r| r.min(overdue)));
                tracing::debug!(
                    container = %meta.name,
                    reason = "its spec changed too: the kubelet recreates it with the new env",
                    "stale env, not stopping"
                );
            }
            Verdict::Blocked(reason) => {
                tracing::debug!(container = %meta.name, %reason, "stale env, not stopping")
            }
            Verdict::UpToDate | Verdict::Unknown(_) => {}
        }
    }
    if let Some(at) = recheck_at {
        shared.queue.add_after(
            key.clone(),
            at.saturating_duration_since(now) + Duration::from_millis(1),
            &shared.cancel,
        );
    }
    out
}

/// Whether the spec image resolves to the image the container runs (`None`: cannot tell).
pub async fn image_matches(
    runtime: &RemoteRuntime,
    spec: &k8s_openapi::api::core::v1::Container,
    running: &Container,
) -> Option<bool> {
    let image = spec.image.as_deref()?;
    match runtime.image_status(image).await {
        Ok(Some(img)) => Some(crate::cri::dialect::runs_image(&img, running)),
        Ok(None) => Some(false),
        Err(_) => None,
    }
}

fn spawn_kill(shared: &Shared, runtime: &RemoteRuntime, pod: &Pod, stop: Stop) {
    let Stop {
        container: c,
        reason,
        expected,
    } = stop;
    let uid = pod.uid().unwrap_or_default();
    let name = c.metadata.name.clone();
    lock(&shared.stopped).insert(c.id.clone(), Instant::now());
    lock(&shared.last_stops).insert(
        (uid, name.clone()),
        PreviousStop {
            id: c.id.clone(),
            expected,
            corrective: reason == RestartReason::StaleRecreation,
        },
    );
    let runtime = runtime.clone();
    let events = shared.events.clone();
    let metrics = shared.metrics.clone();
    let stopped = shared.stopped.clone();
    let lag = shared.lag.clone();
    let pod_uid = pod.uid().unwrap_or_default();
    let cancel = shared.cancel.clone();
    let mut regarding = write::object_ref(pod);
    regarding.field_path = Some(format!("spec.containers{{{name}}}"));
    let (why, warning) = match reason {
        RestartReason::EnvChanged => (
            "its env from metadata changed, the kubelet recreates it with the new values"
                .to_string(),
            false,
        ),
        RestartReason::StaleRecreation => (
            "the kubelet recreated it from a pod it had taken before the change of its env from \
             metadata (the values are still the old ones); stopping it once more, after the \
             kubelet took the change"
                .to_string(),
            true,
        ),
        RestartReason::KubeletDidNotRecreate => (
            "its spec changed too, but the kubelet did not recreate it within its grace period; \
             stopping it so that it gets the new values"
                .to_string(),
            true,
        ),
    };
    shared.tracker.spawn(
        async move {
            // the pod IP only matters to a preStop hook: no extra call on the hot path otherwise
            let pod_ip = if c.annotations.contains_key(keys::KUBELET_PRESTOP_HANDLER) {
                runtime
                    .pod_sandbox_status(&c.pod_sandbox_id, false)
                    .await
                    .ok()
                    .map(|s| s.ip)
            } else {
                None
            };
            if warning {
                tracing::warn!(container = %name, id = %c.id, reason = reason.as_str(), "stopping container: {why}");
            } else {
                tracing::info!(container = %name, id = %c.id, reason = reason.as_str(), "stopping container: {why}");
            }
            events.record(EventSpec {
                regarding: regarding.clone(),
                warning,
                reason: "Killing".into(),
                note: format!("Stopping container {name} (containerID {}): {why}", c.id),
                action: "Restart".into(),
            });
            let spec = kill::KillSpec::from_kubelet_annotations(&c);
            match kill::kill_container(&runtime, &c, &spec, pod_ip.as_deref(), &cancel).await {
                Ok(outcome) => {
                    lag.expect(&c.id, &pod_uid, &name, ContainerChange::Stopped, Instant::now());
                    metrics.restarted(reason.as_str());
                    if let Some(Err(hook)) = outcome.pre_stop {
                        tracing::warn!(container = %name, error = %hook, "preStop hook failed; the container was stopped all the same");
                        events.record(EventSpec {
                            regarding,
                            warning: true,
                            reason: "FailedPreStopHook".into(),
                            note: format!("preStop hook of {name} failed: {hook}"),
                            action: "PreStop".into(),
                        });
                    }
                }
                Err(e) => {
                    // forget it, so the next reconcile tries again
                    lock(&stopped).remove(&c.id);
                    metrics.restart_failed();
                    tracing::warn!(container = %name, error = %e, "could not stop container");
                }
            }
        }
        .instrument(tracing::info_span!("kill")),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_as_the_first_list_found_it_is_left_alone_until_it_changes() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "5", Start::Listed("5")));
        // a later event of the same version (a relist, a resync) is still the state at start
        assert!(v.unchanged_since_start("a", "5", Start::No));
        assert!(!v.unchanged_since_start("a", "6", Start::No));
        // once changed, it is followed even if a version repeats
        assert!(!v.unchanged_since_start("a", "5", Start::No));
    }

    #[test]
    fn a_change_the_store_took_before_the_list_entry_was_read_is_a_change() {
        // the first list found the pod at 5; its change to 6 reached the store before this
        // daemon read the list's entry (the race that missed an env change right after start)
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("a", "6", Start::Listed("5")));
        // and the resync that ends the first list does not take 6 for the state at start
        assert!(!v.unchanged_since_start("a", "6", Start::No));
    }

    #[test]
    fn without_the_lists_own_entries_the_store_stands_in_for_the_start() {
        let mut v = StartVersions::default();
        assert!(v.unchanged_since_start("a", "6", Start::Snapshot));
        assert!(!v.unchanged_since_start("a", "7", Start::No));
    }

    #[test]
    fn a_pod_never_listed_is_followed_from_its_first_event() {
        let mut v = StartVersions::default();
        assert!(!v.unchanged_since_start("new", "9", Start::No));
    }
}
