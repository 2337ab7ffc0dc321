//! The waiting room: the waits the tests and benchmarks share, each with a limit, each
//! re-checked on a change notification where there is one (a write to the API double's store, a
//! call to the fake CRI runtime, a `tokio::sync::watch` channel), polled where there is none (a
//! real runtime's state, a unit's properties), and each failing with what it waited for and what
//! it saw last. (kruised's log is waited on by [`Daemon`](crate::daemon::Daemon)'s own methods,
//! over its lines as they come, with [`try_watch`].)
//!
//! A wait is a `look` (what to see of the world: the object as it is, a count, a value) and a
//! `done` (whether what was seen is what the test waits for). What the last `look` returned is
//! what a failure shows, so there is no second fetch that may see something else.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use apiserver_double::{Handle, StoreView};
use kruised::cri::fake::{FakeRuntime, FakeState};
use kruised::cri::{ImageService, RemoteRuntime};
use kruised::k8s::crd::{ContainerRecreateRequest, NodeImage, NodeImageStatus, NodePodProbe};
use kruised::k8s::crd::{ContainerRecreateRequestPhase, ProbeState};
use kruised::k8s::keys::{self, RuntimeContainerMetaSet};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

/// The limit of a wait on the doubles, when the test names none.
pub const LIMIT: Duration = Duration::from_secs(60);

/// A wait that gave up: what it waited for, for how long, and what it saw last (`None` when it
/// never got to look, as when the thing it watched went away first).
pub struct Missed<S> {
    /// What was waited for.
    pub what: String,
    /// How long.
    pub limit: Duration,
    /// What the last look saw.
    pub last: Option<S>,
}

impl<S: fmt::Debug> Missed<S> {
    /// Fails the test with what was waited for and what was seen last.
    pub fn fail(&self) -> ! {
        panic!("{self:?}")
    }

    /// [`Missed::fail`], with `context` after (a log, a journal).
    pub fn fail_with(&self, context: impl fmt::Display) -> ! {
        panic!("{self:?}\n{context}")
    }
}

impl<S: fmt::Debug> fmt::Debug for Missed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "waited {:?} for {}; last seen: {:#?}",
            self.limit, self.what, self.last
        )
    }
}

fn missed<S>(what: &str, limit: Duration, last: Option<S>) -> Missed<S> {
    Missed {
        what: what.to_string(),
        limit,
        last,
    }
}

/// Waits until `done` holds of what `look` sees in the API double's store, re-checked after
/// every write; returns what it saw. The store is locked while `look` runs: do not call back
/// into the double from it.
pub async fn try_store<S>(
    api: &Handle,
    limit: Duration,
    what: &str,
    mut look: impl FnMut(&StoreView<'_>) -> S,
    mut done: impl FnMut(&S) -> bool,
) -> Result<S, Missed<S>> {
    let mut last = None;
    api.wait_for_value(limit, |v| {
        let seen = look(v);
        if done(&seen) {
            Some(seen)
        } else {
            last = Some(seen);
            None
        }
    })
    .await
    .map_err(|_| missed(what, limit, last))
}

/// [`try_store`], failing the test when it gives up.
pub async fn store<S: fmt::Debug>(
    api: &Handle,
    limit: Duration,
    what: &str,
    look: impl FnMut(&StoreView<'_>) -> S,
    done: impl FnMut(&S) -> bool,
) -> S {
    try_store(api, limit, what, look, done)
        .await
        .unwrap_or_else(|m| m.fail())
}

/// Waits until `done` holds of what `look` sees in the fake runtime's state, re-checked after
/// every CRI call it serves; returns what it saw.
pub async fn try_cri<S>(
    rt: &FakeRuntime,
    limit: Duration,
    what: &str,
    mut look: impl FnMut(&FakeState) -> S,
    mut done: impl FnMut(&S) -> bool,
) -> Result<S, Missed<S>> {
    let (mut last, mut found) = (None, None);
    // the outcome is in `found`: the fake's own timeout error says nothing more
    let _ = rt
        .wait_for(limit, |st| {
            let seen = look(st);
            let ok = done(&seen);
            *(if ok { &mut found } else { &mut last }) = Some(seen);
            ok
        })
        .await;
    found.ok_or_else(|| missed(what, limit, last))
}

/// [`try_cri`], failing the test when it gives up.
pub async fn cri<S: fmt::Debug>(
    rt: &FakeRuntime,
    limit: Duration,
    what: &str,
    look: impl FnMut(&FakeState) -> S,
    done: impl FnMut(&S) -> bool,
) -> S {
    try_cri(rt, limit, what, look, done)
        .await
        .unwrap_or_else(|m| m.fail())
}

/// Waits until `done` holds of what `look` sees in the watched value, re-checked on every
/// change; returns what it saw. Gives up early when the sender is gone.
pub async fn try_watch<V, S>(
    rx: &mut watch::Receiver<V>,
    limit: Duration,
    what: &str,
    mut look: impl FnMut(&V) -> S,
    mut done: impl FnMut(&S) -> bool,
) -> Result<S, Missed<S>> {
    let mut last = None;
    let found = tokio::time::timeout(limit, async {
        loop {
            let seen = look(&rx.borrow_and_update());
            if done(&seen) {
                return Some(seen);
            }
            last = Some(seen);
            if rx.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    found
        .ok()
        .flatten()
        .ok_or_else(|| missed(what, limit, last))
}

/// Waits until `done` holds of what the future `look` makes sees, looking again `every` so
/// often: for what tells nobody of its changes (a real runtime, a systemd unit, a fleet of
/// kubelets). Returns what it saw.
pub async fn try_poll<S, F: Future<Output = S>>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut look: impl FnMut() -> F,
    mut done: impl FnMut(&S) -> bool,
) -> Result<S, Missed<S>> {
    let mut last = None;
    let found = tokio::time::timeout(limit, async {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let seen = look().await;
            if done(&seen) {
                return seen;
            }
            last = Some(seen);
        }
    })
    .await;
    found.map_err(|_| missed(what, limit, last))
}

/// [`try_poll`], failing the test when it gives up.
pub async fn poll<S: fmt::Debug, F: Future<Output = S>>(
    limit: Duration,
    every: Duration,
    what: &str,
    look: impl FnMut() -> F,
    done: impl FnMut(&S) -> bool,
) -> S {
    try_poll(limit, every, what, look, done)
        .await
        .unwrap_or_else(|m| m.fail())
}

/// Waits until the real runtime `rt` reports `image` there and not pinned (CRI `Image.pinned`),
/// looking every 250 ms (a runtime tells nobody of it); `what` names the wait. A failure shows
/// the last look: `Some(pinned)`, or `None` for an image gone.
pub async fn unpinned(rt: &RemoteRuntime, limit: Duration, what: &str, image: &str) {
    poll(
        limit,
        Duration::from_millis(250),
        what,
        || async {
            rt.image_status(image)
                .await
                .unwrap_or_else(|e| panic!("the status of {image}: {e}"))
                .map(|i| i.pinned)
        },
        |pinned| *pinned == Some(false),
    )
    .await;
}

/// Waits until the recreate request `namespace/name` satisfies `cond`; returns it. A failure
/// shows the object as it was stored last (parsed or not).
pub async fn crr(
    api: &Handle,
    limit: Duration,
    namespace: &str,
    name: &str,
    what: &str,
    mut cond: impl FnMut(&ContainerRecreateRequest) -> bool,
) -> ContainerRecreateRequest {
    let parse =
        |o: &Option<Value>| serde_json::from_value::<ContainerRecreateRequest>(o.clone()?).ok();
    let seen = store(
        api,
        limit,
        &format!("{what} (recreate request {namespace}/{name})"),
        |v| v.get("containerrecreaterequests", namespace, name),
        |o| parse(o).is_some_and(|r| cond(&r)),
    )
    .await;
    parse(&seen).expect("parsed when it was seen")
}

/// Waits until the recreate request `namespace/name` is in `phase`; returns it.
pub async fn crr_phase(
    api: &Handle,
    limit: Duration,
    namespace: &str,
    name: &str,
    phase: ContainerRecreateRequestPhase,
) -> ContainerRecreateRequest {
    let what = format!("phase {phase:?}");
    crr(api, limit, namespace, name, &what, |r| r.phase() == phase).await
}

/// The `runtime-containers-meta` annotation of a pod object, parsed.
pub fn meta_of(pod: &Value) -> Option<RuntimeContainerMetaSet> {
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(pod["metadata"]["annotations"].clone()).unwrap_or_default();
    keys::parse_runtime_containers_meta(&annotations)
        .ok()
        .flatten()
}

/// Waits until the `runtime-containers-meta` annotation of the pod `namespace/pod` satisfies
/// `cond`; returns it. A failure shows the annotation as it was last.
pub async fn try_meta(
    api: &Handle,
    limit: Duration,
    namespace: &str,
    pod: &str,
    what: &str,
    mut cond: impl FnMut(&RuntimeContainerMetaSet) -> bool,
) -> Result<RuntimeContainerMetaSet, Missed<Option<RuntimeContainerMetaSet>>> {
    try_store(
        api,
        limit,
        &format!("{what} (the annotation of pod {namespace}/{pod})"),
        |v| v.get("pods", namespace, pod).and_then(|o| meta_of(&o)),
        |m| m.as_ref().is_some_and(&mut cond),
    )
    .await
    .map(|m| m.expect("seen when done"))
}

/// [`try_meta`], failing the test when it gives up.
pub async fn meta(
    api: &Handle,
    limit: Duration,
    namespace: &str,
    pod: &str,
    what: &str,
    cond: impl FnMut(&RuntimeContainerMetaSet) -> bool,
) -> RuntimeContainerMetaSet {
    let found = try_meta(api, limit, namespace, pod, what, cond).await;
    found.unwrap_or_else(|m| m.fail())
}

/// [`meta`] of the pod `pod` in `default`, where the fake node's pods are.
pub async fn pod_meta(
    api: &Handle,
    limit: Duration,
    pod: &str,
    what: &str,
    cond: impl FnMut(&RuntimeContainerMetaSet) -> bool,
) -> RuntimeContainerMetaSet {
    meta(api, limit, "default", pod, what, cond).await
}

/// Waits until the probe `probe` of the pod `uid` is in state `want` in the NodePodProbe of
/// `node`; returns the probe's message. A failure shows its state and message as they were.
pub async fn probe_state(
    api: &Handle,
    limit: Duration,
    node: &str,
    uid: &str,
    probe: &str,
    want: ProbeState,
) -> String {
    let seen = store(
        api,
        limit,
        &format!("probe {probe} of pod {uid} {want:?}"),
        |v| {
            let npp: NodePodProbe =
                serde_json::from_value(v.get("nodepodprobes", "", node)?).ok()?;
            let s = npp.status?.probe_state(uid, probe)?.clone();
            Some((s.state, s.message))
        },
        |s| s.as_ref().is_some_and(|(state, _)| *state == want),
    )
    .await;
    seen.map(|(_, message)| message).expect("seen when done")
}

/// The status of a NodeImage object.
pub fn node_image_status(obj: Option<Value>) -> Option<NodeImageStatus> {
    let ni: NodeImage = serde_json::from_value(obj?).ok()?;
    ni.status
}

/// Waits until the status of the NodeImage `node` satisfies `pred`; returns it.
pub async fn node_image(
    api: &Handle,
    limit: Duration,
    node: &str,
    what: &str,
    mut pred: impl FnMut(&NodeImageStatus) -> bool,
) -> NodeImageStatus {
    store(
        api,
        limit,
        &format!("{what} (NodeImage {node})"),
        |v| node_image_status(v.get("nodeimages", "", node)),
        |s| s.as_ref().is_some_and(&mut pred),
    )
    .await
    .expect("seen when done")
}

/// How often an event happened: its count (core v1 events fold repeats into it), or once.
pub fn occurrences(e: &Value) -> u64 {
    e["count"].as_u64().unwrap_or(1)
}

/// Waits until events with `reason` occurred at least `n` times (the recorder folds repeats on
/// one object into a count, as client-go does); returns them.
pub async fn events(api: &Handle, limit: Duration, reason: &str, n: u64) -> Vec<Value> {
    store(
        api,
        limit,
        &format!("{n} {reason} events"),
        |v| {
            v.list("events", None)
                .into_iter()
                .filter(|e| e["reason"] == reason)
                .collect::<Vec<_>>()
        },
        |e| e.iter().map(occurrences).sum::<u64>() >= n,
    )
    .await
}

/// Waits until `cond` holds for the object `name` of a real API server's `api`, watching it, at
/// most `limit`; returns it. A failure shows the object as it is then (`None`: not there).
pub async fn try_kube<K>(
    api: &kube::Api<K>,
    limit: Duration,
    name: &str,
    what: &str,
    cond: impl kube::runtime::wait::Condition<K>,
) -> Result<K, Missed<Option<K>>>
where
    K: Clone + fmt::Debug + DeserializeOwned + kube::Resource + Send + Sync + 'static,
{
    let found = try_kube_maybe(api, limit, name, what, cond).await?;
    found.ok_or_else(|| missed(&format!("{what} ({name})"), limit, Some(None)))
}

/// [`try_kube`] for a condition that may hold of no object (`None`: not there, as when waiting
/// for a deletion).
pub async fn try_kube_maybe<K>(
    api: &kube::Api<K>,
    limit: Duration,
    name: &str,
    what: &str,
    cond: impl kube::runtime::wait::Condition<K>,
) -> Result<Option<K>, Missed<Option<K>>>
where
    K: Clone + fmt::Debug + DeserializeOwned + kube::Resource + Send + Sync + 'static,
{
    let found = tokio::time::timeout(
        limit,
        kube::runtime::wait::await_condition(api.clone(), name, cond),
    )
    .await;
    match found {
        Ok(Ok(obj)) => Ok(obj),
        _ => Err(missed(
            &format!("{what} ({name})"),
            limit,
            Some(api.get_opt(name).await.ok().flatten()),
        )),
    }
}
