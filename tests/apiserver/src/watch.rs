//! WATCH streams: newline-delimited `{"type", "object"}` events over a chunked
//! HTTP/1.1 response, produced by one task per watch.
//!
//! A watch replays retained history after its start RV (or first sends the
//! current objects as ADDED), then follows live writes. Selector transitions
//! follow the real watch cache: an object that stops matching is sent as
//! DELETED (its previous state, stamped with the new RV), one that starts
//! matching as ADDED. BOOKMARKs carry the RV up to which every event has been
//! considered, so resuming from a bookmark never skips an event.
//!
//! Bookmarks follow the real watch cache too (measured on v1.36): when a watch
//! that allows them starts with the current state (no resourceVersion, `0`, or
//! `sendInitialEvents=true`), the initial ADDED events end with a bookmark
//! annotated `k8s.io/initial-events-end: "true"`; after that a bookmark comes
//! every `bookmark_interval` (a minute on the real server) and once two
//! seconds before `timeoutSeconds` ends the watch, each only if the RV moved
//! since the last event or bookmark sent. The stream then ends without one.
//! A watch lasts `timeoutSeconds` × [`Config::watch_timeout_scale`](crate::Config)
//! (1.0 unless a test shortens or stretches it).
//! A bookmark is the kind's empty object as the real server serializes it
//! (a pod's has `spec: {containers: null}, status: {}`).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::hold;
use crate::kinds::{KindInfo, from_storage};
use crate::selectors::Selectors;
use crate::server::Shared;
use crate::status::ApiError;
use crate::store::{EventType, HistEvent, set_rv};

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Send the current matching objects as ADDED, then follow.
    Initial,
    /// Replay events with RV greater than this, then follow.
    From(u64),
}

/// A validated watch request.
#[derive(Clone, Debug)]
pub(crate) struct WatchRequest {
    pub kidx: usize,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub selectors: Selectors,
    pub start: Start,
    pub bookmarks: bool,
    pub timeout: Duration,
}

/// How long before the end of a watch the real server sends its last bookmark.
const PRE_TIMEOUT_BOOKMARK: Duration = Duration::from_secs(2);

/// One chunk of a watch body; an `Err` aborts the connection.
pub(crate) type Chunk = Result<Bytes, io::Error>;

/// Counts a watch (or a connection) as open from creation until dropped.
pub(crate) struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    pub(crate) fn new(open: Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::SeqCst);
        OpenGuard(open)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn line(etype: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": etype, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The fields of a built-in kind's zero value as the real server serializes
/// it in a bookmark (custom resources have none).
fn empty_object_fields(kind: &KindInfo) -> Value {
    match (kind.group.as_str(), kind.plural.as_str()) {
        ("", "pods") => json!({"spec": {"containers": null}, "status": {}}),
        ("", "namespaces") => json!({"spec": {}, "status": {}}),
        ("", "nodes") => json!({"spec": {}, "status": {
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "", "architecture": ""}}}),
        ("", "events") => json!({"involvedObject": {}, "source": {}, "firstTimestamp": null,
            "lastTimestamp": null, "eventTime": null, "reportingComponent": "",
            "reportingInstance": ""}),
        ("events.k8s.io", "events") => json!({"eventTime": null, "regarding": {},
            "deprecatedSource": {}, "deprecatedFirstTimestamp": null,
            "deprecatedLastTimestamp": null}),
        _ => json!({}),
    }
}

fn bookmark(kind: &KindInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut obj = json!({
        "kind": kind.kind,
        "apiVersion": kind.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if let (Value::Object(o), Value::Object(extra)) = (&mut obj, empty_object_fields(kind)) {
        o.extend(extra);
    }
    if initial_end {
        obj["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line("BOOKMARK", &obj)
}

fn too_old(rv: u64, compacted: u64) -> Bytes {
    let status =
        ApiError::expired(format!("too old resource version: {rv} ({compacted})")).to_status();
    line("ERROR", &status)
}

impl WatchRequest {
    fn in_scope(&self, kind: &KindInfo, obj: &Value) -> bool {
        let is = |want: &Option<String>, f: &str| {
            let got = obj.pointer(f).and_then(Value::as_str).unwrap_or("");
            want.as_deref().is_none_or(|w| w == got)
        };
        is(&self.namespace, "/metadata/namespace")
            && is(&self.name, "/metadata/name")
            && self.selectors.matches(kind, obj)
    }

    /// The event this watcher sees for a stored write, if any.
    fn transform(&self, kind: &KindInfo, ev: &HistEvent) -> Option<(EventType, Value)> {
        let new = from_storage(kind, &ev.object);
        let new_match = self.in_scope(kind, &new);
        match ev.etype {
            EventType::Added | EventType::Deleted => new_match.then_some((ev.etype, new)),
            EventType::Modified => {
                let old = ev.prev.as_ref().map(|p| from_storage(kind, p));
                let old_match = old.as_ref().is_some_and(|o| self.in_scope(kind, o));
                match (old_match, new_match) {
                    (true, true) => Some((EventType::Modified, new)),
                    (false, true) => Some((EventType::Added, new)),
                    (true, false) => old.map(|mut o| {
                        set_rv(&mut o, ev.rv);
                        (EventType::Deleted, o)
                    }),
                    (false, false) => None,
                }
            }
        }
    }
}

/// How long a watch that asked for `timeout` lasts ([`Config::watch_timeout_scale`]).
///
/// [`Config::watch_timeout_scale`]: crate::Config::watch_timeout_scale
fn scaled(timeout: Duration, scale: f64) -> Duration {
    if !(scale.is_finite() && scale > 0.0) {
        return timeout;
    }
    Duration::try_from_secs_f64(timeout.as_secs_f64() * scale).unwrap_or(timeout)
}

/// Produce the watch body into `tx` until timeout, drop, shutdown or client exit.
pub(crate) async fn run(
    shared: Arc<Shared>,
    req: WatchRequest,
    tx: mpsc::Sender<Chunk>,
    guard: OpenGuard,
) {
    let _guard = guard;
    let store = &shared.store;
    let mut drop_rx = shared.drop_tx.subscribe();
    let mut shutdown_rx = shared.shutdown_rx.clone();
    let mut rv_rx = store.subscribe();
    rv_rx.borrow_and_update();
    let deadline = Instant::now() + scaled(req.timeout, shared.config.watch_timeout_scale);

    let (kind, sidx, _) = shared.kinds.with_storage(req.kidx);
    let send = |b: Bytes| {
        let tx = tx.clone();
        async move { tx.send(Ok(b)).await.is_ok() }
    };

    let mut last = match req.start {
        Start::From(rv) => {
            let compacted = store.read(|st| st.compacted);
            if compacted > 0 && rv <= compacted {
                let _ = send(too_old(rv, compacted)).await;
                return;
            }
            rv
        }
        Start::Initial => {
            let (rv, initial) = store.read(|st| {
                let objs: Vec<Value> = st
                    .objects(sidx)
                    .map(|o| from_storage(kind, o))
                    .filter(|o| req.in_scope(kind, o))
                    .collect();
                (st.rv, objs)
            });
            for obj in initial {
                if !send(line("ADDED", &obj)).await {
                    return;
                }
            }
            if req.bookmarks && !send(bookmark(kind, rv, true)).await {
                return;
            }
            rv
        }
    };
    // RV of the last event or bookmark sent (or of the start): bookmarks only
    // report progress past it.
    let mut reported = last;

    let period = shared
        .config
        .bookmark_interval
        .max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let pre_deadline = deadline.checked_sub(PRE_TIMEOUT_BOOKMARK);
    let mut pre_deadline_due = pre_deadline.is_some_and(|t| t > Instant::now());
    let mut bookmark_due = false;
    loop {
        let (events, now_rv, compacted) =
            store.read(|st| (st.events_after(last), st.rv, st.compacted));
        let Some(events) = events else {
            let _ = send(too_old(last, compacted)).await;
            return;
        };
        // a held event stops the stream before it, until the test releases it
        let mut held = None;
        for ev in events.iter().filter(|e| e.sidx == sidx) {
            if let Some(released) = hold::lock(&shared.holds).watch_event(sidx, ev.rv) {
                last = ev.rv - 1;
                held = Some(released);
                break;
            }
            if let Some((etype, obj)) = req.transform(kind, ev) {
                if !send(line(etype.as_str(), &obj)).await {
                    return;
                }
                reported = reported.max(ev.rv);
            }
        }
        // a watch from an RV ahead of the store waits for it
        if held.is_none() {
            last = last.max(now_rv);
        }
        if bookmark_due && req.bookmarks && last > reported {
            if !send(bookmark(kind, last, false)).await {
                return;
            }
            reported = last;
        }
        bookmark_due = false;
        tokio::select! {
            biased;
            _ = shutdown_rx.changed() => return,
            _ = drop_rx.changed() => {
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch dropped by the test"))).await;
                return;
            }
            _ = tx.closed() => return,
            _ = tokio::time::sleep_until(deadline) => return,
            _ = tokio::time::sleep_until(pre_deadline.unwrap_or(deadline)), if pre_deadline_due => {
                pre_deadline_due = false;
                bookmark_due = true;
            }
            _ = ticker.tick(), if req.bookmarks => bookmark_due = true,
            () = async {
                match held {
                    Some(released) => hold::until_released(released).await,
                    None => std::future::pending().await,
                }
            } => {}
            changed = rv_rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
