//! The in-place pull: a pod's next image on the node before the kubelet needs it (kruised's
//! own; kruise's `PreDownloadImageForInPlaceUpdate` is the manager's, alpha and off by default).
//!
//! In an in-place update the kubelet kills the old container (preStop hook, termination grace)
//! and only then pulls the new image, all of it inside the pod's unready window. The node can
//! know the next image earlier, at two moments ([`plan`]):
//!
//! - the manager's grace annotation (`apps.kruise.io/inplace-update-grace`, written with
//!   `gracePeriodSeconds > 0`, `gracePeriodSeconds` before it changes the spec): its
//!   `containerImages`;
//! - the spec's change itself (a container's image differs from the image its status reports
//!   running): a pull begun then overlaps the preStop hook and the termination grace.
//!
//! What it pulls, and with whose credentials, follows the next-batch pre-pull's rules
//! ([`super::prepull`], docs/security.md "The in-place and next-batch pulls"): pods controlled
//! by a kruise workload only, bounded annotations, at most 4 images per pod and 16 on the node,
//! the disk floor, own-namespace secrets only. An image already present is not pulled;
//! identical pulls in flight are joined ([`super::pull`]: with a NodeImage tag's, the next
//! batch's, or another pod's); an image no pod asks for any more is forgotten, and its pull
//! stopped unless a kruise workload's pod still names it (then the kubelet took over and its own
//! pull joins the runtime's).
//!
//! **Order.** These pulls are on the critical path, unlike the next batch:
//!
//! 1. every wanted image is pulled at once, each in its own future (several pods are never
//!    served one at a time), bounded only by the pull slots (`--max-workers-for-pull-image`);
//! 2. an in-place pull waiting for a slot takes the next one freed, before any NodeImage tag or
//!    next-batch image waiting for one ([`super::slots`]); a pre-pull already running is called
//!    off, and gives its slot back ([`super::turn`]);
//! 3. it waits for nothing else: not for NodeImage work to go idle, nor for the next batch;
//!    the next-batch pre-pull, in turn, starts nothing while an in-place pull runs.
//!
//! A failed pull is tried again with the next batch's backoff while a pod still asks for it (the
//! kubelet pulls for itself meanwhile). No API writes; the state kept is one entry per wanted
//! image (at most 16 per node plus the pods that asked), and the last plan's skipped entries.
//!
//! Off with the feature gate `PrePullInPlaceUpdate=false` (it also needs `DaemonWatchingPod`).

pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::plan::{Plan, Want};
use super::metrics::Source;
use super::prepull::plan::{Skip, WantKey};
use super::prepull::{
    Ensured, PrePullError, RETRY_BASE, RETRY_MAX, Target, ensure, node_image_entries,
};
use super::secrets::Credentials;
use super::task::PullTools;
use crate::cri::ImageService;
use crate::k8s::crd::NodeImage;
use crate::k8s::watch::Watched;

/// Most pods named in one log line.
const LOG_PODS: usize = 8;

/// What happened to one wanted image.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tried {
    /// Present on the node (pulled or found), for these pods (names in the want's namespace).
    Done { pods: BTreeSet<String> },
    /// Failed `attempts` times; try again at `retry_at`.
    Failed { attempts: u32, retry_at: Instant },
}

/// A pull under way: its id (a key wanted again after a stop gets a new one) and its stop.
struct Running {
    id: u64,
    stop: CancellationToken,
}

/// How one attempt ended.
struct Finished {
    key: WantKey,
    id: u64,
    want: Want,
    took: Duration,
    /// `None`: stopped (no pod names the image any more).
    result: Option<Result<Ensured, PrePullError>>,
}

/// Runs the in-place pull until `cancel`. `busy` tells the next-batch pre-pull how many
/// in-place pulls run.
pub async fn run<I, C>(
    tools: Arc<PullTools<I, C>>,
    pods: Watched<Pod>,
    node_images: Watched<NodeImage>,
    busy: watch::Sender<usize>,
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
    let mut running: BTreeMap<WantKey, Running> = BTreeMap::new();
    let mut attempts = FuturesUnordered::new();
    let mut reported: BTreeSet<Skip> = BTreeSet::new();
    let mut next_id: u64 = 0;
    let mut asks = plan::Asks::default();
    loop {
        let pod_list = pods.state();
        let plan = plan::plan_with(
            pod_list.iter().map(|p| p.as_ref()),
            plan::limits(),
            &mut asks,
            !running.is_empty(),
        );
        drop(pod_list);
        report(&tools, &plan, &mut reported);
        running.retain(|key, r| {
            let keep = plan.wanted.contains_key(key) || plan.named.contains(key);
            if !keep {
                tracing::info!(image = %key.0, namespace = %key.1, "in-place pull stopped: no pod names the image any more");
                r.stop.cancel();
            }
            keep
        });
        tried.retain(|key, _| plan.wanted.contains_key(key) || running.contains_key(key));
        let now = Instant::now();
        for (key, want) in &plan.wanted {
            if running.contains_key(key) {
                continue;
            }
            match tried.get_mut(key) {
                Some(Tried::Done { pods }) => {
                    // pods that asked after the image came: it is there for them too (those
                    // no longer asking are dropped: the set stays within the pods asking)
                    pods.retain(|p| want.pods.contains_key(p));
                    let new: Vec<&String> =
                        want.pods.keys().filter(|p| !pods.contains(*p)).collect();
                    if !new.is_empty() {
                        image_present(&tools, want, &new, Ensured::Present, Duration::ZERO);
                        pods.extend(new.into_iter().cloned());
                    }
                    continue;
                }
                Some(Tried::Failed { retry_at, .. }) if *retry_at > now => continue,
                _ => {}
            }
            next_id += 1;
            let stop = CancellationToken::new();
            let whys: BTreeSet<&str> = want.pods.values().map(|w| w.as_str()).collect();
            tracing::info!(
                image = %want.image,
                pods = %want.describe_pods(LOG_PODS),
                why = %whys.into_iter().collect::<Vec<_>>().join(", "),
                "in-place update: pulling the pod's next image ahead of the kubelet"
            );
            let (refs, sandbox) = node_image_entries(&node_images.state(), &want.reference);
            attempts.push(attempt(
                tools.clone(),
                key.clone(),
                next_id,
                want.clone(),
                refs,
                sandbox,
                stop.clone(),
            ));
            running.insert(key.clone(), Running { id: next_id, stop });
        }
        busy.send_replace(running.len());
        let retry_at = tried
            .iter()
            .filter(|(k, _)| !running.contains_key(*k))
            .filter_map(|(_, t)| match t {
                Tried::Failed { retry_at, .. } => Some(*retry_at),
                Tried::Done { .. } => None,
            })
            .min();
        tokio::select! {
            () = cancel.cancelled() => return,
            r = changes.recv() => if let Err(broadcast::error::RecvError::Closed) = r { return },
            Some(done) = attempts.next(), if !attempts.is_empty() => {
                finish(&tools, done, &plan, &mut running, &mut tried);
            }
            () = async {
                match retry_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// One attempt at `want`, until it ends or `stop`.
async fn attempt<I, C>(
    tools: Arc<PullTools<I, C>>,
    key: WantKey,
    id: u64,
    want: Want,
    refs: Vec<crate::k8s::crd::ReferenceObject>,
    sandbox: Option<crate::k8s::crd::SandboxConfig>,
    stop: CancellationToken,
) -> Finished
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let started = Instant::now();
    let target = Target {
        image: &want.image,
        reference: &want.reference,
        namespace: &want.namespace,
        source: Source::InPlace,
    };
    let result = tokio::select! {
        () = stop.cancelled() => None,
        r = ensure(&tools, target, &refs, sandbox.as_ref()) => Some(r),
    };
    Finished {
        key,
        id,
        took: started.elapsed(),
        want,
        result,
    }
}

/// Records how an attempt ended.
fn finish<I, C>(
    tools: &PullTools<I, C>,
    done: Finished,
    plan: &Plan,
    running: &mut BTreeMap<WantKey, Running>,
    tried: &mut BTreeMap<WantKey, Tried>,
) {
    let Finished {
        key,
        id,
        want,
        took,
        result,
    } = done;
    // a stopped attempt, or one that a later attempt for the same image replaced
    if running.get(&key).is_none_or(|r| r.id != id) {
        return;
    }
    running.remove(&key);
    let Some(result) = result else { return };
    // the pods asking now and those that asked when it started (the kubelet may have taken
    // some over since)
    let want = match plan.wanted.get(&key) {
        Some(now) => {
            let mut merged = now.clone();
            for (pod, why) in want.pods {
                merged.pods.entry(pod).or_insert(why);
            }
            merged
        }
        None => want,
    };
    match result {
        Ok(how) => {
            let pods: Vec<&String> = want.pods.keys().collect();
            image_present(tools, &want, &pods, how, took);
            tried.insert(
                key,
                Tried::Done {
                    pods: want.pods.keys().cloned().collect(),
                },
            );
        }
        Err(e) => {
            let attempts = match tried.get(&key) {
                Some(Tried::Failed { attempts, .. }) => attempts + 1,
                _ => 1,
            };
            let pause = crate::backoff::exponential(attempts - 1, RETRY_BASE, RETRY_MAX);
            tracing::warn!(image = %want.image, pods = %want.describe_pods(LOG_PODS), error = %e, retry_in = ?pause, "in-place pull failed; the kubelet will pull for itself");
            tried.insert(
                key,
                Tried::Failed {
                    attempts,
                    retry_at: Instant::now() + pause,
                },
            );
        }
    }
}

/// The image of an in-place update is on the node for `pods` (names in `want.namespace`, each
/// asking for the reason in `want.pods`): pulled by kruised (`how`: [`Ensured::Pulled`], `took`
/// from the start of the attempt, the slot wait included), or found present.
///
/// The one place where a critical-path pull ends for the pods that asked: a per-pod timeline's
/// "image present" step belongs here (`tools` is the puller's context; now is the moment).
fn image_present<I, C>(
    tools: &PullTools<I, C>,
    want: &Want,
    pods: &[&String],
    how: Ensured,
    took: Duration,
) {
    let how = match how {
        Ensured::Pulled => "pulled",
        Ensured::Present => "already present",
    };
    let names: BTreeMap<String, plan::Why> = pods
        .iter()
        .filter_map(|p| want.pods.get(*p).map(|w| ((*p).clone(), *w)))
        .collect();
    let asked = Want {
        pods: names,
        ..want.clone()
    };
    tracing::info!(image = %want.image, pods = %asked.describe_pods(LOG_PODS), how, ?took, "in-place update: the pod's next image is on the node");
    if let Some(told) = &tools.present {
        let at = crate::cri::clock::now_ns();
        for pod in asked.pods.keys() {
            told(&want.namespace, pod, &want.image, at);
        }
    }
}

/// Sets the metrics of `plan` and logs what it leaves out that the last one did not: an
/// unusable annotation as a warning, the rest at debug (a pod's changes would repeat them).
fn report<I, C>(tools: &PullTools<I, C>, plan: &Plan, reported: &mut BTreeSet<Skip>) {
    let counts = super::prepull::plan::skipped_counts(&plan.skipped);
    tools.metrics.in_place(plan.images(), counts);
    let now: BTreeSet<Skip> = plan.skipped.iter().cloned().collect();
    for skip in now.difference(reported) {
        match skip {
            Skip::Invalid { pod, reason } => {
                tracing::warn!(%pod, %reason, "in-place pull: the pod's grace annotation or image skipped")
            }
            Skip::NotKruiseOwned { pod } => {
                tracing::debug!(%pod, "in-place pull: not for this pod, its controller is no kruise workload")
            }
            Skip::OverPodBound { pod, image } => {
                tracing::debug!(%pod, %image, limit = super::prepull::plan::MAX_IMAGES_PER_POD, "in-place pull: image skipped, past the pod's share")
            }
            Skip::OverNodeBound { pod, image } => {
                tracing::debug!(%pod, %image, limit = super::prepull::plan::MAX_IMAGES_PER_NODE, "in-place pull: image skipped, past the node's bound")
            }
        }
    }
    *reported = now;
}

#[cfg(test)]
mod tests;
