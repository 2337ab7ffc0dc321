//! Holds: requests, or the watch events of a resource, kept back until the test releases them,
//! as a slow answer or a lagging watch keeps them on a real server. A test forces an
//! interleaving with them (a write answered late, its watch event later still) instead of
//! hoping for it.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

use crate::control::Control;
use crate::status::ApiError;

/// A hold set by [`Control::hold_requests`] or [`Control::hold_watch_events`]: what it keeps
/// back goes on when it is released, or dropped.
#[must_use = "dropping a hold releases it"]
#[derive(Debug)]
pub struct Hold {
    released: watch::Sender<bool>,
}

impl Hold {
    fn new() -> (Hold, watch::Receiver<bool>) {
        let (released, rx) = watch::channel(false);
        (Hold { released }, rx)
    }

    /// Lets what was held go on (what dropping the hold does too).
    pub fn release(self) {}
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.released.send_replace(true);
    }
}

/// Resolves once `released` says so (or its hold is gone).
pub(crate) async fn until_released(mut released: watch::Receiver<bool>) {
    let _ = released.wait_for(|r| *r).await;
}

struct RequestHold {
    verb: String,
    resource: String,
    body_contains: String,
    released: watch::Receiver<bool>,
}

struct WatchHold {
    /// The storage index of the held kind.
    sidx: usize,
    /// Events after this resourceVersion are held.
    after_rv: u64,
    released: watch::Receiver<bool>,
}

/// The holds in force, shared by the HTTP layer and every watch.
#[derive(Default)]
pub(crate) struct Holds {
    requests: Vec<RequestHold>,
    watches: Vec<WatchHold>,
}

impl Holds {
    fn prune(&mut self) {
        self.requests.retain(|h| !*h.released.borrow());
        self.watches.retain(|h| !*h.released.borrow());
    }

    /// The hold a request is to wait for, if one matches it.
    pub(crate) fn request(
        &mut self,
        verb: &str,
        resource: &str,
        body: &[u8],
    ) -> Option<watch::Receiver<bool>> {
        self.prune();
        let body = String::from_utf8_lossy(body);
        self.requests
            .iter()
            .find(|h| h.verb == verb && h.resource == resource && body.contains(&h.body_contains))
            .map(|h| h.released.clone())
    }

    /// The hold the watch event of a write (`rv`) to storage `sidx` is to wait for, if any.
    pub(crate) fn watch_event(&mut self, sidx: usize, rv: u64) -> Option<watch::Receiver<bool>> {
        self.prune();
        self.watches
            .iter()
            .find(|h| h.sidx == sidx && rv > h.after_rv)
            .map(|h| h.released.clone())
    }
}

/// Locks `m` (a panic while it was held leaves what it guards usable).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Control {
    /// Holds every request with `verb` on `resource` (`patch`, `containerrecreaterequests/status`)
    /// whose body contains `body_contains` (`""`: any) before it is served, until the hold is
    /// released: the client waits for its answer, and the write has not happened. The request
    /// is in the request log as soon as it arrives ([`Control::wait_for_requests`]).
    pub fn hold_requests(&self, verb: &str, resource: &str, body_contains: &str) -> Hold {
        let (hold, released) = Hold::new();
        lock(&self.shared.holds).requests.push(RequestHold {
            verb: verb.to_string(),
            resource: resource.to_string(),
            body_contains: body_contains.to_string(),
            released,
        });
        hold
    }

    /// Holds the watch events of every write to `resource` from now on, on every watch of it,
    /// until the hold is released; then they come in order, as from a watch that lagged. The
    /// writes happen and are read back as usual (GET, LIST, a watch started from the current
    /// state): only the events are late.
    pub fn hold_watch_events(&self, resource: &str) -> Result<Hold, ApiError> {
        let sidx = self.shared.kinds.storage_of(self.kind(resource)?);
        let (hold, released) = Hold::new();
        // under the store's lock: no write comes between the RV read and the hold in force
        self.shared.store.read(|st| {
            lock(&self.shared.holds).watches.push(WatchHold {
                sidx,
                after_rv: st.rv,
                released,
            });
        });
        Ok(hold)
    }
}
