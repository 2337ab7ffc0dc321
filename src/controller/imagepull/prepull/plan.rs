//! Which next-batch images the pre-pull works on: a pure function of the node's pods.
//!
//! Every pod that can write an annotation can write `apps.kruise.io/inplace-update-state`, so
//! what it asks for is bounded before anything is pulled:
//!
//! - only pods whose controller is a kruise workload ([`kruise_controlled`]) are read;
//! - an annotation longer than [`Limits::state_bytes`], or that does not parse, is skipped with a
//!   message; so is an image name that does not parse;
//! - a pod gets at most [`Limits::per_pod`] distinct images, the node at most
//!   [`Limits::per_node`]; pods are taken oldest first (then by namespace and name), so new pods
//!   cannot push out the images of the ones already waiting for their next batch.
//!
//! An image is wanted per namespace: credentials are chosen by the pod's namespace
//! (`secrets::lends_to`), so the same image for pods of two namespaces is two items, and one
//! image towards the node's bound.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::super::metrics::Skipped;
use super::super::reference::Reference;
use crate::controller::text::one_line;
use crate::k8s::keys;

/// Most distinct next-batch images the node works on at once.
pub const MAX_IMAGES_PER_NODE: usize = 16;
/// Most distinct next-batch images of one pod.
pub const MAX_IMAGES_PER_POD: usize = 4;
/// Longest in-place update state read (kruise's for a pod of ten containers is a few KiB; the
/// API server allows 256 KiB of annotations in all).
pub const MAX_STATE_BYTES: usize = 32 * 1024;
/// Longest reason in a [`Skip`].
const REASON_MAX: usize = 256;

/// The bounds of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most distinct images on the node.
    pub per_node: usize,
    /// Most distinct images of one pod.
    pub per_pod: usize,
    /// Longest annotation read, in bytes.
    pub state_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_node: MAX_IMAGES_PER_NODE,
            per_pod: MAX_IMAGES_PER_POD,
            state_bytes: MAX_STATE_BYTES,
        }
    }
}

/// One image to pre-pull for the pods of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The image as the first pod asking for it spells it (what the runtime is sent).
    pub image: String,
    /// The parsed reference, `latest` added.
    pub reference: Reference,
    /// The namespace of the pods, whose credentials may be used.
    pub namespace: String,
}

/// The key of a [`Want`]: the pull key (normalised reference) and the namespace.
pub type WantKey = (String, String);

/// Something the plan leaves out, and why (for the log).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// A pod with an in-place update state whose controller is no kruise workload.
    NotKruiseOwned {
        /// `namespace/name`.
        pod: String,
    },
    /// An annotation or image name that cannot be used.
    Invalid {
        /// `namespace/name`.
        pod: String,
        /// What is wrong, on one line, bounded.
        reason: String,
    },
    /// An image past the pod's share.
    OverPodBound {
        /// `namespace/name`.
        pod: String,
        /// The pull key.
        image: String,
    },
    /// An image past the node's bound.
    OverNodeBound {
        /// `namespace/name`.
        pod: String,
        /// The pull key.
        image: String,
    },
}

/// What the pre-pull works on now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The images to pre-pull, per namespace.
    pub wanted: BTreeMap<WantKey, Want>,
    /// What was left out.
    pub skipped: Vec<Skip>,
}

impl Plan {
    /// Distinct images wanted (an image wanted in two namespaces counts once).
    pub fn images(&self) -> usize {
        self.wanted
            .keys()
            .map(|(k, _)| k)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// What was left out, counted by reason (for the metrics).
    pub fn skipped_counts(&self) -> Skipped {
        skipped_counts(&self.skipped)
    }
}

/// `skipped` counted by reason (for the metrics).
pub fn skipped_counts(skipped: &[Skip]) -> Skipped {
    let mut c = Skipped::default();
    for s in skipped {
        match s {
            Skip::NotKruiseOwned { .. } => c.not_kruise_owned += 1,
            Skip::Invalid { .. } => c.invalid += 1,
            Skip::OverPodBound { .. } => c.over_pod_bound += 1,
            Skip::OverNodeBound { .. } => c.over_node_bound += 1,
        }
    }
    c
}

/// The kinds of `apps.kruise.io` that own pods and update them in place (CloneSet, Advanced
/// StatefulSet, Advanced DaemonSet): the workloads that write `nextContainerImages` and the
/// grace annotation.
pub const KRUISE_WORKLOAD_KINDS: [&str; 3] = ["CloneSet", "StatefulSet", "DaemonSet"];

/// The order pods are planned in: oldest first, then by namespace and name (borrowed: a plan
/// sorts on every change of a pod).
pub fn order(
    p: &Pod,
) -> (
    Option<&k8s_openapi::jiff::Timestamp>,
    Option<&str>,
    Option<&str>,
) {
    (
        p.metadata.creation_timestamp.as_ref().map(|t| &t.0),
        p.metadata.namespace.as_deref(),
        p.metadata.name.as_deref(),
    )
}

/// Whether the pod's controller is a kruise workload: an owner reference with `controller:
/// true` whose apiVersion's group is `apps.kruise.io` and whose kind is one of
/// [`KRUISE_WORKLOAD_KINDS`]. Any other kind of the group (a ContainerRecreateRequest, a
/// PodProbeMarker: objects a tenant makes) is not a workload: a bare pod it "owns" is not
/// taken for one.
pub fn kruise_controlled(pod: &Pod) -> bool {
    pod.owner_references().iter().any(|o| {
        o.controller == Some(true)
            && o.api_version.split('/').next() == Some(keys::KRUISE_GROUP)
            && KRUISE_WORKLOAD_KINDS.contains(&o.kind.as_str())
    })
}

/// The pod's in-place update state as written, from the annotation kruise reads
/// (`parse_inplace_update_state`'s choice: the current key, else the pre-1.0 one).
fn state_text(pod: &Pod) -> Option<&String> {
    let a = pod.annotations();
    a.get(keys::INPLACE_UPDATE_STATE)
        .or_else(|| a.get(keys::INPLACE_UPDATE_STATE_OLD))
}

/// Admits pod `id`'s image `key` against the bounds, given the pod's keys `seen` and
/// images `taken` so far and the node's `distinct` images: a repeat of the pod's is dropped
/// quietly, one past the pod's share or the node's bound is recorded in `skipped`. Both plans
/// (the next batch, the in-place pull) bound their images with it.
pub fn admit(
    limits: &Limits,
    id: &str,
    key: &str,
    (seen, taken, distinct): (&mut BTreeSet<String>, &mut usize, &mut BTreeSet<String>),
    skipped: &mut Vec<Skip>,
) -> bool {
    if !seen.insert(key.to_string()) {
        return false;
    }
    let (pod, image) = (id.to_string(), key.to_string());
    if *taken >= limits.per_pod {
        skipped.push(Skip::OverPodBound { pod, image });
        return false;
    }
    if !distinct.contains(key) && distinct.len() >= limits.per_node {
        skipped.push(Skip::OverNodeBound { pod, image });
        return false;
    }
    *taken += 1;
    distinct.insert(image);
    true
}

/// The plan for `pods` within `limits`.
pub fn plan<'a>(pods: impl IntoIterator<Item = &'a Pod>, limits: Limits) -> Plan {
    let mut pods: Vec<(&Pod, &String)> = pods
        .into_iter()
        .filter_map(|p| state_text(p).map(|t| (p, t)))
        .collect();
    pods.sort_by(|(a, _), (b, _)| order(a).cmp(&order(b)));
    let mut out = Plan::default();
    let mut distinct: BTreeSet<String> = BTreeSet::new();
    for (pod, text) in pods {
        let namespace = pod.namespace().unwrap_or_default();
        let id = format!("{namespace}/{}", pod.name_any());
        if !kruise_controlled(pod) {
            out.skipped.push(Skip::NotKruiseOwned { pod: id });
            continue;
        }
        if text.len() > limits.state_bytes {
            out.skipped.push(Skip::Invalid {
                pod: id,
                reason: format!(
                    "the in-place update state is {} bytes, more than the {} read",
                    text.len(),
                    limits.state_bytes
                ),
            });
            continue;
        }
        let state = match keys::parse_inplace_update_state(pod.annotations()) {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                out.skipped.push(Skip::Invalid {
                    pod: id,
                    reason: one_line(&e.to_string(), REASON_MAX),
                });
                continue;
            }
        };
        let mut seen = BTreeSet::new();
        let mut taken = 0;
        for image in state.next_container_images.values() {
            let reference = match Reference::parse(image) {
                Ok(r) => r.with_default_tag(),
                Err(e) => {
                    out.skipped.push(Skip::Invalid {
                        pod: id.clone(),
                        reason: one_line(&e.to_string(), REASON_MAX),
                    });
                    continue;
                }
            };
            let key = reference.pull_key();
            let bounds = (&mut seen, &mut taken, &mut distinct);
            if !admit(&limits, &id, &key, bounds, &mut out.skipped) {
                continue;
            }
            out.wanted
                .entry((key, namespace.clone()))
                .or_insert_with(|| Want {
                    image: image.clone(),
                    reference,
                    namespace: namespace.clone(),
                });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use serde_json::json;

    use super::*;

    /// A CloneSet's pod as kruise-manager writes it: the controller owner reference and the
    /// in-place update state (kruise 07169cf, as the manager double tests/support/manager
    /// writes them; `apps.kruise.io/v1alpha1` CloneSet).
    fn pod(namespace: &str, name: &str, created: i64, state: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(namespace.into());
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps.kruise.io/v1alpha1".into(),
            kind: "CloneSet".into(),
            name: "web".into(),
            uid: "u-web".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        if let Some(s) = state {
            p.metadata.annotations =
                Some([(keys::INPLACE_UPDATE_STATE.to_string(), s.to_string())].into());
        }
        p
    }

    fn next(images: &[(&str, &str)]) -> String {
        let m: serde_json::Map<String, serde_json::Value> = images
            .iter()
            .map(|(c, i)| (c.to_string(), json!(i)))
            .collect();
        json!({"revision": "r2", "nextContainerImages": m}).to_string()
    }

    fn keys_of(p: &Plan) -> Vec<(&str, &str)> {
        p.wanted
            .keys()
            .map(|(k, ns)| (k.as_str(), ns.as_str()))
            .collect()
    }

    #[test]
    fn a_bare_pod_owned_by_a_tenants_recreate_request_or_probe_marker_is_no_workloads_pod() {
        // issue 43, row 8: any owner in apps.kruise.io passed, so a tenant's bare pod "owned"
        // by its own ContainerRecreateRequest had its next batch pre-pulled
        for (kind, workload) in [
            ("CloneSet", true),
            ("StatefulSet", true),
            ("DaemonSet", true),
            ("ContainerRecreateRequest", false),
            ("PodProbeMarker", false),
            ("ImagePullJob", false),
        ] {
            let mut p = pod("tenant", "bare", 1, Some(&next(&[("c", "busybox:2")])));
            if let Some(o) = p
                .metadata
                .owner_references
                .as_mut()
                .and_then(|o| o.first_mut())
            {
                o.kind = kind.into();
            }
            assert_eq!(kruise_controlled(&p), workload, "{kind}");
            let wanted = plan([&p], Limits::default()).wanted.len();
            assert_eq!(wanted, usize::from(workload), "{kind}");
        }
    }

    #[test]
    fn next_batch_images_are_collected_normalised_and_deduplicated_per_namespace() {
        let pods = [
            pod(
                "default",
                "a",
                1,
                Some(&next(&[
                    ("sidecar", "nginx:1.25"),
                    ("main", "127.0.0.1:5000/app"),
                ])),
            ),
            pod(
                "default",
                "b",
                2,
                Some(&next(&[("x", "docker.io/library/nginx:1.25")])),
            ),
            pod("other", "c", 3, Some(&next(&[("x", "nginx:1.25")]))),
            pod("default", "d", 4, None),
        ];
        let p = plan(&pods, Limits::default());
        assert_eq!(
            keys_of(&p),
            [
                ("127.0.0.1:5000/app:latest", "default"),
                ("docker.io/library/nginx:1.25", "default"),
                ("docker.io/library/nginx:1.25", "other"),
            ]
        );
        assert_eq!(p.images(), 2, "one image in two namespaces counts once");
        // the first spelling is what is sent to the runtime
        let nginx = &p.wanted[&("docker.io/library/nginx:1.25".into(), "default".into())];
        assert_eq!(nginx.image, "nginx:1.25");
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    }

    #[test]
    fn a_pod_not_controlled_by_a_kruise_workload_is_ignored() {
        let state = next(&[("c", "r.io/app:v2")]);
        let mut bare = pod("t", "bare", 1, Some(&state));
        bare.metadata.owner_references = None;
        let mut replica_set = pod("t", "rs", 1, Some(&state));
        let o = &mut replica_set.metadata.owner_references.as_mut().unwrap()[0];
        (o.api_version, o.kind) = ("apps/v1".into(), "ReplicaSet".into());
        let mut not_controller = pod("t", "nc", 1, Some(&state));
        not_controller.metadata.owner_references.as_mut().unwrap()[0].controller = None;
        // a look-alike group is not kruise's
        let mut look_alike = pod("t", "la", 1, Some(&state));
        look_alike.metadata.owner_references.as_mut().unwrap()[0].api_version =
            "apps.kruise.io.evil.example/v1".into();

        let p = plan(
            [&bare, &replica_set, &not_controller, &look_alike],
            Limits::default(),
        );
        assert!(p.wanted.is_empty(), "{:?}", p.wanted);
        assert_eq!(p.skipped_counts().not_kruise_owned, 4);

        let owned = pod("t", "owned", 1, Some(&state));
        assert_eq!(
            keys_of(&plan([&owned], Limits::default())),
            [("r.io/app:v2", "t")]
        );
    }

    #[test]
    fn a_pod_listing_1000_images_pre_pulls_at_most_its_share() {
        let images: Vec<(String, String)> = (0..1000)
            .map(|i| (format!("c{i:04}"), format!("r.io/i{i:04}:v1")))
            .collect();
        let refs: Vec<(&str, &str)> = images
            .iter()
            .map(|(c, i)| (c.as_str(), i.as_str()))
            .collect();
        let state = next(&refs);
        assert!(state.len() < MAX_STATE_BYTES, "{} bytes", state.len());
        let p = plan([&pod("t", "greedy", 1, Some(&state))], Limits::default());
        assert_eq!(p.wanted.len(), MAX_IMAGES_PER_POD);
        assert_eq!(
            keys_of(&p),
            [
                ("r.io/i0000:v1", "t"),
                ("r.io/i0001:v1", "t"),
                ("r.io/i0002:v1", "t"),
                ("r.io/i0003:v1", "t")
            ],
            "the first containers by name"
        );
        assert_eq!(p.skipped_counts().over_pod_bound, 1000 - MAX_IMAGES_PER_POD);
    }

    #[test]
    fn the_node_works_on_at_most_its_bound_of_distinct_images_oldest_pods_first() {
        // 10 pods of 4 images each: 40 distinct; a shared image costs nothing more
        let mut pods: Vec<Pod> = (0..10)
            .rev()
            .map(|n| {
                let images: Vec<(String, String)> = (0..4)
                    .map(|i| (format!("c{i}"), format!("r.io/p{n}-{i}:v1")))
                    .collect();
                let refs: Vec<(&str, &str)> = images
                    .iter()
                    .map(|(c, i)| (c.as_str(), i.as_str()))
                    .collect();
                pod("t", &format!("p{n}"), n, Some(&next(&refs)))
            })
            .collect();
        pods.push(pod("t", "late", 100, Some(&next(&[("c", "r.io/p0-0:v1")]))));
        let p = plan(&pods, Limits::default());
        assert_eq!(p.images(), MAX_IMAGES_PER_NODE);
        assert!(
            p.wanted
                .keys()
                .all(|(k, _)| ["p0-", "p1-", "p2-", "p3-"].iter().any(|o| k.contains(o))),
            "the four oldest pods: {:?}",
            p.wanted.keys()
        );
        assert_eq!(p.skipped_counts().over_node_bound, 40 - MAX_IMAGES_PER_NODE);
        // a later pod still gets an image the node already works on
        assert!(
            !p.skipped
                .iter()
                .any(|s| matches!(s, Skip::OverNodeBound { pod, .. } if pod == "t/late"))
        );
    }

    #[test]
    fn a_malformed_or_oversized_annotation_is_skipped_with_a_message() {
        let huge = next(&[("c", &format!("r.io/app:v1@sha256:{}", "a".repeat(40_000)))]);
        let pods = [
            pod("t", "not-json", 1, Some("not json\u{1b}[2J")),
            pod("t", "huge", 2, Some(&huge)),
            pod("t", "bad-ref", 3, Some(&next(&[("c", "Not A Ref")]))),
            pod("t", "fine", 4, Some(&next(&[("c", "r.io/ok:v1")]))),
        ];
        let p = plan(&pods, Limits::default());
        assert_eq!(keys_of(&p), [("r.io/ok:v1", "t")]);
        let reasons: Vec<(&str, &str)> = p
            .skipped
            .iter()
            .map(|s| match s {
                Skip::Invalid { pod, reason } => (pod.as_str(), reason.as_str()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert_eq!(reasons[0].0, "t/not-json");
        assert_eq!(reasons[1].0, "t/huge");
        assert!(
            reasons[1].1.contains("more than the 32768 read"),
            "{reasons:?}"
        );
        assert_eq!(reasons[2].0, "t/bad-ref");
        assert!(reasons[2].1.contains("Not A Ref"), "{reasons:?}");
        for (_, r) in &reasons {
            assert!(r.len() <= REASON_MAX && !r.contains('\u{1b}'), "{r:?}");
        }
    }
}
