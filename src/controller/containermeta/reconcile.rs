//! One pass over a pod, in three steps:
//!
//! 1. [`observe`]: the pod as the store has it, then `observe.rs`'s step (the one `kruised
//!    explain` takes too): its containers in the runtime, the env of those whose hash is not
//!    known yet, and what the memory holds of them;
//! 2. [`plan`]: pure, the decisions of `decide.rs` on what was observed: the new annotation and
//!    the restart plan, with its stops;
//! 3. [`apply`]: the stops (each on a task of its own, `restart.rs`), what the memory is to
//!    keep, the next look at the pod, and the annotation's patch.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::controller::{ContainerMeta, Key};
use super::decide::{self, Observation, Plan, RestartStep, Verdict};
use super::env;
use super::observe::{Observed, observe_pod};
use super::restart::{self, Stop};
use crate::controller::containers::newest_by_name;
use crate::controller::provenance::PodId;
use crate::controller::queue::{Pass, Retry};
use crate::cri::{Container, CriError, RuntimeLookupError};
use crate::hash::env::expected_env_hash;
use crate::k8s::keys;
use crate::k8s::pods::Pods;
use crate::k8s::write;

/// Pause before retrying a pod whose pass failed, doubled with each failure in a row
/// ([`crate::controller::queue::RETRY_DELAY_LIMIT`]).
pub const RETRY_DELAY: Duration = Duration::from_secs(3);
/// Pause before retrying a pod whose pass failed because the runtime did not answer (a
/// restarting runtime, one not connected yet): 250 ms, doubling up to [`RETRY_DELAY`], so the
/// work resumes within seconds of the runtime's return however often it went away, instead of
/// after the minute that failures in a row add up to otherwise.
pub const RUNTIME_RETRY: Retry = Retry::after(Duration::from_millis(250)).at_most(RETRY_DELAY);

/// How a pass that failed with `e` is retried: soon while the runtime is away, else the
/// ordinary doubling pause.
fn retry_of(e: &ReconcileError) -> Retry {
    match e {
        ReconcileError::Runtime(e) if e.is_unreachable() => RUNTIME_RETRY,
        ReconcileError::Lookup(RuntimeLookupError::NotConnected) => RUNTIME_RETRY,
        _ => Retry::after(RETRY_DELAY),
    }
}

/// Why a pass must be retried.
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

/// Works the queue until the daemon stops: one pass per pod at a time.
pub async fn worker(c: Arc<ContainerMeta>) {
    let queue = c.queue.clone();
    let cancel = c.cancel.clone();
    queue
        .run_worker("containermeta", cancel, RETRY_DELAY, |key| {
            let c = c.clone();
            async move {
                let started = Instant::now();
                let result = reconcile(&c, &key)
                    .instrument(tracing::info_span!("reconcile", pod = %key))
                    .await;
                c.metrics.observe_reconcile(started.elapsed());
                match result {
                    Ok(()) => Pass::Done,
                    Err(e) => {
                        let retry = retry_of(&e);
                        let retry_in = c.queue.next_retry(&key, retry);
                        tracing::warn!(pod = %key, error = %e, ?retry_in, "reconcile failed; retrying");
                        Pass::Retry(retry)
                    }
                }
            }
        })
        .await;
}

async fn reconcile(c: &ContainerMeta, key: &Key) -> Result<(), ReconcileError> {
    let Some(seen) = observe(c, key).await? else {
        return Ok(());
    };
    let planned = plan(&seen);
    apply(c, key, &seen, planned).await?;
    match seen.env_error {
        Some((container, error)) => Err(ReconcileError::Env { container, error }),
        None => {
            if seen.env_deferred > 0 {
                // the envs this pass left (`env::ENV_READS_PER_PASS`): the pod runs again after
                // the others waiting, not after a backoff
                tracing::debug!(
                    left = seen.env_deferred,
                    "envs left for the pod's next pass"
                );
                c.queue.add(key.clone());
            }
            Ok(())
        }
    }
}

/// Observes pod `key` (`observe.rs`): `None` when there is nothing to do (gone, being
/// deleted, not kruise-managed, no container yet).
async fn observe(c: &ContainerMeta, key: &Key) -> Result<Option<Observed>, ReconcileError> {
    let Some(pod) = c.pods.store().get(key) else {
        return Ok(None);
    };
    if pod.metadata.deletion_timestamp.is_some() || !decide::is_managed(&pod) {
        return Ok(None);
    }
    // a test build's failpoint: a pass stuck on a call that never returns (until the daemon
    // stops), for the liveness check and systemd's watchdog (`controller::failpoint`)
    #[cfg(feature = "test-util")]
    if crate::controller::failpoint::pass_is_stuck(&pod) {
        tracing::warn!("failpoint: this pass never ends");
        c.cancel.cancelled().await;
        return Ok(None);
    }
    // the pod's runtime and the runtime name of its container IDs; none before a container
    // has an ID
    let ids: Vec<&str> = decide::container_ids(&pod).collect();
    if ids.is_empty() {
        return Ok(None);
    }
    let (runtime, runtime_name) = c.runtimes.for_containers(ids)?;
    let seen = observe_pod(
        pod,
        runtime.clone(),
        runtime_name,
        c.with_env,
        &c.memory,
        c.restart_delay,
    )
    .await?;
    for source in &seen.env_read {
        c.metrics.env_read(*source);
    }
    Ok(Some(seen))
}

/// What a pass decided.
pub struct Planned<'a> {
    /// The annotation's new value, where it changes.
    pub annotation: Option<String>,
    /// The restart plan, its steps paired with the containers they are about.
    pub restarts: Plan,
    /// The running container of each step, in the plan's order.
    pub running: Vec<&'a Container>,
    /// The stops to make now.
    pub stops: Vec<Stop>,
}

/// Decides on what was observed, without any I/O: the annotation and the restart plan
/// (`decide.rs`), the plan's stops with the env hash each stop is made for. The decision the
/// daemon acts on and `kruised explain` prints.
pub fn plan(seen: &Observed) -> Planned<'_> {
    let annotation = (seen.old.as_ref() != Some(&seen.meta) && !seen.meta.containers.is_empty())
        .then(|| seen.meta.to_annotation_value());
    let newest = newest_by_name(&seen.containers);
    let mut planned = Planned {
        annotation,
        restarts: Plan::default(),
        running: Vec::new(),
        stops: Vec::new(),
    };
    let Some(inputs) = &seen.restarts else {
        return planned;
    };
    let mut observed = Vec::new();
    for (i, name) in inputs.names.iter().enumerate() {
        let (Some(spec), Some(meta), Some(running)) = (
            decide::spec_of(&seen.pod, name),
            seen.meta.container(name),
            newest.get(name.as_str()),
        ) else {
            continue;
        };
        let remembered = &inputs.memory.containers[i];
        observed.push(Observation {
            spec,
            meta,
            running,
            image_id_matches: inputs.image_id_matches[i],
            already_stopped: remembered.already_stopped,
            previous_stop: remembered.previous_stop.as_ref(),
            kubelet_expected_since: remembered.kubelet_expected_since,
        });
    }
    planned.restarts = decide::plan_restarts(
        &seen.pod,
        &observed,
        seen.now,
        inputs.memory.stop_allowed_at,
    );
    let (labels, annotations) = decide::metadata_maps(&seen.pod);
    for ((_, step), o) in planned.restarts.steps.iter().zip(&observed) {
        if let RestartStep::Stop(reason) = step {
            planned.stops.push(Stop {
                container: o.running.clone(),
                reason: *reason,
                expected: expected_env_hash(o.spec, &labels, &annotations),
            });
        }
    }
    planned.running = observed.iter().map(|o| o.running).collect();
    planned
}

/// Carries out what was planned: the memory learns what the kubelet is to do, the pod is
/// looked at again when the plan changes by time alone, the stops start, and the annotation
/// (with the stops this daemon made that the pod does not show yet) is written.
async fn apply(
    c: &ContainerMeta,
    key: &Key,
    seen: &Observed,
    planned: Planned<'_>,
) -> Result<(), ReconcileError> {
    let now = seen.now;
    let excess = seen
        .restarts
        .as_ref()
        .map_or(Duration::ZERO, |r| r.memory.kubelet_lag_excess);
    for ((name, step), running) in planned.restarts.steps.iter().zip(&planned.running) {
        match step {
            RestartStep::Stop(_) => {}
            RestartStep::StopAt { at, .. } => tracing::debug!(
                container = %name,
                in_ms = (*at - now).as_millis() as u64,
                kubelet_lag_excess_ms = excess.as_millis() as u64,
                "stale env: stopping once the kubelet holds the change"
            ),
            RestartStep::KubeletRecreates { since, overdue_at } => {
                c.memory
                    .expect_kubelet_recreation(&running.id, *since, *overdue_at);
                tracing::debug!(
                    container = %name,
                    reason = "its spec changed too: the kubelet recreates it with the new env",
                    "stale env, not stopping"
                );
            }
            RestartStep::Nothing(Verdict::Blocked(reason)) => {
                tracing::debug!(container = %name, %reason, "stale env, not stopping")
            }
            RestartStep::Nothing(_) => {}
        }
    }
    if let Some(at) = planned.restarts.recheck_at {
        c.queue.add_after(
            key.clone(),
            at.saturating_duration_since(now) + Duration::from_millis(1),
            &c.cancel,
        );
    }
    for stop in planned.stops {
        restart::spawn_kill(c, &seen.runtime, &seen.runtime_name, &seen.pod, stop);
    }
    // the stops this daemon made that the pod does not show yet ride along
    let pod_id = PodId::of(&seen.pod);
    let stops = c.book.update(&pod_id, seen.pod.annotations());
    let meta = planned.annotation;
    if meta.is_none() && stops.is_none() {
        return Ok(());
    }
    let pods = Pods::namespaced(c.client.clone(), &seen.pod.namespace().unwrap_or_default());
    let written: Vec<(&str, Option<&str>)> = [
        (keys::RUNTIME_CONTAINERS_META, meta.as_deref()),
        (keys::LAST_RESTARTS, stops.as_deref()),
    ]
    .into_iter()
    .filter(|(_, v)| v.is_some())
    .collect();
    let result = write::patch_pod_annotations(&pods, &seen.pod.name_any(), &written).await;
    if meta.is_some() {
        c.metrics.patched(result.is_ok());
    }
    result?;
    if let Some(value) = &stops {
        c.book.written(&pod_id, value);
    }
    tracing::debug!(meta = ?meta, stops = ?stops, "annotation updated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_failed_by_an_absent_runtime_is_retried_within_seconds_however_often_it_failed() {
        let away = ReconcileError::Runtime(CriError::Unreachable {
            endpoint: "unix:///run/containerd/containerd.sock".into(),
            message: "connection refused".into(),
        });
        assert_eq!(retry_of(&away).pause(1), Duration::from_millis(250));
        assert_eq!(retry_of(&away).pause(20), RETRY_DELAY);
        let not_yet = ReconcileError::Lookup(RuntimeLookupError::NotConnected);
        assert_eq!(retry_of(&not_yet).pause(20), RETRY_DELAY);
        // any other failure keeps the ordinary doubling, up to the queue's minute
        let other = ReconcileError::Lookup(RuntimeLookupError::NotFound("docker".into()));
        assert_eq!(retry_of(&other).pause(1), RETRY_DELAY);
        assert_eq!(
            retry_of(&other).pause(20),
            crate::controller::queue::RETRY_DELAY_LIMIT
        );
    }
}
