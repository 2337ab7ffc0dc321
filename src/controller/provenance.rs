//! Restart provenance: every container stop kruised makes is recorded with its reason where a user
//! can ask later ("why did my container restart?", kruise #910, #1044): on the pod itself, in the
//! annotation [`keys::LAST_RESTARTS`], the last [`MAX_ENTRIES`] stops as a JSON list of
//! `{container, containerID, reason, detail, time}`. `kruised explain` (its own process, which
//! reads the API and the runtime, not the daemon) prints them beside the kubelet's restart count,
//! so a restart with no entry shows as one kruised did not make: a crash, an OOM kill, the
//! kubelet.
//!
//! The annotation is written by the controllers that stop containers (container meta in the same
//! patch as `runtime-containers-meta`, recreate requests in a patch of their own) from the
//! [`Book`] they share: the stops this daemon made lately, so a write made from a copy of the pod
//! older than another writer's keeps that writer's entries, and an entry a concurrent write took
//! out is written again. The pod's author can write the annotation too: it is parsed leniently
//! and bounded ([`parse`]), and never used for a decision.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::text::bounded_text;
use crate::k8s::keys;
use crate::sync::lock;

/// Stops kept in the annotation, the newest last.
pub const MAX_ENTRIES: usize = 5;
/// The reason of a stop for a ContainerRecreateRequest (container meta's reasons are
/// `containermeta::decide::RestartReason::as_str`).
pub const RECREATE_REQUEST: &str = "recreate-request";
/// What `kruised explain` says of a restart the kubelet counted and kruised did not make.
pub const NOT_BY_KRUISED: &str = "not stopped by kruised (a crash, an OOM kill, or the kubelet)";

/// A value longer than this is not read (five entries at their bounds take under 4 KiB).
const MAX_VALUE_BYTES: usize = 16 * 1024;
/// Bounds of each field read from the annotation, in bytes.
const MAX_NAME: usize = 253;
const MAX_ID: usize = 160;
const MAX_REASON: usize = 64;
/// Bound of a detail, read or written.
pub const MAX_DETAIL: usize = 256;
const MAX_TIME: usize = 40;
/// How long the [`Book`] keeps a stop after it was recorded: long past any write of it.
const RETENTION: Duration = Duration::from_secs(600);

/// One stop kruised made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    /// The container's name in the pod spec.
    pub container: String,
    /// The container stopped, as the kubelet writes it (`containerd://<id>`).
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Why: `env-from-metadata`, `stale-recreation`, `kubelet-did-not-recreate`,
    /// `recreate-request`.
    pub reason: String,
    /// What the reason concerns: the env from metadata that changed, the request's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// When (RFC3339, seconds), or empty where an entry read had no valid time.
    #[serde(default)]
    pub time: String,
}

impl Restart {
    /// A stop of `container` (`container_id` as the kubelet writes it) made now.
    pub fn now(container: &str, container_id: String, reason: &str, detail: &str) -> Self {
        Restart {
            container: container.to_string(),
            container_id,
            reason: reason.to_string(),
            detail: bounded_text(detail.as_bytes(), MAX_DETAIL),
            time: crate::k8s::time::now_rfc3339(),
        }
    }

    /// The container ID without the runtime's `<name>://`.
    pub fn runtime_id(&self) -> &str {
        self.container_id
            .split_once("://")
            .map_or(self.container_id.as_str(), |(_, id)| id)
    }

    fn same_stop(&self, other: &Restart) -> bool {
        self.container == other.container && self.container_id == other.container_id
    }

    /// An entry as read from the annotation: the three identifying fields non-empty strings,
    /// every field bounded and without control characters, a time that does not parse dropped.
    fn from_json(v: &serde_json::Value) -> Option<Restart> {
        let text = |field: &str, limit: usize| {
            v.get(field)
                .and_then(serde_json::Value::as_str)
                .map(|s| bounded_text(s.as_bytes(), limit))
        };
        let required = |field: &str, limit: usize| text(field, limit).filter(|s| !s.is_empty());
        Some(Restart {
            container: required("container", MAX_NAME)?,
            container_id: required("containerID", MAX_ID)?,
            reason: required("reason", MAX_REASON)?,
            detail: text("detail", MAX_DETAIL).unwrap_or_default(),
            time: text("time", MAX_TIME)
                .filter(|t| t.parse::<Timestamp>().is_ok())
                .unwrap_or_default(),
        })
    }
}

/// The stops recorded in an annotation value, leniently: a value too long or not a JSON list
/// gives none, entries that are not well formed are skipped, at most the last [`MAX_ENTRIES`]
/// are kept.
pub fn parse(value: &str) -> Vec<Restart> {
    if value.len() > MAX_VALUE_BYTES {
        return Vec::new();
    }
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str(value) else {
        return Vec::new();
    };
    let mut out: Vec<Restart> = items.iter().filter_map(Restart::from_json).collect();
    let extra = out.len().saturating_sub(MAX_ENTRIES);
    out.drain(..extra);
    out
}

/// The stops recorded on a pod with these annotations.
pub fn of_pod(annotations: &BTreeMap<String, String>) -> Vec<Restart> {
    annotations
        .get(keys::LAST_RESTARTS)
        .map(|v| parse(v))
        .unwrap_or_default()
}

/// `current` with `ours` added, the newest last: an entry of the same stop is replaced by ours,
/// and the oldest go beyond [`MAX_ENTRIES`].
pub fn merge(current: &[Restart], ours: &[Restart]) -> Vec<Restart> {
    let mut out: Vec<Restart> = current
        .iter()
        .filter(|c| !ours.iter().any(|o| o.same_stop(c)))
        .cloned()
        .collect();
    out.extend(ours.iter().cloned());
    let extra = out.len().saturating_sub(MAX_ENTRIES);
    out.drain(..extra);
    out
}

/// The annotation value of `entries`.
pub fn to_value(entries: &[Restart]) -> String {
    serde_json::to_string(entries).expect("a list of strings always serializes")
}

// === impl Book ===

/// A pod by name and UID (a pod of the same name later is another pod).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodId {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl PodId {
    /// The pod's identity.
    pub fn of(pod: &Pod) -> Self {
        PodId {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
        }
    }
}

struct Recorded {
    at: Instant,
    entry: Restart,
    /// Whether a write that carried it succeeded.
    written: bool,
}

impl Recorded {
    /// Whether it is still kept at `now` ([`RETENTION`]).
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < RETENTION
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The stops this daemon made lately, by pod, shared by the controllers that stop containers,
/// and the counter of every stop by reason (cheap to clone: handles to shared values).
#[derive(Clone)]
pub struct Book {
    pods: Arc<Mutex<HashMap<PodId, Vec<Recorded>>>>,
    stops: Family<ReasonLabel, Counter>,
}

impl Book {
    /// A book whose counter is `container_stops_total` on `registry` (`kruised_` prefixed).
    pub fn register(registry: &mut Registry) -> Self {
        let book = Book {
            pods: Arc::new(Mutex::new(HashMap::new())),
            stops: Family::default(),
        };
        registry.register(
            "container_stops",
            "Containers kruised stopped, by reason (env-from-metadata, stale-recreation, \
             kubelet-did-not-recreate, recreate-request); a crash is no stop of kruised's",
            book.stops.clone(),
        );
        book
    }

    /// Records a stop of a container of `pod` (counted at once; written by the pod's next
    /// write of the annotation).
    pub fn record(&self, pod: PodId, entry: Restart) {
        self.stops
            .get_or_create(&ReasonLabel {
                reason: entry.reason.clone(),
            })
            .inc();
        let now = Instant::now();
        let mut pods = lock(&self.pods);
        for list in pods.values_mut() {
            list.retain(|r| r.fresh(now));
        }
        pods.retain(|_, list| !list.is_empty());
        let list = pods.entry(pod).or_default();
        list.retain(|r| !r.entry.same_stop(&entry));
        list.push(Recorded {
            at: now,
            entry,
            written: false,
        });
        let extra = list.len().saturating_sub(MAX_ENTRIES);
        list.drain(..extra);
    }

    /// The value the annotation of `pod` must take to hold every stop recorded here, or `None`
    /// when `annotations` (a copy of the pod's) hold them already.
    pub fn update(&self, pod: &PodId, annotations: &BTreeMap<String, String>) -> Option<String> {
        let now = Instant::now();
        let ours: Vec<Restart> = lock(&self.pods)
            .get(pod)?
            .iter()
            .filter(|r| r.fresh(now))
            .map(|r| r.entry.clone())
            .collect();
        if ours.is_empty() {
            return None;
        }
        let current = of_pod(annotations);
        let merged = merge(&current, &ours);
        let value = to_value(&merged);
        (annotations.get(keys::LAST_RESTARTS) != Some(&value)).then_some(value)
    }

    /// A write of `value` to the annotation of `pod` succeeded: the stops it holds are written.
    pub fn written(&self, pod: &PodId, value: &str) {
        let held = parse(value);
        if let Some(list) = lock(&self.pods).get_mut(pod) {
            for r in list.iter_mut() {
                r.written |= held.iter().any(|h| h == &r.entry);
            }
        }
    }

    /// The pod `namespace/name` if a stop of its is recorded and not yet written.
    pub fn unwritten(&self, namespace: &str, name: &str) -> Option<PodId> {
        let now = Instant::now();
        lock(&self.pods)
            .iter()
            .find(|(id, list)| {
                id.namespace == namespace
                    && id.name == name
                    && list.iter().any(|r| !r.written && r.fresh(now))
            })
            .map(|(id, _)| id.clone())
    }

    /// Forgets the stops of a pod that is gone.
    pub fn forget(&self, uid: &str) {
        lock(&self.pods).retain(|id, _| id.uid != uid);
    }

    /// Forgets every pod whose UID is not in `live` (a relist hid their deletions).
    pub fn retain(&self, live: &std::collections::HashSet<String>) {
        lock(&self.pods).retain(|id, _| live.contains(&id.uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(container: &str, id: &str, reason: &str) -> Restart {
        Restart {
            container: container.into(),
            container_id: format!("containerd://{id}"),
            reason: reason.into(),
            detail: String::new(),
            time: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn annotated(value: &str) -> BTreeMap<String, String> {
        [(keys::LAST_RESTARTS.to_string(), value.to_string())].into()
    }

    fn pod(uid: &str) -> PodId {
        PodId {
            namespace: "default".into(),
            name: "web-0".into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn the_annotation_keeps_the_last_five_stops_the_newest_last() {
        let mut list = Vec::new();
        for i in 0..8 {
            list = merge(
                &list,
                &[stop("main", &format!("c{i}"), "env-from-metadata")],
            );
        }
        let ids: Vec<&str> = list.iter().map(Restart::runtime_id).collect();
        assert_eq!(ids, ["c3", "c4", "c5", "c6", "c7"]);
        assert_eq!(parse(&to_value(&list)), list, "what is written reads back");
        // the same stop recorded again replaces its entry
        let again = merge(&list, &[stop("main", "c5", RECREATE_REQUEST)]);
        assert_eq!(again.len(), 5);
        assert_eq!(again[4].reason, RECREATE_REQUEST);
        assert_eq!(again.iter().filter(|r| r.runtime_id() == "c5").count(), 1);
    }

    #[test]
    fn a_written_entry_has_the_fields_explain_reads_and_omits_an_empty_detail() {
        let value = to_value(&[Restart {
            detail: "ROLE (annotation role)".into(),
            ..stop("main", "abc", "env-from-metadata")
        }]);
        assert_eq!(
            value,
            r#"[{"container":"main","containerID":"containerd://abc","reason":"env-from-metadata","detail":"ROLE (annotation role)","time":"2026-01-01T00:00:00Z"}]"#
        );
        assert!(!to_value(&[stop("main", "abc", "x")]).contains("detail"));
        let now = Restart::now("main", "containerd://abc".into(), RECREATE_REQUEST, "r1");
        assert!(now.time.parse::<Timestamp>().is_ok(), "{}", now.time);
    }

    #[test]
    fn an_annotation_written_by_the_pods_author_is_read_leniently_and_within_bounds() {
        // the pod's author can write any value: it never fails a parse, never grows without
        // bound, and keeps no control character for a terminal
        for garbage in ["", "null", "{}", "[1,2]", "not json", "[{\"container\":1}]"] {
            assert!(parse(garbage).is_empty(), "{garbage}");
        }
        assert!(parse(&"[".repeat(100_000)).is_empty(), "too long: not read");
        let nested = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        assert!(parse(&nested).is_empty(), "too deep: not read");
        let hostile = serde_json::json!([
            {"container": "main", "containerID": "containerd://a", "reason": "x\u{1b}[31mred\ninjected",
             "detail": "d".repeat(10_000), "time": "yesterday", "extra": {"ignored": true}},
            {"container": "", "containerID": "containerd://b", "reason": "x"},
            {"containerID": "containerd://c", "reason": "x"},
            "a string",
        ]);
        let read = parse(&hostile.to_string());
        assert_eq!(read.len(), 1, "{read:?}");
        let r = &read[0];
        assert!(!r.reason.chars().any(char::is_control), "{:?}", r.reason);
        assert!(
            r.detail.len() <= MAX_DETAIL + '…'.len_utf8(),
            "{}",
            r.detail.len()
        );
        assert_eq!(r.time, "", "a time that does not parse is dropped");
        let many: Vec<Restart> = (0..50).map(|i| stop("main", &i.to_string(), "x")).collect();
        let read = parse(&serde_json::to_string(&many).unwrap());
        assert_eq!(read.len(), MAX_ENTRIES);
        assert_eq!(read[4].runtime_id(), "49", "the last ones");
    }

    #[test]
    fn the_book_writes_what_the_pod_lacks_and_nothing_when_it_holds_it() {
        let book = Book::register(&mut Registry::default());
        let p = pod("u1");
        assert_eq!(book.update(&p, &BTreeMap::new()), None, "nothing recorded");
        book.record(p.clone(), stop("main", "a", "env-from-metadata"));
        assert_eq!(book.unwritten("default", "web-0"), Some(p.clone()));
        let value = book
            .update(&p, &BTreeMap::new())
            .expect("the stop to write");
        assert_eq!(parse(&value), [stop("main", "a", "env-from-metadata")]);
        book.written(&p, &value);
        assert_eq!(book.unwritten("default", "web-0"), None);
        assert_eq!(book.update(&p, &annotated(&value)), None, "held already");
        // a writer whose copy was older took the entry out: it is written again
        let other = to_value(&[stop("side", "b", RECREATE_REQUEST)]);
        let again = book.update(&p, &annotated(&other)).expect("written again");
        let ids: Vec<String> = parse(&again)
            .iter()
            .map(|r| r.runtime_id().to_string())
            .collect();
        assert_eq!(ids, ["b", "a"], "the other writer's entry kept");
        // another pod of the same name is another pod
        assert_eq!(book.update(&pod("u2"), &BTreeMap::new()), None);
        book.forget("u1");
        assert_eq!(book.update(&p, &BTreeMap::new()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_book_keeps_a_stop_ten_minutes_then_leaves_the_pod_as_it_is() {
        // long past any write of it: a stop older than that is the annotation's alone
        let book = Book::register(&mut Registry::default());
        let p = pod("u1");
        book.record(p.clone(), stop("main", "a", "env-from-metadata"));
        tokio::time::advance(RETENTION - Duration::from_secs(1)).await;
        assert!(book.update(&p, &BTreeMap::new()).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(book.update(&p, &BTreeMap::new()), None);
        assert_eq!(book.unwritten("default", "web-0"), None);
    }

    #[test]
    fn every_stop_is_counted_by_reason() {
        let mut registry = Registry::default();
        let book = Book::register(&mut registry);
        book.record(pod("u1"), stop("main", "a", "env-from-metadata"));
        book.record(pod("u1"), stop("main", "b", RECREATE_REQUEST));
        book.record(pod("u2"), stop("main", "c", RECREATE_REQUEST));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("container_stops_total{reason=\"recreate-request\"} 2\n")
                && text.contains("container_stops_total{reason=\"env-from-metadata\"} 1\n"),
            "{text}"
        );
    }
}
