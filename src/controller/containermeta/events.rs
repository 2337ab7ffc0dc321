//! The runtime side of the triggers: its container events (CRI `GetContainerEvents`) where it
//! offers them.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

use super::controller::ContainerMeta;
use super::decide;
use super::pods::enqueue_annotated;
use crate::cri::{ContainerEventKind, CriError, RemoteRuntime, RuntimeService};

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
pub async fn runtime_events(c: Arc<ContainerMeta>, relist_every: Duration) {
    let Some(runtime) = c.runtimes.wait_primary(&c.cancel).await else {
        return;
    };
    let mut backoff = crate::backoff::Backoff::new(EVENTS_BACKOFF_MIN, EVENTS_BACKOFF_MAX);
    // whether a stream was ever up (the first needs no catch-up: start-up looks at every pod),
    // whether "no events" was said (said once, then quietly retried), and how many streams in
    // a row ended at once
    let mut ever_up = false;
    let mut said_no_events = false;
    let mut ended_at_once = 0;
    loop {
        let Some(end) = follow_events(&c, &runtime, ever_up).await else {
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
            () = c.cancel.cancelled() => return,
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
    c: &ContainerMeta,
    runtime: &RemoteRuntime,
    catch_up: bool,
) -> Option<Followed> {
    let mut stream = runtime.container_events();
    let settle = tokio::time::sleep(EVENTS_SETTLE);
    tokio::pin!(settle);
    let mut up = false;
    loop {
        let item = tokio::select! {
            () = c.cancel.cancelled() => return None,
            () = &mut settle, if !up => {
                up = true;
                established(c, catch_up);
                continue;
            }
            i = stream.next() => i,
        };
        let end = match item {
            Some(Ok(e)) => {
                if !up {
                    up = true;
                    established(c, catch_up);
                }
                if let Some(sandbox) = &e.pod_sandbox_id {
                    let pod =
                        enqueue_sandbox(c, runtime, sandbox, e.sandbox_status.as_deref()).await;
                    if let Some(pod) = pod
                        && e.kind == ContainerEventKind::Started
                        && c.with_env
                    {
                        c.memory.container_started(&pod, &e);
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

fn established(c: &ContainerMeta, catch_up: bool) {
    tracing::info!("following the runtime's container events");
    if catch_up {
        enqueue_annotated(c);
    }
}

/// Queues the kruise-managed pod that owns `sandbox` (and returns it): the UID from the event
/// when the runtime sends the sandbox's status with it, else from an earlier event, else
/// `ListPodSandbox`.
async fn enqueue_sandbox(
    c: &ContainerMeta,
    runtime: &RemoteRuntime,
    sandbox: &str,
    status: Option<&crate::cri::PodSandboxStatus>,
) -> Option<Arc<Pod>> {
    let known = status
        .map(|s| s.sandbox.metadata.uid.clone())
        .filter(|uid| !uid.is_empty())
        .or_else(|| c.memory.pod_of_sandbox(sandbox));
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
    c.memory.remember_sandbox(sandbox, &uid);
    let pod = c
        .pods
        .state()
        .into_iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        .filter(|p| decide::is_managed(p))?;
    c.queue.add(ObjectRef::from_obj(pod.as_ref()));
    Some(pod)
}
