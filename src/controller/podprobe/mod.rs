//! NodePodProbe: runs the custom probes kruise-manager lists for the node's pods (from
//! PodProbeMarkers) and reports their results in the NodePodProbe's status, which the manager
//! turns into pod conditions, labels and annotations (docs/kruise-wire.md).
//!
//! - One task per (pod, probe): kubelet semantics (initial delay, period, timeout, success and
//!   failure thresholds, each at least 1), started, updated in place or stopped as the spec
//!   changes; a handler change resets the result to Unknown. No thread per probe: thousands of
//!   probes are thousands of sleeping tasks.
//! - The containers are looked up in one shared listing of the runtime, refreshed once a second
//!   while probes exist (one CRI call whatever their number); exec probes run through a bounded
//!   number of concurrent `ExecSync` calls.
//! - Results are keyed by (pod UID, probe name) (kruise keys by container ID, so two probes of
//!   one container overwrite each other). The status is written only when a result changes,
//!   coalesced across probes into one merge patch; stale entries of pods and probes gone from
//!   the spec are dropped. The manager needs no heartbeat (it reacts to changes only).
//! - Events `KruiseProbeSucceeded` / `KruiseProbeFailed` on the pod when a result changes, and
//!   for a first result only when it is a failure (kruise emits one per result on every status
//!   pass).

pub mod grpc;
mod metrics;
pub mod prober;
pub mod state;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Probe};
use kube::{Api, ResourceExt};
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use self::metrics::Metrics;
use self::prober::{Handler, Outcome};
use self::state::{ProbeKey, Result as ProbeResult, Thresholds};
use super::containers::newest_named;
use super::context::Context;
use super::target::PodIps;
use crate::backoff::Backoff;
use crate::cri::{Container, ContainerFilter, ContainerState, RemoteRuntime, RuntimeService};
use crate::k8s::crd::{NodePodProbe, ProbeState};
use crate::k8s::keys;
use crate::k8s::time::now_seconds;
use crate::k8s::watch::Watched;
use crate::k8s::write::{self, EventSink, EventSpec};
use crate::sync::lock;

/// The event component (kruise's).
pub const EVENT_COMPONENT: &str = "kruise-daemon-podprobe";
/// The reason of the event of a probe that passes again (kruise's).
pub const REASON_SUCCEEDED: &str = "KruiseProbeSucceeded";
/// The reason of the event of a probe that fails (kruise's).
pub const REASON_FAILED: &str = "KruiseProbeFailed";
/// How often the runtime's containers are listed while probes exist.
const CONTAINER_REFRESH: Duration = Duration::from_secs(1);
/// Exec probes running at once on the node.
const EXEC_CONCURRENCY: usize = 16;
/// Exec probes of one namespace running at once: a namespace whose probes sleep through their
/// timeouts holds at most this many of the node's slots, and the others' probes keep their
/// periods (one tenant's probes cannot starve another's).
const EXEC_PER_NAMESPACE: usize = 4;
/// The longest probe timeout honoured: a longer `timeoutSeconds` is cut to this (the kubelet
/// has no cap; here a probe holds a shared slot for as long as its timeout).
pub const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(60);
/// How long results are gathered before one status write.
const STATUS_COALESCE: Duration = Duration::from_millis(100);

/// The containers of the node by pod UID (in no order: [`newest_named`] picks a name's current one).
#[derive(Default)]
struct ContainerIndex {
    by_pod: HashMap<String, Vec<Container>>,
}

/// What one probe task works from; replaced in place when the spec changes.
#[derive(Clone, Debug, PartialEq)]
struct ProbeSpec {
    pod: ObjectReference,
    ip: String,
    container: String,
    probe: Probe,
}

struct Worker {
    spec: watch::Sender<ProbeSpec>,
    cancel: CancellationToken,
}

/// The pod probe controller: what its probe tasks, the container listing and the status
/// writer share.
struct ProbeController {
    probes: Watched<NodePodProbe>,
    client: kube::Client,
    node: String,
    index: RwLock<ContainerIndex>,
    /// Results by (pod UID, probe name).
    results: Mutex<BTreeMap<ProbeKey, ProbeResult>>,
    dirty: Notify,
    exec_slots: Semaphore,
    /// Each namespace's share of the exec slots ([`EXEC_PER_NAMESPACE`]).
    namespace_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    events: EventSink,
    metrics: Metrics,
    started: Instant,
    cancel: CancellationToken,
    tracker: tokio_util::task::TaskTracker,
}

impl ProbeController {
    /// The exec slots of namespace `ns` (made on first use; namespaces whose probes are all
    /// gone are forgotten when the next one is made).
    fn namespace_slots(&self, ns: &str) -> Arc<Semaphore> {
        let mut slots = lock(&self.namespace_slots);
        if !slots.contains_key(ns) {
            // idle shares (no probe holds or waits for them) go: the map follows the live
            // namespaces, not every one ever seen
            slots.retain(|_, s| Arc::strong_count(s) > 1);
        }
        slots
            .entry(ns.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(EXEC_PER_NAMESPACE)))
            .clone()
    }
}

/// Starts the controller when probes are enabled (`PodProbeMarkerGate`).
pub fn start(ctx: &Context, registry: &mut Registry) {
    let Some(probes) = ctx.pod_probes.clone() else {
        return;
    };
    let events = ctx.event_sink(EVENT_COMPONENT);
    let shared = Arc::new(ProbeController {
        probes,
        client: ctx.client.clone(),
        node: ctx.config.node_name.clone(),
        index: RwLock::new(ContainerIndex::default()),
        results: Mutex::new(BTreeMap::new()),
        dirty: Notify::new(),
        exec_slots: Semaphore::new(EXEC_CONCURRENCY),
        namespace_slots: Mutex::new(HashMap::new()),
        events,
        metrics: Metrics::register(registry),
        started: Instant::now(),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let runtimes = ctx.runtimes.clone();
    let span = tracing::info_span!("podprobe");
    let writer_alive = ctx.liveness.task("podprobe status writer", &ctx.cancel);
    ctx.spawn(
        "podprobe",
        async move {
            let Some(runtime) = runtimes.wait_primary(&shared.cancel).await else {
                return;
            };
            let writer = write_status(shared.clone());
            shared.tracker.spawn(
                async move {
                    let _alive = writer_alive;
                    writer.await;
                }
                .in_current_span(),
            );
            sync_workers(shared, runtime).await;
        }
        .instrument(span),
    );
}

/// The probe tasks follow the spec; the container listing runs while there are probes.
async fn sync_workers(shared: Arc<ProbeController>, runtime: RemoteRuntime) {
    let mut generation = shared.probes.generation();
    let mut workers: HashMap<(String, String, String), Worker> = HashMap::new();
    let mut refresher: Option<CancellationToken> = None;
    loop {
        let npp = shared
            .probes
            .state()
            .into_iter()
            .find(|n| n.name_any() == shared.node);
        let mut wanted: HashMap<(String, String, String), ProbeSpec> = HashMap::new();
        for pod in npp.iter().flat_map(|n| n.spec.pod_probes.iter()) {
            for p in &pod.probes {
                let pod_ref = write::pod_ref(&pod.namespace, &pod.name, &pod.uid);
                wanted.insert(
                    (pod.uid.clone(), p.name.clone(), p.container_name.clone()),
                    ProbeSpec {
                        pod: pod_ref,
                        ip: pod.ip.clone(),
                        container: p.container_name.clone(),
                        probe: p.probe.clone(),
                    },
                );
            }
        }
        // stop what left the spec and forget its result
        workers.retain(|key, w| {
            if wanted.contains_key(key) {
                return true;
            }
            w.cancel.cancel();
            lock(&shared.results).remove(&(key.0.clone(), key.1.clone()));
            shared.dirty.notify_one();
            false
        });
        for (key, spec) in wanted {
            match workers.get(&key) {
                Some(w) => {
                    w.spec.send_if_modified(|s| {
                        if *s == spec {
                            return false;
                        }
                        *s = spec.clone();
                        true
                    });
                }
                None => {
                    let (tx, rx) = watch::channel(spec);
                    let cancel = shared.cancel.child_token();
                    shared.tracker.spawn(
                        probe_task(
                            shared.clone(),
                            runtime.clone(),
                            (key.0.clone(), key.1.clone()),
                            rx,
                            cancel.clone(),
                        )
                        .instrument(tracing::debug_span!("probe", pod = %key.0, probe = %key.1)),
                    );
                    workers.insert(key, Worker { spec: tx, cancel });
                }
            }
        }
        shared.dirty.notify_one();
        match (workers.is_empty(), &refresher) {
            (false, None) => {
                let t = shared.cancel.child_token();
                shared.tracker.spawn(
                    refresh_containers(shared.clone(), runtime.clone(), t.clone())
                        .in_current_span(),
                );
                refresher = Some(t);
            }
            (true, Some(t)) => {
                t.cancel();
                refresher = None;
            }
            _ => {}
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            r = generation.changed() => if r.is_err() { return },
        }
    }
}

/// Lists the node's containers once a second into the shared index.
async fn refresh_containers(
    shared: Arc<ProbeController>,
    runtime: RemoteRuntime,
    cancel: CancellationToken,
) {
    loop {
        match runtime.list_containers(ContainerFilter::default()).await {
            Ok(cs) => {
                let mut by_pod: HashMap<String, Vec<Container>> = HashMap::new();
                for c in cs {
                    if let Some(uid) = c.labels.get(keys::KUBELET_POD_UID).cloned() {
                        by_pod.entry(uid).or_default().push(c);
                    }
                }
                *shared.index.write().unwrap_or_else(|e| e.into_inner()) =
                    ContainerIndex { by_pod };
            }
            Err(e) => tracing::debug!(error = %e, "listing containers for the probes failed"),
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CONTAINER_REFRESH) => {}
        }
    }
}

/// A probe's seconds field: at least 1 (the kubelet's floor), at most a year.
fn seconds(v: Option<i32>) -> Duration {
    crate::k8s::crd::api_seconds(i64::from(v.unwrap_or(0).max(1)))
}

/// One probe, until its token is cancelled.
async fn probe_task(
    shared: Arc<ProbeController>,
    runtime: RemoteRuntime,
    key: ProbeKey,
    mut spec: watch::Receiver<ProbeSpec>,
    cancel: CancellationToken,
) {
    let mut container_id: Option<String> = None;
    // the pod's IPs, and the IP the spec gave when they were found
    let mut pod_ips: Option<(String, PodIps)> = None;
    let mut thresholds = Thresholds::default();
    let mut handler = Handler::of(&spec.borrow().probe);
    // spread the first runs of many probes over a period, as the kubelet does after a restart
    let period = seconds(spec.borrow().probe.period_seconds);
    if shared.started.elapsed() < period {
        let delay = period.mul_f64(rand::random_range(0.0..1.0));
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
            r = spec.changed() => {
                if r.is_err() { return }
                let s = spec.borrow_and_update().clone();
                let new_handler = Handler::of(&s.probe);
                if new_handler != handler && container_id.is_some() {
                    set_result(&shared, &key, &s, ProbeState::Unknown, String::new());
                    thresholds.reset();
                }
                handler = new_handler;
                let p = seconds(s.probe.period_seconds);
                if p != tick.period() {
                    tick = tokio::time::interval_at(Instant::now() + p, p);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
                continue;
            }
        }
        let s = spec.borrow().clone();
        let found = shared
            .index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_pod
            .get(&key.0)
            .and_then(|cs| newest_named(cs, &s.container).cloned());
        let Some(c) = found else { continue };
        if container_id.as_deref() != Some(c.id.as_str()) {
            container_id = Some(c.id.clone());
            pod_ips = None;
            thresholds.reset();
            set_result(&shared, &key, &s, ProbeState::Unknown, String::new());
        }
        if c.state != ContainerState::Running {
            set_result(
                &shared,
                &key,
                &s,
                ProbeState::Failed,
                format!("Container({}) is Non-running", s.container),
            );
            continue;
        }
        let up_ns = i64::try_from(k8s_openapi::jiff::Timestamp::now().as_nanosecond())
            .unwrap_or(i64::MAX)
            - c.created_at;
        let initial = seconds(s.probe.initial_delay_seconds);
        if Duration::from_nanos(u64::try_from(up_ns).unwrap_or(0)) < initial {
            continue;
        }
        let Some(h) = handler else { continue };
        let timeout = seconds(s.probe.timeout_seconds).min(PROBE_TIMEOUT_MAX);
        // where network probes may go: the pod's IPs, asked of the runtime once per container
        // (the sandbox's) beside the one kruise-manager wrote from the pod's status
        if h != Handler::Exec && pod_ips.as_ref().is_none_or(|(ip, _)| *ip != s.ip) {
            let sandbox = runtime
                .pod_sandbox_status(&c.pod_sandbox_id, false)
                .await
                .ok();
            pod_ips = Some((s.ip.clone(), PodIps::of(sandbox.as_ref(), [s.ip.as_str()])));
        }
        let ips = pod_ips
            .as_ref()
            .map(|(_, ips)| ips.clone())
            .unwrap_or_default();
        let started = Instant::now();
        let outcome = if h == Handler::Exec {
            // the namespace's share first, then the node's: waiting for the node's slot never
            // holds one of another namespace's
            let ns = s.pod.namespace.clone().unwrap_or_default();
            let share = shared.namespace_slots(&ns);
            let _ns_slot = share.acquire().await;
            let _slot = shared.exec_slots.acquire().await;
            prober::run(&runtime, &s.probe, &c.id, &ips, timeout).await
        } else {
            prober::run(&runtime, &s.probe, &c.id, &ips, timeout).await
        };
        shared.metrics.probed(h, &outcome, started.elapsed());
        let (success, message) = match outcome {
            Outcome::Success(m) => (true, m),
            Outcome::Failure(m) => (false, m),
            Outcome::Error(e) => {
                tracing::debug!(error = %e, "probe could not run");
                continue;
            }
        };
        let success_threshold = s.probe.success_threshold.unwrap_or(1);
        let failure_threshold = s.probe.failure_threshold.unwrap_or(1);
        if thresholds.observe(success, success_threshold, failure_threshold) {
            let state = if success {
                ProbeState::Succeeded
            } else {
                ProbeState::Failed
            };
            set_result(
                &shared,
                &key,
                &s,
                state,
                prober::truncate(message.trim_end()),
            );
        }
    }
}

/// Stores a result if it differs from the current one, with an event when the state changes,
/// and asks for a status write.
fn set_result(
    shared: &ProbeController,
    key: &ProbeKey,
    spec: &ProbeSpec,
    state: ProbeState,
    message: String,
) {
    let now = now_seconds();
    let event = {
        let mut results = lock(&shared.results);
        let previous = results.get(key);
        if previous.is_some_and(|p| p.state == state && p.message == message) {
            return;
        }
        let state_changed = previous.is_none_or(|p| p.state != state);
        let was_known = previous.is_some_and(|p| p.state != ProbeState::Unknown);
        let since = match previous {
            Some(p) if !state_changed => p.since.clone(),
            _ => now.clone(),
        };
        results.insert(
            key.clone(),
            ProbeResult {
                state: state.clone(),
                message: message.clone(),
                since,
                observed: now,
            },
        );
        // a first success is not news (the kubelet records no event for a passing probe): 1000
        // probes starting would otherwise make 1000 events, drained at the client's rate limit
        state_changed && state != ProbeState::Unknown && (was_known || state == ProbeState::Failed)
    };
    if event {
        let reason = if state == ProbeState::Succeeded {
            REASON_SUCCEEDED
        } else {
            REASON_FAILED
        };
        tracing::info!(pod = %key.0, probe = %key.1, state = %state.as_str(), %message, "probe result changed");
        shared.events.record(EventSpec {
            regarding: spec.pod.clone(),
            warning: false,
            reason: reason.into(),
            note: message,
            action: "Probe".into(),
        });
    }
    shared.dirty.notify_one();
}

/// Writes the status when results changed: one merge patch for all changes within
/// [`STATUS_COALESCE`], and only when the status differs from the stored one.
async fn write_status(shared: Arc<ProbeController>) {
    let api: Api<NodePodProbe> = Api::all(shared.client.clone());
    let mut retry = Backoff::status_write();
    loop {
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = shared.dirty.notified() => {}
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            () = tokio::time::sleep(STATUS_COALESCE) => {}
        }
        let Some(npp) = shared
            .probes
            .state()
            .into_iter()
            .find(|n| n.name_any() == shared.node)
        else {
            continue;
        };
        let status = state::build_status(&npp, &lock(&shared.results));
        if Some(&status) == npp.status.as_ref()
            || (status.pod_probe_statuses.is_empty()
                && npp
                    .status
                    .as_ref()
                    .is_none_or(|s| s.pod_probe_statuses.is_empty()))
        {
            continue;
        }
        let body = serde_json::json!({"podProbeStatuses": status.pod_probe_statuses});
        match write::patch_status(&api, &shared.node, &body).await {
            Ok(_) => {
                retry.reset();
                tracing::debug!("NodePodProbe status written");
            }
            Err(e) => {
                let pause = retry.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "writing the NodePodProbe status failed; retrying");
                tokio::select! {
                    () = shared.cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                shared.dirty.notify_one();
            }
        }
    }
}
