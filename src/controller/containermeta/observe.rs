//! Observing a pod: what a pass sees, and what `kruised explain` shows, taken the same way so
//! the two cannot disagree. The pod's containers in its runtime; the annotation as the pod
//! carries it and as it should be, every env hash the runtime gave filled in (read where the
//! annotation holds none for the running container); and, where env from metadata is
//! followed, what the restart plan needs: per running container, whether its image matches
//! the spec's, and what the memory holds of it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;

use super::decide;
use super::env::{self, EnvError, EnvSource};
use super::memory::{Memory, View};
use super::restart;
use super::settle::RestartDelay;
use crate::controller::containers::{containers_of_pod, newest_by_name};
use crate::cri::{Container, CriError, RemoteRuntime};
use crate::hash::env::current_env_hash;
use crate::k8s::keys::{self, RuntimeContainerMetaSet};

/// What was seen of a pod.
pub struct Observed {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its runtime.
    pub runtime: RemoteRuntime,
    /// The runtime's name, as the kubelet's container IDs begin (`containerd`).
    pub runtime_name: String,
    /// Every container of the pod in the runtime.
    pub containers: Vec<Container>,
    /// The annotation as the pod carries it (`None`: none, or malformed).
    pub old: Option<RuntimeContainerMetaSet>,
    /// The annotation as it should be, every env hash the runtime gave filled in.
    pub meta: RuntimeContainerMetaSet,
    /// The container whose env could not be read, and why, if one could not (the last).
    pub env_error: Option<(String, EnvError)>,
    /// Where each env read came from.
    pub env_read: Vec<EnvSource>,
    /// Where env from metadata is followed: what a restart is decided on.
    pub restarts: Option<RestartInputs>,
    /// When it was observed.
    pub now: Instant,
}

/// What the restart plan needs beyond the pod: per container of the new annotation that runs
/// (in its order), whether its image matches the spec's, and what the memory holds of it.
pub struct RestartInputs {
    /// The containers' names, in the annotation's order.
    pub names: Vec<String>,
    /// Per container: whether the spec image resolves to the one it runs, where asked.
    pub image_id_matches: Vec<Option<bool>>,
    /// What the memory holds of them.
    pub memory: View,
}

/// Observes `pod`, whose containers run in `runtime` (named `runtime_name` in their IDs);
/// `with_env`: whether env from metadata is followed; `memory` and `delay`: what is
/// remembered of the pod, and how restarts wait for the kubelet.
pub async fn observe_pod(
    pod: Arc<Pod>,
    runtime: RemoteRuntime,
    runtime_name: String,
    with_env: bool,
    memory: &Memory,
    delay: RestartDelay,
) -> Result<Observed, CriError> {
    let uid = pod.uid().unwrap_or_default();
    let containers = containers_of_pod(&runtime, &uid).await?;
    let old = match keys::parse_runtime_containers_meta(pod.annotations()) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a malformed annotation; it will be rewritten");
            None
        }
    };
    let newest = newest_by_name(&containers);
    let (mut meta, to_read) =
        decide::build_meta(&pod, &runtime_name, &newest, old.as_ref(), with_env);
    let mut env_error = None;
    let mut env_read = Vec::new();
    for r in to_read {
        let Some(spec) = decide::spec_of(&pod, &r.name) else {
            continue;
        };
        match env::read_env(&runtime, &r.id).await {
            Ok((values, source)) => {
                env_read.push(source);
                let hash = current_env_hash(spec, |n| values.get(n).cloned());
                if let Some(e) = meta.containers.iter_mut().find(|e| e.name == r.name) {
                    e.hashes.extracted_env_from_metadata_hash = hash;
                }
            }
            Err(e) => env_error = Some((r.name.clone(), e)),
        }
    }
    // per container of the new annotation that runs, where env from metadata is followed:
    // whether its image matches the spec's, then what the memory holds of it, as of `now`
    let mut names = Vec::new();
    let mut running = Vec::new();
    let mut image_id_matches = Vec::new();
    for entry in meta.containers.iter().filter(|_| with_env) {
        let (Some(spec), Some(current)) = (
            decide::spec_of(&pod, &entry.name),
            newest.get(entry.name.as_str()),
        ) else {
            continue;
        };
        image_id_matches.push(restart::image_id_matches(&runtime, spec, current).await);
        names.push(entry.name.clone());
        running.push((entry.name.as_str(), current.id.as_str()));
    }
    let now = Instant::now();
    let restarts = with_env.then(|| RestartInputs {
        memory: memory.view(&uid, &running, now, delay),
        names,
        image_id_matches,
    });
    Ok(Observed {
        pod,
        runtime,
        runtime_name,
        containers,
        old,
        meta,
        env_error,
        env_read,
        restarts,
        now,
    })
}

/// `pod` observed as a daemon that just started observes it: env from metadata followed,
/// nothing remembered. What `kruised explain` shows.
pub async fn observe_as_started(
    pod: Arc<Pod>,
    runtime: RemoteRuntime,
    runtime_name: String,
) -> Result<Observed, CriError> {
    let memory = Memory::default();
    observe_pod(
        pod,
        runtime,
        runtime_name,
        true,
        &memory,
        RestartDelay::Auto,
    )
    .await
}
