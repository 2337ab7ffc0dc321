//! A warm set for new nodes (`--startup-taint`, off by default): the taint with the key given
//! stays on kruised's own Node until the NodeImage tags listed when kruised starts have
//! finished, or until the deadline, whichever comes first; then kruised removes it, once,
//! logs which of the two it was and records it as an event on the Node.
//!
//! - **The warm set** is the tags of the NodeImage named after the node as the first full list
//!   of the watch shows it (or, when there is none yet, as it first appears): each tag with its
//!   version. A tag is *finished* when its status for the spec's version says `Succeeded`, or
//!   `Failed` (failed for good: its attempts are used up; waiting on it would only wait for the
//!   deadline, so it counts as finished and is named in the event); a tag taken out of the
//!   spec is no longer wanted and counts as finished too. Tags added later are not waited for.
//! - **The deadline** counts from the Node's `creationTimestamp` (from kruised's start when the
//!   Node cannot be read), so a kruised that restarts does not keep the node from pods longer.
//! - **Once**: kruised reads its Node first; with no such taint there, nothing is done (a
//!   restart after the removal does nothing). After its removal kruised never looks at the taint
//!   again: a taint with the key added later is someone else's business. kruised keeps no record
//!   of its own beyond the taint itself, so a kruised that restarts while a re-added taint is
//!   there takes it for its startup taint: use another key for a taint meant to stay.
//! - **The write** is [`crate::k8s::node::remove_taint`]: a JSON patch of only the taints with
//!   the key, guarded by the `resourceVersion` read, so no other taint is ever dropped; it is
//!   retried with a back-off until it succeeds or the daemon stops.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::state::TagKey;
use crate::backoff::Backoff;
use crate::config::StartupTaint;
use crate::controller::context::Context;
use crate::k8s::crd::{ImagePullPhase, NodeImage};
use crate::k8s::node::{NodeView, TaintRemoval, remove_taint};
use crate::k8s::time::later;
use crate::k8s::watch::Watched;
use crate::k8s::write::{EventSink, EventSpec};

/// The reason of the event on the Node.
pub const EVENT_REASON: &str = "StartupTaintRemoved";

/// How many tags an event or log line names before it says how many more there are.
const NAMED: usize = 5;

/// The tags of the warm set, each with the spec version it had when it was taken.
pub type WarmSet = BTreeMap<TagKey, i64>;

/// The tags of `node_image`'s spec with their versions.
pub fn warm_set(node_image: &NodeImage) -> WarmSet {
    node_image
        .spec
        .images
        .iter()
        .flat_map(|(image, spec)| {
            spec.tags
                .iter()
                .map(|t| ((image.clone(), t.tag.clone()), t.version))
        })
        .collect()
}

/// Where the warm set stands against the NodeImage as stored now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Tags pulled.
    pub succeeded: usize,
    /// Tags failed for good, `image:tag`.
    pub failed: Vec<String>,
    /// Tags taken out of the spec since (or the NodeImage gone).
    pub dropped: usize,
    /// Tags not finished yet, `image:tag` and their phase.
    pub pending: Vec<String>,
}

impl Progress {
    /// Every tag of the warm set has finished.
    pub fn done(&self) -> bool {
        self.pending.is_empty()
    }

    /// The number of tags in the warm set.
    pub fn total(&self) -> usize {
        self.succeeded + self.failed.len() + self.dropped + self.pending.len()
    }
}

/// How far `set` is in `node_image` (`None`: the NodeImage is gone): a tag counts by its
/// status for the version its spec has now (a re-pull asked for since is waited for too).
pub fn progress(set: &WarmSet, node_image: Option<&NodeImage>) -> Progress {
    let mut p = Progress::default();
    for ((image, tag), started) in set {
        let name = format!("{image}:{tag}");
        let version = node_image
            .and_then(|n| n.spec.images.get(image))
            .and_then(|i| i.tags.iter().find(|t| &t.tag == tag))
            .map(|t| t.version.max(*started));
        let Some(version) = version else {
            p.dropped += 1;
            continue;
        };
        let phase = node_image
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.tag_status(image, tag, version))
            .map(|s| s.phase.clone());
        match phase {
            Some(ImagePullPhase::Succeeded) => p.succeeded += 1,
            Some(ImagePullPhase::Failed) => p.failed.push(name),
            Some(other) => p.pending.push(format!("{name} {other}")),
            None => p.pending.push(format!("{name} not started")),
        }
    }
    p
}

/// Why the taint goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Why {
    /// Every tag of the warm set finished.
    Pulled(Progress),
    /// The deadline passed first.
    Deadline(Progress),
}

fn names(list: &[String]) -> String {
    let mut s = list
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if list.len() > NAMED {
        s.push_str(&format!(" and {} more", list.len() - NAMED));
    }
    s
}

/// What the event and the log say: which of the two it was, with the counts.
pub fn message(key: &str, deadline: Duration, why: &Why) -> String {
    match why {
        Why::Pulled(p) => {
            let mut m = format!(
                "Removed taint {key}: the {} NodeImage tags listed at start are finished: {} \
                 pulled, {} failed for good",
                p.total(),
                p.succeeded,
                p.failed.len()
            );
            if !p.failed.is_empty() {
                m.push_str(&format!(" ({})", names(&p.failed)));
            }
            if p.dropped > 0 {
                m.push_str(&format!(", {} taken out of the NodeImage", p.dropped));
            }
            m
        }
        Why::Deadline(p) if p.total() == 0 => format!(
            "Removed taint {key}: its deadline ({deadline:?} after the Node's creation) passed \
             before a NodeImage with tags was read (none exists, or its watch had not synced)"
        ),
        Why::Deadline(p) => format!(
            "Removed taint {key}: its deadline ({deadline:?} after the Node's creation) passed \
             with {} of the {} NodeImage tags listed at start not finished ({}); {} pulled, {} \
             failed for good",
            p.pending.len(),
            p.total(),
            names(&p.pending),
            p.succeeded,
            p.failed.len()
        ),
    }
}

/// Starts the warm set's task when `--startup-taint` is given; `events` records on the Node.
pub fn start(ctx: &Context, events: EventSink) {
    let Some(taint) = ctx.config.startup_taint.clone() else {
        return;
    };
    let span = tracing::info_span!("startup_taint", key = %taint.key);
    // not `ctx.spawn`: this task ends by design once the taint is gone
    ctx.tracker.spawn(
        run(
            ctx.client.clone(),
            ctx.config.node_name.clone(),
            taint,
            ctx.node_images.clone(),
            events,
            ctx.cancel.clone(),
        )
        .instrument(span),
    );
}

/// The Node as read at start, or `None` when it cannot be read (said in the log).
async fn read_node(
    client: &kube::Client,
    name: &str,
    cancel: &CancellationToken,
) -> Option<NodeView> {
    let mut retry = Backoff::status_write();
    for _ in 0..5 {
        match crate::k8s::node::get(client, name).await {
            Ok(n) => return Some(n),
            Err(e) => {
                let pause = retry.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot read the Node");
                tokio::select! {
                    () = cancel.cancelled() => return None,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
    None
}

/// How much of `deadline` is left for a Node created at `created`.
fn left(
    created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    deadline: Duration,
) -> Duration {
    let Some(created) = created else {
        return deadline;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
    deadline.saturating_sub(Duration::try_from(age).unwrap_or(Duration::ZERO))
}

/// Waits for the warm set or the deadline, then removes the taint `taint.key` from the Node
/// `node`, once.
pub async fn run(
    client: kube::Client,
    node: String,
    taint: StartupTaint,
    node_images: Watched<NodeImage>,
    events: EventSink,
    cancel: CancellationToken,
) {
    let started = Instant::now();
    let key = taint.key.as_str();
    let first = read_node(&client, &node, &cancel).await;
    if let Some(n) = &first {
        let has = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == key));
        if !has {
            tracing::info!("the Node has no startup taint: nothing to do");
            return;
        }
    }
    let left = first.as_ref().map_or(taint.deadline, |n| {
        left(n.metadata.creation_timestamp.as_ref(), taint.deadline)
    });
    let deadline_at = later(started, left);
    tracing::info!(deadline_in = ?left, "startup taint kept until the warm set is pulled or the deadline passes");

    let why = tokio::select! {
        () = cancel.cancelled() => return,
        why = wait_warm(&node, &node_images, deadline_at) => why,
    };
    let note = message(key, taint.deadline, &why);
    let warning = match &why {
        Why::Pulled(p) => !p.failed.is_empty(),
        Why::Deadline(_) => true,
    };

    let mut retry = Backoff::status_write();
    let removed = loop {
        match remove_taint(&client, &node, key).await {
            Ok(r) => break r,
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::error!(error = %s.message, "kruised may not patch its Node (RBAC: patch on nodes, which deploy/overlays/startup-taint grants, and get, which deploy/rbac.yaml grants): the startup taint stays");
                return;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::error!(error = %s.message, "the Node is gone: no startup taint to remove");
                return;
            }
            Err(e) => {
                let pause = retry.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "cannot remove the startup taint");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    };
    match removed {
        TaintRemoval::Removed { taints, conflicts } => {
            if warning {
                tracing::warn!(taints, conflicts, after = ?started.elapsed(), "{note}");
            } else {
                tracing::info!(taints, conflicts, after = ?started.elapsed(), "{note}");
            }
            let uid = first.as_ref().and_then(|n| n.metadata.uid.clone());
            events.record(EventSpec {
                regarding: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    uid,
                    ..Default::default()
                },
                warning,
                reason: EVENT_REASON.into(),
                note,
                action: "RemoveTaint".into(),
            });
        }
        TaintRemoval::Absent => {
            tracing::info!(
                "the startup taint was already gone when its time came: nothing written"
            );
        }
    }
}

/// Waits until the warm set has finished or `deadline_at`, whichever comes first.
async fn wait_warm(node: &str, node_images: &Watched<NodeImage>, deadline_at: Instant) -> Why {
    let object = || node_images.store().get(&ObjectRef::new(node));
    let mut changes = node_images.subscribe();
    let mut set: Option<WarmSet> = None;
    let deadline = tokio::time::sleep_until(deadline_at);
    tokio::pin!(deadline);
    let mut synced = false;
    loop {
        if !synced {
            tokio::select! {
                () = &mut deadline => return Why::Deadline(Progress::default()),
                () = node_images.wait_synced() => synced = true,
            }
        }
        let current = object();
        if set.is_none() {
            set = current.as_deref().map(warm_set);
            if let Some(s) = &set {
                tracing::info!(tags = s.len(), "warm set taken from the NodeImage");
            }
        }
        if let Some(s) = &set {
            let p = progress(s, current.as_deref());
            if p.done() {
                return Why::Pulled(p);
            }
            tracing::debug!(pending = %names(&p.pending), "warm set not finished");
        }
        tokio::select! {
            () = &mut deadline => {
                let p = set.as_ref().map(|s| progress(s, object().as_deref())).unwrap_or_default();
                return Why::Deadline(p);
            }
            r = changes.recv() => {
                if let Err(broadcast::error::RecvError::Closed) = r {
                    // the watch ended (the daemon stops): only the deadline is left
                    deadline.as_mut().await;
                    let p = set.as_ref().map(|s| progress(s, object().as_deref())).unwrap_or_default();
                    return Why::Deadline(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_image(spec: serde_json::Value, status: serde_json::Value) -> NodeImage {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
            "metadata": {"name": "n1"},
            "spec": {"images": spec},
            "status": status,
        }))
        .expect("a NodeImage")
    }

    fn tags(list: &[(&str, i64, &str)]) -> serde_json::Value {
        let tags: Vec<_> = list
            .iter()
            .map(|(t, v, phase)| serde_json::json!({"tag": t, "version": v, "phase": phase}))
            .collect();
        serde_json::json!({"r.io/app": {"tags": tags}})
    }

    #[test]
    fn succeeded_and_failed_for_good_tags_finish_the_warm_set_and_others_keep_it_waiting() {
        let spec = serde_json::json!({"r.io/app": {"tags": [
            {"tag": "a", "version": 1}, {"tag": "b", "version": 1}, {"tag": "c", "version": 1}]}});
        let start = node_image(spec.clone(), serde_json::json!({}));
        let set = warm_set(&start);
        assert_eq!(set.len(), 3);
        let p = progress(&set, Some(&start));
        assert_eq!(p.pending.len(), 3, "{p:?}");

        let later = node_image(
            spec,
            serde_json::json!({"imageStatuses": tags(&[
                ("a", 1, "Succeeded"), ("b", 1, "Failed"), ("c", 1, "Pulling")])}),
        );
        let p = progress(&set, Some(&later));
        assert_eq!(
            (p.succeeded, p.failed.clone(), p.pending.clone()),
            (
                1,
                vec!["r.io/app:b".to_string()],
                vec!["r.io/app:c Pulling".to_string()]
            )
        );
        assert!(!p.done());
    }

    #[test]
    fn a_status_of_an_older_version_does_not_count_and_a_tag_taken_out_is_not_waited_for() {
        let set = warm_set(&node_image(
            serde_json::json!({"r.io/app": {"tags": [{"tag": "a", "version": 2}, {"tag": "b", "version": 1}]}}),
            serde_json::json!({}),
        ));
        let now = node_image(
            serde_json::json!({"r.io/app": {"tags": [{"tag": "a", "version": 2}]}}),
            serde_json::json!({"imageStatuses": tags(&[("a", 1, "Succeeded")])}),
        );
        let p = progress(&set, Some(&now));
        assert_eq!((p.dropped, p.pending.len()), (1, 1), "{p:?}");
        let gone = progress(&set, None);
        assert_eq!((gone.dropped, gone.done()), (2, true));
    }

    #[test]
    fn the_message_says_whether_the_warm_set_or_the_deadline_removed_the_taint() {
        let pulled = Why::Pulled(Progress {
            succeeded: 2,
            failed: vec!["r.io/app:bad".into()],
            ..Default::default()
        });
        let m = message("w", Duration::from_secs(60), &pulled);
        assert!(m.contains("3 NodeImage tags listed at start are finished: 2 pulled, 1 failed for good (r.io/app:bad)"), "{m}");
        let late = Why::Deadline(Progress {
            succeeded: 1,
            pending: (0..7).map(|i| format!("r.io/app:t{i} Pulling")).collect(),
            ..Default::default()
        });
        let m = message("w", Duration::from_secs(60), &late);
        assert!(
            m.contains("deadline (60s after the Node's creation) passed with 7 of the 8"),
            "{m}"
        );
        assert!(m.contains("and 2 more"), "{m}");
    }
}
