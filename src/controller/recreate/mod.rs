//! ContainerRecreateRequest: recreates the named containers of a pod on request, the way
//! kruise-daemon does (docs/kruise-wire.md): the node's active requests (labels
//! `crr.apps.kruise.io/node-name=<node>` and `active=true`), one pod at a time (the work queue
//! key is the pod, so requests for one pod run one after the other and the others wait in
//! phase Pending), phase `Recreating` first, the unready grace, one kill per pass through the
//! shared kill path ([`super::kill`]), per-container states, and `Completed` at the end. Each
//! stop is recorded on the pod with the request's name ([`record`], [`super::provenance`]).
//!
//! Decisions are the pure functions of [`decide`]; this module does the I/O. Status writes are
//! JSON merge patches of the changed fields only. What was done is read back from the
//! request's status and the runtime: a container about to be killed is recorded as killed
//! first, so a daemon restart in the middle never kills it twice. The daemon also remembers its
//! own kills until the request ends, because the watched copy of a request can be older than
//! its last write, and a status written from that copy must not take `isKilled` back. For the
//! same reason it remembers the requests it completed until the watch shows them completed or
//! gone: a pass on a copy older than the completion would complete (and count) it again. When
//! the manager ends a request (completion, deletion), a kill in progress for it is called off.

mod controller;
pub mod decide;
mod metrics;
mod record;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LifecycleHandler, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, ResourceExt};
use prometheus_client::registry::Registry;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::controller::{Key, RETRY, RecreateController, key_of};
use self::decide::{NextStep, Observed};
pub use self::metrics::Metrics;
use super::containers::{containers_of_pod, newest_by_name};
use super::context::Context;
use super::kill::{self, KillSpec};
use super::provenance::{Book, PodId, RECREATE_REQUEST, Restart};
use super::queue::{Pass, QueueMetrics, RECREATE_QUEUE, Retry, WorkQueue};
use crate::cri::{CriError, RemoteRuntime, RuntimeLookupError, RuntimeService};
use crate::k8s::crd::{
    ContainerRecreateRequest, ContainerRecreateRequestContainerRecreateState as State,
    ContainerRecreateRequestPhase as Phase,
};
use crate::k8s::keys;
use crate::k8s::watch::Change;
use crate::k8s::write;
use crate::sync::lock;

/// Pods worked on at once (kruise: 32 workers).
const WORKERS: usize = 8;
/// Pause before retrying a pod whose pass failed because the runtime did not answer: short, so
/// the work resumes soon after a restarted runtime answers again (a call to a missing socket
/// costs nothing): 250 ms, doubling up to the 2 s of other failures' first pause.
const RUNTIME_RETRY: Retry = Retry::after(Duration::from_millis(250)).at_most(RETRY.first());
/// How often a recreating request is looked at again without any event (the runtime has no
/// container events on containerd 1.6; kruise's manager polls every 3 s too).
const RECREATING_POLL: Duration = Duration::from_secs(3);
/// The event component (kruise's).
pub const EVENT_COMPONENT: &str = "kruise-daemon-crr";

/// Starts the controller (kruise runs it always: no gate): its own metrics on `registry`, its
/// queue's on `queues` (kruise-daemon's queue name), its stops recorded in `book`.
pub fn start(ctx: &Context, registry: &mut Registry, queues: &QueueMetrics, book: &Book) {
    let events = ctx.event_sink(EVENT_COMPONENT);
    let shared = Arc::new(RecreateController {
        requests: ctx.recreate_requests.clone(),
        client: ctx.client.clone(),
        runtimes: ctx.runtimes.clone(),
        queue: WorkQueue::with_metrics(RECREATE_QUEUE, queues),
        events,
        metrics: Metrics::register(registry),
        inflight: Default::default(),
        killed: Default::default(),
        pods: ctx.pods.clone(),
        pod_of: Default::default(),
        completed: Default::default(),
        book: book.clone(),
        cancel: ctx.cancel.clone(),
        tracker: ctx.tracker.clone(),
    });
    let span = tracing::info_span!("recreate");
    ctx.spawn(
        "recreate request watch",
        watch_requests(shared.clone()).instrument(span.clone()),
    );
    ctx.watch_queue("recreate", &shared.queue);
    for _ in 0..WORKERS {
        ctx.spawn(
            "recreate worker",
            worker(shared.clone()).instrument(span.clone()),
        );
    }
}

async fn watch_requests(shared: Arc<RecreateController>) {
    let mut changes = shared.requests.subscribe();
    shared.requests.wait_synced().await;
    for r in shared.requests.state() {
        shared.on_change(&r);
    }
    loop {
        let change = tokio::select! {
            () = shared.cancel.cancelled() => return,
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Applied(key) | Change::Listed(key, _)) => {
                if let Some(r) = shared.requests.store().get(&key) {
                    shared.on_change(&r);
                }
            }
            Ok(Change::Deleted(key)) => {
                // gone from the watch: deleted, or no longer active
                if let Some(uid) = key.extra.uid.as_deref() {
                    shared.on_gone(uid);
                }
            }
            Ok(Change::Resynced) | Err(RecvError::Lagged(_)) => {
                for r in shared.requests.state() {
                    shared.on_change(&r);
                }
            }
            Err(RecvError::Closed) => return,
        }
    }
}

async fn worker(shared: Arc<RecreateController>) {
    let queue = shared.queue.clone();
    let cancel = shared.cancel.clone();
    queue
        .run_worker("recreate", cancel, RETRY.first(), |key| {
            let shared = shared.clone();
            async move {
                let result = sync_pod(&shared, &key)
                    .instrument(tracing::info_span!("pod", namespace = %key.0, name = %key.1))
                    .await;
                match result {
                    Ok(Some(after)) => Pass::After(after),
                    Ok(None) => Pass::Done,
                    Err(e) => {
                        let retry = e.retry();
                        let retry_in = shared.queue.next_retry(&key, retry);
                        tracing::warn!(pod = %format!("{}/{}", key.0, key.1), error = %e, ?retry_in, "recreate request pass failed; retrying");
                        Pass::Retry(retry)
                    }
                }
            }
        })
        .await;
}

/// Why a pass must be retried.
#[derive(Debug, thiserror::Error)]
enum PassError {
    /// The API refused or failed a write.
    #[error("writing the request's status: {0}")]
    Api(#[from] kube::Error),
    /// No runtime is connected yet.
    #[error("runtime: {0}")]
    NotConnected(RuntimeLookupError),
    /// The runtime failed a call.
    #[error("runtime: {0}")]
    Runtime(#[from] CriError),
}

impl PassError {
    /// The pause before the pod's next pass: short while the runtime is away or failed a call
    /// that may go through next time (it answers again soon after a restart, and a call to a
    /// missing socket costs nothing); the ordinary pause after an answer that stays the same
    /// whenever asked (not found, not supported), as after a failed write.
    fn retry(&self) -> Retry {
        match self {
            PassError::NotConnected(_) => RUNTIME_RETRY,
            PassError::Runtime(e) if e.is_retryable() => RUNTIME_RETRY,
            PassError::Runtime(_) | PassError::Api(_) => RETRY,
        }
    }
}

fn api_of(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
) -> Api<ContainerRecreateRequest> {
    Api::namespaced(shared.client.clone(), &r.namespace().unwrap_or_default())
}

/// A merge patch of the status fields the daemon owns (never the manager's snapshot); the
/// fields left `None` are not touched.
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusPatch<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    completion_time: Option<String>,
    /// `Some(None)` clears the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_recreate_states: Option<&'a [State]>,
}

impl<'a> StatusPatch<'a> {
    fn phase(phase: Phase) -> Self {
        StatusPatch {
            phase: Some(phase),
            ..Default::default()
        }
    }

    fn states(states: &'a [State]) -> Self {
        StatusPatch {
            container_recreate_states: Some(states),
            ..Default::default()
        }
    }

    /// `Completed` now, with `message` (cleared when `None`).
    fn completed(message: Option<&'a str>) -> Self {
        StatusPatch {
            phase: Some(Phase::Completed),
            completion_time: Some(crate::k8s::time::now_rfc3339()),
            message: Some(message),
            ..Default::default()
        }
    }
}

async fn patch(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
    status: StatusPatch<'_>,
) -> Result<(), kube::Error> {
    let status = serde_json::to_value(status).map_err(kube::Error::SerdeError)?;
    write::patch_status(&api_of(shared, r), &r.name_any(), &status)
        .await
        .map(drop)
}

/// One pass over the requests of a pod. `Some(d)`: look again after `d`.
async fn sync_pod(
    shared: &Arc<RecreateController>,
    key: &Key,
) -> Result<Option<Duration>, PassError> {
    // the stops recorded for the pod are written first; a write that fails holds up no request
    record::write_stops_or_retry(shared, key).await;
    let (requests, done): (Vec<Arc<ContainerRecreateRequest>>, Vec<_>) = shared
        .requests
        .state()
        .into_iter()
        .filter(|r| key_of(r) == *key)
        .partition(|r| !shared.completed_here(r));
    for r in done {
        tracing::debug!(request = %r.name_any(), "completed here; waiting for the watch to show it");
    }
    let (picked, to_pending) = decide::pick(&requests);
    for r in to_pending {
        tracing::info!(request = %r.name_any(), "another request of the pod runs first: Pending");
        patch(shared, &r, StatusPatch::phase(Phase::Pending)).await?;
    }
    let Some(r) = picked else {
        return Ok(None);
    };
    let name = r.name_any();
    if r.phase() != Phase::Recreating {
        tracing::info!(request = %name, "recreating");
        patch(shared, &r, StatusPatch::phase(Phase::Recreating)).await?;
        // the write's watch event brings the next pass
        return Ok(None);
    }
    if let Some(grace) = r.spec.unready_grace_period() {
        match decide::unready_since(&r) {
            Err(e) => {
                complete(shared, &r, &e.to_string(), &[]).await?;
                return Ok(None);
            }
            Ok(None) => {
                tracing::info!(request = %name, "waiting for the manager to take the pod out of service (unready grace)");
                return Ok(None);
            }
            Ok(Some(since)) => {
                let left = grace.saturating_sub(elapsed_since(since));
                if !left.is_zero() {
                    tracing::debug!(request = %name, ?left, "in the unready grace period");
                    return Ok(Some(left.saturating_add(Duration::from_millis(100))));
                }
            }
        }
    }
    manage(shared, &r).await
}

fn elapsed_since(t: Timestamp) -> Duration {
    let d = Timestamp::now().as_nanosecond() - t.as_nanosecond();
    Duration::from_nanos(u64::try_from(d).unwrap_or(0))
}

/// The runtime of the request's containers: the one their `statusContext` IDs name, else the
/// node's primary runtime.
fn runtime_of(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
) -> Result<(RemoteRuntime, String), RuntimeLookupError> {
    let ids = r
        .spec
        .containers
        .iter()
        .filter_map(|c| c.status_context.as_ref())
        .map(|c| c.container_id.as_str());
    shared.runtimes.for_containers(ids)
}

async fn manage(
    shared: &Arc<RecreateController>,
    r: &Arc<ContainerRecreateRequest>,
) -> Result<Option<Duration>, PassError> {
    // a kill of this request's is under way on its task: it looks at the pod again when it ends
    if lock(&shared.inflight).contains_key(&r.uid().unwrap_or_default()) {
        return Ok(Some(RECREATING_POLL));
    }
    let (runtime, runtime_name) = match runtime_of(shared, r) {
        Ok(x) => x,
        Err(e @ RuntimeLookupError::NotConnected) => return Err(PassError::NotConnected(e)),
        Err(e) => {
            complete(
                shared,
                r,
                &format!("failed to find runtime service: {e}"),
                &[],
            )
            .await?;
            return Ok(None);
        }
    };
    let uid = r
        .labels()
        .get(keys::CRR_POD_UID_LABEL)
        .cloned()
        .unwrap_or_default();
    if uid.is_empty() {
        // kruise's webhook sets it on every request: one without came past the webhook
        complete(
            shared,
            r,
            "the request has no crr.apps.kruise.io/pod-uid label (kruise's webhook sets it): refused",
            &[],
        )
        .await?;
        return Ok(None);
    }
    let containers = containers_of_pod(&runtime, &uid).await?;
    // the containers the uid names must be the request's pod's, in the request's namespace:
    // the uid label alone is the creator's word where the webhook was bypassed, and would
    // point at another tenant's pod
    if let Some(other) = containers
        .iter()
        .find(|c| !decide::is_pod(c, &r.namespace().unwrap_or_default(), &r.spec.pod_name))
    {
        let of = |k: &str| other.labels.get(k).map(String::as_str).unwrap_or("?");
        let message = format!(
            "pod-uid {uid} names pod {}/{}, not this request's {}/{}: refused",
            of(keys::KUBELET_POD_NAMESPACE),
            of(keys::KUBELET_POD_NAME),
            r.namespace().unwrap_or_default(),
            r.spec.pod_name
        );
        tracing::warn!(request = %r.name_any(), "{message}");
        complete(shared, r, &message, &[]).await?;
        return Ok(None);
    }
    let newest = newest_by_name(&containers);
    let mut observed = BTreeMap::new();
    for c in r.spec.containers.iter() {
        let Some(running) = newest.get(c.name.as_str()) else {
            continue;
        };
        let status = runtime.container_status(&running.id, false).await?;
        observed.insert(
            c.name.clone(),
            Observed {
                container_id: format!("{runtime_name}://{}", running.id),
                state: status.state,
                restart_count: running
                    .annotations
                    .get(keys::KUBELET_CONTAINER_RESTART_COUNT)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                started_at_ns: status.started_at,
            },
        );
    }
    let snapshot = decide::snapshot(r);
    let now_ns = i64::try_from(Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX);
    let killed = lock(&shared.killed)
        .get(&r.uid().unwrap_or_default())
        .cloned()
        .unwrap_or_default();
    let mut states = decide::container_states(r, &observed, &snapshot, &killed, now_ns);
    let current = r
        .status
        .as_ref()
        .map(|s| s.container_recreate_states.clone())
        .unwrap_or_default();
    if states != current {
        patch(shared, r, StatusPatch::states(&states[..])).await?;
        return Ok(None);
    }
    match decide::next_step(r, &mut states) {
        NextStep::Complete => {
            complete(shared, r, "", &states).await?;
            Ok(None)
        }
        NextStep::Wait => {
            if states != current {
                patch(shared, r, StatusPatch::states(&states[..])).await?;
            }
            let until_min_started = decide::min_started_deadline(r, &states, &observed)
                .map(|at| Duration::from_nanos(u64::try_from(at - now_ns).unwrap_or(0)));
            Ok(Some(
                until_min_started.map_or(RECREATING_POLL, |d| d.min(RECREATING_POLL)),
            ))
        }
        NextStep::Kill(container) => {
            let runtime = (&runtime, runtime_name.as_str());
            kill_one(shared, r, runtime, &container, &uid, &mut states, &newest).await?;
            Ok(Some(RECREATING_POLL))
        }
    }
}

/// Records the kill of `container` in the status first, then kills it on a task of its own:
/// a preStop hook runs for as long as the request's grace (its creator's), and on a worker it
/// would hold one of the node's few for that long (2c6dc4e ran it inline: 8 hanging hooks and
/// no other pod's request moved). When the kill ends, the pod is looked at again; a failed kill
/// marks the container Failed.
async fn kill_one(
    shared: &Arc<RecreateController>,
    r: &Arc<ContainerRecreateRequest>,
    (runtime, runtime_name): (&RemoteRuntime, &str),
    container: &str,
    pod_uid: &str,
    states: &mut [State],
    newest: &BTreeMap<&str, &crate::cri::Container>,
) -> Result<(), PassError> {
    let Some(running) = newest.get(container) else {
        return Ok(());
    };
    set_state(states, container, Phase::Recreating, String::new(), true);
    patch(shared, r, StatusPatch::states(&states[..])).await?;
    lock(&shared.killed)
        .entry(r.uid().unwrap_or_default())
        .or_default()
        .insert(container.to_string());

    let spec_container = r.spec.containers.iter().find(|c| c.name == container);
    let spec = KillSpec {
        pre_stop: spec_container
            .and_then(|c| c.pre_stop.clone())
            .map(|h| LifecycleHandler {
                exec: h.exec,
                http_get: h.http_get,
                tcp_socket: h.tcp_socket,
                ..Default::default()
            }),
        grace: r.spec.termination_grace_period(),
        ports: spec_container.map(|c| c.ports.clone()).unwrap_or_default(),
    };
    let uid = r.uid().unwrap_or_default();
    let token = shared.cancel.child_token();
    lock(&shared.inflight).insert(uid.clone(), token.clone());
    let pod = PodId {
        namespace: r.namespace().unwrap_or_default(),
        name: r.spec.pod_name.clone(),
        uid: pod_uid.to_string(),
    };
    let regarding = kill::container_ref(
        &write::pod_ref(&pod.namespace, &pod.name, &pod.uid),
        container,
    );
    // the pod's status IPs (for a host-network pod, whose sandbox has none), from the node's
    // pods where they are watched
    let status_ips = shared
        .pods
        .as_ref()
        .and_then(|pods| {
            pods.state().into_iter().find(|p| {
                p.uid().as_deref() == Some(pod_uid)
                    && p.namespace() == r.namespace()
                    && p.name_any() == r.spec.pod_name
            })
        })
        .map(|p| crate::k8s::pod_ips(&p))
        .unwrap_or_default();
    let task = KillTask {
        shared: shared.clone(),
        request: r.clone(),
        runtime: runtime.clone(),
        running: (*running).clone(),
        container: container.to_string(),
        states: states.to_vec(),
        spec,
        regarding,
        token,
        status_ips,
        pod,
        kubelet_id: format!("{runtime_name}://{}", running.id),
    };
    shared.tracker.spawn(task.run().in_current_span());
    Ok(())
}

fn set_state(states: &mut [State], container: &str, phase: Phase, message: String, killed: bool) {
    if let Some(s) = states.iter_mut().find(|s| s.name == container) {
        s.phase = phase;
        s.message = message;
        s.is_killed = killed;
    }
}

/// One container's kill for a request, on a task of its own.
struct KillTask {
    shared: Arc<RecreateController>,
    request: Arc<ContainerRecreateRequest>,
    runtime: RemoteRuntime,
    running: crate::cri::Container,
    container: String,
    states: Vec<State>,
    spec: KillSpec,
    regarding: ObjectReference,
    token: CancellationToken,
    status_ips: Vec<String>,
    /// The pod, for the record of the stop.
    pod: PodId,
    /// The container stopped, as the kubelet writes its ID.
    kubelet_id: String,
}

impl KillTask {
    async fn run(mut self) {
        let (shared, r, container) = (&self.shared, &self.request, self.container.as_str());
        let key = (r.namespace().unwrap_or_default(), r.spec.pod_name.clone());
        let uid = r.uid().unwrap_or_default();
        tracing::info!(request = %r.name_any(), %container, id = %self.running.id, "stopping container for the recreate request");
        let announcement = kill::Announcement {
            regarding: self.regarding.clone(),
            container: container.to_string(),
            note: format!(
                "Stopping container {container} by ContainerRecreateRequest {}",
                r.name_any()
            ),
            warning: false,
            action: "Recreate",
        };
        let outcome = kill::kill_announced(
            &self.runtime,
            &self.running,
            &self.spec,
            &self.status_ips,
            &self.token,
            &shared.events,
            announcement,
        )
        .await;
        lock(&shared.inflight).remove(&uid);
        let again = match outcome {
            Ok(_) => {
                shared.metrics.killed();
                // written on the pod by its next pass, which the add below brings at once
                shared.book.record(
                    self.pod.clone(),
                    Restart::now(
                        container,
                        self.kubelet_id.clone(),
                        RECREATE_REQUEST,
                        &r.name_any(),
                    ),
                );
                None
            }
            Err(kill::KillError::Cancelled) => {
                tracing::info!(request = %r.name_any(), %container, "kill called off: the request ended");
                None
            }
            // the runtime went away under the call, called it off, or failed inside
            // (containerd answers Unknown "ttrpc: closed" when its shim connection breaks in a
            // restart): whether the container stopped is unknown, and a later pass finds out
            // and stops it again if not, as the kubelet retries a kill; the manager ends the
            // request at its activeDeadlineSeconds. Only a final error (not found, not
            // supported) fails it.
            Err(kill::KillError::Cri(e)) if e.is_retryable() => {
                tracing::warn!(request = %r.name_any(), %container, error = %e, "stopping the container failed; trying again");
                Some(RUNTIME_RETRY)
            }
            Err(kill::KillError::Cri(e)) => {
                tracing::warn!(request = %r.name_any(), %container, error = %e, "could not stop the container");
                set_state(
                    &mut self.states,
                    container,
                    Phase::Failed,
                    format!("kill container error: {e}"),
                    true,
                );
                match patch(shared, r, StatusPatch::states(&self.states[..])).await {
                    Ok(()) => None,
                    Err(e) => {
                        tracing::warn!(request = %r.name_any(), error = %e, "writing the failed kill; trying again");
                        Some(RETRY)
                    }
                }
            }
        };
        match again {
            Some(after) => shared.queue.retry_after(key, after, &shared.cancel),
            None => shared.queue.add(key),
        }
    }
}

/// Completes the request: phase `Completed`, `completionTime` now, `message` (cleared when
/// empty).
async fn complete(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
    message: &str,
    states: &[State],
) -> Result<(), PassError> {
    let message = (!message.is_empty()).then_some(message);
    let uid = r.uid().unwrap_or_default();
    // before the write: its watch event may come before its answer, and forgets it then
    lock(&shared.completed).insert(uid.clone());
    if let Err(e) = patch(shared, r, StatusPatch::completed(message)).await {
        lock(&shared.completed).remove(&uid);
        return Err(e.into());
    }
    lock(&shared.killed).remove(&uid);
    let failed = message.is_some() || states.iter().any(|s| s.phase == Phase::Failed);
    let took = r
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| elapsed_since(t.0));
    shared.metrics.completed(!failed, took);
    tracing::info!(request = %r.name_any(), message = message.unwrap_or(""), failed, "request completed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_the_runtime_failed_for_good_waits_as_a_failed_write_and_one_it_was_away_for_briefly()
    {
        let not_found = CriError::NotFound {
            call: "ContainerStatus",
            message: "container gone".into(),
        };
        let away = CriError::Unreachable {
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            message: "connection refused".into(),
        };
        // before issue 35 only the text was kept, and a final NotFound was retried at 250 ms like
        // a runtime that was away
        assert_eq!(PassError::from(not_found).retry(), RETRY);
        assert_eq!(PassError::from(away).retry(), RUNTIME_RETRY);
        assert_eq!(
            PassError::NotConnected(RuntimeLookupError::NotConnected).retry(),
            RUNTIME_RETRY
        );
        let unsupported = CriError::Unsupported {
            endpoint: "unix:///x".into(),
            call: "ContainerStatus",
            message: "unknown method".into(),
        };
        assert_eq!(PassError::from(unsupported).retry(), RETRY);
    }

    #[test]
    fn a_runtime_lookup_that_ends_a_request_says_what_kruise_daemon_says() {
        // the request's message is "failed to find runtime service: " and these words
        assert_eq!(
            RuntimeLookupError::MixedTypes("containerd, cri-o".into()).to_string(),
            "has different runtime types containerd, cri-o in Pod"
        );
        assert_eq!(
            RuntimeLookupError::NotFound("docker://0a1b".into()).to_string(),
            "not found runtime service for docker://0a1b in daemon"
        );
    }
}
