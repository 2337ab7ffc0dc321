//! A timeline as the daemon's admin endpoint serves it and `kruised explain` prints it: JSON
//! both ways ([`PodTimelines`]), and text ([`render`]).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::track::{End, Ns, PresentBy, Step, Update};

/// A pod's timelines: the update in flight, then the last one that ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodTimelines {
    /// `namespace/name`.
    pub pod: String,
    /// Where they come from: the daemon, or what explain read from the runtime and the pod.
    pub source: String,
    /// The update in flight, then the last one that ended.
    pub updates: Vec<TimelineView>,
}

/// One update's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineView {
    /// `in progress`, `finished`, `superseded`, `abandoned`, `unfinished`, or `read back` (what
    /// explain rebuilt without the daemon).
    pub state: String,
    /// What showed the update first.
    pub seen_by: String,
    /// When it was seen (RFC3339, UTC).
    pub seen_at: String,
    /// First seen while already under way: its steps are shown, not measured.
    pub joined_late: bool,
    /// The containers it changes.
    pub containers: Vec<ContainerView>,
    /// Each step: when, and how long after the update was seen.
    pub steps: Vec<StepView>,
    /// From `InPlaceUpdateReady` False (or the update seen) to `Ready` again, in seconds.
    pub unready_seconds: Option<f64>,
}

/// A container an update changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    /// Its name.
    pub name: String,
    /// The new image.
    pub image: String,
    /// The runtime ID of the old container.
    pub old_container: Option<String>,
    /// The runtime ID of the new one.
    pub new_container: Option<String>,
}

/// One step of a timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepView {
    /// `image_present`, `container_stopped`, `container_started`, `ready`, `meta_written`.
    pub step: String,
    /// When (RFC3339, UTC, to the millisecond), if it happened.
    pub at: Option<String>,
    /// Seconds after the update was seen (0 for a step done before).
    pub after_seconds: Option<f64>,
    /// How it is known, where that varies (`image_present`).
    pub source: Option<String>,
}

/// Runtime time `ns` as RFC3339, UTC, to the millisecond.
pub fn rfc3339(ns: Ns) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns)).map_or_else(
        |_| format!("{ns}ns"),
        |t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    )
}

/// Seconds rounded to the millisecond.
fn seconds(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

impl TimelineView {
    /// The view of `u`.
    pub fn of(u: &Update) -> TimelineView {
        let state = u
            .end
            .map_or("in progress", |(how, _): (End, Ns)| how.as_str())
            .to_string();
        let steps = Step::ALL
            .iter()
            .map(|step| StepView {
                step: step.as_str().to_string(),
                at: u.at(*step).map(rfc3339),
                after_seconds: u.after_seen(*step).map(seconds),
                source: (*step == Step::ImagePresent)
                    .then(|| u.present_by().map(|by: PresentBy| by.as_str().to_string()))
                    .flatten(),
            })
            .collect();
        TimelineView {
            state,
            seen_by: u.seen_by.as_str().to_string(),
            seen_at: rfc3339(u.seen_at),
            joined_late: u.joined_late,
            containers: u
                .containers
                .iter()
                .map(|t| ContainerView {
                    name: t.name.clone(),
                    image: t.image.clone(),
                    old_container: t.old_id.clone(),
                    new_container: t.new_id.clone(),
                })
                .collect(),
            steps,
            unready_seconds: u.unready().map(seconds),
        }
    }
}

/// The timelines as text, as `kruised explain` prints them.
pub fn render(t: &PodTimelines) -> String {
    let mut out = format!("\nIn-place updates ({})\n", t.source);
    if t.updates.is_empty() {
        out.push_str("  none seen\n");
    }
    for u in &t.updates {
        let late = if u.joined_late {
            " (joined under way: not measured)"
        } else {
            ""
        };
        // writing to a String cannot fail
        let _ = writeln!(
            out,
            "  {}: seen by {} at {}{}",
            u.state, u.seen_by, u.seen_at, late
        );
        for c in &u.containers {
            let _ = writeln!(
                out,
                "    container {}: {}  {} -> {}",
                c.name,
                c.image,
                c.old_container.as_deref().unwrap_or("-"),
                c.new_container.as_deref().unwrap_or("-")
            );
        }
        for s in &u.steps {
            let after = s
                .after_seconds
                .map_or_else(|| "-".to_string(), |a| format!("+{a:.3}s"));
            let source = s
                .source
                .as_deref()
                .map_or_else(String::new, |s| format!(" ({s})"));
            let _ = writeln!(
                out,
                "    {:<18} {:>10}  {}{}",
                s.step.replace('_', " "),
                after,
                s.at.as_deref().unwrap_or(""),
                source
            );
        }
        if let Some(w) = u.unready_seconds {
            let _ = writeln!(out, "    unready window     {w:.3}s");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::timeline::track::example;

    #[test]
    fn a_timeline_shows_each_step_after_the_update_seen_and_its_window() {
        let t = PodTimelines {
            pod: "default/web-0".into(),
            source: "from the daemon at 127.0.0.1:10221".into(),
            updates: vec![TimelineView::of(&example(false))],
        };
        let text = render(&t);
        assert_eq!(
            text,
            "\nIn-place updates (from the daemon at 127.0.0.1:10221)\n\
             \x20 finished: seen by gate at 2027-01-15T08:00:00.000Z\n\
             \x20   container main: app:v2  c1 -> c2\n\
             \x20   image present         +1.000s  2027-01-15T08:00:01.000Z (pulled by kruised)\n\
             \x20   container stopped     +2.000s  2027-01-15T08:00:02.000Z\n\
             \x20   container started     +3.000s  2027-01-15T08:00:03.000Z\n\
             \x20   ready                 +4.000s  2027-01-15T08:00:04.000Z\n\
             \x20   meta written          +5.000s  2027-01-15T08:00:05.000Z\n\
             \x20   unready window     4.000s\n"
        );
        // and back from JSON, as explain reads the daemon's answer
        let json = serde_json::to_string(&t).expect("serialises");
        assert_eq!(
            serde_json::from_str::<PodTimelines>(&json).expect("parses"),
            t
        );
    }
}
