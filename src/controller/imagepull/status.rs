//! The NodeImage status the daemon reports, and the patch that writes it.
//!
//! The daemon owns the counters (`desired`, `succeeded`, `failed`, `pulling`, `waiting`) and
//! `imageStatuses`; everything else in the status (`firstSyncStatus`, fields of newer kruise
//! versions) belongs to the manager and is never sent. The write is a JSON merge patch on
//! `/status` with the counters and every image's tag list (a list is replaced whole by a merge
//! patch); an image that left the spec is removed with `null`, since `imageStatuses` is a map
//! and a merge patch would otherwise keep its key.
//!
//! A status equal, in those fields, to the freshest stored one is not written at all; nor is one
//! already sent when nobody wrote since (see [`decide`]).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::state::TagKey;
use crate::k8s::crd::{ImageStatus, ImageTagStatus, NodeImageSpec, NodeImageStatus};

/// The status for `spec` from the tags' current statuses (kruise's `GetStatus` + counters):
/// each image's tags in spec order, then sorted by tag; images without any tag status left out;
/// counters recomputed.
pub fn build(spec: &NodeImageSpec, tags: &BTreeMap<TagKey, ImageTagStatus>) -> NodeImageStatus {
    let mut status = NodeImageStatus::default();
    for (image, ispec) in &spec.images {
        let mut seen = std::collections::BTreeSet::new();
        let list: Vec<ImageTagStatus> = ispec
            .tags
            .iter()
            .filter(|t| seen.insert(t.tag.as_str()))
            .filter_map(|t| tags.get(&(image.clone(), t.tag.clone())).cloned())
            .collect();
        if list.is_empty() {
            continue;
        }
        let mut s = ImageStatus { tags: list };
        s.sort_tags();
        status.image_statuses.insert(image.clone(), s);
    }
    status.recount(spec.desired());
    status
}

/// Whether the fields the daemon owns are equal.
pub fn same_owned_fields(a: &NodeImageStatus, b: &NodeImageStatus) -> bool {
    a.desired == b.desired
        && a.succeeded == b.succeeded
        && a.failed == b.failed
        && a.pulling == b.pulling
        && a.waiting == b.waiting
        && a.image_statuses == b.image_statuses
}

/// Whether `a` and `b` differ, and only in tags' `progress`: a write that only moves progress
/// bars, which goes at a slower pace (`Settings::progress_min_interval`).
pub fn only_progress_differs(a: &NodeImageStatus, b: &NodeImageStatus) -> bool {
    let without_progress = |s: &NodeImageStatus| {
        let mut s = s.clone();
        for tag in s
            .image_statuses
            .values_mut()
            .flat_map(|i| i.tags.iter_mut())
        {
            tag.progress = 0;
        }
        s
    };
    !same_owned_fields(a, b) && same_owned_fields(&without_progress(a), &without_progress(b))
}

/// Whether `a` and `b` differ at most in tags' `progress` (or not at all): nothing that
/// would need a write sooner than the progress pace.
pub fn at_most_progress_differs(a: &NodeImageStatus, b: &NodeImageStatus) -> bool {
    same_owned_fields(a, b) || only_progress_differs(a, b)
}

/// What this process last wrote: the status it sent and what the server stored, at the
/// `resourceVersion` the write produced.
#[derive(Clone, Debug, PartialEq)]
pub struct LastWrite {
    /// The object's `resourceVersion` after the write.
    pub resource_version: u64,
    /// The status as sent.
    pub sent: NodeImageStatus,
    /// The status as the server stored it (the write's answer).
    pub stored: NodeImageStatus,
}

/// The patch to write, if any. `stored` is the status in the watch cache at `stored_rv`.
///
/// The baseline is the freshest stored status: the cache, or the answer to our last write when
/// that is newer. Nothing is written when the owned fields equal it, nor when we already sent
/// exactly `want` and nobody wrote since: a server whose CRD prunes a field (kruise 1.8 has no
/// `status.waiting`) would otherwise be rewritten forever.
pub fn decide(
    want: &NodeImageStatus,
    stored: Option<&NodeImageStatus>,
    stored_rv: u64,
    last: Option<&LastWrite>,
) -> Option<Value> {
    let (baseline, baseline_rv) = match last {
        Some(l) if l.resource_version > stored_rv => (Some(&l.stored), l.resource_version),
        _ => (stored, stored_rv),
    };
    // (resourceVersions that are not numbers read as 0 and never match: compare contents)
    if let Some(l) = last
        && l.resource_version > 0
        && l.resource_version == baseline_rv
        && same_owned_fields(&l.sent, want)
    {
        return None;
    }
    merge_patch(baseline, want)
}

/// The merge patch (the value of `status`) that turns `stored` into `want` in the fields the
/// daemon owns, or `None` when they are already equal.
pub fn merge_patch(stored: Option<&NodeImageStatus>, want: &NodeImageStatus) -> Option<Value> {
    let empty = NodeImageStatus::default();
    let stored = stored.unwrap_or(&empty);
    if same_owned_fields(stored, want) {
        return None;
    }
    let mut images = Map::new();
    for (name, s) in &want.image_statuses {
        images.insert(name.clone(), json!({ "tags": s.tags }));
    }
    for name in stored.image_statuses.keys() {
        if !want.image_statuses.contains_key(name) {
            images.insert(name.clone(), Value::Null);
        }
    }
    let mut patch = json!({
        "desired": want.desired,
        "succeeded": want.succeeded,
        "failed": want.failed,
        "pulling": want.pulling,
        "waiting": want.waiting,
    });
    if !images.is_empty() {
        patch["imageStatuses"] = Value::Object(images);
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::imagepull::state::{fail, start_pulling, succeed, waiting};
    use crate::k8s::crd::{ImagePullPhase, ImageSpec, ImageTagSpec, SyncStatus};
    use crate::k8s::time::now_seconds as now;

    fn spec(tags: &[(&str, &str)]) -> NodeImageSpec {
        let mut s = NodeImageSpec::default();
        for (image, tag) in tags {
            s.images
                .entry(image.to_string())
                .or_insert_with(ImageSpec::default)
                .tags
                .push(ImageTagSpec {
                    tag: tag.to_string(),
                    ..Default::default()
                });
        }
        s
    }

    fn tag(t: &str) -> ImageTagStatus {
        waiting(&ImageTagSpec {
            tag: t.into(),
            ..Default::default()
        })
    }

    fn key(i: &str, t: &str) -> TagKey {
        (i.into(), t.into())
    }

    #[test]
    fn status_lists_tags_sorted_and_counts_phases() {
        let s = spec(&[
            ("nginx", "latest"),
            ("nginx", "1.9"),
            ("nginx", "1.10"),
            ("redis", "7"),
        ]);
        let mut pulling = tag("1.9");
        start_pulling(&mut pulling, now());
        let mut ok = tag("1.10");
        succeed(&mut ok, now(), "nginx@sha256:1".into(), String::new());
        let mut bad = tag("7");
        fail(&mut bad, now(), "no".into());
        let tags = [
            (key("nginx", "latest"), tag("latest")),
            (key("nginx", "1.9"), pulling),
            (key("nginx", "1.10"), ok),
            (key("redis", "7"), bad),
            // not in the spec: ignored
            (key("gone", "1"), tag("1")),
        ]
        .into();
        let st = build(&s, &tags);
        let order: Vec<_> = st.image_statuses["nginx"]
            .tags
            .iter()
            .map(|t| t.tag.as_str())
            .collect();
        assert_eq!(order, ["1.10", "1.9", "latest"]);
        assert!(!st.image_statuses.contains_key("gone"));
        assert_eq!(
            (st.desired, st.succeeded, st.failed, st.pulling, st.waiting),
            (4, 1, 1, 1, 1)
        );
    }

    #[test]
    fn an_image_without_any_tag_status_is_left_out() {
        let st = build(&spec(&[("nginx", "1")]), &BTreeMap::new());
        assert!(st.image_statuses.is_empty());
        assert_eq!(st.desired, 1);
    }

    #[test]
    fn an_equal_status_is_not_written_even_with_other_fields_set() {
        let s = spec(&[("nginx", "1")]);
        let want = build(&s, &[(key("nginx", "1"), tag("1"))].into());
        let mut stored = want.clone();
        stored.first_sync_status = Some(SyncStatus::default());
        assert_eq!(merge_patch(Some(&stored), &want), None);
        assert!(merge_patch(None, &want).is_some());
    }

    #[test]
    fn the_patch_carries_counters_and_tags_and_never_first_sync_status() {
        let s = spec(&[("nginx", "1")]);
        let want = build(&s, &[(key("nginx", "1"), tag("1"))].into());
        let stored = NodeImageStatus {
            first_sync_status: Some(SyncStatus::default()),
            ..Default::default()
        };
        let p = merge_patch(Some(&stored), &want).unwrap();
        assert_eq!(
            p,
            json!({"desired": 1, "succeeded": 0, "failed": 0, "pulling": 0, "waiting": 1,
                   "imageStatuses": {"nginx": {"tags": [{"tag": "1", "phase": "Waiting"}]}}})
        );
    }

    #[test]
    fn an_image_that_left_the_spec_is_removed_with_null() {
        let before = build(
            &spec(&[("nginx", "1"), ("redis", "7")]),
            &[(key("nginx", "1"), tag("1")), (key("redis", "7"), tag("7"))].into(),
        );
        let after = build(
            &spec(&[("nginx", "1")]),
            &[(key("nginx", "1"), tag("1"))].into(),
        );
        let p = merge_patch(Some(&before), &after).unwrap();
        assert_eq!(p["imageStatuses"]["redis"], Value::Null);
        assert_eq!(p["imageStatuses"]["nginx"]["tags"][0]["phase"], "Waiting");
        assert_eq!(p["desired"], 1);
        // all images gone: every key is nulled, the counters go to zero
        let none = build(&NodeImageSpec::default(), &BTreeMap::new());
        let p = merge_patch(Some(&before), &none).unwrap();
        assert_eq!(p["imageStatuses"], json!({"nginx": null, "redis": null}));
        assert_eq!(p["waiting"], 0);
    }

    fn last(rv: u64, sent: &NodeImageStatus, stored: &NodeImageStatus) -> LastWrite {
        LastWrite {
            resource_version: rv,
            sent: sent.clone(),
            stored: stored.clone(),
        }
    }

    #[test]
    fn the_freshest_stored_status_is_the_baseline() {
        let s = spec(&[("nginx", "1")]);
        let want = build(&s, &[(key("nginx", "1"), tag("1"))].into());
        let old = NodeImageStatus::default();
        // the cache still shows the old status, but our write (newer) stored `want`
        assert_eq!(
            decide(&want, Some(&old), 5, Some(&last(6, &want, &want))),
            None
        );
        // someone wrote after us: the cache is newer and differs, so we write again
        let mut theirs = want.clone();
        theirs.waiting = 0;
        theirs.failed = 1;
        assert!(decide(&want, Some(&theirs), 7, Some(&last(6, &want, &want))).is_some());
        // no write of ours yet: the cache decides
        assert!(decide(&want, Some(&old), 5, None).is_some());
        assert_eq!(decide(&want, Some(&want), 5, None), None);
    }

    #[test]
    fn a_field_the_server_prunes_is_not_written_again_and_again() {
        let s = spec(&[("nginx", "1")]);
        let want = build(&s, &[(key("nginx", "1"), tag("1"))].into());
        assert_eq!(want.waiting, 1);
        // a kruise 1.8 CRD has no status.waiting: the server drops it
        let mut pruned = want.clone();
        pruned.waiting = 0;
        let l = last(8, &want, &pruned);
        assert_eq!(decide(&want, Some(&pruned), 8, Some(&l)), None);
        assert_eq!(
            decide(&want, Some(&pruned), 7, Some(&l)),
            None,
            "cache behind our write"
        );
        // a real change is still written
        let mut changed = want.clone();
        changed.waiting = 0;
        changed.pulling = 1;
        assert!(decide(&changed, Some(&pruned), 8, Some(&l)).is_some());
    }

    #[test]
    fn a_status_whose_tags_only_moved_their_progress_is_told_apart() {
        let s = spec(&[("nginx", "1"), ("redis", "7")]);
        let mut pulling = tag("1");
        start_pulling(&mut pulling, now());
        let before = build(
            &s,
            &[
                (key("nginx", "1"), pulling.clone()),
                (key("redis", "7"), tag("7")),
            ]
            .into(),
        );
        let mut moved = pulling.clone();
        moved.progress = 40;
        let after = build(
            &s,
            &[
                (key("nginx", "1"), moved.clone()),
                (key("redis", "7"), tag("7")),
            ]
            .into(),
        );
        assert!(only_progress_differs(&before, &after));
        assert!(!only_progress_differs(&before, &before), "nothing differs");
        let mut done = moved;
        succeed(&mut done, now(), "nginx@sha256:1".into(), String::new());
        let finished = build(
            &s,
            &[(key("nginx", "1"), done), (key("redis", "7"), tag("7"))].into(),
        );
        assert!(!only_progress_differs(&after, &finished), "a phase changed");
    }

    #[test]
    fn phases_round_trip_through_json_unchanged() {
        let s = spec(&[("nginx", "1")]);
        let mut t = tag("1");
        start_pulling(&mut t, now());
        succeed(
            &mut t,
            now(),
            "nginx@sha256:1".into(),
            "secret x not found".into(),
        );
        let want = build(&s, &[(key("nginx", "1"), t)].into());
        let back: NodeImageStatus =
            serde_json::from_value(serde_json::to_value(&want).unwrap()).unwrap();
        assert!(same_owned_fields(&back, &want));
        assert_eq!(
            back.image_statuses["nginx"].tags[0].phase,
            ImagePullPhase::Succeeded
        );
    }
}
