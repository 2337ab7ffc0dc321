//! What bounds the admin server's cost: connection slots (in all and per peer address), the
//! rate of the log line about refused connections, and the admin server's own metrics.
//!
//! The admin port is reachable by whatever can reach the pod's IP (or, under host network, the
//! node's), tenants' pods included; these limits keep a flood of connections from starving the
//! kubelet's probes or the node's memory (issue: "flood the admin port").

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Connections served at once from peers that are not the node. The kubelet opens one per probe
/// and closes it, a scraper one or two. Past this, a newcomer takes the slot of the oldest idle
/// connection of the peer that holds the most (more than the newcomer's peer does); when there is
/// none, it is accepted and reset at once, so the listen backlog never fills.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one peer address that is not the node's, so that one pod
/// cannot take a large share of the slots: four pods hold at most half of them.
pub(crate) const MAX_CONNECTIONS_PER_PEER: usize = 8;
/// Slots past [`MAX_CONNECTIONS`] kept for the node's own addresses (the kubelet's probes come
/// from the node): a connection from the node is never refused while fewer than
/// `MAX_CONNECTIONS + NODE_RESERVE` are open, and past that it takes an idle tenant's slot.
pub(crate) const NODE_RESERVE: usize = 8;
/// hyper's read buffer per connection (its default is ~400 KiB); it also bounds a request head,
/// which is refused with 431 when it does not fit. A probe's head is ~150 bytes.
pub(crate) const MAX_BUF_SIZE: usize = 16 * 1024;
/// A client must send its request head within this long, on a new connection and between the
/// requests of a kept-alive one (hyper restarts the timer whenever it waits for a head), so idle
/// sockets cannot pile up. A probe sends its head at once; a scraper that keeps its connection
/// between scrapes reconnects.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection is asked to close (after its request in flight) once it is this old, and dropped
/// `CONNECTION_DRAIN_GRACE` later if it has not: a client that never reads its responses holds
/// a slot no longer than that.
pub(crate) const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// `/metrics` renderings at once (each reads procfs on a blocking thread).
pub(crate) const CONCURRENT_RENDERS: usize = 2;
/// How long a scrape waits for a rendering slot before it is answered 503.
pub(crate) const RENDER_WAIT: Duration = Duration::from_secs(2);
/// At most one log line about refused connections per this long.
pub(crate) const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The limits of one admin server; `Limits::default()` is what `kruised run` uses, tests use
/// smaller ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// See [`MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`MAX_CONNECTIONS_PER_PEER`].
    pub max_connections_per_peer: usize,
    /// See [`NODE_RESERVE`].
    pub node_reserve: usize,
    /// See [`MAX_BUF_SIZE`]; hyper's minimum is 8 KiB.
    pub max_buf_size: usize,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`MAX_CONNECTION_AGE`].
    pub max_connection_age: Duration,
    /// See [`CONCURRENT_RENDERS`].
    pub concurrent_renders: usize,
    /// See [`RENDER_WAIT`].
    pub render_wait: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            node_reserve: NODE_RESERVE,
            max_buf_size: MAX_BUF_SIZE,
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connection_age: MAX_CONNECTION_AGE,
            concurrent_renders: CONCURRENT_RENDERS,
            render_wait: RENDER_WAIT,
        }
    }
}

// === Slots ===

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every slot is taken (the node's reserve too, for the node) and no idle connection of a
    /// busier peer could give its slot up.
    ServerFull,
    /// [`Limits::max_connections_per_peer`] are open from this peer address.
    PeerFull,
}

impl Refusal {
    /// The `reason` label of `kruised_admin_connections_refused_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refusal::ServerFull => "server_full",
            Refusal::PeerFull => "peer_full",
        }
    }
}

/// What the server knows of one open connection: whether it serves a request now, and the
/// signal that asks it to close because a newcomer took its slot.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    in_flight: AtomicUsize,
    evicted: CancellationToken,
}

impl ConnState {
    /// A request started; it ends when the guard is dropped.
    pub(crate) fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Resolves when a newcomer took this connection's slot.
    pub(crate) async fn evicted(&self) {
        self.evicted.cancelled().await;
    }
}

/// A request in flight on a connection (see [`ConnState::busy`]).
#[derive(Debug)]
pub(crate) struct Busy(Arc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One open connection, oldest first in [`Occupancy`].
#[derive(Debug, Clone)]
struct Held {
    id: u64,
    peer: IpAddr,
    node: bool,
    state: Arc<ConnState>,
}

/// The connections open now, in all and by peer address.
#[derive(Debug, Default, Clone)]
pub(crate) struct Occupancy {
    /// Open connections.
    pub open: usize,
    /// Open connections by peer address (only addresses with one or more).
    pub by_peer: HashMap<IpAddr, usize>,
    /// Every open connection, oldest first.
    held: Vec<Held>,
    next_id: u64,
}

impl Occupancy {
    fn count(&self, peer: IpAddr) -> usize {
        self.by_peer.get(&peer).copied().unwrap_or(0)
    }

    fn add(&mut self, peer: IpAddr, node: bool) -> (u64, Arc<ConnState>) {
        let id = self.next_id;
        self.next_id += 1;
        let state = Arc::new(ConnState::default());
        self.held.push(Held {
            id,
            peer,
            node,
            state: state.clone(),
        });
        *self.by_peer.entry(peer).or_insert(0) += 1;
        self.open += 1;
        (id, state)
    }

    /// Forgets connection `id`; `false` if it was forgotten before (evicted).
    fn remove(&mut self, id: u64) -> Option<Held> {
        let at = self.held.iter().position(|h| h.id == id)?;
        let held = self.held.remove(at);
        self.open = self.open.saturating_sub(1);
        if let Entry::Occupied(mut e) = self.by_peer.entry(held.peer) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
        Some(held)
    }

    /// The connection that gives its slot to a newcomer from a peer holding `newcomer_holds`:
    /// the oldest idle one of the peer (not the node) holding the most, if that is more than
    /// the newcomer's peer holds.
    fn victim(&self, newcomer_holds: usize) -> Option<u64> {
        let mut best: Option<(usize, &Held)> = None;
        for h in self.held.iter().filter(|h| !h.node && h.state.is_idle()) {
            let holds = self.count(h.peer);
            // oldest first: a later connection of the same peer never replaces an earlier one
            if holds > newcomer_holds && best.is_none_or(|(b, _)| holds > b) {
                best = Some((holds, h));
            }
        }
        best.map(|(_, h)| h.id)
    }
}

/// What [`Slots::try_take`] gave: the slot, and the peer whose idle connection gave its slot up,
/// if one did.
#[derive(Debug)]
pub(crate) struct Taken {
    /// The newcomer's slot.
    pub slot: Slot,
    /// The peer of the connection asked to close for it.
    pub evicted: Option<IpAddr>,
}

/// Hands out connection slots. Cloning shares them. The occupancy is a watch so that tests can
/// wait until a closed connection has given its slot back.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    occupancy: watch::Sender<Occupancy>,
    max: usize,
    max_per_peer: usize,
    node_reserve: usize,
    open_gauge: Gauge,
}

/// One connection's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Slots,
    id: u64,
    peer: IpAddr,
    node: bool,
    state: Arc<ConnState>,
}

impl Slot {
    /// Whether the slot was taken for one of the node's own addresses.
    pub(crate) fn is_node(&self) -> bool {
        self.node
    }

    /// The peer address the slot was taken for.
    pub(crate) fn peer(&self) -> IpAddr {
        self.peer
    }

    /// The connection's state: its requests in flight, and whether it was evicted.
    pub(crate) fn state(&self) -> &Arc<ConnState> {
        &self.state
    }
}

impl Slots {
    /// Slots for `limits`, reporting the open count on `open_gauge`.
    pub(crate) fn new(limits: &Limits, open_gauge: Gauge) -> Self {
        Slots {
            occupancy: watch::Sender::new(Occupancy::default()),
            max: limits.max_connections,
            max_per_peer: limits.max_connections_per_peer,
            node_reserve: limits.node_reserve,
            open_gauge,
        }
    }

    /// A slot for a connection from `peer` (`node`: one of the node's own addresses). A peer
    /// that is not the node is refused at its own limit. When every slot is taken, the oldest
    /// idle connection of the busiest peer gives its slot up (it is asked to close); the node
    /// first uses its reserve.
    pub(crate) fn try_take(&self, peer: IpAddr, node: bool) -> Result<Taken, Refusal> {
        let mut outcome = Err(Refusal::ServerFull);
        self.occupancy.send_if_modified(|o| {
            let holds = o.count(peer);
            let peer_full = !node && holds >= self.max_per_peer;
            let room = if node {
                self.max + self.node_reserve
            } else {
                self.max
            };
            let mut evicted = None;
            if o.open >= room {
                if peer_full {
                    return false;
                }
                // the node may take any tenant's idle slot; a tenant only a busier peer's
                let newcomer_holds = if node { 0 } else { holds + 1 };
                let Some(held) = o.victim(newcomer_holds).and_then(|id| o.remove(id)) else {
                    return false;
                };
                held.state.evicted.cancel();
                evicted = Some(held.peer);
            } else if peer_full {
                outcome = Err(Refusal::PeerFull);
                return false;
            }
            let (id, state) = o.add(peer, node);
            self.open_gauge.set(gauge_value(o.open));
            outcome = Ok((id, state, evicted));
            true
        });
        outcome.map(|(id, state, evicted)| Taken {
            slot: Slot {
                slots: self.clone(),
                id,
                peer,
                node,
                state,
            },
            evicted,
        })
    }

    /// Watches the occupancy (tests wait on it).
    #[cfg(test)]
    pub(crate) fn subscribe(&self) -> watch::Receiver<Occupancy> {
        self.occupancy.subscribe()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let slots = &self.slots;
        slots.occupancy.send_if_modified(|o| {
            // an evicted connection gave its slot back when it was evicted
            let removed = o.remove(self.id).is_some();
            slots.open_gauge.set(gauge_value(o.open));
            removed
        });
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// === RefusalLog ===

/// Decides which refused connections are logged: the first at once, then at most one per
/// interval, saying how many went unlogged in between, so that a flood cannot flood the log.
#[derive(Debug)]
pub(crate) struct RefusalLog {
    interval: Duration,
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    /// At most one line per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        RefusalLog {
            interval,
            last: None,
            unlogged: 0,
        }
    }

    /// Records a refusal at `now`. `Some(n)`: log this one, saying that `n` were refused
    /// without a line since the last; `None`: stay quiet.
    pub(crate) fn refused(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                self.unlogged += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.unlogged))
            }
        }
    }
}

// === AdminMetrics ===

type ReasonLabel = [(&'static str, &'static str); 1];

/// The admin server's own metrics, `kruised_admin_*`, in a registry of its own that `/metrics`
/// encodes after the daemon's. Cloning shares them.
#[derive(Debug, Clone)]
pub(crate) struct AdminMetrics {
    /// `kruised_admin_connections_refused_total{reason}`.
    pub refused: Family<ReasonLabel, Counter>,
    /// `kruised_admin_connections`.
    pub open: Gauge,
    /// `kruised_admin_scrapes_refused_total`.
    pub scrapes_refused: Counter,
    /// `kruised_admin_connections_evicted_total`.
    pub evicted: Counter,
    /// The registry holding the four.
    pub registry: Arc<Registry>,
}

impl AdminMetrics {
    /// Creates the metrics and their registry.
    pub(crate) fn new() -> Self {
        let refused = Family::<ReasonLabel, Counter>::default();
        let open = Gauge::default();
        let scrapes_refused = Counter::default();
        let evicted = Counter::default();
        let mut root = Registry::with_prefix(crate::metrics::PREFIX);
        let admin = root.sub_registry_with_prefix("admin");
        admin.register(
            "connections_refused",
            "Connections the admin server reset at once because it or the peer address was at \
             its connection limit",
            refused.clone(),
        );
        admin.register(
            "connections",
            "Connections the admin server has open",
            open.clone(),
        );
        admin.register(
            "scrapes_refused",
            "Scrapes of /metrics answered 503 because the renderings at once were at their limit",
            scrapes_refused.clone(),
        );
        admin.register(
            "connections_evicted",
            "Idle connections asked to close because every slot was taken and a newcomer from \
             a peer holding fewer (or from the node) took the slot",
            evicted.clone(),
        );
        AdminMetrics {
            refused,
            open,
            scrapes_refused,
            evicted,
            registry: Arc::new(root),
        }
    }

    /// Counts a refused connection.
    pub(crate) fn count_refusal(&self, reason: Refusal) {
        self.refused
            .get_or_create(&[("reason", reason.as_str())])
            .inc();
    }

    /// How many connections were refused for `reason` so far.
    #[cfg(test)]
    pub(crate) fn refusals(&self, reason: Refusal) -> u64 {
        self.refused
            .get(&[("reason", reason.as_str())])
            .map_or(0, |c| c.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        Ipv4Addr::new(10, 0, 0, last).into()
    }

    fn slots(max: usize, per_peer: usize) -> Slots {
        let limits = Limits {
            max_connections: max,
            max_connections_per_peer: per_peer,
            ..Limits::default()
        };
        Slots::new(&limits, Gauge::default())
    }

    #[test]
    fn one_peer_gets_its_share_of_slots_and_the_server_its_total_and_dropping_a_slot_frees_it() {
        let slots = slots(3, 2);
        let a1 = slots.try_take(ip(1), false).expect("first from a").slot;
        let a2 = slots.try_take(ip(1), false).expect("second from a").slot;
        assert_eq!(
            slots.try_take(ip(1), false).map(|_| ()),
            Err(Refusal::PeerFull),
            "a third from one peer"
        );
        let b1 = slots
            .try_take(ip(2), false)
            .expect("another peer still gets in")
            .slot;
        // every connection busy: nothing to evict
        let _busy = [a1.state().busy(), a2.state().busy(), b1.state().busy()];
        assert_eq!(
            slots.try_take(ip(3), false).map(|_| ()),
            Err(Refusal::ServerFull),
            "a fourth in all"
        );
        assert_eq!(slots.open_gauge.get(), 3);

        drop(a1);
        let occupancy = slots.subscribe().borrow().clone();
        assert_eq!(occupancy.open, 2);
        assert_eq!(occupancy.by_peer.get(&ip(1)), Some(&1));
        assert_eq!(slots.open_gauge.get(), 2);
        let _c1 = slots
            .try_take(ip(3), false)
            .expect("a freed slot is handed out again");
    }

    #[test]
    fn a_full_server_evicts_the_oldest_idle_connection_of_the_peer_holding_the_most() {
        let slots = slots(4, 4);
        let b1 = slots.try_take(ip(2), false).expect("b's first").slot;
        let a = [
            slots.try_take(ip(1), false).expect("a's first").slot,
            slots.try_take(ip(1), false).expect("a's second").slot,
            slots.try_take(ip(1), false).expect("a's third").slot,
        ];
        let _busy = a[0].state().busy();
        let taken = slots.try_take(ip(3), false).expect("a newcomer gets in");
        assert_eq!(taken.evicted, Some(ip(1)), "the busiest peer gives one up");
        let evicted: Vec<bool> = a.iter().map(|s| s.state().evicted.is_cancelled()).collect();
        assert_eq!(
            evicted,
            [false, true, false],
            "its oldest idle one: the first is busy"
        );
        assert!(!b1.state().evicted.is_cancelled());
        let occupancy = slots.subscribe().borrow().clone();
        assert_eq!(occupancy.open, 4);
        assert_eq!(occupancy.by_peer.get(&ip(1)), Some(&2));
        drop(a);
        assert_eq!(
            slots.subscribe().borrow().open,
            2,
            "the evicted slot is not given back twice"
        );
    }

    #[test]
    fn a_tenant_never_evicts_a_peer_holding_no_more_than_it_would() {
        let slots = slots(4, 4);
        let _a = [
            slots.try_take(ip(1), false).expect("a").slot,
            slots.try_take(ip(1), false).expect("a").slot,
        ];
        let _b = [
            slots.try_take(ip(2), false).expect("b").slot,
            slots.try_take(ip(2), false).expect("b").slot,
        ];
        assert_eq!(
            slots.try_take(ip(2), false).map(|_| ()),
            Err(Refusal::ServerFull),
            "b would hold three: a holds two"
        );
        let taken = slots
            .try_take(ip(3), false)
            .expect("a newcomer holding none");
        assert!(taken.evicted.is_some());
    }

    #[test]
    fn the_node_uses_its_reserve_first_then_any_tenants_idle_slot_and_is_never_limited_per_peer() {
        let limits = Limits {
            max_connections: 2,
            max_connections_per_peer: 1,
            node_reserve: 2,
            ..Limits::default()
        };
        let slots = Slots::new(&limits, Gauge::default());
        let t = [
            slots.try_take(ip(1), false).expect("tenant 1").slot,
            slots.try_take(ip(2), false).expect("tenant 2").slot,
        ];
        let node = ip(9);
        let mut mine = Vec::new();
        for i in 0..2 {
            let taken = slots.try_take(node, true).expect("the node's reserve");
            assert_eq!(taken.evicted, None, "reserve slot {i}");
            mine.push(taken.slot);
        }
        let taken = slots.try_take(node, true).expect("past its reserve");
        assert_eq!(taken.evicted, Some(ip(1)), "the oldest tenant's idle slot");
        mine.push(taken.slot);
        let _busy = t[1].state().busy();
        assert_eq!(
            slots.try_take(node, true).map(|_| ()),
            Err(Refusal::ServerFull),
            "every tenant busy and the reserve used: the node too must wait"
        );
    }

    #[test]
    fn a_peer_whose_connections_all_closed_is_forgotten() {
        let slots = slots(4, 4);
        drop(slots.try_take(ip(1), false).expect("a slot"));
        let occupancy = slots.subscribe().borrow().clone();
        assert_eq!((occupancy.open, occupancy.by_peer.len()), (0, 0));
    }

    /// The flood: without a limit, every refused connection would be a log line.
    #[test]
    fn refused_connections_are_logged_at_most_once_an_interval_with_the_count_in_between() {
        let mut log = RefusalLog::new(REFUSAL_LOG_INTERVAL);
        let t0 = Instant::now();
        assert_eq!(log.refused(t0), Some(0), "the first is logged");
        for s in 1..60 {
            assert_eq!(log.refused(t0 + Duration::from_secs(s)), None, "{s}s later");
        }
        assert_eq!(
            log.refused(t0 + REFUSAL_LOG_INTERVAL),
            Some(59),
            "a minute later, with the 59 in between"
        );
        assert_eq!(log.refused(t0 + REFUSAL_LOG_INTERVAL), None);
        assert_eq!(
            log.refused(t0 + 3 * REFUSAL_LOG_INTERVAL),
            Some(1),
            "after a quiet spell the next is logged, with the one unlogged before it"
        );
    }

    #[test]
    fn refusals_are_counted_by_reason_in_the_admin_registry() {
        let metrics = AdminMetrics::new();
        metrics.count_refusal(Refusal::ServerFull);
        metrics.count_refusal(Refusal::ServerFull);
        metrics.count_refusal(Refusal::PeerFull);
        assert_eq!(metrics.refusals(Refusal::ServerFull), 2);
        assert_eq!(metrics.refusals(Refusal::PeerFull), 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &metrics.registry)
            .expect("encodes");
        assert!(
            text.contains("kruised_admin_connections_refused_total{reason=\"server_full\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kruised_admin_connections_refused_total{reason=\"peer_full\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("kruised_admin_connections 0\n"), "{text}");
        assert!(
            text.contains("kruised_admin_scrapes_refused_total 0\n"),
            "{text}"
        );
    }
}
