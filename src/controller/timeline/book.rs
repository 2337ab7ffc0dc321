//! The node's timelines: one [`PodTrack`] per kruise-managed pod on the node (an update in
//! flight and the last one ended), forgotten when the pod leaves. The one place that locks;
//! [`Timelines`] is its handle (cheap to clone), for the watch task, the puller
//! ([`Timelines::image_present`]) and the admin endpoint ([`Timelines::view`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::facts::{PodFacts, bounded_image};
use super::track::{Ns, PodTrack, PresentBy, RuntimeContainer, Update};
use super::view::{PodTimelines, TimelineView};

/// A pod as the book keys it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodKey {
    /// Its UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug)]
struct Entry {
    namespace: String,
    name: String,
    track: PodTrack,
}

/// What a version of a pod asks of the watch task.
#[derive(Debug, Default)]
pub struct Observed {
    /// Updates it ended (superseded, abandoned, finished).
    pub ended: Vec<Update>,
    /// The runtime has more to tell of the update in flight.
    pub wants_runtime: bool,
    /// New images to ask the runtime for, once each.
    pub image_checks: Vec<String>,
}

/// The node's timelines (see the module's head). Cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct Timelines {
    pods: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Timelines {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // a panic while the lock was held leaves whole entries (no step is half-written)
        self.pods
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes in a version of pod `key` seen at `now`.
    pub fn observe_pod(&self, key: &PodKey, facts: &PodFacts, now: Ns) -> Observed {
        let mut pods = self.lock();
        let entry = pods.entry(key.uid.clone()).or_insert_with(|| Entry {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            track: PodTrack::default(),
        });
        let mut out = Observed::default();
        out.ended.extend(entry.track.observe(facts, now));
        if let Some(u) = &mut entry.track.current {
            out.wants_runtime = u.wants_runtime(facts);
            out.image_checks = u.take_image_checks();
        }
        out
    }

    /// Takes in what the runtime holds of pod `uid`'s containers.
    pub fn observe_runtime(&self, uid: &str, containers: &[RuntimeContainer]) {
        if let Some(e) = self.lock().get_mut(uid) {
            e.track.observe_runtime(containers);
        }
    }

    /// Ends pod `uid`'s update if it is done at `now`.
    pub fn finish_if_done(&self, uid: &str, now: Ns) -> Option<Update> {
        self.lock().get_mut(uid)?.track.finish_if_done(now)
    }

    /// Ends every update done at `now` (the meta no longer waited for, the in-flight limit).
    pub fn sweep(&self, now: Ns) -> Vec<(PodKey, Update)> {
        let mut pods = self.lock();
        pods.iter_mut()
            .filter_map(|(uid, e)| {
                let u = e.track.finish_if_done(now)?;
                let key = PodKey {
                    uid: uid.clone(),
                    namespace: e.namespace.clone(),
                    name: e.name.clone(),
                };
                Some((key, u))
            })
            .collect()
    }

    /// The puller's word: `image` is on the node for the update of pod `name` of `namespace`
    /// since `at` (the runtime's clock, `cri::clock::now_ns`). A word for a pod the node does
    /// not hold is dropped; one for an update not seen yet is kept for it (a few per pod).
    pub fn image_present(&self, namespace: &str, name: &str, image: &str, at: Ns) {
        let mut pods = self.lock();
        let entry = pods
            .values_mut()
            .find(|e| e.namespace == namespace && e.name == name);
        if let Some(e) = entry {
            e.track
                .image_present(&bounded_image(image), at, PresentBy::Puller);
        }
    }

    /// The runtime had `image` for pod `uid`'s update at `at`.
    pub fn image_already_present(&self, uid: &str, image: &str, at: Ns) {
        if let Some(e) = self.lock().get_mut(uid) {
            e.track.image_present(image, at, PresentBy::AlreadyPresent);
        }
    }

    /// Forgets pod `uid` (it left the node).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Forgets every pod not in `present` (UIDs): what a relist of the node's pods leaves.
    pub fn retain(&self, present: &std::collections::HashSet<String>) {
        self.lock().retain(|uid, _| present.contains(uid));
    }

    /// The timelines of pod `namespace/name`: the update in flight, then the last ended; `None`
    /// when the pod is not known here.
    pub fn view(&self, namespace: &str, name: &str) -> Option<PodTimelines> {
        let pods = self.lock();
        let e = pods
            .values()
            .find(|e| e.namespace == namespace && e.name == name)?;
        Some(PodTimelines {
            pod: format!("{namespace}/{name}"),
            source: "the daemon".to_string(),
            updates: e
                .track
                .current
                .iter()
                .chain(e.track.last.iter())
                .map(TimelineView::of)
                .collect(),
        })
    }

    /// How many pods are kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::timeline::facts::SpecContainer;

    fn facts(image: &str) -> PodFacts {
        PodFacts {
            spec: vec![SpecContainer {
                name: "main".into(),
                image: image.into(),
                env_hash: 0,
            }],
            ..PodFacts::default()
        }
    }

    #[test]
    fn a_pod_that_leaves_the_node_is_forgotten_and_a_word_for_an_unknown_pod_is_dropped() {
        let book = Timelines::default();
        let key = PodKey {
            uid: "u1".into(),
            namespace: "default".into(),
            name: "web-0".into(),
        };
        book.observe_pod(&key, &facts("app:v1"), 1);
        book.observe_pod(&key, &facts("app:v2"), 2);
        let view = book.view("default", "web-0").expect("known");
        assert_eq!(view.updates.len(), 1);
        assert_eq!(view.updates[0].state, "in progress");
        assert_eq!(view.updates[0].seen_by, "image-change");
        book.image_present("default", "someone-else", "app:v2", 3);
        assert_eq!(
            book.len(),
            1,
            "no entry made for a pod the node does not hold"
        );
        book.forget("u1");
        assert!(book.is_empty());
        assert_eq!(book.view("default", "web-0"), None);
        book.observe_pod(&key, &facts("app:v1"), 4);
        book.retain(&Default::default());
        assert!(book.is_empty(), "a relist without the pod forgets it");
    }
}
