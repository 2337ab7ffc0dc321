//! Stopping a container whose env from metadata went stale: when it is due and safe
//! ([`super::settle`]), and the stop itself, kubelet-style ([`super::super::kill`]), recorded
//! with its reason and the env that changed ([`super::super::provenance`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::decide::{self, Observation, PreviousStop, RestartReason, Step, Verdict};
use super::lag::ContainerChange;
use super::{Key, Shared, env, lock};
use crate::controller::kill;
use crate::controller::provenance::{PodId, Restart};
use crate::cri::{Container, ImageService, RemoteRuntime, RuntimeService};
use crate::hash::env::{MetaRef, env_meta_refs, expected_env_hash};
use crate::k8s::keys::{self, RuntimeContainerMetaSet};
use crate::k8s::write::{self, EventSpec};

/// A stop decided by [`restarts_due`].
pub(super) struct Stop {
    container: Container,
    reason: RestartReason,
    expected: u64,
}

/// The containers to stop now for stale env from metadata. A stop that is due but not yet
/// safe (see [`super::settle`]) or a container the kubelet should recreate by itself is looked at
/// again when that changes.
pub(super) async fn restarts_due(
    shared: &Shared,
    key: &Key,
    runtime: &RemoteRuntime,
    pod: &Pod,
    set: &RuntimeContainerMetaSet,
    newest: &std::collections::BTreeMap<&str, &Container>,
) -> Vec<Stop> {
    let uid = pod.uid().unwrap_or_default();
    let mut previous = Vec::new();
    let mut found = Vec::new();
    for meta in &set.containers {
        let (Some(spec), Some(running)) = (
            decide::spec_of(pod, &meta.name),
            newest.get(meta.name.as_str()),
        ) else {
            continue;
        };
        previous.push(
            lock(&shared.last_stops)
                .get(&(uid.clone(), meta.name.clone()))
                .cloned(),
        );
        found.push((spec, meta, *running));
    }
    let mut observed = Vec::new();
    for ((spec, meta, running), previous_stop) in found.into_iter().zip(&previous) {
        observed.push(Observation {
            spec,
            meta,
            running,
            image_id_matches: image_id_matches(runtime, spec, running).await,
            already_stopped: lock(&shared.stopped).contains_key(&running.id),
            previous_stop: previous_stop.as_ref(),
            kubelet_expected_since: lock(&shared.kubelet_expected).get(&running.id).copied(),
        });
    }
    let now = Instant::now();
    let excess = shared.lag.excess(now);
    let allowed_at = lock(&shared.timelines)
        .get(&uid)
        .map_or(now, |t| t.stop_allowed_at(shared.restart_delay, excess));
    let plan = decide::plan_restarts(pod, &observed, now, allowed_at);
    let (labels, annotations) = decide::metadata_maps(pod);
    let mut out = Vec::new();
    for ((name, step), o) in plan.steps.into_iter().zip(&observed) {
        match step {
            Step::Stop(reason) => out.push(Stop {
                container: o.running.clone(),
                reason,
                expected: expected_env_hash(o.spec, &labels, &annotations),
            }),
            Step::StopAt { at, .. } => tracing::debug!(
                container = %name,
                in_ms = (at - now).as_millis() as u64,
                kubelet_lag_excess_ms = excess.as_millis() as u64,
                "stale env: stopping once the kubelet holds the change"
            ),
            Step::KubeletRecreates { since, .. } => {
                lock(&shared.kubelet_expected)
                    .entry(o.running.id.clone())
                    .or_insert(since);
                tracing::debug!(
                    container = %name,
                    reason = "its spec changed too: the kubelet recreates it with the new env",
                    "stale env, not stopping"
                );
            }
            Step::Nothing(Verdict::Blocked(reason)) => {
                tracing::debug!(container = %name, %reason, "stale env, not stopping")
            }
            Step::Nothing(_) => {}
        }
    }
    if let Some(at) = plan.recheck_at {
        shared.queue.add_after(
            key.clone(),
            at.saturating_duration_since(now) + Duration::from_millis(1),
            &shared.cancel,
        );
    }
    out
}

/// Whether the spec image resolves to the image the container runs, asked of the runtime only
/// where the kubelet's recorded hash cannot tell (`None`: not asked, or no answer).
pub async fn image_id_matches(
    runtime: &RemoteRuntime,
    spec: &k8s_openapi::api::core::v1::Container,
    running: &Container,
) -> Option<bool> {
    if decide::recorded_hash(spec, running) == decide::RecordedHash::Matches {
        return None;
    }
    image_matches(runtime, spec, running).await
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

/// Each env from metadata of `spec` with the value the pod's metadata gives it now.
fn env_from_metadata(pod: &Pod, spec_name: &str) -> Vec<(String, MetaRef, String)> {
    let Some(spec) = decide::spec_of(pod, spec_name) else {
        return Vec::new();
    };
    let (labels, annotations) = decide::metadata_maps(pod);
    env_meta_refs(spec)
        .into_iter()
        .map(|(name, r)| {
            let value = match &r {
                MetaRef::Label(k) => labels.get(k),
                MetaRef::Annotation(k) => annotations.get(k),
            };
            let value = value.cloned().unwrap_or_default();
            (name, r, value)
        })
        .collect()
}

/// The env from metadata of the running container `id` whose value differs from `wanted` (the
/// pod's metadata now), as `NAME (annotation key)`, for the record of the stop. Read from the
/// runtime's verbose status only (containerd and CRI-O include the OCI spec): no exec, so the
/// stop never waits on one; empty where the runtime does not say.
pub(super) async fn changed_env<R: RuntimeService>(
    runtime: &R,
    id: &str,
    wanted: &[(String, MetaRef, String)],
) -> String {
    if wanted.is_empty() {
        return String::new();
    }
    let Ok(status) = runtime.container_status(id, true).await else {
        return String::new();
    };
    let Some(running) = env::env_from_info(&status.info) else {
        return String::new();
    };
    wanted
        .iter()
        .filter(|(name, _, value)| running.get(name) != Some(value))
        .map(|(name, r, _)| {
            let kind = match r {
                MetaRef::Label(_) => "label",
                MetaRef::Annotation(_) => "annotation",
            };
            format!("{name} ({kind} {})", r.key())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn spawn_kill(
    shared: &Shared,
    runtime: &RemoteRuntime,
    runtime_name: &str,
    pod: &Pod,
    stop: Stop,
) {
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
    let (book, queue, key) = (
        shared.book.clone(),
        shared.queue.clone(),
        kube::runtime::reflector::ObjectRef::from_obj(pod),
    );
    let pod_id = PodId::of(pod);
    let kubelet_id = format!("{runtime_name}://{}", c.id);
    let wanted = env_from_metadata(pod, &name);
    let stopped = shared.stopped.clone();
    let lag = shared.lag.clone();
    let pod_uid = pod.uid().unwrap_or_default();
    let status_ips = crate::k8s::pod_ips(pod);
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
            let ips = kill::pod_ips(
                &runtime,
                &c.pod_sandbox_id,
                c.annotations.contains_key(keys::KUBELET_PRESTOP_HANDLER),
                &status_ips,
            )
            .await;
            let changed = changed_env(&runtime, &c.id, &wanted).await;
            if warning {
                tracing::warn!(container = %name, id = %c.id, reason = reason.as_str(), %changed, "stopping container: {why}");
            } else {
                tracing::info!(container = %name, id = %c.id, reason = reason.as_str(), %changed, "stopping container: {why}");
            }
            let changed_note = if changed.is_empty() {
                String::new()
            } else {
                format!(" (changed: {changed})")
            };
            events.record(EventSpec {
                regarding: regarding.clone(),
                warning,
                reason: "Killing".into(),
                note: format!(
                    "Stopping container {name} (containerID {}): {why}{changed_note}",
                    c.id
                ),
                action: "Restart".into(),
            });
            let spec = kill::KillSpec::from_kubelet_annotations(&c);
            match kill::kill_container(&runtime, &c, &spec, &ips, &cancel).await {
                Ok(outcome) => {
                    lag.expect(&c.id, &pod_uid, &name, ContainerChange::Stopped, Instant::now());
                    metrics.restarted(reason.as_str());
                    // recorded on the pod by the next pass's patch, which comes at once
                    book.record(
                        pod_id,
                        Restart::now(&name, kubelet_id, reason.as_str(), &changed),
                    );
                    queue.add(key);
                    if let Some(event) = outcome.failed_hook_event(&regarding, &name) {
                        events.record(event);
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
