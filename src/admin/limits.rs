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
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;

/// Connections served at once. The kubelet opens one per probe and closes it, a scraper one or
/// two; beyond this, new connections are accepted and reset at once, so the listen backlog never
/// fills and a probe gets in as soon as a slot frees.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Connections served at once from one peer address, so that one pod cannot take every slot.
pub(crate) const MAX_CONNECTIONS_PER_PEER: usize = 16;
/// hyper's read buffer per connection (its default is ~400 KiB); it also bounds a request head,
/// which is refused with 431 when it does not fit. A probe's head is ~150 bytes.
pub(crate) const MAX_BUF_SIZE: usize = 16 * 1024;
/// A client must send its request head within this long, on a new connection and between the
/// requests of a kept-alive one (hyper restarts the timer whenever it waits for a head), so idle
/// sockets cannot pile up.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// [`Limits::max_connections`] are open.
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

/// The connections open now, in all and by peer address.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Occupancy {
    /// Open connections.
    pub open: usize,
    /// Open connections by peer address (only addresses with one or more).
    pub by_peer: HashMap<IpAddr, usize>,
}

/// Hands out connection slots. Cloning shares them. The occupancy is a watch so that tests can
/// wait until a closed connection has given its slot back.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    occupancy: watch::Sender<Occupancy>,
    max: usize,
    max_per_peer: usize,
    open_gauge: Gauge,
}

/// One connection's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Slots,
    peer: IpAddr,
}

impl Slot {
    /// The peer address the slot was taken for.
    pub(crate) fn peer(&self) -> IpAddr {
        self.peer
    }
}

impl Slots {
    /// Slots for `limits`, reporting the open count on `open_gauge`.
    pub(crate) fn new(limits: &Limits, open_gauge: Gauge) -> Self {
        Slots {
            occupancy: watch::Sender::new(Occupancy::default()),
            max: limits.max_connections,
            max_per_peer: limits.max_connections_per_peer,
            open_gauge,
        }
    }

    /// A slot for a connection from `peer`, unless the server or that peer is at its limit.
    pub(crate) fn try_take(&self, peer: IpAddr) -> Result<Slot, Refusal> {
        let mut outcome = Err(Refusal::ServerFull);
        self.occupancy.send_if_modified(|o| {
            if o.open >= self.max {
                return false;
            }
            if o.by_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer {
                outcome = Err(Refusal::PeerFull);
                return false;
            }
            *o.by_peer.entry(peer).or_insert(0) += 1;
            o.open += 1;
            self.open_gauge.set(gauge_value(o.open));
            outcome = Ok(());
            true
        });
        outcome.map(|()| Slot {
            slots: self.clone(),
            peer,
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
        slots.occupancy.send_modify(|o| {
            o.open = o.open.saturating_sub(1);
            if let Entry::Occupied(mut e) = o.by_peer.entry(self.peer) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
            slots.open_gauge.set(gauge_value(o.open));
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
    /// The registry holding the three.
    pub registry: Arc<Registry>,
}

impl AdminMetrics {
    /// Creates the metrics and their registry.
    pub(crate) fn new() -> Self {
        let refused = Family::<ReasonLabel, Counter>::default();
        let open = Gauge::default();
        let scrapes_refused = Counter::default();
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
        AdminMetrics {
            refused,
            open,
            scrapes_refused,
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
        let a1 = slots.try_take(ip(1)).expect("first from a");
        let _a2 = slots.try_take(ip(1)).expect("second from a");
        assert_eq!(
            slots.try_take(ip(1)).map(|_| ()),
            Err(Refusal::PeerFull),
            "a third from one peer"
        );
        let _b1 = slots.try_take(ip(2)).expect("another peer still gets in");
        assert_eq!(
            slots.try_take(ip(3)).map(|_| ()),
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
            .try_take(ip(3))
            .expect("a freed slot is handed out again");
    }

    #[test]
    fn a_peer_whose_connections_all_closed_is_forgotten() {
        let slots = slots(4, 4);
        drop(slots.try_take(ip(1)).expect("a slot"));
        assert_eq!(slots.subscribe().borrow().clone(), Occupancy::default());
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
