//! What the pod probes decide, as pure functions: the probes the spec asks for ([`wanted`]),
//! whether a probe runs on its container now ([`due`]), the kubelet's thresholds over
//! consecutive outcomes ([`Thresholds`], [`judge`]), a new result and whether it is news
//! ([`next_result`]), and the NodePodProbe status built from the spec, the old status and the
//! current results ([`build_status`], [`status_to_write`]).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;

use super::prober::{self, Outcome};
use crate::k8s::crd::{
    ContainerProbeState, NodePodProbe, NodePodProbeStatus, PodProbeStatus, ProbeState,
};
use crate::k8s::write;

/// The reason of the event of a probe that passes again (kruise's).
pub const REASON_SUCCEEDED: &str = "KruiseProbeSucceeded";
/// The reason of the event of a probe that fails (kruise's).
pub const REASON_FAILED: &str = "KruiseProbeFailed";
/// The longest probe timeout honoured: a longer `timeoutSeconds` is cut to this (the kubelet
/// has no cap; here a probe holds a shared slot for as long as its timeout).
pub const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(60);

/// A probe task's identity: pod UID, probe name, container name.
pub type TaskKey = (String, String, String);

/// What one probe task works from; replaced in place when the spec changes.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSpec {
    /// The pod, for events.
    pub pod: ObjectReference,
    /// The pod's IP as kruise-manager wrote it from the pod's status.
    pub ip: String,
    /// The container probed.
    pub container: String,
    /// The probe.
    pub probe: Probe,
}

/// The probes the node's NodePodProbe (none: no probes) asks for, by task.
pub fn wanted(npp: Option<&NodePodProbe>) -> HashMap<TaskKey, ProbeSpec> {
    let mut wanted = HashMap::new();
    for pod in npp.iter().flat_map(|n| n.spec.pod_probes.iter()) {
        for p in &pod.probes {
            let pod_ref = write::pod_ref(&pod.namespace, &pod.name, &pod.uid);
            wanted.insert(
                (pod.uid.clone(), p.name.clone(), p.container_name.clone()),
                ProbeSpec {
                    pod: pod_ref,
                    ip: pod.ip.clone(),
                    container: p.container_name.clone(),
                    probe: p.probe.clone(),
                },
            );
        }
    }
    wanted
}

/// The most probes kruised runs for one pod of the NodePodProbe (however many markers list
/// them): the first in (probe name, container) order run, the rest are refused.
pub const PROBES_PER_POD: usize = 32;
/// The most probes kruised runs on its node. Each probe held costs about 20 KiB (its task, its
/// spec, its result: docs/PERFORMANCE.md, the shipped build; about 25 KiB in a debug build):
/// 1024 are some 20 MiB, which with the 13 MiB of a full node without probes stays under the
/// 48 MiB the hostile benchmark holds kruised to (`benches/hostile.rs`), with room.
pub const PROBES_PER_NODE: usize = 1024;

/// The probes the spec asks for, split by the caps: those that run, and those that do not with
/// the message their status shows.
#[derive(Debug, Default)]
pub struct Capped {
    /// The probes that run, by task.
    pub run: HashMap<TaskKey, ProbeSpec>,
    /// The probes over a cap, with why they do not run.
    pub refused: BTreeMap<ProbeKey, String>,
}

/// Splits `wanted` by the caps: each pod runs at most `per_pod` of its probes (its first in
/// (probe name, container) order), then the node at most `per_node`, taken one at a time from
/// each namespace in turn and, within a namespace, from each of its pods in turn; so a tenant
/// listing thousands of probes, or many pods of them, takes only its share and every other
/// namespace's first probes run. The same spec always splits the same way.
pub fn cap(mut wanted: HashMap<TaskKey, ProbeSpec>, per_pod: usize, per_node: usize) -> Capped {
    // namespace -> pod UID -> the pod's probes, in order
    let mut by_namespace: BTreeMap<String, BTreeMap<String, Vec<TaskKey>>> = BTreeMap::new();
    for (key, spec) in &wanted {
        let namespace = spec.pod.namespace.clone().unwrap_or_default();
        by_namespace
            .entry(namespace)
            .or_default()
            .entry(key.0.clone())
            .or_default()
            .push(key.clone());
    }
    let mut refused = BTreeMap::new();
    let mut namespaces = Vec::new();
    for pods in by_namespace.into_values() {
        let mut lists = Vec::new();
        for mut probes in pods.into_values() {
            probes.sort();
            let listed = probes.len();
            for key in probes.split_off(per_pod.min(listed)) {
                refused.insert(
                    (key.0, key.1),
                    format!(
                        "not run: the pod lists {listed} probes, kruised runs at most {per_pod} a pod"
                    ),
                );
            }
            lists.push(probes);
        }
        namespaces.push(interleave(lists));
    }
    let mut order = interleave(namespaces);
    let listed = wanted.len();
    for key in order.split_off(per_node.min(order.len())) {
        refused.insert(
            (key.0, key.1),
            format!(
                "not run: the node's pods list {listed} probes, kruised runs at most {per_node} a node, shared by namespace and pod"
            ),
        );
    }
    let run = order
        .into_iter()
        .filter_map(|key| wanted.remove_entry(&key))
        .collect();
    Capped { run, refused }
}

/// The first of each list, then the second of each, and so on.
fn interleave<T>(lists: Vec<Vec<T>>) -> Vec<T> {
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        out.extend(iters.iter_mut().filter_map(Iterator::next));
        if out.len() == before {
            return out;
        }
    }
}

/// A probe's seconds field: at least 1 (the kubelet's floor), at most a year.
pub fn seconds(v: Option<i32>) -> Duration {
    crate::k8s::crd::api_seconds(i64::from(v.unwrap_or(0).max(1)))
}

/// A probe's timeout: its `timeoutSeconds`, at most [`PROBE_TIMEOUT_MAX`].
pub fn timeout(probe: &Probe) -> Duration {
    seconds(probe.timeout_seconds).min(PROBE_TIMEOUT_MAX)
}

/// Whether a probe runs on its container now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    /// The container is not running: the probe fails, saying so.
    NotRunning(String),
    /// The container has not been up `initialDelaySeconds` yet.
    TooEarly,
    /// The probe runs.
    Run,
}

/// A container's age as its probe reads it: how long it had been up when the probe's task first
/// saw it (the runtime's creation time against the wall clock, read this once per container),
/// and from then on the monotonic clock only, so a step of the wall clock later (NTP, a clock
/// set back an hour, a VM resumed) neither holds a probe back nor lets it run early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Age {
    seen: Instant,
    up_then: Duration,
}

impl Age {
    /// A container created at `created_at_ns` (the runtime's time, ns since the epoch), seen
    /// first now: `now_ns` on the runtime's clock, `now` on the monotonic one.
    pub fn first_seen(created_at_ns: i64, now_ns: i64, now: Instant) -> Age {
        let up = now_ns.saturating_sub(created_at_ns);
        Age {
            seen: now,
            up_then: Duration::from_nanos(u64::try_from(up).unwrap_or(0)),
        }
    }

    /// How long it has been up at `now` (monotonic).
    pub fn at(&self, now: Instant) -> Duration {
        self.up_then
            .saturating_add(now.saturating_duration_since(self.seen))
    }
}

/// Whether `spec`'s probe runs on its container, running or not, up for `age`.
pub fn due(spec: &ProbeSpec, running: bool, age: Duration) -> Due {
    if !running {
        return Due::NotRunning(format!("Container({}) is Non-running", spec.container));
    }
    if age < seconds(spec.probe.initial_delay_seconds) {
        return Due::TooEarly;
    }
    Due::Run
}

/// What a run's `outcome` makes of the probe's result, given its thresholds: the state and
/// message to record, or nothing (the run could not be made, or the run of outcomes is shorter
/// than the threshold).
pub fn judge(
    thresholds: &mut Thresholds,
    outcome: Outcome,
    probe: &Probe,
) -> Option<(ProbeState, String)> {
    let (success, message) = match outcome {
        Outcome::Success(m) => (true, m),
        Outcome::Failure(m) => (false, m),
        Outcome::Error(_) => return None,
    };
    let success_threshold = probe.success_threshold.unwrap_or(1);
    let failure_threshold = probe.failure_threshold.unwrap_or(1);
    if !thresholds.observe(success, success_threshold, failure_threshold) {
        return None;
    }
    let state = if success {
        ProbeState::Succeeded
    } else {
        ProbeState::Failed
    };
    Some((state, prober::truncate(message.trim_end())))
}

/// How often a probe whose state holds may have a new message recorded (and so written to the
/// NodePodProbe status): a probe printing the time would otherwise rewrite the node's whole
/// status at every run.
pub const MESSAGE_REFRESH: Duration = Duration::from_secs(60);

/// The result that replaces `previous` when a probe says `state` and `message` at `now`, and
/// whether it is news (an event): `None` when it is the same as `previous`, or only its message
/// changed within [`MESSAGE_REFRESH`] of the last one recorded. A first success is not news
/// (the kubelet records no event for a passing probe): 1000 probes starting would otherwise
/// make 1000 events, drained at the client's rate limit.
pub fn next_result(
    previous: Option<&Result>,
    state: ProbeState,
    message: String,
    now: Time,
) -> Option<(Result, bool)> {
    let refresh = k8s_openapi::jiff::SignedDuration::try_from(MESSAGE_REFRESH).unwrap_or_default();
    if previous.is_some_and(|p| {
        p.state == state && (p.message == message || now.0.duration_since(p.observed.0) < refresh)
    }) {
        return None;
    }
    let state_changed = previous.is_none_or(|p| p.state != state);
    let was_known = previous.is_some_and(|p| p.state != ProbeState::Unknown);
    let since = match previous {
        Some(p) if !state_changed => p.since.clone(),
        _ => now.clone(),
    };
    let event =
        state_changed && state != ProbeState::Unknown && (was_known || state == ProbeState::Failed);
    let result = Result {
        state,
        message,
        since,
        observed: now,
    };
    Some((result, event))
}

/// The longest probe message written to the daemon's log.
pub const LOG_MESSAGE_LIMIT: usize = 256;

/// A probe's message (an exec probe's output, what the tenant's container printed) as it goes
/// to the daemon's log: one line, control characters (a forged line's newline, a terminal's
/// escapes) and bidirectional overrides made spaces, at most [`LOG_MESSAGE_LIMIT`] bytes.
pub fn log_message(message: &str) -> String {
    crate::controller::text::one_line(message, LOG_MESSAGE_LIMIT)
}

/// The reason of the event of a result in `state`.
pub fn reason(state: &ProbeState) -> &'static str {
    if *state == ProbeState::Succeeded {
        REASON_SUCCEEDED
    } else {
        REASON_FAILED
    }
}

/// A probe's identity in the status: pod UID and probe name (`<marker>#<probe>`).
pub type ProbeKey = (String, String);

/// A probe's current result.
#[derive(Clone, Debug, PartialEq)]
pub struct Result {
    /// Succeeded, Failed or Unknown.
    pub state: ProbeState,
    /// What the probe said (at most 1024 bytes).
    pub message: String,
    /// When this state began.
    pub since: Time,
    /// When this state and message were first seen.
    pub observed: Time,
}

/// Consecutive outcomes of one probe, and the thresholds that turn them into results.
#[derive(Clone, Debug, Default)]
pub struct Thresholds {
    last: Option<bool>,
    run: u32,
}

impl Thresholds {
    /// Forgets the run (a new container).
    pub fn reset(&mut self) {
        self.last = None;
        self.run = 0;
    }

    /// Records an outcome (`true`: success); whether it is to be reported, given the
    /// success and failure thresholds (each at least 1).
    pub fn observe(
        &mut self,
        success: bool,
        success_threshold: i32,
        failure_threshold: i32,
    ) -> bool {
        if self.last == Some(success) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(success);
            self.run = 1;
        }
        let needed = if success {
            success_threshold
        } else {
            failure_threshold
        };
        self.run >= u32::try_from(needed.max(1)).unwrap_or(1)
    }
}

/// The status to write: the old entries of pods and probes still in the spec, each probe's
/// current result applied (new probes appended), pods and probes gone from the spec dropped.
pub fn build_status(
    npp: &NodePodProbe,
    results: &BTreeMap<ProbeKey, Result>,
) -> NodePodProbeStatus {
    // the old entries by pod UID and probe name, the first of each as before: a lookup, not a
    // scan, so a pod listing thousands of probes costs linear time, not quadratic
    let mut previous_of: HashMap<&str, HashMap<&str, &ContainerProbeState>> = HashMap::new();
    for p in npp.status.iter().flat_map(|s| &s.pod_probe_statuses) {
        if let Entry::Vacant(slot) = previous_of.entry(p.uid.as_str()) {
            let states = slot.insert(HashMap::with_capacity(p.probe_states.len()));
            for s in &p.probe_states {
                states.entry(s.name.as_str()).or_insert(s);
            }
        }
    }
    let mut out = NodePodProbeStatus::default();
    for pod in &npp.spec.pod_probes {
        let previous = previous_of.get(pod.uid.as_str());
        let mut entry = PodProbeStatus {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            uid: pod.uid.clone(),
            probe_states: Vec::new(),
        };
        for probe in &pod.probes {
            let key = (pod.uid.clone(), probe.name.clone());
            let before = previous.and_then(|p| p.get(probe.name.as_str()).copied());
            match results.get(&key) {
                Some(r) => entry.probe_states.push(ContainerProbeState {
                    name: probe.name.clone(),
                    state: r.state.clone(),
                    last_probe_time: Some(r.observed.clone()),
                    last_transition_time: Some(r.since.clone()),
                    message: r.message.clone(),
                }),
                None => entry.probe_states.extend(before.cloned()),
            }
        }
        if !entry.probe_states.is_empty() {
            out.pod_probe_statuses.push(entry);
        }
    }
    out
}

/// The status to write on `npp`: [`build_status`], unless it is what `npp` shows already, or
/// there is nothing to show and `npp` shows nothing.
pub fn status_to_write(
    npp: &NodePodProbe,
    results: &BTreeMap<ProbeKey, Result>,
) -> Option<NodePodProbeStatus> {
    let status = build_status(npp, results);
    if Some(&status) == npp.status.as_ref()
        || (status.pod_probe_statuses.is_empty()
            && npp
                .status
                .as_ref()
                .is_none_or(|s| s.pod_probe_statuses.is_empty()))
    {
        return None;
    }
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn thresholds_need_that_many_outcomes_in_a_row() {
        let mut t = Thresholds::default();
        assert!(!t.observe(false, 1, 3));
        assert!(!t.observe(false, 1, 3));
        assert!(t.observe(false, 1, 3));
        assert!(
            t.observe(true, 1, 3),
            "one success is enough with threshold 1"
        );
        let mut t = Thresholds::default();
        assert!(
            t.observe(true, 0, 0),
            "0 counts as 1, as kruise's manager leaves it"
        );
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn the_status_keeps_what_is_in_the_spec_applies_results_and_drops_the_rest() {
        let npp: NodePodProbe = serde_json::from_value(json!({
            "metadata": {"name": "node-a"},
            "spec": {"podProbes": [{"name": "p", "namespace": "ns", "uid": "u1", "IP": "1.2.3.4",
                "probes": [{"name": "m#a", "containerName": "c", "probe": {}},
                           {"name": "m#b", "containerName": "c", "probe": {}}]}]},
            "status": {"podProbeStatuses": [
                {"name": "p", "namespace": "ns", "uid": "u1", "probeStates": [
                    {"name": "m#a", "state": "Failed", "message": "old"},
                    {"name": "m#gone", "state": "Succeeded"}]},
                {"name": "q", "namespace": "ns", "uid": "u-gone", "probeStates": [{"name": "m#a", "state": "Succeeded"}]}]}
        }))
        .unwrap();
        let mut results = BTreeMap::new();
        results.insert(
            ("u1".to_string(), "m#b".to_string()),
            Result {
                state: ProbeState::Succeeded,
                message: "fine".into(),
                since: time(100),
                observed: time(100),
            },
        );
        let s = build_status(&npp, &results);
        assert_eq!(
            s.pod_probe_statuses.len(),
            1,
            "the pod gone from the spec is dropped"
        );
        let states = &s.pod_probe_statuses[0].probe_states;
        let names: Vec<_> = states.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["m#a", "m#b"],
            "the probe gone from the spec is dropped"
        );
        assert_eq!(
            states[0].message, "old",
            "no result yet: the old state is kept"
        );
        assert_eq!(states[1].state, ProbeState::Succeeded);
        assert_eq!(states[1].last_transition_time, Some(time(100)));
    }

    fn node_probes() -> NodePodProbe {
        serde_json::from_value(json!({
            "metadata": {"name": "node-a"},
            "spec": {"podProbes": [{"name": "p", "namespace": "ns", "uid": "u1", "IP": "1.2.3.4",
                "probes": [{"name": "m#a", "containerName": "c", "probe": {"periodSeconds": 5}},
                           {"name": "m#b", "containerName": "d", "probe": {}}]}]}
        }))
        .unwrap()
    }

    #[test]
    fn each_probe_of_the_spec_is_a_task_of_its_pod_probe_and_container() {
        let npp = node_probes();
        let tasks = wanted(Some(&npp));
        assert_eq!(tasks.len(), 2);
        let a = &tasks[&("u1".to_string(), "m#a".to_string(), "c".to_string())];
        assert_eq!((a.ip.as_str(), a.container.as_str()), ("1.2.3.4", "c"));
        assert_eq!(a.pod.name.as_deref(), Some("p"));
        assert_eq!(a.pod.namespace.as_deref(), Some("ns"));
        assert_eq!(a.probe.period_seconds, Some(5));
        assert!(wanted(None).is_empty(), "no NodePodProbe: no probes");
    }

    /// `probes` probes for each (namespace, pod UID) of `pods`.
    fn listed(pods: &[(&str, &str, usize)]) -> HashMap<TaskKey, ProbeSpec> {
        let mut wanted = HashMap::new();
        for (namespace, uid, probes) in pods {
            for i in 0..*probes {
                let key = (uid.to_string(), format!("m#p{i:05}"), "c".to_string());
                let pod = write::pod_ref(namespace, uid, uid);
                wanted.insert(
                    key,
                    ProbeSpec {
                        pod,
                        ip: String::new(),
                        container: "c".into(),
                        probe: Probe::default(),
                    },
                );
            }
        }
        wanted
    }

    /// How many of `uid`'s probes run.
    fn running(capped: &Capped, uid: &str) -> usize {
        capped.run.keys().filter(|k| k.0 == uid).count()
    }

    #[test]
    fn a_pod_listing_thousands_of_probes_runs_its_first_few_and_each_other_says_why_not() {
        let capped = cap(listed(&[("t", "hog", 3000), ("o", "other", 2)]), 32, 1024);
        assert_eq!(running(&capped, "hog"), 32);
        assert_eq!(running(&capped, "other"), 2);
        assert_eq!(capped.refused.len(), 3000 - 32, "none dropped silently");
        assert!(
            capped
                .run
                .contains_key(&("hog".into(), "m#p00000".into(), "c".into())),
            "the first in name order run"
        );
        let why = &capped.refused[&("hog".to_string(), "m#p02999".to_string())];
        assert_eq!(
            why,
            "not run: the pod lists 3000 probes, kruised runs at most 32 a pod"
        );
    }

    #[test]
    fn a_tenant_with_many_pods_of_probes_takes_its_share_of_the_node_and_others_still_run() {
        // one namespace, 40 pods of 32 probes (1280): over the node's cap of 1024 alone
        let mut pods: Vec<(String, usize)> = (0..40).map(|i| (format!("hog-{i:02}"), 32)).collect();
        pods.push(("small".into(), 3));
        let specs: Vec<(&str, &str, usize)> = pods
            .iter()
            .map(|(uid, n)| {
                let namespace = if uid == "small" { "b" } else { "a" };
                (namespace, uid.as_str(), *n)
            })
            .collect();
        let capped = cap(listed(&specs), 32, 1024);
        assert_eq!(capped.run.len(), 1024);
        assert_eq!(
            running(&capped, "small"),
            3,
            "another namespace's probes all run"
        );
        // the tenant's 1021 slots shared by its pods in turn: 25 or 26 each
        for i in 0..40 {
            let n = running(&capped, &format!("hog-{i:02}"));
            assert!((25..=26).contains(&n), "hog-{i:02} runs {n}");
        }
        assert_eq!(capped.refused.len(), 40 * 32 + 3 - 1024);
        let why = capped.refused.values().next().expect("one refused");
        assert!(why.contains("at most 1024 a node"), "{why}");
        // the same spec splits the same way
        let again = cap(listed(&specs), 32, 1024);
        let keys = |c: &Capped| {
            let mut k: Vec<TaskKey> = c.run.keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(keys(&capped), keys(&again));
    }

    #[test]
    fn many_namespaces_share_the_node_by_namespace_before_pod() {
        let capped = cap(
            listed(&[("a", "a1", 4), ("a", "a2", 4), ("b", "b1", 4)]),
            4,
            6,
        );
        // a's and b's in turn: a1, b1, a2, b1, a1, b1 ...
        assert_eq!(running(&capped, "b1"), 3);
        assert_eq!(running(&capped, "a1") + running(&capped, "a2"), 3);
        assert_eq!(capped.refused.len(), 6);
        assert_eq!(
            interleave(vec![vec![1, 2, 3], vec![], vec![4]]),
            [1, 4, 2, 3]
        );
    }

    fn spec(probe: serde_json::Value) -> ProbeSpec {
        ProbeSpec {
            pod: ObjectReference::default(),
            ip: String::new(),
            container: "c".into(),
            probe: serde_json::from_value(probe).unwrap(),
        }
    }

    const SEC: i64 = 1_000_000_000;

    #[test]
    fn a_probe_runs_on_a_running_container_up_its_initial_delay_and_fails_on_a_stopped_one() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let s = spec(json!({"initialDelaySeconds": 10}));
        // seen first 5 s after its creation
        let age = Age::first_seen(95 * SEC, 100 * SEC, t0);
        assert_eq!(age.at(t0), secs(5));
        assert_eq!(
            due(&s, false, age.at(t0 + secs(100))),
            Due::NotRunning("Container(c) is Non-running".into())
        );
        assert_eq!(due(&s, true, age.at(t0 + secs(4))), Due::TooEarly);
        assert_eq!(due(&s, true, age.at(t0 + secs(5))), Due::Run);
        let s = spec(json!({}));
        let age = Age::first_seen(99 * SEC + 1, 100 * SEC, t0);
        assert_eq!(
            due(&s, true, age.at(t0)),
            Due::TooEarly,
            "the kubelet's floor: at least 1 s"
        );
    }

    #[test]
    fn a_wall_clock_set_back_an_hour_after_a_container_is_seen_does_not_hold_its_probe_an_hour() {
        // issue 43, row 16: the initial delay was measured on the wall clock at every run, so a
        // clock stepped back an hour (NTP, a VM resumed) held every probe of the node an hour,
        // and one stepped forward ran them before their delay. The age is read on the wall
        // clock once, when the container is first seen, and on the monotonic clock after: the
        // wall clock is not an input of any later decision
        let t0 = Instant::now();
        let s = spec(json!({"initialDelaySeconds": 10}));
        let created = 1_000 * SEC;
        let age = Age::first_seen(created, created + SEC, t0);
        // 9 s later on the monotonic clock, whatever the wall clock reads by then
        assert_eq!(due(&s, true, age.at(t0 + Duration::from_secs(9))), Due::Run);
        assert_eq!(
            due(&s, true, age.at(t0 + Duration::from_secs(8))),
            Due::TooEarly,
            "nor does a clock stepped forward let it run early"
        );
        // created "in the future" (a wall clock behind the runtime's when first seen): up 0 s,
        // the whole delay on the monotonic clock
        let age = Age::first_seen(created + 3600 * SEC, created, t0);
        assert_eq!(
            due(&s, true, age.at(t0 + Duration::from_secs(10))),
            Due::Run
        );
    }

    #[test]
    fn an_exec_probe_printing_a_forged_log_line_and_escapes_is_logged_as_one_bounded_clean_line() {
        // issue 43, row 16: the output went to text logs as printed, so a container could add
        // lines of its own to kruised's log (a forged "level=ERROR ...") or drive the terminal
        // of whoever reads it
        let output = format!(
            "ok\n2026-01-01T00:00:00Z ERROR kruised: forged\r\u{1b}[2J\u{202e}{}",
            "x".repeat(2000)
        );
        let logged = log_message(&output);
        assert!(!logged.chars().any(char::is_control), "{logged:?}");
        assert!(!logged.contains('\u{202e}'));
        assert!(logged.len() <= LOG_MESSAGE_LIMIT, "{}", logged.len());
        assert!(logged.starts_with("ok 2026-01-01T00:00:00Z ERROR kruised: forged"));
    }

    #[test]
    fn a_timeout_is_at_least_a_second_and_at_most_the_cap() {
        assert_eq!(timeout(&Probe::default()), Duration::from_secs(1));
        let long = Probe {
            timeout_seconds: Some(3600),
            ..Default::default()
        };
        assert_eq!(timeout(&long), PROBE_TIMEOUT_MAX);
    }

    #[test]
    fn an_outcome_counts_once_its_threshold_is_reached_and_one_that_could_not_run_never() {
        let probe = Probe {
            failure_threshold: Some(2),
            ..Default::default()
        };
        let mut t = Thresholds::default();
        assert_eq!(judge(&mut t, Outcome::Failure("no".into()), &probe), None);
        assert_eq!(
            judge(&mut t, Outcome::Error("bad port".into()), &probe),
            None
        );
        assert_eq!(
            judge(&mut t, Outcome::Failure("no\n".into()), &probe),
            Some((ProbeState::Failed, "no".into())),
            "the second failure in a row, its message trimmed"
        );
        assert_eq!(
            judge(&mut t, Outcome::Success("x".repeat(2000)), &probe),
            Some((ProbeState::Succeeded, "x".repeat(prober::MESSAGE_LIMIT))),
            "cut to the limit"
        );
    }

    #[test]
    fn a_new_result_keeps_its_transition_time_while_the_state_holds_and_is_news_as_kruise_says() {
        let first = next_result(None, ProbeState::Succeeded, "ok".into(), time(1));
        let (r, event) = first.unwrap();
        assert!(!event, "a first success is no news");
        assert_eq!(
            next_result(Some(&r), ProbeState::Succeeded, "ok".into(), time(2)),
            None
        );
        let (r2, event) =
            next_result(Some(&r), ProbeState::Succeeded, "fine".into(), time(61)).unwrap();
        assert!(!event, "the same state, another message");
        assert_eq!((r2.since.clone(), r2.observed.clone()), (time(1), time(61)));
        let (r3, event) =
            next_result(Some(&r2), ProbeState::Failed, "down".into(), time(62)).unwrap();
        assert!(event);
        assert_eq!(r3.since, time(62));
        let (_, event) = next_result(None, ProbeState::Failed, "down".into(), time(5)).unwrap();
        assert!(event, "a first failure is news");
        let (u, event) =
            next_result(Some(&r3), ProbeState::Unknown, String::new(), time(6)).unwrap();
        assert!(!event, "Unknown is never news");
        let (_, event) =
            next_result(Some(&u), ProbeState::Succeeded, "ok".into(), time(7)).unwrap();
        assert!(!event, "a success after Unknown is a first success");
        assert_eq!(reason(&ProbeState::Succeeded), REASON_SUCCEEDED);
        assert_eq!(reason(&ProbeState::Failed), REASON_FAILED);
    }

    #[test]
    fn a_probe_printing_the_time_records_a_new_message_once_a_minute_not_at_every_run() {
        // issue 43, row 7: an exec probe printing the time made a NodePodProbe write a second
        let (mut r, _) = next_result(None, ProbeState::Succeeded, "t=0".into(), time(0)).unwrap();
        let mut recorded = 0;
        for t in 1..=180 {
            if let Some((next, event)) =
                next_result(Some(&r), ProbeState::Succeeded, format!("t={t}"), time(t))
            {
                assert!(!event, "no event for a message");
                r = next;
                recorded += 1;
            }
        }
        assert_eq!(recorded, 3, "at 60, 120 and 180 s");
        assert_eq!(r.message, "t=180");
        // a change of state is recorded at once, whatever the message did
        let (failed, event) =
            next_result(Some(&r), ProbeState::Failed, "t=181".into(), time(181)).unwrap();
        assert!(event && failed.since == time(181));
    }

    #[test]
    fn the_status_is_written_only_when_it_differs_from_the_stored_one() {
        let mut npp = node_probes();
        assert_eq!(
            status_to_write(&npp, &BTreeMap::new()),
            None,
            "no results and none stored"
        );
        let mut results = BTreeMap::new();
        results.insert(
            ("u1".to_string(), "m#a".to_string()),
            Result {
                state: ProbeState::Failed,
                message: "down".into(),
                since: time(100),
                observed: time(100),
            },
        );
        let status = status_to_write(&npp, &results).expect("a result to write");
        npp.status = Some(status);
        assert_eq!(status_to_write(&npp, &results), None, "already written");
        npp.spec.pod_probes.clear();
        assert_eq!(
            status_to_write(&npp, &results),
            Some(NodePodProbeStatus::default()),
            "the pod left the spec: its entry is dropped"
        );
    }
}
