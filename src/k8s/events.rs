//! Events as kruise-daemon records them: core `v1` Events (the only events kruise's Helm chart
//! lets `kruise-daemon-role` write), with client-go's `EventCorrelator` in front of the API:
//!
//! 1. aggregation: more than 9 distinct messages of the same source, object, type and reason
//!    within 10 minutes fold into one event "(combined from similar events): ...";
//! 2. deduplication: a repeat of an event already written PATCHes its `count`,
//!    `lastTimestamp` and `message` (strategic merge) instead of creating another;
//! 3. a spam filter: per source and object, a token bucket of 25 events refilled at one per
//!    5 minutes; what exceeds it is dropped.
//!
//! The correlator is a pure state machine over times ([`Correlator::correlate`]); the sink that
//! writes is in `k8s::write`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::time::Instant;

/// Records each cache keeps (client-go's `maxLruCacheEntries`).
const CACHE_ENTRIES: usize = 4096;
/// Distinct messages before similar events are combined.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// How long a group of similar events stays open.
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// Spam filter: tokens per source and object.
const SPAM_BURST: f64 = 25.0;
/// Spam filter: one token per this long.
const SPAM_REFILL: Duration = Duration::from_secs(300);
/// The message prefix of combined events.
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// One event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct EventSpec {
    /// The object it is about (with `fieldPath` for a container).
    pub regarding: ObjectReference,
    /// Warning or not (Normal).
    pub warning: bool,
    /// Machine-readable reason (kruise's: `Killing`, `PullImageSucceed`, ...).
    pub reason: String,
    /// Human-readable message.
    pub note: String,
    /// What was done; kept for the log (core v1 events written by client-go's recorder carry
    /// no action).
    pub action: String,
}

/// What the correlator decided to write.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// POST the event.
    Create(Box<Event>),
    /// PATCH the existing event `name` in `namespace` with `patch` (strategic merge); if it is
    /// gone, POST `event` instead.
    Patch {
        /// Namespace of the event.
        namespace: String,
        /// Its name.
        name: String,
        /// `{"count", "lastTimestamp", "message"}`.
        patch: serde_json::Value,
        /// The whole event, for the POST fallback.
        event: Box<Event>,
    },
}

/// A map that forgets its oldest keys beyond a bound.
#[derive(Debug)]
struct Bounded<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K: Clone + Eq + Hash, V> Bounded<K, V> {
    fn new() -> Self {
        Bounded {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    fn insert(&mut self, k: K, v: V) {
        if let Some(slot) = self.map.get_mut(&k) {
            *slot = v;
            return;
        }
        self.make_room();
        self.order.push_back(k.clone());
        self.map.insert(k, v);
    }

    fn make_room(&mut self) {
        if self.map.len() >= CACHE_ENTRIES
            && let Some(old) = self.order.pop_front()
        {
            self.map.remove(&old);
        }
    }

    fn entry_or_insert(&mut self, k: K, make: impl FnOnce() -> V) -> &mut V {
        if !self.map.contains_key(&k) {
            self.make_room();
            self.order.push_back(k.clone());
            self.map.insert(k.clone(), make());
        }
        self.map.get_mut(&k).expect("inserted above")
    }
}

#[derive(Debug)]
struct Aggregate {
    messages: HashSet<String>,
    last: Instant,
}

#[derive(Clone, Debug)]
struct Logged {
    name: String,
    count: i32,
    first: Time,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// client-go's `EventCorrelator` for one component.
#[derive(Debug)]
pub struct Correlator {
    component: String,
    host: String,
    aggregates: Bounded<String, Aggregate>,
    logged: Bounded<String, Logged>,
    buckets: Bounded<String, Bucket>,
}

fn reference_key(r: &ObjectReference) -> String {
    format!(
        "{}{}{}{}{}",
        r.kind.as_deref().unwrap_or_default(),
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default(),
        r.uid.as_deref().unwrap_or_default(),
        r.api_version.as_deref().unwrap_or_default()
    )
}

impl Correlator {
    /// A correlator for events of `component` on node `host`.
    pub fn new(component: &str, host: &str) -> Self {
        Correlator {
            component: component.to_string(),
            host: host.to_string(),
            aggregates: Bounded::new(),
            logged: Bounded::new(),
            buckets: Bounded::new(),
        }
    }

    fn event_type(spec: &EventSpec) -> &'static str {
        if spec.warning { "Warning" } else { "Normal" }
    }

    /// A new event object for `spec` with `message`, named as client-go names them.
    fn make_event(&self, spec: &EventSpec, message: &str, wall: Time) -> Event {
        let r = &spec.regarding;
        let nanos = wall.0.as_nanosecond();
        Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    r.name.as_deref().unwrap_or_default(),
                    nanos
                )),
                namespace: Some(event_namespace(r)),
                ..Default::default()
            },
            involved_object: r.clone(),
            reason: Some(spec.reason.clone()),
            message: Some(message.to_string()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()),
            }),
            first_timestamp: Some(wall.clone()),
            last_timestamp: Some(wall),
            count: Some(1),
            type_: Some(Self::event_type(spec).to_string()),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            ..Default::default()
        }
    }

    /// Decides what to write for `spec` at `now` (monotonic) / `wall` (the event's time);
    /// `None` when the spam filter drops it.
    pub fn correlate(&mut self, spec: &EventSpec, now: Instant, wall: Time) -> Option<Write> {
        let r = &spec.regarding;
        let ty = Self::event_type(spec);
        let source = format!("{}{}", self.component, self.host);
        let object = reference_key(r);

        // 1. aggregation
        let agg_key = format!(
            "{source}{object}{ty}{}{}{}",
            spec.reason, self.component, self.host
        );
        let record = self
            .aggregates
            .entry_or_insert(agg_key.clone(), || Aggregate {
                messages: HashSet::new(),
                last: now,
            });
        if now.duration_since(record.last) > AGGREGATE_WINDOW {
            record.messages.clear();
        }
        record.messages.insert(spec.note.clone());
        record.last = now;
        let (mut event, cache_key) = if record.messages.len() < AGGREGATE_MAX_EVENTS {
            let key = format!(
                "{source}{object}{}{ty}{}{}",
                r.field_path.as_deref().unwrap_or_default(),
                spec.reason,
                spec.note
            );
            (self.make_event(spec, &spec.note, wall.clone()), key)
        } else {
            // keep the set below the limit, so every later similar event lands here too
            if let Some(any) = record.messages.iter().next().cloned() {
                record.messages.remove(&any);
            }
            let message = format!("{COMBINED_PREFIX}{}", spec.note);
            let mut e = self.make_event(spec, &message, wall.clone());
            e.reporting_component = None;
            e.reporting_instance = None;
            (e, agg_key)
        };

        // 2. deduplication
        let previous = self.logged.get_mut(&cache_key).cloned();
        let write = match previous {
            Some(prev) => {
                event.metadata.name = Some(prev.name.clone());
                event.first_timestamp = Some(prev.first.clone());
                event.count = Some(prev.count + 1);
                let patch = serde_json::json!({
                    "count": prev.count + 1,
                    "lastTimestamp": event.last_timestamp,
                    "message": event.message,
                });
                Write::Patch {
                    namespace: event_namespace(r),
                    name: prev.name,
                    patch,
                    event: Box::new(event.clone()),
                }
            }
            None => Write::Create(Box::new(event.clone())),
        };
        let logged = Logged {
            name: event.metadata.name.clone().unwrap_or_default(),
            count: event.count.unwrap_or(1),
            first: event.first_timestamp.clone().unwrap_or(wall),
        };
        self.logged.insert(cache_key, logged);

        // 3. spam filter
        let spam_key = format!("{source}{object}{ty}");
        let bucket = self.buckets.entry_or_insert(spam_key, || Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return None;
        }
        bucket.tokens -= 1.0;
        Some(write)
    }
}

/// The namespace an event about `r` lives in: the object's, or `default` for cluster-scoped
/// objects.
pub fn event_namespace(r: &ObjectReference) -> String {
    r.namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(note: &str) -> EventSpec {
        EventSpec {
            regarding: ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some("web".into()),
                uid: Some("u1".into()),
                api_version: Some("v1".into()),
                field_path: Some("spec.containers{main}".into()),
                ..Default::default()
            },
            warning: false,
            reason: "Killing".into(),
            note: note.into(),
            action: "Restart".into(),
        }
    }

    fn wall() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_event_is_created_with_client_gos_name_and_fields() {
        let mut c = Correlator::new("kruise-daemon-containermeta", "node-a");
        let Some(Write::Create(e)) = c.correlate(&spec("stopping main"), Instant::now(), wall())
        else {
            panic!("a first event is created");
        };
        assert_eq!(
            e.metadata.name.as_deref(),
            Some("web.18fae27693b40000"),
            "<object>.<hex unix nanos>"
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(e.count, Some(1));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        let source = e.source.expect("source");
        assert_eq!(
            source.component.as_deref(),
            Some("kruise-daemon-containermeta")
        );
        assert_eq!(source.host.as_deref(), Some("node-a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_patches_the_count_of_the_first_event() {
        let mut c = Correlator::new("c", "h");
        let now = Instant::now();
        let first = c.correlate(&spec("same"), now, wall());
        let Some(Write::Create(e)) = first else {
            panic!()
        };
        let Some(Write::Patch {
            name, patch, event, ..
        }) = c.correlate(&spec("same"), now + Duration::from_secs(1), wall())
        else {
            panic!("a repeat is a patch");
        };
        assert_eq!(Some(name), e.metadata.name);
        assert_eq!(patch["count"], 2);
        assert_eq!(patch["message"], "same");
        assert_eq!(event.count, Some(2));
        let Some(Write::Patch { patch, .. }) = c.correlate(&spec("same"), now, wall()) else {
            panic!()
        };
        assert_eq!(patch["count"], 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tenth_distinct_message_is_combined_and_later_ones_join_it() {
        let mut c = Correlator::new("c", "h");
        let now = Instant::now();
        for i in 0..9 {
            assert!(matches!(
                c.correlate(&spec(&format!("m{i}")), now, wall()),
                Some(Write::Create(_))
            ));
        }
        let Some(Write::Create(combined)) = c.correlate(&spec("m9"), now, wall()) else {
            panic!("the tenth is a new, combined event");
        };
        assert_eq!(
            combined.message.as_deref(),
            Some("(combined from similar events): m9")
        );
        let Some(Write::Patch { name, patch, .. }) = c.correlate(&spec("m10"), now, wall()) else {
            panic!("the next similar one updates the combined event");
        };
        assert_eq!(Some(name), combined.metadata.name);
        assert_eq!(patch["message"], "(combined from similar events): m10");
    }

    #[tokio::test(start_paused = true)]
    async fn the_spam_filter_lets_25_through_then_one_per_five_minutes() {
        let mut c = Correlator::new("c", "h");
        let now = Instant::now();
        let through = (0..30)
            .filter(|_| c.correlate(&spec("same"), now, wall()).is_some())
            .count();
        assert_eq!(through, 25);
        assert!(
            c.correlate(&spec("same"), now + Duration::from_secs(299), wall())
                .is_none()
        );
        assert!(
            c.correlate(&spec("same"), now + Duration::from_secs(301), wall())
                .is_some()
        );
    }

    #[test]
    fn cluster_scoped_objects_have_their_events_in_default() {
        let r = ObjectReference {
            kind: Some("NodeImage".into()),
            name: Some("node-a".into()),
            ..Default::default()
        };
        assert_eq!(event_namespace(&r), "default");
    }
}
