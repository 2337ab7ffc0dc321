//! The node's pods waiting for their own image (kruised's own): pre-pulls yield to them
//! ([`super::turn`]).
//!
//! A pod waits for its own image when it is bound to this node, not being deleted, not finished,
//! and one of its containers (init containers included) is `waiting` with the kubelet's reason
//! `ContainerCreating`, `PodInitializing`, `ErrImagePull` or `ImagePullBackOff`
//! ([`WAITING_REASONS`]) while its image is not on the node (CRI `ImageStatus`). A container
//! created for some other reason (a volume, a sandbox) with its image present is not waiting for
//! its image and holds nothing back.
//!
//! The pods are the store kruised already keeps (`DaemonWatchingPod`, this node's pods only): no
//! watch of its own. It looks again on every change of a pod and, while some pod is a candidate,
//! every [`RECHECK`] (the kubelet may have pulled the image before the pod's status changes).
//!
//! Bounds: one pod's container holds pre-pulls back for at most [`MAX_HOLD`] (a pod whose image
//! cannot be pulled, a typo or a refused credential, would hold them back forever); at most
//! [`MAX_CHECKS`] `ImageStatus` calls a look, and at most [`MAX_TRACKED`] waiting containers
//! remembered.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cri::ImageService;
use crate::k8s::watch::Watched;

/// The kubelet's waiting reasons of a container whose image may not be on the node yet.
pub const WAITING_REASONS: [&str; 4] = [
    "ContainerCreating",
    "PodInitializing",
    "ErrImagePull",
    "ImagePullBackOff",
];
/// How often the images of waiting pods are looked at again while no pod changes.
pub const RECHECK: Duration = Duration::from_secs(2);
/// Longest time one pod's container holds pre-pulls back (the kubelet's longest image pull
/// back-off).
pub const MAX_HOLD: Duration = Duration::from_secs(300);
/// Most `ImageStatus` calls of one look.
pub const MAX_CHECKS: usize = 16;
/// Most waiting containers remembered (for [`MAX_HOLD`]).
pub const MAX_TRACKED: usize = 256;

/// One container of a pod that may wait for its image.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Candidate {
    /// The pod's uid (its name when it has none).
    pub uid: String,
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The container's image, as its spec names it.
    pub image: String,
}

/// The containers of `pod` that may wait for their image: bound to `node`, not being deleted,
/// not finished, waiting with one of [`WAITING_REASONS`].
pub fn candidates(pod: &Pod, node: &str) -> Vec<Candidate> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    let (Some(status), Some(true)) = (&pod.status, spec.node_name.as_ref().map(|n| n == node))
    else {
        return Vec::new();
    };
    if pod.metadata.deletion_timestamp.is_some()
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return Vec::new();
    }
    let mut statuses = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .filter(|s| waits(s))
        .peekable();
    // looked at on every change of every pod: nothing allocated for a pod with none waiting
    if statuses.peek().is_none() {
        return Vec::new();
    }
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let uid = pod.metadata.uid.clone().unwrap_or_else(|| name.clone());
    let specs = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    let mut out: Vec<Candidate> = statuses
        .filter_map(|s| {
            let image = specs
                .clone()
                .find(|c| c.name == s.name)
                .and_then(|c| c.image.clone())
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| s.image.clone());
            (!image.is_empty()).then(|| Candidate {
                uid: uid.clone(),
                pod: name.clone(),
                image,
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn waits(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
        .is_some_and(|r| WAITING_REASONS.contains(&r))
}

/// Keeps `waiting` at the number of the node's pods found waiting for their own image, until
/// `cancel`.
pub async fn run<I: ImageService>(
    runtime: I,
    pods: Watched<Pod>,
    node: String,
    waiting: watch::Sender<usize>,
    cancel: CancellationToken,
) {
    let mut changes = pods.subscribe();
    tokio::select! {
        () = cancel.cancelled() => return,
        () = pods.wait_synced() => {}
    }
    // when each waiting container was first seen
    let mut since: BTreeMap<Candidate, Instant> = BTreeMap::new();
    let mut released: BTreeSet<Candidate> = BTreeSet::new();
    let mut last: Option<Candidate> = None;
    loop {
        let now = Instant::now();
        let all: BTreeSet<Candidate> = pods
            .state()
            .iter()
            .flat_map(|p| candidates(p, &node))
            .collect();
        since.retain(|c, _| all.contains(c));
        released.retain(|c| all.contains(c));
        for c in &all {
            if since.len() >= MAX_TRACKED {
                break;
            }
            since.entry(c.clone()).or_insert(now);
        }
        let mut pods_waiting: BTreeSet<&str> = BTreeSet::new();
        let mut first = None;
        let mut checks = 0;
        for (c, seen) in &since {
            if pods_waiting.contains(c.uid.as_str()) {
                continue;
            }
            if now.saturating_duration_since(*seen) >= MAX_HOLD {
                if released.insert(c.clone()) {
                    tracing::info!(pod = %c.pod, image = %c.image, after = ?MAX_HOLD, "pre-pulls no longer wait for this pod's image");
                }
                continue;
            }
            if checks == MAX_CHECKS {
                break;
            }
            checks += 1;
            let absent = match runtime.image_status(&c.image).await {
                Ok(found) => found.is_none(),
                Err(e) => {
                    // the runtime cannot tell: the pod is taken to wait (bounded by MAX_HOLD)
                    tracing::debug!(image = %c.image, error = %e, "ImageStatus failed; the pod is taken to wait for its image");
                    true
                }
            };
            if absent {
                pods_waiting.insert(c.uid.as_str());
                first.get_or_insert(c);
            }
        }
        let count = pods_waiting.len();
        if first != last.as_ref() {
            match first {
                Some(c) => {
                    tracing::info!(pod = %c.pod, image = %c.image, pods = count, "pre-pulls wait: a pod on the node waits for its own image")
                }
                None => tracing::info!("pre-pulls resume: no pod on the node waits for its image"),
            }
            last = first.cloned();
        }
        waiting.send_if_modified(|n| std::mem::replace(n, count) != count);
        let recheck = !since.is_empty();
        tokio::select! {
            () = cancel.cancelled() => return,
            r = changes.recv() => if let Err(broadcast::error::RecvError::Closed) = r { return },
            () = tokio::time::sleep(RECHECK), if recheck => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(node: &str, reason: &str, extra: serde_json::Value) -> Pod {
        let mut p = json!({
            "metadata": {"namespace": "ns", "name": "web-0", "uid": "u0"},
            "spec": {"nodeName": node, "containers": [
                {"name": "app", "image": "r.io/app:v2"},
                {"name": "side", "image": "r.io/side:v1"}]},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": "app", "image": "r.io/app:v2", "imageID": "", "ready": false,
                 "restartCount": 0, "state": {"waiting": {"reason": reason}}},
                {"name": "side", "image": "r.io/side:v1", "imageID": "", "ready": true,
                 "restartCount": 0, "state": {"running": {}}}]}
        });
        if let (Some(p), Some(e)) = (p.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                p.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(p).unwrap_or_else(|e| panic!("pod: {e}"))
    }

    #[test]
    fn a_container_waiting_to_be_created_or_for_its_pull_is_a_candidate() {
        for reason in WAITING_REASONS {
            let c = candidates(&pod("n1", reason, json!({})), "n1");
            assert_eq!(
                c,
                vec![Candidate {
                    uid: "u0".into(),
                    pod: "ns/web-0".into(),
                    image: "r.io/app:v2".into()
                }],
                "{reason}"
            );
        }
    }

    #[test]
    fn other_waits_other_nodes_deleted_and_finished_pods_are_no_candidates() {
        assert!(candidates(&pod("n1", "CrashLoopBackOff", json!({})), "n1").is_empty());
        assert!(candidates(&pod("n2", "ContainerCreating", json!({})), "n1").is_empty());
        let deleted = json!({"metadata": {"namespace": "ns", "name": "web-0",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert!(candidates(&pod("n1", "ErrImagePull", deleted), "n1").is_empty());
        let mut done = pod("n1", "ContainerCreating", json!({}));
        if let Some(s) = done.status.as_mut() {
            s.phase = Some("Failed".into());
        }
        assert!(candidates(&done, "n1").is_empty());
    }
}
