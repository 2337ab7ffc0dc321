//! Watches of the API objects of this node, each kept in an in-memory store: the node's pods
//! (field selector `spec.nodeName`), the NodeImage and NodePodProbe named after the node, and
//! the node's active ContainerRecreateRequests.
//!
//! Each watch is a loop of kruised's own over `list` and `watch` requests (not kube's
//! `watcher()`, which swallows bookmarks and says nothing when a watch request after an error
//! was accepted, so a live watch could not be told from a dead one):
//!
//! - The first list reads the API server's watch cache (`resourceVersion=0`), as client-go's
//!   informers do: a fleet's daemons starting at once never read etcd, and before Kubernetes
//!   1.31 a consistent list of pods by `spec.nodeName` reads every pod of the cluster from etcd,
//!   for each node. A relist (after `410 Gone`) reads the watch cache too, at least as new as
//!   the last resourceVersion the watch saw (`resourceVersionMatch=NotOlderThan`), as
//!   client-go's reflector does: the store is never taken back in time, and an API server
//!   restarted under a large cluster is not asked for a quorum read from every node at once.
//!   Only when the cache cannot serve that (`410`, or its `Too large resource version`) is the
//!   relist a consistent read from etcd, in pages of [`LIST_PAGE`], so that no single call
//!   reads the cluster's objects under the call's time limit ([`ListFrom`]).
//! - Each watch request asks for bookmarks and for a `timeoutSeconds` drawn at random between 10
//!   and 15 minutes ([`Renewal`]). The server ends the watch then, and the loop watches again
//!   from the last resourceVersion it saw, an event's or a bookmark's, without a list. At rest
//!   that is a node's only API traffic: its four watches renewed every 12.5 minutes on
//!   average, 0.32 requests a minute (0.40 at most, were every draw 10 minutes), where
//!   kruise-daemon's client-go renews its four every 5 to 10 minutes (0.53 a minute over a
//!   long run). Drawn per request, so a fleet's renewals spread out.
//! - A watch still open and silent [`Renewal::margin`] past its `timeoutSeconds` is a dead
//!   connection (the server would have ended it): it is dropped and watched again from its
//!   resourceVersion. The client's TCP keepalive notices a dropped connection sooner; this
//!   notices one that stays up and carries nothing.
//! - `410 Gone` relists (the store keeps the last state until the new list replaces it whole;
//!   objects deleted meanwhile vanish then). Any other failure (a request refused or failed, a
//!   stream broken, an `ERROR` event, a silent watch, a `410` on the first watch after a list)
//!   is retried after a jittered backoff: 0.8 s doubling to 30 s, as client-go's reflector,
//!   from the start again once 2 minutes passed without a failure.
//! - Readiness tells the truth: not ready until the first list is in and its watch accepted;
//!   after that, from a failure until a watch request is accepted again, not ready with the
//!   watch's condition saying since when and why (`not live since 2026-12-03T10:00:00Z: …`).
//!   A watch task that ends while the daemon runs fails liveness ([`Liveness::task`]).
//! - What the daemon never reads is pruned before an object is stored; subscribers are told
//!   what changed ([`Change`]) and a generation counter moves after every change.
//!
//! Objects are read one by one, leniently ([`read_lenient`]): a typed list fails whole on one
//! object it cannot read, and a recreate request is written by any tenant (kruise's CRD does not
//! even require its `spec`), so one unreadable object would stop the node's watch and keep the
//! daemon unready. Go's decoder, kruise-daemon's, reads a missing field as its zero value; so
//! does this, and an object that still cannot be read is kept by its name alone, with a
//! warning.
//!
//! [`Liveness::task`]: crate::health::Liveness::task

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::health::ReadinessCondition;

/// How many unread changes a slow subscriber may fall behind before it must resync (every
/// subscriber treats `Lagged` as a resync against the store, so this bounds memory, not
/// correctness). A broadcast channel allocates all its slots up front: 4096 slots cost 512 KiB
/// per watch, 2 MiB of the daemon's 4.8 MiB heap on a 110-pod node (massif); 256 cost 32 KiB.
const CHANGE_BUFFER: usize = 256;

/// First pause after a failure; doubles up to [`BACKOFF_MAX`] (client-go's reflector's).
const BACKOFF_MIN: Duration = Duration::from_millis(800);
/// Longest pause between attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A failure this long after the last one starts the backoff from [`BACKOFF_MIN`] again.
const BACKOFF_RESET: Duration = Duration::from_secs(120);

/// How long each watch request asks the server to keep it open, and how long past that a
/// silent watch is taken for a dead connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewal {
    /// The shortest `timeoutSeconds` drawn.
    pub min: Duration,
    /// The longest `timeoutSeconds` drawn.
    pub max: Duration,
    /// How long past its `timeoutSeconds` a watch may stay open and silent before it is
    /// dropped as dead.
    pub margin: Duration,
}

impl Renewal {
    /// 10 to 15 minutes, 30 s of margin. Longer than client-go's 5 to 10: a renewal costs the
    /// API server a resumed watch (8.5 ms of its CPU, `docs/PERFORMANCE.md`), and a connection
    /// that died is noticed by the client's TCP keepalive within about a minute, not by the
    /// watch's end. The mean, 12.5 minutes, makes the node's four watches 0.32 requests a
    /// minute; the shortest, 0.40, kruise-daemon's measured rate.
    pub const DEFAULT: Renewal = Renewal {
        min: Duration::from_secs(600),
        max: Duration::from_secs(900),
        margin: Duration::from_secs(30),
    };

    /// A `timeoutSeconds` for the next watch request: whole seconds, uniform in
    /// [`Renewal::min`, `Renewal::max`], at least 1.
    pub fn draw(&self) -> u32 {
        let secs = |d: Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1);
        let (lo, hi) = (secs(self.min), secs(self.max));
        crate::backoff::random_in(lo.min(hi), hi.max(lo))
    }
}

/// Something that changed in a watched store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<K: Resource<DynamicType = ()>> {
    /// The object was added or modified.
    Applied(ObjectRef<K>),
    /// A (re)list found the object, at this resourceVersion. The store may hold a newer
    /// version by the time a subscriber reads it: a subscriber that must tell the objects as
    /// they were at start from later changes compares with this.
    Listed(ObjectRef<K>, Option<String>),
    /// The object was deleted.
    Deleted(ObjectRef<K>),
    /// The store was (re)filled from a full list: objects may have vanished without a
    /// `Deleted` (after `410 Gone`). Subscribers compare with the store.
    Resynced,
}

/// A watched, cached set of objects.
#[derive(Clone)]
pub struct Watched<K: Resource<DynamicType = ()> + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    generation: watch::Receiver<u64>,
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// The current objects.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The current objects, as a list.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// A receiver of changes from now on. A receiver that lags gets
    /// `RecvError::Lagged` and should treat it as [`Change::Resynced`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change<K>> {
        self.changes.subscribe()
    }

    /// A counter bumped after every change is applied to the store, for waiting on a condition
    /// without polling.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Waits until the first list is in the store.
    pub async fn wait_synced(&self) {
        // kube's ready signal keeps one waker (a oneshot's): of two tasks awaiting it, the first
        // would never wake. So it is only looked at, and the generation, moved once the first
        // list is in, is what wakes. The writer lives as long as the watch task; an ended task
        // also ends the wait.
        let mut generation = self.generation.clone();
        loop {
            if futures::FutureExt::now_or_never(self.store.wait_until_ready()).is_some() {
                return;
            }
            if generation.changed().await.is_err() {
                return;
            }
        }
    }
}

/// What to watch: the objects of `api` that the selectors of `config` pick (the rest of it is
/// kruised's own: bookmarks, unpaged lists), named `name` in logs and readiness, with `prune`
/// dropping what the daemon never reads before an object is stored, each watch request
/// renewed as [`Renewal::DEFAULT`] says.
pub struct WatchSpec<K> {
    name: &'static str,
    api: Api<K>,
    config: watcher::Config,
    prune: fn(&mut K),
    renewal: Renewal,
    pages: Option<u32>,
}

impl<K> WatchSpec<K> {
    /// The watch `name` of what `config` picks of `api`, pruned by `prune`.
    pub fn new(
        name: &'static str,
        api: Api<K>,
        config: watcher::Config,
        prune: fn(&mut K),
    ) -> Self {
        WatchSpec {
            name,
            api,
            config,
            prune,
            renewal: Renewal::DEFAULT,
            pages: None,
        }
    }

    /// Every list of this watch a consistent read in pages of `limit` objects, each page read
    /// and pruned before the next is asked for: for objects a tenant writes, each up to the
    /// API server's 1.5 MiB (256 KiB of annotations), which the watch cache would answer in one
    /// body, hundreds of them at once.
    #[must_use]
    pub fn paged(self, limit: u32) -> Self {
        WatchSpec {
            pages: Some(limit),
            ..self
        }
    }

    /// Renewed as `renewal` says, for tests that cannot wait 10 minutes for a watch to end
    /// (only with the `test-util` feature).
    #[cfg(any(test, feature = "test-util"))]
    #[must_use]
    pub fn with_renewal(self, renewal: Renewal) -> Self {
        WatchSpec { renewal, ..self }
    }
}

/// Starts the watch `spec` once `after` is done, in a task of `tracker` that ends with
/// `cancel` and beats on `liveness`. `ready` becomes ready once the first list is in and its
/// watch accepted, and says whenever the watch is not live after that.
pub fn spawn<K>(
    spec: WatchSpec<K>,
    ready: ReadinessCondition,
    cancel: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
    liveness: &crate::health::Liveness,
    after: impl std::future::Future<Output = ()> + Send + 'static,
) -> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let WatchSpec {
        name,
        api,
        config,
        prune,
        renewal,
        pages,
    } = spec;
    let (reader, writer) = reflector::store();
    let (changes, _) = broadcast::channel(CHANGE_BUFFER);
    let (gen_tx, generation) = watch::channel(0u64);
    ready.set_not_ready("waiting for the first list");
    // objects are read raw, then one by one ([`read_lenient`])
    let api: Api<DynamicObject> = Api::all_with(api.into_client(), &ApiResource::erase::<K>(&()));
    let mut w = WatchLoop {
        api,
        labels: config.label_selector,
        fields: config.field_selector,
        prune,
        renewal,
        writer,
        changes: changes.clone(),
        generation: gen_tx,
        health: Health::new(ready),
        backoff: watch_backoff(),
        list_from: if pages.is_some() {
            ListFrom::Consistent
        } else {
            ListFrom::Cache
        },
        pages: pages.unwrap_or(LIST_PAGE),
        always_paged: pages.is_some(),
        cancel: cancel.clone(),
    };
    // a watch that ends while the daemon runs leaves its store frozen: liveness says so
    let alive = liveness.task(name, &cancel);
    tracker.spawn(
        async move {
            let _alive = alive;
            // the watch starts once `after` is done (the served versions are known)
            tokio::select! {
                () = cancel.cancelled() => return,
                () = after => {}
            }
            w.run().await;
            tracing::debug!("watch stopped");
        }
        .instrument(tracing::info_span!("watch", resource = name)),
    );
    Watched {
        store: reader,
        changes,
        generation,
    }
}

/// What the loop does next.
#[derive(Debug)]
enum Next {
    /// A list (the first, or a relist).
    List,
    /// A watch from `rv`; `fresh`: `rv` is a list's and no watch from it was accepted yet.
    Watch { rv: String, fresh: bool },
    /// The daemon stops.
    Stop,
}

/// How a list reads the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListFrom {
    /// The first list: the watch cache, any state (`resourceVersion=0`).
    Cache,
    /// A relist after `410 Gone`: the watch cache, at least as new as `rv`, the last
    /// resourceVersion the watch saw (`resourceVersionMatch=NotOlderThan`), as client-go's
    /// reflector relists: no store taken back in time, no read from etcd.
    NotOlderThan(String),
    /// A relist the cache could not serve (it answered `410`): a consistent read from etcd, in
    /// pages of [`LIST_PAGE`] so that no one call reads a large cluster's objects.
    Consistent,
}

/// Objects a page of a consistent list asks for, as client-go's pager does.
pub const LIST_PAGE: u32 = 500;

/// One watch's loop: its requests, its store, its subscribers, its health.
struct WatchLoop<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<DynamicObject>,
    labels: Option<String>,
    fields: Option<String>,
    prune: fn(&mut K),
    renewal: Renewal,
    writer: reflector::store::Writer<K>,
    changes: broadcast::Sender<Change<K>>,
    generation: watch::Sender<u64>,
    health: Health,
    backoff: Backoff,
    cancel: CancellationToken,
    /// How the next list reads (see [`ListFrom`]).
    list_from: ListFrom,
    /// Objects a page of a consistent list asks for.
    pages: u32,
    /// Every list consistent and paged ([`WatchSpec::paged`]).
    always_paged: bool,
}

impl<K> WatchLoop<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// Lists, then watches and renews, until cancelled.
    async fn run(&mut self) {
        let mut next = Next::List;
        loop {
            let (then, failure) = match next {
                Next::Stop => return,
                Next::List => self.list().await,
                Next::Watch { rv, fresh } => self.watch(rv, fresh).await,
            };
            next = then;
            if let Some(error) = failure {
                self.health.failed(error);
                tokio::select! {
                    () = self.cancel.cancelled() => return,
                    () = tokio::time::sleep(self.backoff.pause()) => {}
                }
            }
        }
    }

    /// A list ([`ListFrom`]): the store is refilled from it whole.
    async fn list(&mut self) -> (Next, Option<String>) {
        let from = self.list_from.clone();
        let (items, rv) = match self.list_pages(&from).await {
            Ok(Some(listed)) => listed,
            Ok(None) => return (Next::Stop, None),
            Err(e) => {
                if from != ListFrom::Cache && is_gone(&e) && !self.always_paged {
                    // the cache cannot serve it (or a page's continue token expired): from etcd
                    self.list_from = ListFrom::Consistent;
                }
                return (Next::List, Some(format!("list: {e}")));
            }
        };
        let Some(rv) = rv else {
            return (
                Next::List,
                Some("list: the answer has no resourceVersion".to_string()),
            );
        };
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for k in items {
            let at = k.meta().resource_version.clone();
            let key = ObjectRef::from_obj(&k);
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply(k));
            self.tell(Change::Listed(key, at));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        match from {
            ListFrom::Cache => tracing::info!("synced"),
            ListFrom::NotOlderThan(since) => {
                tracing::info!(%since, "relisted from the watch cache")
            }
            ListFrom::Consistent => tracing::info!("relisted (a consistent read)"),
        }
        self.health.listed();
        self.tell(Change::Resynced);
        (Next::Watch { rv, fresh: true }, None)
    }

    /// The objects and resourceVersion of a list read as `from` says, every page of it;
    /// `None` when the daemon stops meanwhile.
    async fn list_pages(
        &self,
        from: &ListFrom,
    ) -> Result<Option<(Vec<K>, Option<String>)>, kube::Error> {
        // the cache answers a list whole (it ignores a limit); only etcd pages
        let (resource_version, version_match, limit) = match from {
            ListFrom::Cache => (
                Some("0".to_string()),
                Some(VersionMatch::NotOlderThan),
                None,
            ),
            ListFrom::NotOlderThan(rv) => {
                (Some(rv.clone()), Some(VersionMatch::NotOlderThan), None)
            }
            ListFrom::Consistent => (None, None, Some(self.pages)),
        };
        let mut params = ListParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            resource_version,
            version_match,
            limit,
            ..ListParams::default()
        };
        let mut items = Vec::new();
        loop {
            let answer = tokio::select! {
                () = self.cancel.cancelled() => return Ok(None),
                a = self.api.list(&params) => a,
            };
            let page = answer?;
            // read and pruned page by page: a page's raw objects go before the next comes
            items.extend(page.items.into_iter().filter_map(|o| self.read(o)));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) if limit.is_some() => {
                    params.continue_token = Some(token);
                }
                _ => {
                    return Ok(Some((
                        items,
                        page.metadata.resource_version.filter(|v| !v.is_empty()),
                    )));
                }
            }
        }
    }

    /// A watch from `rv`, followed until the server ends it (then renewed from the last
    /// resourceVersion seen), it fails, or it is silent past its bound.
    async fn watch(&mut self, rv: String, fresh: bool) -> (Next, Option<String>) {
        let timeout = self.renewal.draw();
        let params = WatchParams {
            label_selector: self.labels.clone(),
            field_selector: self.fields.clone(),
            timeout: Some(timeout),
            bookmarks: true,
            send_initial_events: false,
        };
        let answer = tokio::select! {
            () = self.cancel.cancelled() => return (Next::Stop, None),
            a = self.api.watch(&params, &rv) => a,
        };
        let stream = match answer {
            Ok(s) => s,
            Err(kube::Error::Api(status)) if status.code == 410 => {
                return self.gone(&rv, &status.message, fresh);
            }
            Err(e) => return (Next::Watch { rv, fresh }, Some(format!("watch: {e}"))),
        };
        // accepted: the server answered 200 and streams from here
        let accepted = Instant::now();
        self.health.live();
        let ends = accepted + Duration::from_secs(u64::from(timeout));
        let mut last_heard = accepted;
        let mut rv = rv;
        // still at a list's resourceVersion with nothing heard since: a 410 is a failure
        let mut fresh = fresh;
        let mut stream = std::pin::pin!(stream);
        loop {
            let dead_at = ends.max(last_heard) + self.renewal.margin;
            let event = tokio::select! {
                () = self.cancel.cancelled() => return (Next::Stop, None),
                () = tokio::time::sleep_until(dead_at) => {
                    let silent = dead_at.saturating_duration_since(last_heard);
                    return (
                        Next::Watch { rv, fresh: false },
                        Some(format!(
                            "the watch asked for timeoutSeconds={timeout} and is still open, \
                             silent for {}s: taken for a dead connection",
                            silent.as_secs()
                        )),
                    );
                }
                e = stream.next() => e,
            };
            last_heard = Instant::now();
            match event {
                // the server ended it (its timeout, or a clean close): renewed at once
                None => return (Next::Watch { rv, fresh: false }, None),
                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    fresh = false;
                    rv = o.metadata.resource_version.clone().unwrap_or(rv);
                    if let Some(k) = self.read(o) {
                        let key = ObjectRef::from_obj(&k);
                        self.writer.apply_watcher_event(&watcher::Event::Apply(k));
                        self.tell(Change::Applied(key));
                    }
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    fresh = false;
                    rv = o.metadata.resource_version.clone().unwrap_or(rv);
                    if let Some(k) = self.read(o) {
                        let key = ObjectRef::from_obj(&k);
                        self.writer.apply_watcher_event(&watcher::Event::Delete(k));
                        self.tell(Change::Deleted(key));
                    }
                }
                Some(Ok(WatchEvent::Bookmark(b))) => {
                    fresh = false;
                    if !b.metadata.resource_version.is_empty() {
                        rv = b.metadata.resource_version;
                    }
                }
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    return self.gone(&rv, &status.message, fresh);
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    return (
                        Next::Watch { rv, fresh: false },
                        Some(format!(
                            "watch: the server sent an error: {} ({})",
                            status.message, status.code
                        )),
                    );
                }
                // a `Status` line instead of an event
                Some(Err(kube::Error::Api(status))) if status.code == 410 => {
                    return self.gone(&rv, &status.message, fresh);
                }
                Some(Err(e)) => {
                    return (
                        Next::Watch { rv, fresh: false },
                        Some(format!("watch: {e}")),
                    );
                }
            }
        }
    }

    /// `410 Gone`: the history the watch resumes from is compacted away, so a relist, at once.
    /// On the first watch from a list's resourceVersion it cannot be that: a failure (backoff),
    /// so a server that answers it to every watch is not asked in a loop.
    fn gone(&mut self, rv: &str, message: &str, fresh: bool) -> (Next, Option<String>) {
        if fresh {
            // the cache could not watch from its own list's version: read etcd next
            self.list_from = ListFrom::Consistent;
            return (
                Next::List,
                Some(format!(
                    "watch: 410 Gone from the resourceVersion a list just gave: {message}"
                )),
            );
        }
        if !self.always_paged {
            self.list_from = ListFrom::NotOlderThan(rv.to_string());
        }
        tracing::info!(reason = %message, "410 Gone: relisting");
        (Next::List, None)
    }

    /// `o` as a `K` ([`read_lenient`]), pruned; `None` if it cannot be read at all.
    fn read(&self, o: DynamicObject) -> Option<K> {
        let mut k = read_lenient::<K>(o)?;
        (self.prune)(&mut k);
        Some(k)
    }

    /// Tells subscribers (none is fine) and moves the generation.
    fn tell(&self, change: Change<K>) {
        let _ = self.changes.send(change);
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Whether a relist's answer says the cache cannot serve it: `410` (the version is gone, or a
/// page's continue token expired), or the cache's `Too large resource version` (it has not
/// caught up with the version asked for within its wait), as client-go's reflector tells them.
fn is_gone(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code == 410 || (s.code == 504 && s.message.contains("Too large resource version"))
        }
        _ => false,
    }
}

/// What the watch's readiness condition says, and what the log says of it.
struct Health {
    ready: ReadinessCondition,
    /// The first list is in.
    listed: bool,
    /// Since when the watch is not live (UTC, to the second), once it was.
    down_since: Option<String>,
    /// The error last logged, so a failure repeated while retrying is logged once.
    last_logged: Option<String>,
}

impl Health {
    fn new(ready: ReadinessCondition) -> Self {
        Health {
            ready,
            listed: false,
            down_since: None,
            last_logged: None,
        }
    }

    /// A list is in; ready once its watch is accepted.
    fn listed(&mut self) {
        if !self.listed {
            self.listed = true;
            self.ready.set_not_ready("listed; starting the watch");
        }
    }

    /// A watch request was accepted: live.
    fn live(&mut self) {
        if !self.listed {
            return;
        }
        if let Some(since) = self.down_since.take() {
            tracing::info!(%since, "watch live again");
        }
        self.last_logged = None;
        self.ready.set_ready();
    }

    /// A failure: not live from now (or since the first failure of a run of them), saying why;
    /// readiness first, then the log (a test that waits for the log line finds `/readyz`
    /// already saying so).
    fn failed(&mut self, error: String) {
        if self.listed {
            let since = self.down_since.get_or_insert_with(super::time::now_rfc3339);
            self.ready
                .set_not_ready(format!("not live since {since}: {error}"));
        } else {
            self.ready.set_not_ready(format!("not listed yet: {error}"));
        }
        if self.last_logged.as_deref() != Some(&error) {
            tracing::warn!(%error, "watch failed; retrying with backoff");
            self.last_logged = Some(error);
        }
    }
}

/// The back-off between failed attempts: [`BACKOFF_MIN`] doubling up to [`BACKOFF_MAX`], each
/// pause ± 20 %, from the start again after [`BACKOFF_RESET`] without a failure (client-go's
/// reflector: 800 ms, 30 s, 2 minutes).
fn watch_backoff() -> Backoff {
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX).forgetting_after(BACKOFF_RESET)
}

/// Reads `o` as a `K` the way Go's decoder would: a missing `spec` is an empty one. An object
/// that still cannot be read (a field of the wrong type: the API server's schema lets few
/// through) is kept by its name alone, its spec empty, with a warning naming it and why, so the
/// rest of the watch goes on; `None` where even that cannot be read.
pub fn read_lenient<K>(o: DynamicObject) -> Option<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let with_spec = |mut v: serde_json::Value| {
        if let Some(map) = v.as_object_mut() {
            map.entry("spec").or_insert_with(|| serde_json::json!({}));
        }
        v
    };
    let error = match serde_json::to_value(&o).map(with_spec) {
        Ok(v) => match serde_json::from_value::<K>(v) {
            Ok(k) => return Some(k),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    tracing::warn!(kind = %K::kind(&()), namespace = ?o.namespace(), name = %o.name_any(), %error,
        "an object could not be read: kept by its name alone");
    let bare = with_spec(serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": serde_json::to_value(&o.metadata).ok()?,
    }));
    serde_json::from_value::<K>(bare).ok()
}

/// The field selector of the node's pods.
pub fn pods_of_node(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node}"))
}

/// The field selector of a cluster-scoped object named after the node.
pub fn named(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={node}"))
}

/// Drops what the daemon never reads from a pod, to keep the cache small on a full node:
/// managed fields, the last-applied copy, volumes, scheduling constraints. The containers stay
/// whole: kubelet ≤ 1.30 hashes every field of a container, volume mounts included.
pub fn prune_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(crate::k8s::keys::LAST_APPLIED_CONFIGURATION);
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        spec.affinity = None;
        spec.tolerations = None;
        spec.topology_spread_constraints = None;
        spec.node_selector = None;
        spec.image_pull_secrets = None;
    }
}

/// Recreate requests' objects a page of their list asks for (each may carry 256 KiB of a
/// tenant's annotations: a page is a few MiB at most, read and pruned before the next).
pub const RECREATE_LIST_PAGE: u32 = 10;

/// Keeps of a recreate request only what the daemon reads: its `crr.apps.kruise.io/` labels,
/// the two annotations kruise writes for the daemon (`sync-container-statuses`,
/// `unready-acquired`), its spec and status. A tenant's other annotations, labels, owner
/// references, finalizers and managed fields (up to the API server's 1.5 MiB an object) are
/// not kept for the life of the request.
pub fn prune_recreate_request(crr: &mut crate::k8s::crd::ContainerRecreateRequest) {
    use crate::k8s::keys;
    let meta = &mut crr.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k.starts_with("crr.apps.kruise.io/"));
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| {
            k == keys::CRR_SYNC_CONTAINER_STATUSES || k == keys::CRR_UNREADY_ACQUIRED
        });
    }
}

/// Drops managed fields, the one part of every object the daemon never reads.
pub fn prune_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::crd::{ContainerRecreateRequest, NodePodProbe};

    fn raw(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_recreate_request_keeps_only_what_the_daemon_reads_of_a_tenants_metadata() {
        let mut crr: ContainerRecreateRequest = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "t", "uid": "u",
                "labels": {"crr.apps.kruise.io/pod-uid": "p", "tenant": "x"},
                "annotations": {"crr.apps.kruise.io/unready-acquired": "2026-12-05T00:00:00Z",
                                "crr.apps.kruise.io/sync-container-statuses": "[]",
                                "tenant/junk": "x".repeat(1024)},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "p"}],
                "finalizers": ["tenant/f"]},
            "spec": {"podName": "p", "containers": [{"name": "main"}]}
        })))
        .expect("readable");
        prune_recreate_request(&mut crr);
        let meta = &crr.metadata;
        let labels: Vec<&String> = meta.labels.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(labels, ["crr.apps.kruise.io/pod-uid"]);
        let annotations: Vec<&String> = meta.annotations.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(
            annotations,
            [
                "crr.apps.kruise.io/sync-container-statuses",
                "crr.apps.kruise.io/unready-acquired"
            ]
        );
        assert!(meta.owner_references.is_none() && meta.finalizers.is_none());
        assert_eq!(
            (meta.name.as_deref(), meta.uid.as_deref()),
            (Some("r"), Some("u"))
        );
        assert_eq!(crr.spec.containers.len(), 1, "the spec is whole");
    }

    #[test]
    fn each_watch_request_asks_for_a_timeout_drawn_between_10_and_15_minutes() {
        let draws: Vec<u32> = (0..2000).map(|_| Renewal::DEFAULT.draw()).collect();
        assert!(draws.iter().all(|t| (600..=900).contains(t)), "{draws:?}");
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 200, "drawn, not fixed: {distinct:?}");
        let mean = f64::from(draws.iter().sum::<u32>()) / draws.len() as f64;
        // 4 watches renewed every `mean` seconds: 0.32 requests a minute (0.40 at most)
        assert!((730.0..770.0).contains(&mean), "{mean}");
        // a renewal of a second at least, whatever a test asks
        let tiny = Renewal {
            min: Duration::ZERO,
            max: Duration::ZERO,
            margin: Duration::ZERO,
        };
        assert_eq!(tiny.draw(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_backoff_doubles_from_800_ms_to_30_s_and_starts_again_after_2_quiet_minutes() {
        let mut b = watch_backoff();
        let nominal = [800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000];
        for want in nominal {
            let got = b.pause();
            let want = Duration::from_millis(want);
            assert!(
                got >= want.mul_f64(0.8) && got <= want.mul_f64(1.2),
                "{got:?} is not {want:?} ± 20 %"
            );
            tokio::time::advance(got).await;
        }
        // failures keep coming within 2 minutes of each other (the last pause, at most 36 s,
        // and 80 s more): still at the cap
        tokio::time::advance(Duration::from_secs(80)).await;
        assert!(b.pause() >= Duration::from_secs(24));
        // 2 quiet minutes: from the start again
        tokio::time::advance(Duration::from_secs(121)).await;
        assert!(b.pause() <= Duration::from_millis(960));
    }

    #[test]
    fn an_object_without_a_spec_is_read_with_an_empty_one_as_go_reads_it() {
        // kruise's CRDs require no spec: `kubectl create` of metadata alone is accepted, and
        // 2c6dc4e's typed watch then failed whole ("missing field spec"), kruised never ready
        let crr: ContainerRecreateRequest = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "tenant"}
        })))
        .unwrap();
        assert_eq!(crr.spec.pod_name, "");
        assert!(crr.spec.containers.is_empty());
        let npp: NodePodProbe = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
            "metadata": {"name": "node-a"}
        })))
        .unwrap();
        assert!(npp.spec.pod_probes.is_empty());
    }

    #[test]
    fn an_object_with_a_field_of_the_wrong_type_is_kept_by_its_name_alone() {
        let crr: ContainerRecreateRequest = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "odd", "namespace": "tenant", "uid": "u1"},
            "spec": {"podName": "p", "containers": "not a list"}
        })))
        .unwrap();
        assert_eq!(crr.metadata.name.as_deref(), Some("odd"));
        assert_eq!(crr.metadata.uid.as_deref(), Some("u1"));
        assert!(crr.spec.containers.is_empty());
    }

    #[test]
    fn pruning_a_pod_keeps_what_the_daemon_reads_and_the_containers_whole() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"app": "x"},
                "annotations": {
                    "apps.kruise.io/inplace-update-state": "{}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\":true}"
                },
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "nodeName": "n1",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "main", "image": "nginx:1",
                    "env": [{"name": "E", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}],
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}]
                }]
            },
            "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://1",
                "image": "nginx:1", "imageID": "sha256:1", "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        let whole = pod.clone();
        prune_pod(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert!(annotations.contains_key("apps.kruise.io/inplace-update-state"));
        assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none() && spec.tolerations.is_none());
        assert_eq!(spec.containers[0].env.as_ref().unwrap().len(), 1);
        // the legacy kubelet hash covers the whole container
        let before =
            crate::hash::kubelet::hash_container_legacy(&whole.spec.unwrap().containers[0]);
        assert_eq!(
            crate::hash::kubelet::hash_container_legacy(&spec.containers[0]),
            before
        );
        assert_eq!(pod.status.unwrap().container_statuses.unwrap().len(), 1);
    }
}
