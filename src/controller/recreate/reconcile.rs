//! One pass over a pod's requests: observe (`observe.rs`), decide (`decide.rs`, pure), apply
//! (`apply.rs`), in stages, so that nothing is asked of the runtime before a request is ready
//! for it:
//!
//! 1. the stops recorded for the pod are written on it (`record.rs`);
//! 2. the pod's requests: the one to work on is picked, the others new are set Pending
//!    ([`decide::pick`]); the one picked is set `Recreating`, and waits out its unready grace
//!    ([`decide::admit`]);
//! 3. its runtime and its pod's containers there: a request without a runtime, without its
//!    pod's UID, or whose UID names another pod's containers, is completed with why
//!    ([`decide::foreign_pod`]);
//! 4. the state of each container it names, and the plan ([`decide::plan`]): write the states,
//!    wait, kill one container (on a task of its own), or complete.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::apply::{self, StatusPatch};
use super::controller::{RETRY, RUNTIME_RETRY, RecreateController};
use super::decide::{self, Admission, Key, Plan, RECREATING_POLL};
use super::memory::Memory;
use super::observe;
use super::record;
use crate::controller::containers::{containers_of_pod, newest_by_name};
use crate::controller::queue::{Pass, Retry};
use crate::cri::{CriError, RuntimeLookupError};
use crate::k8s::crd::{ContainerRecreateRequest, ContainerRecreateRequestPhase as Phase};

/// Works the queue until the daemon stops: one pass per pod at a time.
pub async fn worker(shared: Arc<RecreateController>) {
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

/// One pass over the requests of a pod. `Some(d)`: look again after `d`.
async fn sync_pod(
    shared: &Arc<RecreateController>,
    key: &Key,
) -> Result<Option<Duration>, PassError> {
    // the stops recorded for the pod are written first; a write that fails holds up no request
    record::write_stops_or_retry(shared, key).await;
    let requests = observe::requests_of(shared, key);
    let (picked, to_pending) = decide::pick(&requests);
    for r in to_pending {
        tracing::info!(request = %r.name_any(), "another request of the pod runs first: Pending");
        apply::patch(shared, &r, StatusPatch::phase(Phase::Pending)).await?;
    }
    let Some(r) = picked else {
        return Ok(None);
    };
    let name = r.name_any();
    match admission(&shared.memory, &r, Timestamp::now(), Instant::now()) {
        Admission::SetRecreating => {
            tracing::info!(request = %name, "recreating");
            apply::patch(shared, &r, StatusPatch::phase(Phase::Recreating)).await?;
            // the write's watch event brings the next pass
            Ok(None)
        }
        Admission::Refuse(message) => {
            apply::complete(shared, &r, &message, &[]).await?;
            Ok(None)
        }
        Admission::AwaitUnready => {
            tracing::info!(request = %name, "waiting for the manager to take the pod out of service (unready grace)");
            Ok(None)
        }
        Admission::InGrace { left, look_again } => {
            tracing::debug!(request = %name, ?left, "in the unready grace period");
            Ok(Some(look_again))
        }
        Admission::Proceed => manage(shared, &r).await,
    }
}

/// What request `r` is ready for ([`decide::admit`]), its unready grace counted on the
/// monotonic clock from the first time it was seen ([`super::memory::Memory::out_of_service`]):
/// `wall` and `now` are the wall and monotonic clocks' time.
fn admission(
    memory: &Memory,
    r: &ContainerRecreateRequest,
    wall: Timestamp,
    now: Instant,
) -> Admission {
    let uid = r.uid().unwrap_or_default();
    decide::admit(r, |since| memory.out_of_service(&uid, since, wall, now))
}

/// A pass over the request picked, once it is ready: its containers observed, then the plan.
async fn manage(
    shared: &Arc<RecreateController>,
    r: &Arc<ContainerRecreateRequest>,
) -> Result<Option<Duration>, PassError> {
    // a kill of this request's is under way on its task: it looks at the pod again when it ends
    if shared.memory.kill_under_way(&r.uid().unwrap_or_default()) {
        return Ok(Some(RECREATING_POLL));
    }
    let (runtime, runtime_name) = match observe::runtime_of(shared, r) {
        Ok(x) => x,
        Err(e @ RuntimeLookupError::NotConnected) => return Err(PassError::NotConnected(e)),
        Err(e) => {
            let message = format!("failed to find runtime service: {e}");
            apply::complete(shared, r, &message, &[]).await?;
            return Ok(None);
        }
    };
    let uid = observe::pod_uid(r);
    if uid.is_empty() {
        // kruise's webhook sets it on every request: one without came past the webhook
        apply::complete(shared, r, decide::NO_POD_UID, &[]).await?;
        return Ok(None);
    }
    let containers = containers_of_pod(&runtime, &uid).await?;
    if let Some(message) = decide::foreign_pod(&containers, r, &uid) {
        tracing::warn!(request = %r.name_any(), "{message}");
        apply::complete(shared, r, &message, &[]).await?;
        return Ok(None);
    }
    let newest = newest_by_name(&containers);
    let observed = observe::containers((&runtime, &runtime_name), r, &newest).await?;
    // container times are the runtime's: compared on its clock
    let now_ns = crate::cri::clock::now_ns();
    let killed = shared.memory.killed(&r.uid().unwrap_or_default());
    match decide::plan(r, &observed, &killed, now_ns) {
        Plan::WriteStates(states) => {
            apply::patch(shared, r, StatusPatch::states(&states[..])).await?;
            Ok(None)
        }
        Plan::Complete(states) => {
            apply::complete(shared, r, "", &states).await?;
            Ok(None)
        }
        Plan::Wait { states, after } => {
            if let Some(states) = states {
                apply::patch(shared, r, StatusPatch::states(&states[..])).await?;
            }
            Ok(Some(after))
        }
        Plan::Kill { container, states } => {
            let runtime = (&runtime, runtime_name.as_str());
            apply::kill(shared, r, runtime, &container, &uid, states, &newest).await?;
            Ok(Some(RECREATING_POLL))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request recreating its pod's container with an unready grace of `grace` seconds,
    /// whose pod the manager took out of service at `unready`.
    fn in_grace(grace: u64, unready: &str) -> ContainerRecreateRequest {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r", "namespace": "tenant", "uid": "r1",
                "annotations": {(crate::k8s::keys::CRR_UNREADY_ACQUIRED): unready}},
            "spec": {"podName": "p", "strategy": {"unreadyGracePeriodSeconds": grace},
                "containers": [{"name": "a"}]},
            "status": {"phase": "Recreating"}
        }))
        .expect("a request")
    }

    fn wall(s: &str) -> Timestamp {
        s.parse().expect("a time")
    }

    fn left(a: Admission) -> Duration {
        match a {
            Admission::InGrace { left, .. } => left,
            other => panic!("not in its grace: {other:?}"),
        }
    }

    /// Issue 43, row 16: the grace was the wall clock's (`now - unready time`), so a clock set
    /// forward an hour ended it at once (the container killed while the pod still took
    /// traffic), and one set back an hour held the kill an hour.
    #[tokio::test(start_paused = true)]
    async fn a_wall_clock_stepped_an_hour_during_a_requests_unready_grace_neither_ends_it_early_nor_holds_it_an_hour()
     {
        let memory = Memory::default();
        let r = in_grace(30, "2026-01-01T00:00:00Z");
        let first = Instant::now();
        // seen first 5 s after the manager took the pod out of service
        let seen = admission(&memory, &r, wall("2026-01-01T00:00:05Z"), first);
        assert_eq!(left(seen), Duration::from_secs(25));
        // 10 s later, the node's clock has been set forward an hour
        tokio::time::advance(Duration::from_secs(10)).await;
        let ahead = admission(&memory, &r, wall("2026-01-01T01:00:15Z"), Instant::now());
        assert_eq!(left(ahead), Duration::from_secs(15), "the grace goes on");
        // then back two hours: the grace ends when its 30 s have passed all the same
        tokio::time::advance(Duration::from_secs(14)).await;
        let behind = admission(&memory, &r, wall("2025-12-31T23:00:29Z"), Instant::now());
        assert_eq!(left(behind), Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            admission(&memory, &r, wall("2025-12-31T23:00:30Z"), Instant::now()),
            Admission::Proceed
        );
        // a new unready time (the manager took the pod out again) is read anew
        let again = in_grace(30, "2025-12-31T23:00:20Z");
        let now = Instant::now();
        let seen = admission(&memory, &again, wall("2025-12-31T23:00:30Z"), now);
        assert_eq!(left(seen), Duration::from_secs(20));
        // and the request's end forgets it
        memory.ended("r1");
        let fresh = admission(&memory, &r, wall("2026-01-01T00:00:29Z"), now);
        assert_eq!(left(fresh), Duration::from_secs(1));
    }

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
