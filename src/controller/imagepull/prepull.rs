//! Pre-pulling the next in-place batch (kruised's own; no kruise component does it).
//!
//! A multi-batch in-place update (a pod whose containers update in priority order) records the
//! images of the later batches in the pod's `apps.kruise.io/inplace-update-state`
//! `nextContainerImages`. This loop pulls those images in the background so each batch finds its
//! image on the node. Anyone who can annotate a pod can write that annotation, so the loop
//! trusts it no further than the kubelet trusts a pod spec (docs/security.md, "The in-place and
//! next-batch pulls"):
//!
//! - which images: [`plan`] (pods controlled by a kruise workload only, a bounded annotation, at
//!   most [`plan::MAX_IMAGES_PER_POD`] per pod and [`plan::MAX_IMAGES_PER_NODE`] on the node);
//! - low priority: only while no NodeImage task waits or pulls, no in-place pull
//!   ([`super::inplace`]) runs and no pod on the node waits for its own image
//!   ([`super::turn`]), one image at a time, and through the same pull slots
//!   (`--max-workers-for-pull-image`) and the pre-pull cap (`--max-concurrent-prepulls`); a
//!   pull under way is called off when a pod begins to wait or an in-place pull starts, and
//!   made again after (no failure, no backoff), at most [`super::turn::MAX_CALL_OFFS`] times
//!   per image (until it is on the node or no pod asks for it): then it is let finish;
//! - an image already present is not pulled; identical pulls in flight are shared with NodeImage
//!   tasks;
//! - the disk floor of every pull (`--image-fs-min-free`): below it nothing is pre-pulled;
//! - credentials: the pull secrets of the NodeImage entries for the same repository that
//!   kruise-manager copied from the pod's own namespace (`secrets::lends_to`), else the
//!   credential provider plugins (which the kubelet would use for any pod), else anonymous.
//!   Never another namespace's secret, never a secret made by hand in the config namespace;
//! - a failed or refused pull is retried with backoff ([`RETRY_BASE`] doubling up to
//!   [`RETRY_MAX`]) while the pod still asks for it; an image no pod asks for any more is
//!   forgotten.
//!
//! Off with the feature gate `PrePullNextBatch=false` (it also needs `DaemonWatchingPod`).

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::plan::{Limits, Plan, Skip, Want, WantKey};
use super::metrics::{Outcome, Source};
use super::pull::PullSpec;
use super::reference::Reference;
use super::secrets::Credentials;
use super::slots::{Priority, Rank};
use super::task::{PullTools, admit_by_size, disk_refusal, find_image, learn, pull_sandbox};
use super::turn::{CallOffs, MAX_CALL_OFFS};
use crate::cri::ImageService;
use crate::k8s::crd::{NodeImage, ReferenceObject, SandboxConfig};
use crate::k8s::watch::Watched;

/// First pause before a failed next-batch pull is tried again.
pub const RETRY_BASE: Duration = Duration::from_secs(10);
/// Longest pause between tries.
pub const RETRY_MAX: Duration = Duration::from_secs(600);
/// Time limit of one next-batch pull.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// What happened to one next-batch image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tried {
    /// Present on the node (pulled or found).
    Done,
    /// Called off (`turn.rs`) `call_offs` times, no failure yet: to pull again now.
    CalledOff { call_offs: CallOffs },
    /// Failed `attempts` times, called off `call_offs` times; try again at `retry_at`.
    Failed {
        attempts: u32,
        retry_at: Instant,
        call_offs: CallOffs,
    },
}

impl Tried {
    /// How often the image's pull was called off: none once it is done.
    fn call_offs(&self) -> CallOffs {
        match self {
            Tried::Done => CallOffs::default(),
            Tried::CalledOff { call_offs } | Tried::Failed { call_offs, .. } => *call_offs,
        }
    }
}

/// Runs the pre-puller until `cancel`. `busy` is the number of unfinished NodeImage tasks,
/// `in_place` the number of in-place pulls under way ([`super::inplace`]): the next batch waits
/// for both to be 0.
pub async fn run<I, C>(
    tools: Arc<PullTools<I, C>>,
    pods: Watched<Pod>,
    node_images: Watched<NodeImage>,
    mut busy: watch::Receiver<usize>,
    mut in_place: watch::Receiver<usize>,
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
    let mut tried: BTreeMap<WantKey, Tried> = BTreeMap::new();
    let mut reported: BTreeSet<Skip> = BTreeSet::new();
    loop {
        let pod_list = pods.state();
        let plan = plan::plan(pod_list.iter().map(|p| p.as_ref()), Limits::default());
        report(&tools, &plan, &mut reported);
        let wanted = plan.wanted;
        tried.retain(|k, _| wanted.contains_key(k));
        let now = Instant::now();
        let next = wanted.iter().find(|(k, _)| match tried.get(*k) {
            None | Some(Tried::CalledOff { .. }) => true,
            Some(Tried::Done) => false,
            Some(Tried::Failed { retry_at, .. }) => *retry_at <= now,
        });
        if let Some((key, want)) = next {
            // NodeImage work, in-place pulls and the node's pods waiting for their image first
            let idle = async {
                loop {
                    until_zero(&mut busy).await;
                    until_zero(&mut in_place).await;
                    tools.turn.clear().await;
                    if *busy.borrow() == 0 && tools.turn.is_clear() {
                        return;
                    }
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = idle => {}
            }
            let (refs, sandbox) = node_image_entries(&node_images.state(), &want.reference);
            let mut call_offs = tried.get(key).map(Tried::call_offs).unwrap_or_default();
            let result = tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                r = pull_one(&tools, want, &refs, sandbox.as_ref()) => r,
                // called off (`turn.rs`): no failure, tried again once nothing is waited for;
                // past the bound, let finish
                () = tools.turn.called_off_within(&mut call_offs) => {
                    tracing::info!(image = %want.image, called_off = call_offs.count(), of = MAX_CALL_OFFS, "next-batch pre-pull called off: a pod on the node waits for its own image or an in-place pull runs");
                    let entry = match tried.get(key) {
                        Some(Tried::Failed { attempts, retry_at, .. }) => Tried::Failed {
                            attempts: *attempts,
                            retry_at: *retry_at,
                            call_offs,
                        },
                        _ => Tried::CalledOff { call_offs },
                    };
                    tried.insert(key.clone(), entry);
                    continue;
                }
            };
            let entry = match result {
                Ok(()) => Tried::Done,
                Err(e) => {
                    let attempts = match tried.get(key) {
                        Some(Tried::Failed { attempts, .. }) => attempts + 1,
                        _ => 1,
                    };
                    let pause = crate::backoff::exponential(attempts - 1, RETRY_BASE, RETRY_MAX);
                    tracing::warn!(image = %want.image, namespace = %want.namespace, error = %e, retry_in = ?pause, "next-batch pre-pull failed");
                    Tried::Failed {
                        attempts,
                        retry_at: Instant::now() + pause,
                        call_offs,
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
                Tried::Done | Tried::CalledOff { .. } => None,
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

/// Returns once `count` is 0, or its sender is gone (nothing left to wait for).
async fn until_zero(count: &mut watch::Receiver<usize>) {
    while *count.borrow_and_update() > 0 {
        if count.changed().await.is_err() {
            return;
        }
    }
}

/// Sets the metrics of `plan` and logs what it leaves out that the last one did not: an
/// unusable annotation as a warning, the rest at debug (a pod's changes would repeat them).
fn report<I, C>(tools: &PullTools<I, C>, plan: &Plan, reported: &mut BTreeSet<Skip>) {
    tools
        .metrics
        .next_batch(plan.images(), plan.skipped_counts());
    let now: BTreeSet<Skip> = plan.skipped.iter().cloned().collect();
    for skip in now.difference(reported) {
        match skip {
            Skip::Invalid { pod, reason } => {
                tracing::warn!(%pod, %reason, "next-batch images of the pod skipped: unusable in-place update state")
            }
            Skip::NotKruiseOwned { pod } => {
                tracing::debug!(%pod, "next batch not pre-pulled: the pod's controller is no kruise workload")
            }
            Skip::OverPodBound { pod, image } => {
                tracing::debug!(%pod, %image, limit = plan::MAX_IMAGES_PER_POD, "next-batch image skipped: past the pod's share")
            }
            Skip::OverNodeBound { pod, image } => {
                tracing::debug!(%pod, %image, limit = plan::MAX_IMAGES_PER_NODE, "next-batch image skipped: past the node's bound")
            }
        }
    }
    *reported = now;
}

/// The pull secrets of every NodeImage entry for the repository of `reference` (candidates:
/// only those copied from the pod's namespace are used), and the sandbox config of the first.
pub fn node_image_entries(
    node_images: &[Arc<NodeImage>],
    reference: &Reference,
) -> (Vec<ReferenceObject>, Option<SandboxConfig>) {
    let name = reference.name();
    let mut refs: Vec<ReferenceObject> = Vec::new();
    let mut sandbox = None;
    let entries = node_images
        .iter()
        .flat_map(|ni| ni.spec.images.iter())
        .filter(|(k, _)| Reference::parse(k).is_ok_and(|r| r.name() == name));
    for (_, spec) in entries {
        for r in &spec.pull_secrets {
            if !refs.contains(r) {
                refs.push(r.clone());
            }
        }
        if sandbox.is_none() {
            sandbox = spec.sandbox_config.clone();
        }
    }
    (refs, sandbox)
}

/// Why an image was not pre-pulled (logged; retried with backoff).
#[derive(Debug, thiserror::Error)]
pub(super) enum PrePullError {
    /// The runtime did not list its images.
    #[error("listing the runtime's images: {0}")]
    List(#[from] crate::cri::CriError),
    /// The image filesystem is below the floor.
    #[error("{0}")]
    NoRoom(String),
    /// The pull failed.
    #[error(transparent)]
    Pull(#[from] super::pull::PullError),
}

/// How an image came to be on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ensured {
    /// It was there already.
    Present,
    /// It was pulled (or an identical pull in flight was joined).
    Pulled,
}

/// Pulls one next-batch image unless present, with the credentials `refs` lend to its
/// namespace.
async fn pull_one<I, C>(
    tools: &PullTools<I, C>,
    want: &Want,
    refs: &[ReferenceObject],
    sandbox: Option<&SandboxConfig>,
) -> Result<(), PrePullError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let target = Target {
        image: &want.image,
        reference: &want.reference,
        namespace: &want.namespace,
        source: Source::NextBatch,
    };
    ensure(tools, target, refs, sandbox).await.map(|_| ())
}

/// One image to have on the node for the pods of one namespace, and who asks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Target<'a> {
    /// As sent to the runtime.
    pub image: &'a str,
    /// Parsed, `latest` added.
    pub reference: &'a Reference,
    /// Whose credentials may be used.
    pub namespace: &'a str,
    /// Who asks.
    pub source: Source,
}

/// Pulls `target` unless present, with the credentials `refs` lend to its namespace, through a
/// pull slot and above the disk floor; identical pulls in flight are joined.
pub(super) async fn ensure<I, C>(
    tools: &PullTools<I, C>,
    target: Target<'_>,
    refs: &[ReferenceObject],
    sandbox: Option<&SandboxConfig>,
) -> Result<Ensured, PrePullError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let Target {
        image,
        reference,
        namespace,
        source,
    } = target;
    // an in-place update's image is on a pod's critical path: first to a freed slot; a
    // next-batch image is a pre-pull, and waits for its turn (`turn.rs`)
    let (_permit, _turn) = match source {
        Source::InPlace => match &tools.slots {
            Some(s) => (Some(s.acquire(Priority::Urgent).await), None),
            None => (None, None),
        },
        _ => {
            let rank = Rank::default();
            let turn = tools.turn.pre_pull(tools.slots.as_ref(), rank).await;
            (None, Some(turn))
        }
    };
    let runtime = tools.puller.runtime();
    let images = runtime.list_images().await?;
    if find_image(&images, reference).is_some() {
        tools.metrics.pulled(source, Outcome::Present);
        tracing::debug!(image, ?source, "image already present");
        return Ok(Ensured::Present);
    }
    if let Some(refusal) = disk_refusal(tools, source).await {
        return Err(PrePullError::NoRoom(refusal));
    }
    let name = reference.name();
    let resolved = tools
        .credentials
        .resolve_for_namespace(refs, &name, namespace)
        .await;
    if !resolved.problems.is_empty() {
        tracing::warn!(image, %namespace, ?source, problems = %resolved.problems_text(), "pre-pull credentials could not all be used; pulling with what was found");
    }
    let credentials = resolved.keyring.lookup(&name);
    // the next batch is admitted by size; an in-place update's pull keeps the floor only
    let admitted = admit_by_size(tools, source, reference, &credentials)
        .await
        .map_err(|r| PrePullError::NoRoom(r.message))?;
    let spec = PullSpec {
        image: image.to_string(),
        key: reference.pull_key(),
        credentials,
        secrets: resolved.keyring.secrets(),
        sandbox: Some(pull_sandbox(sandbox)),
        source,
    };
    match source {
        Source::NextBatch => {
            tracing::info!(image, %namespace, credentials = spec.credentials.len(), "pre-pulling an image of a pod's next in-place batch");
        }
        _ => {
            tracing::debug!(image, %namespace, ?source, credentials = spec.credentials.len(), "pulling: not present");
        }
    }
    let image_ref = tools.puller.pull(spec, PULL_TIMEOUT).await?;
    if let Some(a) = admitted {
        learn(tools, a, &image_ref).await;
    }
    Ok(Ensured::Pulled)
}

#[cfg(test)]
mod tests;
