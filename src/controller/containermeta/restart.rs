//! Stopping a container whose env from metadata went stale, once the pass's plan says so: the
//! stop itself, kubelet-style (`controller/kill.rs`), on a task of its own, recorded with its
//! reason and the env that changed (`controller/provenance.rs`); and what the plan asks of the
//! runtime about a container's image.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::controller::ContainerMeta;
use super::decide::{self, PreviousStop, RestartReason};
use super::env;
use crate::controller::kill;
use crate::controller::provenance::{PodId, Restart};
use crate::cri::{Container, ImageService, RemoteRuntime, RuntimeService};
use crate::hash::env::{MetaRef, env_meta_refs};
use crate::k8s::write;

/// A stop the pass's plan decided (`reconcile.rs`).
pub struct Stop {
    /// The container to stop.
    pub container: Container,
    /// Why.
    pub reason: RestartReason,
    /// The env-from-metadata hash the pod's metadata gives it now.
    pub expected: u64,
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

/// Stops the container of `stop` on a task of its own (a preStop hook may take its whole
/// grace period): remembered as stopped first, so no later pass stops it again; the pod is
/// looked at again when the stop is made.
pub fn spawn_kill(
    c: &ContainerMeta,
    runtime: &RemoteRuntime,
    runtime_name: &str,
    pod: &Pod,
    stop: Stop,
) {
    let Stop {
        container,
        reason,
        expected,
    } = stop;
    let pod_uid = pod.uid().unwrap_or_default();
    let name = container.metadata.name.clone();
    let previous = PreviousStop {
        id: container.id.clone(),
        expected,
        corrective: reason == RestartReason::StaleRecreation,
    };
    c.memory.stopping(&pod_uid, &name, previous, Instant::now());
    let runtime = runtime.clone();
    let events = c.events.clone();
    let metrics = c.metrics.clone();
    let (book, queue, key) = (
        c.book.clone(),
        c.queue.clone(),
        kube::runtime::reflector::ObjectRef::from_obj(pod),
    );
    let pod_id = PodId::of(pod);
    let kubelet_id = format!("{runtime_name}://{}", container.id);
    let wanted = env_from_metadata(pod, &name);
    let memory = c.memory.clone();
    let status_ips = crate::k8s::pod_ips(pod);
    let cancel = c.cancel.clone();
    let tracker = c.tracker.clone();
    let c = container;
    let regarding = kill::container_ref(&write::object_ref(pod), &name);
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
    tracker.spawn(
        async move {
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
            let announcement = kill::Announcement {
                regarding,
                container: name.clone(),
                note: format!(
                    "Stopping container {name} (containerID {}): {why}{changed_note}",
                    c.id
                ),
                warning,
                action: "Restart",
            };
            let spec = kill::KillSpec::from_kubelet_annotations(&c);
            let killed =
                kill::kill_announced(&runtime, &c, &spec, &status_ips, &cancel, &events, announcement)
                    .await;
            match killed {
                Ok(_) => {
                    memory.stopped(&c.id, &pod_uid, &name, Instant::now());
                    metrics.restarted(reason.as_str());
                    // recorded on the pod by the next pass's patch, which comes at once
                    book.record(
                        pod_id,
                        Restart::now(&name, kubelet_id, reason.as_str(), &changed),
                    );
                    queue.add(key);
                }
                Err(e) => {
                    // forget it, so the next reconcile tries again
                    memory.stop_failed(&c.id);
                    metrics.restart_failed();
                    tracing::warn!(container = %name, error = %e, "could not stop container");
                }
            }
        }
        .instrument(tracing::info_span!("kill")),
    );
}
