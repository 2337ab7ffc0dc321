//! The pull task state machine and the decisions around it, as pure functions.
//!
//! ```text
//! new tag (or new version) ──► Waiting{tag, version}
//!     │  a pull slot is free (--max-workers-for-pull-image; unlimited by default)
//!     ▼
//! Pulling{startTime}
//!     │  attempts 0..=backoffLimit, each at most timeoutSeconds (and never past the
//!     │  activeDeadlineSeconds after startTime); between attempts 1 s, 2 s, 4 s ... ≤ 30 s
//!     ▼
//! Succeeded{completionTime, progress 100, imageID}  |  Failed{completionTime, message}
//! ```
//!
//! A tag is done only when the stored status has a `completionTime` for the spec's `version`;
//! such a status is adopted and nothing is pulled. A new `version` stops the running task and
//! starts another; a tag that leaves the spec stops its task and loses its status.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::k8s::crd::{
    ImagePullPhase, ImageTagSpec, ImageTagStatus, NodeImageSpec, NodeImageStatus,
};

/// The identity of a pull task: image name (the NodeImage key) and tag.
pub type TagKey = (String, String);

/// A new task's first status: `Waiting` for `version`.
pub fn waiting(spec: &ImageTagSpec) -> ImageTagStatus {
    ImageTagStatus {
        tag: spec.tag.clone(),
        phase: ImagePullPhase::Waiting,
        version: spec.version,
        ..Default::default()
    }
}

/// The task got a pull slot.
pub fn start_pulling(s: &mut ImageTagStatus, at: Time) {
    s.phase = ImagePullPhase::Pulling;
    s.start_time = Some(at);
}

/// The image is on the node.
pub fn succeed(s: &mut ImageTagStatus, at: Time, image_id: String, message: String) {
    s.phase = ImagePullPhase::Succeeded;
    s.completion_time = Some(at);
    s.progress = 100;
    s.image_id = image_id;
    s.message = message;
}

/// The task gave up.
pub fn fail(s: &mut ImageTagStatus, at: Time, message: String) {
    s.phase = ImagePullPhase::Failed;
    s.completion_time = Some(at);
    s.message = message;
}

/// Whether the phase is final.
pub fn is_terminal(phase: &ImagePullPhase) -> bool {
    matches!(phase, ImagePullPhase::Succeeded | ImagePullPhase::Failed)
}

/// How long the next attempt may take: the tag's timeout, cut to what is left before the
/// active deadline. `None`: the deadline has passed.
pub fn attempt_budget(timeout: Duration, deadline_left: Option<Duration>) -> Option<Duration> {
    match deadline_left {
        Some(left) if left.is_zero() => None,
        Some(left) => Some(timeout.min(left)),
        None => Some(timeout),
    }
}

/// What the controller knows about a tag it tracks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// The spec version the entry is for.
    pub version: i64,
    /// Whether a task of this process runs it and has not finished.
    pub active: bool,
}

/// What to do after the spec or the stored status changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Tasks to stop (tag gone, new version, or finished by someone else).
    pub stop: Vec<TagKey>,
    /// Finished statuses to adopt: the tag is done for its version.
    pub adopt: Vec<(TagKey, ImageTagStatus)>,
    /// Tags to start a task for.
    pub start: Vec<(TagKey, ImageTagSpec)>,
}

/// Compares the spec and the stored status with what is tracked (kruise's `workerPool.Sync`).
pub fn plan(
    spec: &NodeImageSpec,
    stored: Option<&NodeImageStatus>,
    tracked: &BTreeMap<TagKey, Tracked>,
) -> Plan {
    let mut plan = Plan::default();
    let mut wanted = BTreeSet::new();
    for (image, ispec) in &spec.images {
        for tag in &ispec.tags {
            let key = (image.clone(), tag.tag.clone());
            if !wanted.insert(key.clone()) {
                // a tag listed twice: the first entry counts
                continue;
            }
            let done = stored
                .and_then(|s| s.tag_status(image, &tag.tag, tag.version))
                .filter(|s| s.is_finished());
            match tracked.get(&key) {
                Some(t) if t.version == tag.version => {
                    // someone else (the manager's "not responded" timeout) finished it
                    if let (true, Some(d)) = (t.active, done) {
                        plan.stop.push(key.clone());
                        plan.adopt.push((key, d.clone()));
                    }
                }
                Some(_) => {
                    plan.stop.push(key.clone());
                    match done {
                        Some(d) => plan.adopt.push((key, d.clone())),
                        None => plan.start.push((key, tag.clone())),
                    }
                }
                None => match done {
                    Some(d) => plan.adopt.push((key, d.clone())),
                    None => plan.start.push((key, tag.clone())),
                },
            }
        }
    }
    plan.stop
        .extend(tracked.keys().filter(|k| !wanted.contains(*k)).cloned());
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::crd::{ImageSpec, ImageStatus};
    use crate::k8s::time::now_seconds as now;

    fn spec(tags: &[(&str, &str, i64)]) -> NodeImageSpec {
        let mut s = NodeImageSpec::default();
        for (image, tag, version) in tags {
            s.images
                .entry(image.to_string())
                .or_insert_with(ImageSpec::default)
                .tags
                .push(ImageTagSpec {
                    tag: tag.to_string(),
                    version: *version,
                    ..Default::default()
                });
        }
        s
    }

    fn finished(tag: &str, version: i64) -> ImageTagStatus {
        let mut s = waiting(&ImageTagSpec {
            tag: tag.into(),
            version,
            ..Default::default()
        });
        succeed(&mut s, now(), "nginx@sha256:1".into(), String::new());
        s
    }

    fn stored(image: &str, tags: Vec<ImageTagStatus>) -> NodeImageStatus {
        let mut st = NodeImageStatus::default();
        st.image_statuses.insert(image.into(), ImageStatus { tags });
        st
    }

    fn key(i: &str, t: &str) -> TagKey {
        (i.into(), t.into())
    }

    #[test]
    fn a_task_goes_waiting_pulling_then_succeeded_or_failed() {
        let tag = ImageTagSpec {
            tag: "1.25".into(),
            version: 3,
            ..Default::default()
        };
        let mut s = waiting(&tag);
        assert_eq!(
            (s.phase.clone(), s.version, s.start_time.clone()),
            (ImagePullPhase::Waiting, 3, None)
        );
        let t = now();
        start_pulling(&mut s, t.clone());
        assert_eq!(
            (s.phase.clone(), s.start_time.clone()),
            (ImagePullPhase::Pulling, Some(t.clone()))
        );
        assert!(!is_terminal(&s.phase));
        let mut ok = s.clone();
        succeed(&mut ok, t.clone(), "nginx@sha256:abc".into(), String::new());
        assert!(ok.is_finished() && is_terminal(&ok.phase));
        assert_eq!(
            (ok.progress, ok.image_id.as_str()),
            (100, "nginx@sha256:abc")
        );
        fail(&mut s, t, "registry says no".into());
        assert_eq!(
            (s.phase, s.message.as_str()),
            (ImagePullPhase::Failed, "registry says no")
        );
        assert!(s.completion_time.is_some());
    }

    #[test]
    fn the_attempt_budget_is_cut_by_the_active_deadline() {
        let t = Duration::from_secs(600);
        assert_eq!(attempt_budget(t, None), Some(t));
        assert_eq!(
            attempt_budget(t, Some(Duration::from_secs(5))),
            Some(Duration::from_secs(5))
        );
        assert_eq!(attempt_budget(t, Some(Duration::ZERO)), None);
    }

    #[test]
    fn new_tags_start_and_finished_tags_of_the_same_version_are_adopted() {
        let s = spec(&[("nginx", "1", 1), ("nginx", "2", 1)]);
        let st = stored("nginx", vec![finished("1", 1)]);
        let p = plan(&s, Some(&st), &BTreeMap::new());
        assert_eq!(p.adopt.len(), 1);
        assert_eq!(p.adopt[0].0, key("nginx", "1"));
        assert_eq!(p.start.len(), 1);
        assert_eq!(p.start[0].0, key("nginx", "2"));
        assert!(p.stop.is_empty());
    }

    #[test]
    fn a_finished_status_of_another_version_does_not_count() {
        let s = spec(&[("nginx", "1", 2)]);
        let st = stored("nginx", vec![finished("1", 1)]);
        let p = plan(&s, Some(&st), &BTreeMap::new());
        assert!(p.adopt.is_empty());
        assert_eq!(p.start[0].1.version, 2);
    }

    #[test]
    fn an_unfinished_stored_status_is_pulled_again() {
        let s = spec(&[("nginx", "1", 1)]);
        let mut pulling = waiting(&s.images["nginx"].tags[0]);
        start_pulling(&mut pulling, now());
        let st = stored("nginx", vec![pulling]);
        let p = plan(&s, Some(&st), &BTreeMap::new());
        assert_eq!(p.start.len(), 1);
    }

    #[test]
    fn a_version_bump_stops_the_old_task_and_starts_a_new_one() {
        let s = spec(&[("nginx", "1", 2)]);
        let tracked = [(
            key("nginx", "1"),
            Tracked {
                version: 1,
                active: true,
            },
        )]
        .into();
        let p = plan(&s, None, &tracked);
        assert_eq!(p.stop, [key("nginx", "1")]);
        assert_eq!(p.start.len(), 1);
        // a bump after the task finished pulls again too
        let tracked = [(
            key("nginx", "1"),
            Tracked {
                version: 1,
                active: false,
            },
        )]
        .into();
        let st = stored("nginx", vec![finished("1", 1)]);
        let p = plan(&s, Some(&st), &tracked);
        assert_eq!((p.stop.len(), p.start.len()), (1, 1));
    }

    #[test]
    fn tags_removed_from_the_spec_are_stopped() {
        let s = spec(&[("nginx", "1", 1)]);
        let tracked = [
            (
                key("nginx", "1"),
                Tracked {
                    version: 1,
                    active: true,
                },
            ),
            (
                key("nginx", "2"),
                Tracked {
                    version: 1,
                    active: true,
                },
            ),
            (
                key("redis", "7"),
                Tracked {
                    version: 1,
                    active: false,
                },
            ),
        ]
        .into();
        let p = plan(&s, None, &tracked);
        assert_eq!(p.stop, [key("nginx", "2"), key("redis", "7")]);
        assert!(p.start.is_empty() && p.adopt.is_empty());
    }

    #[test]
    fn a_running_task_finished_by_someone_else_is_stopped_and_adopted() {
        let s = spec(&[("nginx", "1", 1)]);
        let mut manager = finished("1", 1);
        fail(
            &mut manager,
            now(),
            "node has not responded for a long time".into(),
        );
        let st = stored("nginx", vec![manager.clone()]);
        let active = [(
            key("nginx", "1"),
            Tracked {
                version: 1,
                active: true,
            },
        )]
        .into();
        let p = plan(&s, Some(&st), &active);
        assert_eq!(p.stop, [key("nginx", "1")]);
        assert_eq!(p.adopt, [(key("nginx", "1"), manager)]);
        // our own finished task is simply kept
        let done = [(
            key("nginx", "1"),
            Tracked {
                version: 1,
                active: false,
            },
        )]
        .into();
        assert_eq!(plan(&s, Some(&st), &done), Plan::default());
    }

    #[test]
    fn a_tag_listed_twice_is_one_task() {
        let s = spec(&[("nginx", "1", 1), ("nginx", "1", 1)]);
        assert_eq!(plan(&s, None, &BTreeMap::new()).start.len(), 1);
    }
}
