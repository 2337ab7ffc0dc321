//! Which images the in-place pull works on: a pure function of the node's pods.
//!
//! A pod asks for an image in two ways, in the order kruise-manager does things:
//!
//! - [`Why::Grace`]: the manager's `apps.kruise.io/inplace-update-grace` (pre-1.0
//!   `inplace-update-grace`; the current key wins, as kruise's `GetInPlaceUpdateGrace`) holds the
//!   `UpdateSpec` it will apply when `gracePeriodSeconds` end; its `containerImages` are the
//!   images the pod will run. An image is asked for only for a container the pod has, and only
//!   if that container does not already run it.
//! - [`Why::SpecChange`]: a container's image in the spec differs from the image its status
//!   reports running (both normalised: the status may spell `docker.io/library/x:1` for
//!   `x:1`). A container without a status (not started yet) asks for nothing: its first pull is
//!   the kubelet's, as for any new pod.
//!
//! The bounds are the next-batch pre-pull's ([`super::super::prepull::plan`]): pods controlled
//! by a kruise workload only, an annotation of at most [`MAX_GRACE_BYTES`], at most
//! [`Limits::per_pod`] distinct images per pod and [`Limits::per_node`] on the node, oldest pods
//! first. A pod being deleted, or whose containers have all ended for good, asks for nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Deserialize;

use super::super::prepull::plan::{
    Limits, MAX_IMAGES_PER_NODE, MAX_IMAGES_PER_POD, Skip, WantKey, admit, kruise_controlled, order,
};
use super::super::reference::Reference;
use crate::controller::text::one_line;
use crate::k8s::keys;

/// Longest grace annotation read. kruise's `UpdateSpec` carries the images, the containers'
/// label and annotation changes and a metadata patch: a few KiB for a pod of ten containers (the
/// API server allows 256 KiB of annotations in all).
pub const MAX_GRACE_BYTES: usize = 64 * 1024;
/// Longest reason in a [`Skip`].
const REASON_MAX: usize = 256;

/// The bounds of the in-place plan: the next batch's per pod and per node, the grace
/// annotation's length.
pub fn limits() -> Limits {
    Limits {
        per_node: MAX_IMAGES_PER_NODE,
        per_pod: MAX_IMAGES_PER_POD,
        state_bytes: MAX_GRACE_BYTES,
    }
}

/// Why a pod asks for an image now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Why {
    /// The container's image in the spec differs from the one it runs: the kubelet is
    /// restarting it.
    SpecChange,
    /// The manager's grace annotation names the image: the spec changes when the grace period
    /// ends.
    Grace,
}

impl Why {
    /// For log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::SpecChange => "spec change",
            Why::Grace => "grace annotation",
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One image to have on the node for the pods of one namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The image as the first pod asking for it spells it (what the runtime is sent).
    pub image: String,
    /// The parsed reference, `latest` added.
    pub reference: Reference,
    /// The namespace of the pods, whose credentials may be used.
    pub namespace: String,
    /// The pods asking (names in `namespace`), and why each does.
    pub pods: BTreeMap<String, Why>,
}

impl Want {
    /// The pods asking, `namespace/name (why)`, at most `max` of them and how many more.
    pub fn describe_pods(&self, max: usize) -> String {
        let mut out: Vec<String> = self
            .pods
            .iter()
            .take(max)
            .map(|(name, why)| format!("{}/{name} ({why})", self.namespace))
            .collect();
        if self.pods.len() > max {
            out.push(format!("and {} more", self.pods.len() - max));
        }
        out.join(", ")
    }
}

/// What the in-place pull works on now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The images to have on the node, per namespace.
    pub wanted: BTreeMap<WantKey, Want>,
    /// Every image a kruise workload's pod of the node names in its spec or grace annotation,
    /// per namespace: a pull already running for one of them is let finish even when no pod
    /// asks for it any more (the kubelet took over: its pull joins the runtime's). Empty from
    /// [`plan_with`] unless asked for.
    pub named: BTreeSet<WantKey>,
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
}

/// The part of kruise's `UpdateSpec` read here; the rest is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GraceSpec {
    #[serde(default)]
    container_images: Option<BTreeMap<String, String>>,
}

/// The grace annotation as written, and its key (the current one wins).
fn grace_text(pod: &Pod) -> Option<(&'static str, &String)> {
    let a = pod.annotations();
    a.get(keys::INPLACE_UPDATE_GRACE)
        .map(|t| (keys::INPLACE_UPDATE_GRACE, t))
        .or_else(|| {
            a.get(keys::INPLACE_UPDATE_GRACE_OLD)
                .map(|t| (keys::INPLACE_UPDATE_GRACE_OLD, t))
        })
}

/// The normalised pull key of `image`, if it parses.
fn key_of(image: &str) -> Option<String> {
    Reference::parse(image)
        .ok()
        .map(|r| r.with_default_tag().pull_key())
}

/// Whether the pod can still start a container: not being deleted, not ended.
fn live(pod: &Pod) -> bool {
    let ended = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    pod.metadata.deletion_timestamp.is_none() && !ended
}

/// What one pod asks for, before the bounds: `(image, why)`, spec changes first (then grace,
/// each in container order); the keys it names; what is wrong with it.
#[derive(Debug)]
struct Asked {
    images: Vec<(String, Why)>,
    named: Vec<String>,
    invalid: Vec<String>,
}

/// What each pod asked for at the `resourceVersion` it was read at, kept between plans: the
/// in-place pull plans again on every change of any pod of the node, and reading every pod's
/// images each time (two reference parses a container, the grace annotation's JSON) was most of
/// kruised's own CPU in `benches/reaction.rs` beside the env restarts. A pod is read again only
/// when its `resourceVersion` changed (or it has none); pods gone from the node are forgotten at
/// the end of each plan.
#[derive(Debug, Default)]
pub struct Asks {
    /// By the pod's uid (`namespace/name` without one): the version read, the plan it was
    /// last used in, what it asked.
    by_pod: HashMap<String, (Option<String>, u64, Asked)>,
    /// Plans made.
    plans: u64,
    /// Pods read (not taken from the cache), for the tests.
    reads: u64,
}

impl Asks {
    /// What `pod` asks for: from the cache when it was read at its current version.
    fn of(&mut self, pod: &Pod, limits: Limits) -> &Asked {
        let key = match pod.metadata.uid.as_deref() {
            Some(uid) if !uid.is_empty() => uid.to_string(),
            _ => format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
        };
        let version = pod.metadata.resource_version.as_deref();
        let plan = self.plans;
        let reads = &mut self.reads;
        let entry = self
            .by_pod
            .entry(key)
            .and_modify(|(at, used, asked_then)| {
                if version.is_none() || at.as_deref() != version {
                    *reads += 1;
                    *at = version.map(str::to_string);
                    *asked_then = asked(pod, limits);
                }
                *used = plan;
            })
            .or_insert_with(|| {
                *reads += 1;
                (version.map(str::to_string), plan, asked(pod, limits))
            });
        &entry.2
    }

    /// Ends a plan: forgets the pods it did not look at.
    fn end_plan(&mut self) {
        let plan = self.plans;
        self.by_pod.retain(|_, (_, used, _)| *used == plan);
        self.plans += 1;
    }

    /// Pods read so far (not taken from the cache).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Pods remembered.
    pub fn len(&self) -> usize {
        self.by_pod.len()
    }

    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_pod.is_empty()
    }
}

fn asked(pod: &Pod, limits: Limits) -> Asked {
    let mut out = Asked {
        images: Vec::new(),
        named: Vec::new(),
        invalid: Vec::new(),
    };
    let containers = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
    // the image each container's status reports running
    let running: BTreeMap<&str, &str> = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.as_str(), s.image.as_str()))
        .collect();
    let runs = |container: &str, key: &str| {
        running
            .get(container)
            .is_some_and(|r| key_of(r).as_deref() == Some(key))
    };
    for c in containers {
        let Some(image) = c.image.as_deref() else {
            continue;
        };
        let Some(key) = key_of(image) else {
            continue;
        };
        out.named.push(key.clone());
        if running.contains_key(c.name.as_str()) && !runs(&c.name, &key) {
            out.images.push((image.to_string(), Why::SpecChange));
        }
    }
    let Some((annotation, text)) = grace_text(pod) else {
        return out;
    };
    if text.len() > limits.state_bytes {
        out.invalid.push(format!(
            "{annotation} is {} bytes, more than the {} read",
            text.len(),
            limits.state_bytes
        ));
        return out;
    }
    let spec: GraceSpec = match serde_json::from_str(text) {
        Ok(s) => s,
        Err(e) => {
            out.invalid.push(format!("{annotation}: {e}"));
            return out;
        }
    };
    let mut unknown: Vec<&str> = Vec::new();
    for (container, image) in spec.container_images.iter().flatten() {
        let Some(c) = containers.iter().find(|c| &c.name == container) else {
            unknown.push(container);
            continue;
        };
        let key = match Reference::parse(image) {
            Ok(r) => r.with_default_tag().pull_key(),
            Err(e) => {
                out.invalid.push(format!("{annotation}: {e}"));
                continue;
            }
        };
        out.named.push(key.clone());
        if !runs(&c.name, &key) {
            out.images.push((image.clone(), Why::Grace));
        }
    }
    if let Some(first) = unknown.first() {
        // one message for any number of them: the annotation is the pod author's to write
        out.invalid.push(format!(
            "{annotation} names {} container(s) the pod does not have ({first:?}{})",
            unknown.len(),
            if unknown.len() > 1 { ", ..." } else { "" }
        ));
    }
    out
}

/// The plan for `pods` within `limits`.
pub fn plan<'a>(pods: impl IntoIterator<Item = &'a Pod>, limits: Limits) -> Plan {
    plan_with(pods, limits, &mut Asks::default(), true)
}

/// [`plan`], with what the pods asked for at their last plan kept in `asks` ([`Asks`]), and
/// [`Plan::named`] filled only when `named` (its one reader, a pull running, asks for it: it
/// is a key for every container of every kruise pod, built again on every plan).
pub fn plan_with<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    limits: Limits,
    asks: &mut Asks,
    named: bool,
) -> Plan {
    let mut pods: Vec<&Pod> = pods.into_iter().filter(|p| live(p)).collect();
    pods.sort_by(|a, b| order(a).cmp(&order(b)));
    let mut out = Plan::default();
    let mut distinct: BTreeSet<String> = BTreeSet::new();
    for pod in pods {
        let asked = asks.of(pod, limits);
        let controlled = kruise_controlled(pod);
        if named && controlled {
            let namespace = pod.namespace().unwrap_or_default();
            out.named
                .extend(asked.named.iter().map(|k| (k.clone(), namespace.clone())));
        }
        if asked.images.is_empty() && asked.invalid.is_empty() {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let id = format!("{namespace}/{name}");
        if !controlled {
            out.skipped.push(Skip::NotKruiseOwned { pod: id });
            continue;
        }
        for reason in &asked.invalid {
            out.skipped.push(Skip::Invalid {
                pod: id.clone(),
                reason: one_line(reason, REASON_MAX),
            });
        }
        let mut seen = BTreeSet::new();
        let mut taken = 0;
        for (image, why) in &asked.images {
            let Ok(reference) = Reference::parse(image).map(Reference::with_default_tag) else {
                continue;
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
                    pods: BTreeMap::new(),
                })
                .pods
                .entry(name.clone())
                .or_insert(*why);
        }
    }
    asks.end_plan();
    out
}

#[cfg(test)]
mod tests;
