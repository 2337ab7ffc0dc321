//! Pre-pulling the next in-place batch (kruised's own; no kruise component does it).
//!
//! A multi-batch in-place update (a pod whose containers update in priority order) records the
//! images of the later batches in the pod's `apps.kruise.io/inplace-update-state`
//! `nextContainerImages`. This loop pulls those images in the background so each batch finds its
//! image on the node:
//!
//! - low priority: only while no NodeImage task waits or pulls, one image at a time, and through
//!   the same pull slots (`--max-workers-for-pull-image`);
//! - an image already present is not pulled; identical pulls in flight are shared with NodeImage
//!   tasks;
//! - credentials: the pull secrets of a NodeImage entry for the same repository, if any, else
//!   anonymous (the pod's own `imagePullSecrets` live in its namespace, which the daemon cannot
//!   read);
//! - a failed pull is retried with backoff ([`RETRY_BASE`] doubling up to [`RETRY_MAX`]) while the
//!   pod still asks for it; an image no pod asks for any more is forgotten.
//!
//! Off with the feature gate `PrePullNextBatch=false` (it also needs `DaemonWatchingPod`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::metrics::{Outcome, Source};
use super::pull::PullSpec;
use super::reference::Reference;
use super::secrets::Credentials;
use super::task::{Env, find_image, pull_sandbox};
use crate::cri::ImageService;
use crate::k8s::crd::NodeImage;
use crate::k8s::keys;
use crate::k8s::watch::Watched;

/// First pause before a failed next-batch pull is tried again.
pub const RETRY_BASE: Duration = Duration::from_secs(10);
/// Longest pause between tries.
pub const RETRY_MAX: Duration = Duration::from_secs(600);
/// Time limit of one next-batch pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// The images the pods' next batches need, by pull key (normalised, `latest` added): what to
/// send to the runtime and the parsed reference. Unparsable annotations and images are skipped.
pub fn next_batch_images<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
) -> BTreeMap<String, (String, Reference)> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let state = match keys::parse_inplace_update_state(pod.annotations()) {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(pod = %pod.name_any(), error = %e, "unreadable in-place update state");
                continue;
            }
        };
        for image in state.next_container_images.values() {
            match Reference::parse(image) {
                Ok(r) => {
                    let r = r.with_default_tag();
                    out.entry(r.pull_key())
                        .or_insert_with(|| (image.clone(), r));
                }
                Err(e) => {
                    tracing::debug!(pod = %pod.name_any(), error = %e, "skipping next-batch image")
                }
            }
        }
    }
    out
}

/// What happened to one next-batch image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tried {
    /// Present on the node (pulled or found).
    Done,
    /// Failed `attempts` times; try again at `retry_at`.
    Failed { attempts: u32, retry_at: Instant },
}

/// Runs the pre-puller until `cancel`. `busy` is the number of unfinished NodeImage tasks.
pub async fn run<I, C>(
    env: Arc<Env<I, C>>,
    pods: Watched<Pod>,
    node_images: Watched<NodeImage>,
    mut busy: watch::Receiver<usize>,
    cancel: CancellationToken,
) where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let mut changes = pods.subscribe();
    tokio::select! {
        () = cancel.cancelled() => return,
        () = pods.wait_synced() => {}
    }
    let mut tried: BTreeMap<String, Tried> = BTreeMap::new();
    loop {
        let pod_list = pods.state();
        let wanted = next_batch_images(pod_list.iter().map(|p| p.as_ref()));
        tried.retain(|k, _| wanted.contains_key(k));
        let now = Instant::now();
        let next = wanted.iter().find(|(k, _)| match tried.get(*k) {
            None => true,
            Some(Tried::Done) => false,
            Some(Tried::Failed { retry_at, .. }) => *retry_at <= now,
        });
        if let Some((key, (image, reference))) = next {
            // NodeImage work first
            let idle = async {
                while *busy.borrow_and_update() > 0 {
                    if busy.changed().await.is_err() {
                        return;
                    }
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = idle => {}
            }
            let result = tokio::select! {
                () = cancel.cancelled() => return,
                r = pull_one(&env, &node_images, image, reference) => r,
            };
            let entry = match result {
                Ok(()) => Tried::Done,
                Err(e) => {
                    let attempts = match tried.get(key) {
                        Some(Tried::Failed { attempts, .. }) => attempts + 1,
                        _ => 1,
                    };
                    let pause = crate::controller::exponential(attempts - 1, RETRY_BASE, RETRY_MAX);
                    tracing::warn!(image = %image, error = %e, retry_in = ?pause, "next-batch pre-pull failed");
                    Tried::Failed {
                        attempts,
                        retry_at: Instant::now() + pause,
                    }
                }
            };
            tried.insert(key.clone(), entry);
            continue;
        }
        let retry_at = tried
            .values()
            .filter_map(|t| match t {
                Tried::Failed { retry_at, .. } => Some(*retry_at),
                Tried::Done => None,
            })
            .min();
        tokio::select! {
            () = cancel.cancelled() => return,
            r = changes.recv() => if let Err(broadcast::error::RecvError::Closed) = r { return },
            () = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// Why a next-batch image was not pre-pulled (logged; retried with backoff).
#[derive(Debug, thiserror::Error)]
enum PrePullError {
    /// The daemon is stopping.
    #[error("shutting down")]
    ShuttingDown,
    /// The runtime did not list its images.
    #[error("listing the runtime's images: {0}")]
    List(#[from] crate::cri::CriError),
    /// The pull failed.
    #[error(transparent)]
    Pull(#[from] super::pull::PullError),
}

/// Pulls one next-batch image unless present.
async fn pull_one<I, C>(
    env: &Env<I, C>,
    node_images: &Watched<NodeImage>,
    image: &str,
    reference: &Reference,
) -> Result<(), PrePullError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let _permit = match &env.slots {
        Some(s) => Some(
            s.clone()
                .acquire_owned()
                .await
                .map_err(|_| PrePullError::ShuttingDown)?,
        ),
        None => None,
    };
    let runtime = env.puller.runtime();
    let images = runtime.list_images().await?;
    if find_image(&images, reference).is_some() {
        env.metrics.pulled(Source::NextBatch, Outcome::Present);
        tracing::debug!(image, "next-batch image already present");
        return Ok(());
    }
    // the pull secrets of a NodeImage entry for the same repository
    let name = reference.name();
    let (secrets_refs, sandbox) = node_images
        .state()
        .iter()
        .flat_map(|ni| {
            ni.spec
                .images
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        })
        .find(|(k, _)| Reference::parse(k).is_ok_and(|r| r.name() == name))
        .map(|(_, v)| (v.pull_secrets, v.sandbox_config))
        .unwrap_or_default();
    let resolved = env.credentials.resolve_for(&secrets_refs, &name).await;
    let spec = PullSpec {
        image: image.to_string(),
        key: reference.pull_key(),
        credentials: resolved.keyring.lookup(&name),
        secrets: resolved.keyring.secrets(),
        sandbox: Some(pull_sandbox(sandbox.as_ref())),
        source: Source::NextBatch,
    };
    tracing::info!(image, "pre-pulling an image of a pod's next in-place batch");
    env.puller.pull(spec, PULL_TIMEOUT).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn keys_of(images: &BTreeMap<String, (String, Reference)>) -> BTreeSet<String> {
        images.keys().cloned().collect()
    }

    fn pod(name: &str, state: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        if let Some(s) = state {
            p.metadata.annotations =
                Some([(keys::INPLACE_UPDATE_STATE.to_string(), s.to_string())].into());
        }
        p
    }

    #[test]
    fn next_batch_images_are_collected_normalised_and_deduplicated() {
        let pods = [
            pod(
                "a",
                Some(
                    r#"{"revision":"r","nextContainerImages":{"sidecar":"nginx:1.25","main":"127.0.0.1:5000/app"}}"#,
                ),
            ),
            pod(
                "b",
                Some(r#"{"nextContainerImages":{"x":"docker.io/library/nginx:1.25"}}"#),
            ),
            pod("c", None),
            pod("d", Some("not json")),
            pod("e", Some(r#"{"nextContainerImages":{"bad":"Not A Ref"}}"#)),
        ];
        let images = next_batch_images(pods.iter());
        assert_eq!(
            keys_of(&images),
            BTreeSet::from([
                "127.0.0.1:5000/app:latest".to_string(),
                "docker.io/library/nginx:1.25".to_string()
            ])
        );
        // the first spelling is what is sent to the runtime
        assert_eq!(images["docker.io/library/nginx:1.25"].0, "nginx:1.25");
    }
}
