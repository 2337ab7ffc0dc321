//! The in-memory object store: objects keyed by (storage kind, namespace, name),
//! the global resourceVersion counter, the event history watches replay from,
//! compaction, and the snapshots that back `limit`/`continue` paging.
//!
//! Every write happens under one mutex and appends to the history before the
//! lock is released, so "all events with RV ≤ the current RV are in the
//! history" holds whenever the lock is held; watches rely on that for bookmarks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::kinds::{Kinds, from_storage};

/// Type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The wire name, e.g. `ADDED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One retained write, in storage representation.
#[derive(Clone, Debug)]
pub(crate) struct HistEvent {
    pub rv: u64,
    pub etype: EventType,
    pub sidx: usize,
    pub object: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

/// A consistent copy of one storage kind's objects, for paged lists.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    pub id: u64,
    pub rv: u64,
    pub items: Arc<Vec<Arc<Value>>>,
}

const MAX_SNAPSHOTS: usize = 64;

type ObjKey = (String, String);

/// Everything behind the store lock.
pub(crate) struct State {
    pub kinds: Arc<Kinds>,
    pub rv: u64,
    /// Watches and continue tokens at or below this RV are too old (0 = none).
    pub compacted: u64,
    /// RV of the newest event dropped from the history (0 = none dropped).
    pruned: u64,
    history: VecDeque<HistEvent>,
    history_limit: usize,
    objects: Vec<BTreeMap<ObjKey, Arc<Value>>>,
    snapshots: VecDeque<Snapshot>,
    next_snapshot: u64,
    pub require_namespaces: bool,
    /// `Warning` header texts produced by the write in progress (taken by the HTTP layer).
    pub warnings: Vec<String>,
    /// The admission hooks HTTP writes go through ([`Control::add_mutating_admission`]).
    ///
    /// [`Control::add_mutating_admission`]: crate::Control::add_mutating_admission
    pub admission: crate::admission::Admission,
}

fn key_of(obj: &Value) -> ObjKey {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

/// The `metadata.resourceVersion` of an object as a number (0 if absent).
pub(crate) fn rv_of(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Set `metadata.resourceVersion` (creating `metadata` if needed).
pub(crate) fn set_rv(obj: &mut Value, rv: u64) {
    crate::ops::meta_mut(obj).insert("resourceVersion".into(), json!(rv.to_string()));
}

impl State {
    pub(crate) fn new(kinds: Arc<Kinds>, history_limit: usize, require_namespaces: bool) -> Self {
        let n = kinds.len();
        State {
            kinds,
            rv: 1,
            compacted: 0,
            pruned: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            objects: vec![BTreeMap::new(); n],
            snapshots: VecDeque::new(),
            next_snapshot: 1,
            require_namespaces,
            warnings: Vec::new(),
            admission: crate::admission::Admission::default(),
        }
    }

    /// The stored object (storage representation).
    pub(crate) fn get(&self, sidx: usize, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(sidx)?
            .get(&(ns.to_string(), name.to_string()))
    }

    /// An object as the kind `kidx` serves it.
    pub(crate) fn served(&self, kidx: usize, ns: &str, name: &str) -> Option<Value> {
        let (kind, sidx, _) = self.kinds.with_storage(kidx);
        self.get(sidx, ns, name).map(|o| from_storage(kind, o))
    }

    /// All stored objects of a storage kind, ordered by (namespace, name).
    pub(crate) fn objects(&self, sidx: usize) -> impl Iterator<Item = &Arc<Value>> {
        self.objects.get(sidx).into_iter().flat_map(|m| m.values())
    }

    /// Store `obj` (ADDED or MODIFIED), assigning the next resourceVersion.
    pub(crate) fn put(&mut self, sidx: usize, obj: Value) -> Arc<Value> {
        self.write(sidx, obj, false)
    }

    /// Remove the object `last` describes (DELETED), assigning the next resourceVersion.
    pub(crate) fn remove(&mut self, sidx: usize, last: Value) -> Arc<Value> {
        self.write(sidx, last, true)
    }

    fn write(&mut self, sidx: usize, mut obj: Value, delete: bool) -> Arc<Value> {
        self.rv += 1;
        set_rv(&mut obj, self.rv);
        let obj = Arc::new(obj);
        let key = key_of(&obj);
        let objects = self.objects.get_mut(sidx);
        let prev = match delete {
            true => objects.and_then(|m| m.remove(&key)),
            false => objects.and_then(|m| m.insert(key, obj.clone())),
        };
        let etype = match (delete, &prev) {
            (true, _) => EventType::Deleted,
            (false, Some(_)) => EventType::Modified,
            (false, None) => EventType::Added,
        };
        let (rv, object) = (self.rv, obj.clone());
        self.record(HistEvent {
            rv,
            etype,
            sidx,
            object,
            prev,
        });
        obj
    }

    fn record(&mut self, ev: HistEvent) {
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.pruned = old.rv;
                self.compacted = self.compacted.max(old.rv);
            }
        }
    }

    /// Retained events with RV > `after`, or `None` if some were dropped.
    pub(crate) fn events_after(&self, after: u64) -> Option<Vec<HistEvent>> {
        if self.pruned > after {
            return None;
        }
        let start = self.history.partition_point(|e| e.rv <= after);
        Some(self.history.range(start..).cloned().collect())
    }

    /// Make every RV up to now too old for new watches, then move the RV on
    /// by one so that a fresh list yields a watchable RV. Returns the compaction point.
    pub(crate) fn compact(&mut self) -> u64 {
        self.compacted = self.rv;
        self.rv += 1;
        self.snapshots.clear();
        self.compacted
    }

    /// Keep `items` (a consistent copy taken at `rv`) for later pages; returns its id.
    pub(crate) fn save_snapshot(&mut self, rv: u64, items: Arc<Vec<Arc<Value>>>) -> u64 {
        let id = self.next_snapshot;
        self.next_snapshot += 1;
        self.snapshots.push_back(Snapshot { id, rv, items });
        while self.snapshots.len() > MAX_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        id
    }

    pub(crate) fn find_snapshot(&self, id: u64) -> Option<Snapshot> {
        self.snapshots.iter().find(|s| s.id == id).cloned()
    }

    /// Whether a namespace object exists.
    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        self.kinds
            .find("", "v1", "namespaces")
            .is_some_and(|i| self.get(i, "", ns).is_some())
    }
}

/// The store: state behind a mutex plus a channel that publishes the global RV.
pub(crate) struct Store {
    state: Mutex<State>,
    rv_tx: watch::Sender<u64>,
}

impl Store {
    pub(crate) fn new(state: State) -> Self {
        let (rv_tx, _) = watch::channel(state.rv);
        Store {
            state: Mutex::new(state),
            rv_tx,
        }
    }

    /// Run `f` with shared access.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&crate::hold::lock(&self.state))
    }

    /// Run `f` with exclusive access, then publish the new RV if it moved.
    pub(crate) fn write<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut st = crate::hold::lock(&self.state);
        let out = f(&mut st);
        let rv = st.rv;
        drop(st);
        self.rv_tx.send_if_modified(|cur| {
            let changed = *cur != rv;
            *cur = rv;
            changed
        });
        out
    }

    /// A receiver that changes whenever the global RV moves.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }
}

/// Read-only view of the store handed to [`Control::wait_for`](crate::Control::wait_for)
/// predicates. Resources are named like in the control API (`pods`,
/// `nodeimages`, `nodeimages.apps.kruise.io`, `events.k8s.io/v1/events`).
pub struct StoreView<'a> {
    pub(crate) state: &'a State,
}

impl StoreView<'_> {
    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.rv
    }

    /// One object, or `None` if absent or the resource is unknown. Use `""`
    /// as namespace for cluster-scoped kinds.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let idx = self.state.kinds.resolve(resource)?;
        self.state.served(idx, namespace, name)
    }

    /// All objects of a resource, in one namespace or (with `None`) all.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let kinds = &self.state.kinds;
        let Some(idx) = kinds.resolve(resource) else {
            return Vec::new();
        };
        let objects = self.state.objects(kinds.storage_of(idx));
        let in_ns = objects.filter(|o| namespace.is_none_or(|ns| key_of(o).0 == ns));
        in_ns.map(|o| from_storage(kinds.get(idx), o)).collect()
    }
}
