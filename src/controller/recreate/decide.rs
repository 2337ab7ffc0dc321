//! What the recreate controller decides, as pure functions over the requests, the runtime's
//! containers and the time: which request of a pod runs, whether the one picked is ready to
//! work on ([`admit`]), whether its pod's containers are its own ([`foreign_pod`]), the state of
//! each of its containers, and the pass's plan ([`plan`]: write the states, wait, kill one
//! container, complete).
//!
//! kruise-daemon's rules (`crr_daemon_util.go`, docs/kruise-wire.md), with these differences:
//! a container that does not exist on the node fails (kruise leaves it Pending until the
//! manager's deadline); a request without any `statusContext` uses the node's runtime (kruise
//! completes it with "failed to find runtime service"); and the kill is recorded in the status
//! before it happens, so a daemon restart never kills a container twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::cri::{Container, ContainerState};
use crate::k8s::crd::{
    ContainerRecreateRequest, ContainerRecreateRequestContainerRecreateState as State,
    ContainerRecreateRequestPhase as Phase, ContainerStatusSnapshot,
};
use crate::k8s::keys;

/// The message of a container that does not exist on the node (kruise's).
pub const NOT_FOUND_ON_NODE: &str = "not found container on Node";

/// The message of a request without the pod-uid label, which completes it.
pub const NO_POD_UID: &str =
    "the request has no crr.apps.kruise.io/pod-uid label (kruise's webhook sets it): refused";

/// How often a recreating request is looked at again without any event (the runtime has no
/// container events on containerd 1.6; kruise's manager polls every 3 s too).
pub const RECREATING_POLL: Duration = Duration::from_secs(3);

/// How long after its unready grace ends a request is looked at again.
const GRACE_MARGIN: Duration = Duration::from_millis(100);

/// The condition type that carries the unready time in `v1beta1`.
const PRE_RECREATE_GRACE: &str = keys::CRR_PRE_RECREATE_GRACE;

/// A pod: namespace and name (the work queue's key: one pass per pod at a time).
pub type Key = (String, String);

/// The pod of request `r`.
pub fn key_of(r: &ContainerRecreateRequest) -> Key {
    (r.namespace().unwrap_or_default(), r.spec.pod_name.clone())
}

/// The time from `since` to `now` (zero when `since` is later).
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let d = now.as_nanosecond() - since.as_nanosecond();
    Duration::from_nanos(u64::try_from(d).unwrap_or(0))
}

/// Picks the request of a pod to work on: the first by phase (Completed, Recreating, Pending,
/// new) and creation time among those not deleting and not completed; the others that are new
/// are to be set Pending.
pub fn pick(
    requests: &[Arc<ContainerRecreateRequest>],
) -> (
    Option<Arc<ContainerRecreateRequest>>,
    Vec<Arc<ContainerRecreateRequest>>,
) {
    let mut active: Vec<&Arc<ContainerRecreateRequest>> = requests
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none() && !r.is_completed())
        .collect();
    active.sort_by(|a, b| {
        (
            a.phase().sort_weight(),
            &a.metadata.creation_timestamp,
            &a.metadata.name,
        )
            .cmp(&(
                b.phase().sort_weight(),
                &b.metadata.creation_timestamp,
                &b.metadata.name,
            ))
    });
    let mut it = active.into_iter();
    let picked = it.next().cloned();
    let to_pending = it.filter(|r| r.phase() == Phase::Unset).cloned().collect();
    (picked, to_pending)
}

/// The manager's snapshot of the pod's containers: `status.containerStatusSnapshot`
/// (`v1beta1`), else the `sync-container-statuses` annotation (`v1alpha1`; unreadable: none).
pub fn snapshot(crr: &ContainerRecreateRequest) -> Vec<ContainerStatusSnapshot> {
    if let Some(s) = crr
        .status
        .as_ref()
        .filter(|s| !s.container_status_snapshot.is_empty())
    {
        return s.container_status_snapshot.clone();
    }
    keys::parse_sync_container_statuses(
        crr.metadata
            .annotations
            .as_ref()
            .unwrap_or(&BTreeMap::new()),
    )
    .ok()
    .flatten()
    .unwrap_or_default()
}

/// The manager's `unready-acquired` annotation cannot be read: kruise 1.9 completes the request
/// with this error's message.
#[derive(Debug, thiserror::Error)]
pub struct UnreadyTimeError(keys::KeyError);

impl std::fmt::Display for UnreadyTimeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            keys::KeyError::Time { value, source, .. } => {
                write!(f, "failed to parse unready time {value}: {source}")
            }
            other => other.fmt(f),
        }
    }
}

/// Since when the manager has the pod not ready: condition `PreRecreateGrace=True`
/// (`v1beta1`), else the `unready-acquired` annotation (`v1alpha1`).
pub fn unready_since(
    crr: &ContainerRecreateRequest,
) -> Result<Option<Timestamp>, UnreadyTimeError> {
    if let Some(c) = crr.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == PRE_RECREATE_GRACE && c.status == "True")
    }) {
        return Ok(c.last_transition_time.as_ref().map(|t| t.0));
    }
    let annotations = crr.metadata.annotations.clone().unwrap_or_default();
    keys::parse_unready_acquired(&annotations).map_err(UnreadyTimeError)
}

/// What the runtime shows of the newest container of one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `<runtimeName>://<id>`.
    pub container_id: String,
    /// Its state.
    pub state: ContainerState,
    /// The kubelet's restart count of it (its CRI annotation).
    pub restart_count: i32,
    /// When it started, ns since the epoch (0: not started).
    pub started_at_ns: i64,
}

/// The state of each container of the request now (kruise's
/// `getCurrentCRRContainersRecreateStates`), in spec order. `observed` is by container name;
/// `killed` the containers this daemon has recorded as killed, which a request read from the
/// watch may not show yet (its copy can be older than the daemon's own last write, and a
/// status written from it must not take `isKilled` back); `now_ns` the wall clock.
pub fn container_states(
    crr: &ContainerRecreateRequest,
    observed: &BTreeMap<String, Observed>,
    snapshot: &[ContainerStatusSnapshot],
    killed: &BTreeSet<String>,
    now_ns: i64,
) -> Vec<State> {
    let strategy = crr.spec.strategy.clone().unwrap_or_default();
    let previous: BTreeMap<&str, &State> = crr
        .status
        .iter()
        .flat_map(|s| s.container_recreate_states.iter())
        .map(|s| (s.name.as_str(), s))
        .collect();
    crr.spec
        .containers
        .iter()
        .map(|c| {
            let prev = previous.get(c.name.as_str());
            let was_killed = prev.is_some_and(|p| p.is_killed) || killed.contains(&c.name);
            let state = |phase: Phase, message: &str, is_killed: bool| State {
                name: c.name.clone(),
                phase,
                message: message.to_string(),
                is_killed,
            };
            if let Some(p) = prev.filter(|p| matches!(p.phase, Phase::Succeeded | Phase::Failed)) {
                return (*p).clone();
            }
            let Some(o) = observed.get(&c.name) else {
                // kruise keeps it Pending until the manager gives up; nothing will create it
                return state(Phase::Failed, NOT_FOUND_ON_NODE, was_killed);
            };
            if o.state == ContainerState::Exited {
                return state(Phase::Recreating, "", was_killed);
            }
            if strategy.force_recreate && !was_killed {
                return state(Phase::Pending, "", false);
            }
            let recreated = c.status_context.as_ref().is_some_and(|ctx| {
                o.container_id != ctx.container_id || o.restart_count > ctx.restart_count
            });
            if recreated {
                let min_started = i64::from(strategy.min_started_seconds) * 1_000_000_000;
                let ready = snapshot
                    .iter()
                    .any(|s| s.name == c.name && s.container_id == o.container_id && s.ready);
                let up_long_enough = o.started_at_ns > 0 && now_ns - o.started_at_ns > min_started;
                let phase = if ready && up_long_enough {
                    Phase::Succeeded
                } else {
                    Phase::Recreating
                };
                return state(phase, "", was_killed);
            }
            state(Phase::Pending, "", was_killed)
        })
        .collect()
}

/// The next step of a request, from its current container states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// Every container is done (or one failed with `failurePolicy: Fail`): complete.
    Complete,
    /// Kill this container (one kill per pass).
    Kill(String),
    /// Wait for the kubelet and the manager (a container is recreating).
    Wait,
}

/// Walks the states in spec order (kruise's `manage`): Succeeded and (with `Ignore`) Failed
/// pass; Failed with `Fail` completes; Recreating is marked killed and, with
/// `orderedRecreate`, waits; the first Pending is killed.
pub fn next_step(crr: &ContainerRecreateRequest, states: &mut [State]) -> NextStep {
    let strategy = crr.spec.strategy.clone().unwrap_or_default();
    let fails_fast = crr.spec.fails_fast();
    let mut waiting = false;
    for s in states.iter_mut() {
        match s.phase {
            Phase::Succeeded => {}
            Phase::Failed => {
                if fails_fast {
                    return NextStep::Complete;
                }
            }
            Phase::Recreating => {
                s.is_killed = true;
                waiting = true;
                if strategy.ordered_recreate {
                    return NextStep::Wait;
                }
            }
            _ => return NextStep::Kill(s.name.clone()),
        }
    }
    if waiting {
        NextStep::Wait
    } else {
        NextStep::Complete
    }
}

/// When a recreating container will have been up `minStartedSeconds` (ns since the epoch), if
/// one still waits for that.
pub fn min_started_deadline(
    crr: &ContainerRecreateRequest,
    states: &[State],
    observed: &BTreeMap<String, Observed>,
) -> Option<i64> {
    let min = i64::from(crr.spec.strategy.as_ref()?.min_started_seconds);
    if min <= 0 {
        return None;
    }
    states
        .iter()
        .filter(|s| s.phase == Phase::Recreating)
        .filter_map(|s| observed.get(&s.name))
        .filter(|o| o.started_at_ns > 0)
        .map(|o| o.started_at_ns + min * 1_000_000_000)
        .min()
}

/// Whether container `c` is of pod `namespace`/`name` by the kubelet's labels.
pub fn is_pod(c: &Container, namespace: &str, name: &str) -> bool {
    c.labels
        .get(keys::KUBELET_POD_NAMESPACE)
        .map(String::as_str)
        == Some(namespace)
        && c.labels.get(keys::KUBELET_POD_NAME).map(String::as_str) == Some(name)
}

/// What the request picked for a pod is ready for, before its containers are looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It is not `Recreating` yet: set it so (the write's watch event brings the next pass).
    SetRecreating,
    /// Its unready time cannot be read: complete it with this message (kruise 1.9's).
    Refuse(String),
    /// It has an unready grace, and the manager has not taken the pod out of service yet (the
    /// manager's write brings the next pass).
    AwaitUnready,
    /// In its unready grace for `left` more: look again after `look_again`.
    InGrace {
        /// What is left of the grace.
        left: Duration,
        /// When to look again: just after it ends.
        look_again: Duration,
    },
    /// Its containers are to be looked at.
    Proceed,
}

/// How long the pod of a request has been out of service, as the daemon counts it: the
/// manager's unready time (its wall clock's) read against the node's wall clock once, when the
/// daemon first sees it, and from then on on the monotonic clock only, so that a step of the
/// node's wall clock later (NTP, a clock set back an hour, a VM resumed) neither holds the kill
/// back by the step nor ends the grace early, before the manager's endpoints have let the pod
/// go (as `podprobe::decide::Age` does for a probe's initial delay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnreadyClock {
    since: Timestamp,
    seen: Instant,
    elapsed_then: Duration,
}

impl UnreadyClock {
    /// The unready time `since`, seen first now: `wall` on the wall clock, `now` on the
    /// monotonic one.
    pub fn first_seen(since: Timestamp, wall: Timestamp, now: Instant) -> UnreadyClock {
        UnreadyClock {
            since,
            seen: now,
            elapsed_then: elapsed(since, wall),
        }
    }

    /// The unready time it counts from.
    pub fn since(&self) -> Timestamp {
        self.since
    }

    /// How long the pod has been out of service at `now` (monotonic).
    pub fn elapsed_at(&self, now: Instant) -> Duration {
        self.elapsed_then
            .saturating_add(now.saturating_duration_since(self.seen))
    }
}

/// Whether request `r` is ready to work on: phase `Recreating` first, then the unready grace
/// (`unreadyGracePeriodSeconds`) from the time the manager took the pod out of service;
/// `out_of_service(since)` says how long ago that was (the daemon: an [`UnreadyClock`]).
pub fn admit(
    r: &ContainerRecreateRequest,
    out_of_service: impl FnOnce(Timestamp) -> Duration,
) -> Admission {
    if r.phase() != Phase::Recreating {
        return Admission::SetRecreating;
    }
    let Some(grace) = r.spec.unready_grace_period() else {
        return Admission::Proceed;
    };
    match unready_since(r) {
        Err(e) => Admission::Refuse(e.to_string()),
        Ok(None) => Admission::AwaitUnready,
        Ok(Some(since)) => {
            let left = grace.saturating_sub(out_of_service(since));
            if left.is_zero() {
                Admission::Proceed
            } else {
                Admission::InGrace {
                    left,
                    look_again: left.saturating_add(GRACE_MARGIN),
                }
            }
        }
    }
}

/// The message that refuses request `r` when a container its pod-uid label (`uid`) names is
/// not of the request's pod in the request's namespace: the label alone is the creator's word
/// where the webhook was bypassed, and would point at another tenant's pod.
pub fn foreign_pod(
    containers: &[Container],
    r: &ContainerRecreateRequest,
    uid: &str,
) -> Option<String> {
    let namespace = r.namespace().unwrap_or_default();
    let other = containers
        .iter()
        .find(|c| !is_pod(c, &namespace, &r.spec.pod_name))?;
    let of = |k: &str| other.labels.get(k).map(String::as_str).unwrap_or("?");
    Some(format!(
        "pod-uid {uid} names pod {}/{}, not this request's {}/{}: refused",
        of(keys::KUBELET_POD_NAMESPACE),
        of(keys::KUBELET_POD_NAME),
        namespace,
        r.spec.pod_name
    ))
}

/// What a pass does with a recreating request whose containers it observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The containers' states differ from the status's: write them (the write's watch event
    /// brings the next pass).
    WriteStates(Vec<State>),
    /// Complete the request; its containers ended in these states.
    Complete(Vec<State>),
    /// Wait for the kubelet and the manager: write `states` first where given, and look again
    /// after `after`.
    Wait {
        /// The states to write, where they changed.
        states: Option<Vec<State>>,
        /// When to look again.
        after: Duration,
    },
    /// Kill `container`, once `states` (which record it killed) are written.
    Kill {
        /// The container.
        container: String,
        /// The states to write first.
        states: Vec<State>,
    },
}

/// The plan of a pass over recreating request `r`: `observed` is what the runtime shows of its
/// containers, by name; `killed` the containers this daemon recorded as killed for it
/// ([`container_states`]); `now_ns` the wall clock.
pub fn plan(
    r: &ContainerRecreateRequest,
    observed: &BTreeMap<String, Observed>,
    killed: &BTreeSet<String>,
    now_ns: i64,
) -> Plan {
    let snapshot = snapshot(r);
    let mut states = container_states(r, observed, &snapshot, killed, now_ns);
    let current = r
        .status
        .as_ref()
        .map(|s| s.container_recreate_states.clone())
        .unwrap_or_default();
    if states != current {
        return Plan::WriteStates(states);
    }
    match next_step(r, &mut states) {
        NextStep::Complete => Plan::Complete(states),
        NextStep::Wait => {
            let until_min_started = min_started_deadline(r, &states, observed)
                .map(|at| Duration::from_nanos(u64::try_from(at - now_ns).unwrap_or(0)));
            let changed = states != current;
            Plan::Wait {
                states: changed.then_some(states),
                after: until_min_started.map_or(RECREATING_POLL, |d| d.min(RECREATING_POLL)),
            }
        }
        NextStep::Kill(container) => {
            set_state(
                &mut states,
                &container,
                Phase::Recreating,
                String::new(),
                true,
            );
            Plan::Kill { container, states }
        }
    }
}

/// Sets the state of `container` in `states`.
pub fn set_state(
    states: &mut [State],
    container: &str,
    phase: Phase,
    message: String,
    killed: bool,
) {
    if let Some(s) = states.iter_mut().find(|s| s.name == container) {
        s.phase = phase;
        s.message = message;
        s.is_killed = killed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crr(strategy: serde_json::Value, states: serde_json::Value) -> ContainerRecreateRequest {
        serde_json::from_value(json!({
            "metadata": {"name": "r", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"crr.apps.kruise.io/pod-uid": "u1"}},
            "spec": {"podName": "p", "strategy": strategy, "containers": [
                {"name": "a", "statusContext": {"containerID": "containerd://a1", "restartCount": 0}},
                {"name": "b", "statusContext": {"containerID": "containerd://b1", "restartCount": 0}}
            ]},
            "status": {"phase": "Recreating", "containerRecreateStates": states}
        }))
        .unwrap()
    }

    fn obs(id: &str, state: ContainerState, rc: i32, started: i64) -> Observed {
        Observed {
            container_id: format!("containerd://{id}"),
            state,
            restart_count: rc,
            started_at_ns: started,
        }
    }

    fn observed(pairs: &[(&str, Observed)]) -> BTreeMap<String, Observed> {
        pairs
            .iter()
            .map(|(n, o)| (n.to_string(), o.clone()))
            .collect()
    }

    const SEC: i64 = 1_000_000_000;

    #[test]
    fn running_originals_are_pending_and_the_first_is_killed() {
        let r = crr(json!({}), json!([]));
        let o = observed(&[
            ("a", obs("a1", ContainerState::Running, 0, SEC)),
            ("b", obs("b1", ContainerState::Running, 0, SEC)),
        ]);
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 100 * SEC);
        assert!(states.iter().all(|s| s.phase == Phase::Pending));
        assert_eq!(next_step(&r, &mut states), NextStep::Kill("a".into()));
    }

    #[test]
    fn a_recreated_container_succeeds_once_ready_in_the_snapshot_and_up_long_enough() {
        let r = crr(
            json!({"minStartedSeconds": 5}),
            json!([{"name": "a", "phase": "Recreating", "isKilled": true}]),
        );
        let o = observed(&[("a", obs("a2", ContainerState::Running, 1, 100 * SEC))]);
        let snap = [ContainerStatusSnapshot {
            name: "a".into(),
            ready: true,
            restart_count: 1,
            container_id: "containerd://a2".into(),
        }];
        assert_eq!(
            container_states(&r, &o, &snap, &BTreeSet::new(), 104 * SEC)[0].phase,
            Phase::Recreating
        );
        assert_eq!(
            container_states(&r, &o, &[], &BTreeSet::new(), 106 * SEC)[0].phase,
            Phase::Recreating,
            "not ready yet"
        );
        let s = &container_states(&r, &o, &snap, &BTreeSet::new(), 106 * SEC)[0];
        assert_eq!((s.phase.clone(), s.is_killed), (Phase::Succeeded, true));
        assert_eq!(
            min_started_deadline(
                &r,
                &container_states(&r, &o, &snap, &BTreeSet::new(), 104 * SEC),
                &o
            ),
            Some(105 * SEC)
        );
    }

    #[test]
    fn an_exited_container_is_recreating_and_ordered_recreate_waits_for_it() {
        let r = crr(json!({"orderedRecreate": true}), json!([]));
        let o = observed(&[
            ("a", obs("a1", ContainerState::Exited, 0, SEC)),
            ("b", obs("b1", ContainerState::Running, 0, SEC)),
        ]);
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(states[0].phase, Phase::Recreating);
        assert_eq!(next_step(&r, &mut states), NextStep::Wait);
        assert!(states[0].is_killed);
        let r = crr(json!({}), json!([]));
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(
            next_step(&r, &mut states),
            NextStep::Kill("b".into()),
            "unordered: the next one"
        );
    }

    #[test]
    fn a_missing_container_fails_and_fail_completes_while_ignore_goes_on() {
        let o = observed(&[("b", obs("b1", ContainerState::Running, 0, SEC))]);
        let r = crr(json!({"failurePolicy": "Fail"}), json!([]));
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(
            (states[0].phase.clone(), states[0].message.as_str()),
            (Phase::Failed, NOT_FOUND_ON_NODE)
        );
        assert_eq!(next_step(&r, &mut states), NextStep::Complete);
        let r = crr(json!({"failurePolicy": "Ignore"}), json!([]));
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(next_step(&r, &mut states), NextStep::Kill("b".into()));
    }

    #[test]
    fn force_recreate_kills_a_container_the_kubelet_restarted_unless_we_killed_it() {
        let o = observed(&[
            ("a", obs("a2", ContainerState::Running, 1, SEC)),
            ("b", obs("b1", ContainerState::Running, 0, SEC)),
        ]);
        let r = crr(json!({"forceRecreate": true}), json!([]));
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(states[0].phase, Phase::Pending);
        assert_eq!(next_step(&r, &mut states), NextStep::Kill("a".into()));
        // once recorded as killed (before the kill, so also across a daemon restart), never again
        let r = crr(
            json!({"forceRecreate": true}),
            json!([{"name": "a", "phase": "Recreating", "isKilled": true}]),
        );
        let mut states = container_states(&r, &o, &[], &BTreeSet::new(), 10 * SEC);
        assert_eq!(states[0].phase, Phase::Recreating);
        assert_eq!(next_step(&r, &mut states), NextStep::Kill("b".into()));
    }

    #[test]
    fn a_kill_the_watched_copy_does_not_show_yet_is_never_taken_back_or_done_again() {
        // the daemon recorded b killed and stopped it; the watch still has the copy before
        let r = crr(
            json!({"forceRecreate": true}),
            json!([{"name": "a", "phase": "Recreating", "isKilled": true},
                   {"name": "b", "phase": "Pending"}]),
        );
        let killed: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        let o = observed(&[
            ("a", obs("a2", ContainerState::Running, 1, SEC)),
            ("b", obs("b1", ContainerState::Exited, 0, SEC)),
        ]);
        let states = container_states(&r, &o, &[], &killed, 10 * SEC);
        assert_eq!(
            (states[1].phase.clone(), states[1].is_killed),
            (Phase::Recreating, true)
        );
        // and once the kubelet has recreated it, a forced request does not kill the new one
        let o = observed(&[
            ("a", obs("a2", ContainerState::Running, 1, SEC)),
            ("b", obs("b2", ContainerState::Running, 1, 5 * SEC)),
        ]);
        let mut states = container_states(&r, &o, &[], &killed, 10 * SEC);
        assert_eq!(
            (states[1].phase.clone(), states[1].is_killed),
            (Phase::Recreating, true)
        );
        assert_eq!(next_step(&r, &mut states), NextStep::Wait);
    }

    #[test]
    fn finished_states_are_kept_and_all_done_completes() {
        let r = crr(
            json!({}),
            json!([{"name": "a", "phase": "Succeeded", "isKilled": true},
                   {"name": "b", "phase": "Failed", "message": "kill container error: x"}]),
        );
        let mut states = container_states(&r, &BTreeMap::new(), &[], &BTreeSet::new(), SEC);
        assert_eq!(states[1].message, "kill container error: x");
        assert_eq!(next_step(&r, &mut states), NextStep::Complete);
    }

    #[test]
    fn requests_of_a_pod_run_by_phase_then_age_and_new_ones_wait_pending() {
        let mk = |name: &str, phase: &str, created: &str| {
            Arc::new(
                serde_json::from_value::<ContainerRecreateRequest>(json!({
                    "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
                    "spec": {"podName": "p", "containers": []},
                    "status": {"phase": phase}
                }))
                .unwrap(),
            )
        };
        let rs = [
            mk("new", "", "2026-01-01T00:00:01Z"),
            mk("running", "Recreating", "2026-01-01T00:00:05Z"),
            mk("older", "", "2026-01-01T00:00:00Z"),
        ];
        let (picked, pending) = pick(&rs);
        assert_eq!(picked.unwrap().metadata.name.as_deref(), Some("running"));
        let names: Vec<_> = pending
            .iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect();
        assert_eq!(names, ["older", "new"]);
    }

    #[test]
    fn the_unready_time_comes_from_the_condition_or_the_annotation() {
        let mut r = crr(json!({}), json!([]));
        assert!(matches!(unready_since(&r), Ok(None)));
        r.metadata.annotations.get_or_insert_default().insert(
            keys::CRR_UNREADY_ACQUIRED.into(),
            "2026-07-02T17:56:09+08:00".into(),
        );
        assert_eq!(
            unready_since(&r).unwrap().map(|t| t.as_second()),
            Some(1_782_986_169)
        );
        r.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::CRR_UNREADY_ACQUIRED.into(), "yesterday".into());
        assert!(
            unready_since(&r)
                .unwrap_err()
                .to_string()
                .starts_with("failed to parse unready time yesterday")
        );
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_request_is_set_recreating_first_then_waits_out_its_unready_grace() {
        let mut r = crr(json!({"unreadyGracePeriodSeconds": 10}), json!([]));
        r.status.as_mut().unwrap().phase = Phase::Pending;
        let now = at("2026-01-01T00:01:00Z");
        let admit = |r: &ContainerRecreateRequest, now| admit(r, |since| elapsed(since, now));
        assert_eq!(admit(&r, now), Admission::SetRecreating);
        let mut r = crr(json!({"unreadyGracePeriodSeconds": 10}), json!([]));
        assert_eq!(
            admit(&r, now),
            Admission::AwaitUnready,
            "the manager has not taken the pod out of service"
        );
        r.metadata.annotations.get_or_insert_default().insert(
            keys::CRR_UNREADY_ACQUIRED.into(),
            "2026-01-01T00:00:56Z".into(),
        );
        assert_eq!(
            admit(&r, now),
            Admission::InGrace {
                left: Duration::from_secs(6),
                look_again: Duration::from_millis(6100)
            }
        );
        assert_eq!(admit(&r, at("2026-01-01T00:01:06Z")), Admission::Proceed);
        r.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::CRR_UNREADY_ACQUIRED.into(), "yesterday".into());
        assert!(matches!(
            admit(&r, now),
            Admission::Refuse(m) if m.starts_with("failed to parse unready time yesterday")
        ));
        let r = crr(json!({}), json!([]));
        assert_eq!(admit(&r, now), Admission::Proceed, "no grace: at once");
    }

    fn container_of(namespace: &str, pod: &str) -> Container {
        Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: crate::cri::ContainerMetadata {
                name: "a".into(),
                attempt: 0,
            },
            image: String::new(),
            image_ref: String::new(),
            state: ContainerState::Running,
            created_at: 0,
            labels: [
                (
                    keys::KUBELET_POD_NAMESPACE.to_string(),
                    namespace.to_string(),
                ),
                (keys::KUBELET_POD_NAME.to_string(), pod.to_string()),
            ]
            .into(),
            annotations: BTreeMap::new(),
            image_id: String::new(),
            image_spec: crate::cri::ImageSpec::default(),
        }
    }

    #[test]
    fn a_pod_uid_that_names_another_pods_containers_refuses_the_request() {
        let r = crr(json!({}), json!([]));
        assert_eq!(foreign_pod(&[container_of("ns", "p")], &r, "u1"), None);
        assert_eq!(
            foreign_pod(
                &[container_of("ns", "p"), container_of("other", "q")],
                &r,
                "u1"
            )
            .as_deref(),
            Some("pod-uid u1 names pod other/q, not this request's ns/p: refused")
        );
    }

    #[test]
    fn a_pass_writes_changed_states_first_then_kills_one_container_recorded_killed() {
        let o = observed(&[
            ("a", obs("a1", ContainerState::Running, 0, SEC)),
            ("b", obs("b1", ContainerState::Running, 0, SEC)),
        ]);
        let r = crr(json!({}), json!([]));
        let Plan::WriteStates(states) = plan(&r, &o, &BTreeSet::new(), 10 * SEC) else {
            panic!("the status has no states yet: they are written first");
        };
        let r = crr(json!({}), serde_json::to_value(&states).unwrap());
        let Plan::Kill { container, states } = plan(&r, &o, &BTreeSet::new(), 10 * SEC) else {
            panic!("the states are written: the first container is killed");
        };
        assert_eq!(container, "a");
        assert_eq!(
            (states[0].phase.clone(), states[0].is_killed),
            (Phase::Recreating, true),
            "recorded as killed before the kill"
        );
        assert_eq!(states[1].phase, Phase::Pending);
    }

    #[test]
    fn a_pass_waits_for_min_started_and_completes_when_every_container_is_done() {
        let r = crr(
            json!({"minStartedSeconds": 5}),
            json!([{"name": "a", "phase": "Recreating", "isKilled": true},
                   {"name": "b", "phase": "Succeeded", "isKilled": true}]),
        );
        let o = observed(&[("a", obs("a2", ContainerState::Running, 1, 100 * SEC))]);
        assert_eq!(
            plan(&r, &o, &BTreeSet::new(), 104 * SEC),
            Plan::Wait {
                states: None,
                after: Duration::from_secs(1)
            },
            "up 4 s of 5: looked at again when it has been up 5"
        );
        assert_eq!(
            plan(&r, &o, &BTreeSet::new(), 90 * SEC),
            Plan::Wait {
                states: None,
                after: RECREATING_POLL
            },
            "never later than the poll"
        );
        let r = crr(
            json!({}),
            json!([{"name": "a", "phase": "Succeeded", "isKilled": true},
                   {"name": "b", "phase": "Succeeded", "isKilled": true}]),
        );
        assert!(matches!(
            plan(&r, &o, &BTreeSet::new(), 104 * SEC),
            Plan::Complete(states) if states.len() == 2
        ));
    }

    #[test]
    fn a_recreating_container_the_status_shows_unkilled_is_written_killed_while_waiting() {
        // the kubelet restarted it by itself: recreating, but never recorded as killed
        let r = crr(
            json!({"orderedRecreate": true}),
            json!([{"name": "a", "phase": "Recreating"},
                   {"name": "b", "phase": "Pending"}]),
        );
        let o = observed(&[
            ("a", obs("a1", ContainerState::Exited, 0, SEC)),
            ("b", obs("b1", ContainerState::Running, 0, SEC)),
        ]);
        let Plan::Wait {
            states: Some(states),
            after,
        } = plan(&r, &o, &BTreeSet::new(), 10 * SEC)
        else {
            panic!("ordered: waits for a, its state written killed");
        };
        assert!(states[0].is_killed);
        assert_eq!(after, RECREATING_POLL);
    }
}
