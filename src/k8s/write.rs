//! Writes to the API server, each carrying only what this daemon owns:
//!
//! - one pod annotation, by strategic-merge patch on `pods/status` (the subresource kruise's RBAC
//!   grants; it accepts metadata changes);
//! - status fields of our custom resources, by JSON merge patch on `/status`;
//! - core `v1` Events, correlated like client-go's recorder and sent off the caller's path.
//!
//! [`is_retryable`] is the one place that decides which API errors are worth retrying.

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use super::client::{FIELD_MANAGER, send_unread};
use super::events::{Correlator, Write};
use super::pods::Pods;

/// Whether an API error may go away by itself: conflicts (retry on fresh data), throttling,
/// server errors, timeouts (a call past its limit, [`is_timeout`]: the connection it went out
/// on may be dead, and the retry goes out on a live one) and connection failures. Everything
/// else (forbidden, not found, invalid) needs someone to change something first.
pub fn is_retryable(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        other => is_timeout(other),
    }
}

/// Whether the call ran past its time limit (`k8s::client::limit`): the API server did not
/// answer in time, or the connection it went out on went silent.
pub fn is_timeout(err: &kube::Error) -> bool {
    super::client::limit::is_call_timeout(err)
}

/// Whether the error is a `404 Not Found`.
pub fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

/// Sets (or with `None` removes) one annotation of a pod, by a strategic-merge patch on
/// `pods/status` that carries nothing else: every other annotation and label, whoever wrote it,
/// is left as it is, also when another writer changes the pod at the same time.
pub async fn patch_pod_annotation(
    pods: &Pods,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), kube::Error> {
    patch_pod_annotations(pods, name, &[(key, value)]).await
}

/// Sets (or with `None` removes) annotations of a pod in one patch, as
/// [`patch_pod_annotation`] does one: container meta writes `runtime-containers-meta` and the
/// stops it made together.
pub async fn patch_pod_annotations(
    pods: &Pods,
    name: &str,
    annotations: &[(&str, Option<&str>)],
) -> Result<(), kube::Error> {
    let values: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_string(), serde_json::json!(v)))
        .collect();
    let patch = serde_json::json!({ "metadata": { "annotations": values } });
    pods.patch_status(name, &params(), &Patch::Strategic(&patch))
        .await
}

/// Merges `status` (only the fields we own) into the object's status by JSON merge patch on
/// `/status`. Fields absent from `status` keep their values; `null` removes one. Returns the
/// object as written: for a caller that reads it (the NodeImage's status writer).
pub async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    status: &serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &params(), &Patch::Merge(&patch))
        .await
}

/// As [`patch_status`], for a caller that does not read the object written: the answer is not
/// read at all ([`send_unread`](super::client::send_unread)).
pub async fn patch_status_unread<K: Resource + Clone>(
    api: &Api<K>,
    name: &str,
    status: &serde_json::Value,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    let request = kube::core::Request::new(api.resource_url()).patch_subresource(
        "status",
        name,
        &params(),
        &Patch::Merge(&patch),
    );
    send_unread(&api.clone().into_client(), request).await
}

pub use super::events::EventSpec;

/// Records Events without blocking the caller: events go through a bounded queue to a task that
/// runs them through client-go's correlator ([`super::events::Correlator`]: aggregation,
/// deduplication into a `count`, spam filter) and writes core `v1` Events. When the queue is
/// full, events are dropped and counted, never waited for.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::Sender<EventSpec>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Events waiting to be published before new ones are dropped.
const EVENT_QUEUE: usize = 256;
/// How often an event is tried before it is given up (client-go's `maxTriesPerEvent`).
const EVENT_TRIES: u32 = 12;
/// The pause between two tries of an event (client-go's `sleepDuration`); the first is a random
/// part of it, so that a node's daemons do not all come back at once when the API server does.
const EVENT_RETRY_PAUSE: Duration = Duration::from_secs(10);

/// Whether an event whose write failed with `err` is tried again: as client-go's recorder,
/// only when the API server did not answer (a connection failure, a call past its limit); an
/// answer, even an error, is final.
fn event_write_is_retried(err: &kube::Error) -> bool {
    !matches!(err, kube::Error::Api(_)) && is_retryable(err)
}

/// The pause before try `tries + 1` of an event; `random` in `[0, 1)`.
fn event_retry_pause(tries: u32, random: f64) -> Duration {
    if tries == 1 {
        EVENT_RETRY_PAUSE.mul_f64(random)
    } else {
        EVENT_RETRY_PAUSE
    }
}

impl EventSink {
    /// Starts the publishing task for `component` (kruise's names:
    /// `kruise-daemon-containermeta`, `kruise-daemon-imagepuller`, ...) on `node`; it ends when
    /// every sink is dropped or `cancel` fires.
    pub fn spawn(
        client: kube::Client,
        component: &str,
        node: &str,
        cancel: tokio_util::sync::CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<EventSpec>(EVENT_QUEUE);
        let mut correlator = Correlator::new(component, node);
        tracker.spawn(async move {
            loop {
                let spec = tokio::select! {
                    () = cancel.cancelled() => break,
                    s = rx.recv() => match s { Some(s) => s, None => break },
                };
                let wall = Time(k8s_openapi::jiff::Timestamp::now());
                let Some(write) = correlator.correlate(&spec, tokio::time::Instant::now(), wall)
                else {
                    tracing::debug!(reason = %spec.reason, "event dropped by the spam filter");
                    continue;
                };
                let mut tries = 0;
                loop {
                    tries += 1;
                    let Err(e) = write_event(&client, write.clone()).await else {
                        break;
                    };
                    if !event_write_is_retried(&e) || tries >= EVENT_TRIES {
                        tracing::warn!(error = %e, reason = %spec.reason, tries, "could not record event");
                        break;
                    }
                    let pause = event_retry_pause(tries, crate::backoff::random_unit());
                    tracing::debug!(error = %e, reason = %spec.reason, tries, retry_in = ?pause, "event not recorded; trying again");
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        });
        EventSink {
            tx,
            dropped: Default::default(),
        }
    }

    /// Queues an event; drops it when the queue is full.
    pub fn record(&self, spec: EventSpec) {
        if self.tx.try_send(spec).is_err() {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Writes what the correlator decided: a POST, or a strategic-merge PATCH of the count that
/// falls back to a POST when the event is gone (expired or deleted), as client-go does.
async fn write_event(client: &kube::Client, write: Write) -> Result<(), kube::Error> {
    let post = |event: Event| async move {
        let ns = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &ns);
        let body = serde_json::to_vec(&event).map_err(kube::Error::SerdeError)?;
        let request =
            kube::core::Request::new(api.resource_url()).create(&PostParams::default(), body);
        send_unread(client, request).await
    };
    match write {
        Write::Create(event) => post(*event).await,
        Write::Patch {
            namespace,
            name,
            patch,
            event,
        } => {
            let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
            let request = kube::core::Request::new(api.resource_url()).patch(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            );
            match send_unread(client, request).await {
                Err(e) if is_not_found(&e) => post(*event).await,
                other => other,
            }
        }
    }
}

/// An `ObjectReference` to `obj`, for events.
pub fn object_ref<K: Resource<DynamicType = ()>>(
    obj: &K,
) -> k8s_openapi::api::core::v1::ObjectReference {
    let mut r = obj.object_ref(&());
    // events about an object need no field path
    r.field_path = None;
    if r.namespace.is_none() {
        r.namespace = obj.namespace();
    }
    r
}

/// An `ObjectReference` to the pod `namespace/name` with `uid`, for events about a pod known by
/// its identity only (a recreate request's pod, a probe's).
pub fn pod_ref(
    namespace: &str,
    name: &str,
    uid: &str,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn conflicts_throttling_and_server_errors_are_retryable() {
        for code in [409, 429, 500, 503, 504] {
            assert!(is_retryable(&api_error(code)), "{code}");
        }
        for code in [400, 401, 403, 404, 415, 422] {
            assert!(!is_retryable(&api_error(code)), "{code}");
        }
        assert!(is_not_found(&api_error(404)));
    }

    fn timed_out() -> crate::k8s::client::CallTimedOut {
        crate::k8s::client::CallTimedOut {
            method: http::Method::PATCH,
            path: "/api/v1/namespaces/ns/pods/p/status".into(),
            limit: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_call_past_its_limit_is_a_retryable_timeout_however_kube_wraps_it() {
        // as the request's future fails (kube's `Client::send`) and as its body does
        let sent = kube::Error::Service(Box::new(timed_out()));
        let body = kube::Error::ReadEvents(std::io::Error::other(kube::Error::Service(Box::new(
            timed_out(),
        ))));
        for e in [sent, body] {
            assert!(is_timeout(&e), "{e}");
            assert!(is_retryable(&e), "{e}");
        }
        assert!(
            !is_timeout(&api_error(504)),
            "a server's own timeout is an answer"
        );
        assert!(!is_timeout(&kube::Error::Service(
            "connection refused".into()
        )));
    }

    #[test]
    fn an_event_is_tried_again_only_when_the_server_did_not_answer() {
        assert!(event_write_is_retried(&kube::Error::Service(Box::new(
            timed_out()
        ))));
        assert!(event_write_is_retried(&kube::Error::Service(
            "connection refused".into()
        )));
        for code in [409, 422, 429, 500] {
            assert!(!event_write_is_retried(&api_error(code)), "{code}");
        }
    }

    #[test]
    fn events_are_retried_ten_seconds_apart_after_a_random_first_pause() {
        assert_eq!(event_retry_pause(1, 0.25), Duration::from_millis(2500));
        assert_eq!(event_retry_pause(1, 0.0), Duration::ZERO);
        for tries in 2..EVENT_TRIES {
            assert_eq!(event_retry_pause(tries, 0.25), EVENT_RETRY_PAUSE);
        }
    }
}
