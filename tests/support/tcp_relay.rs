//! A TCP relay the test controls, standing where a load balancer or a proxy stands between
//! kruised and the API server: it listens on loopback and forwards every connection to the
//! upstream address, and on demand
//!
//! - [`TcpRelay::silence_open`]: every open connection stops forwarding, both ways, and its
//!   sockets stay open (the kernel still acknowledges what arrives, as a relay that forgot the
//!   server does: no FIN, no RST, nothing ever answered); connections made later work;
//! - [`TcpRelay::refuse_new`]: new connections are reset at once.
//!
//! It counts what it did ([`RelayStats`]) and lets a test wait on the counts. Test
//! infrastructure.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::wait;

/// What the relay did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Connections accepted, refused ones included.
    pub accepted: usize,
    /// Connections forwarded: the upstream connection was made.
    pub forwarded: usize,
    /// Connections reset at once because new ones were refused.
    pub refused: usize,
    /// Connections closed at once because the upstream could not be reached.
    pub upstream_failed: usize,
    /// Connections open now, silent ones included.
    pub open: usize,
    /// Connections silenced so far.
    pub silenced: usize,
}

struct Shared {
    upstream: SocketAddr,
    refuse: AtomicBool,
    /// Each open connection's switch to silence, by id.
    conns: Mutex<Vec<(u64, watch::Sender<bool>)>>,
    stats: Mutex<RelayStats>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn record(&self, f: impl FnOnce(&mut RelayStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.send_modify(|n| *n += 1);
    }

    fn lock_conns(&self) -> MutexGuard<'_, Vec<(u64, watch::Sender<bool>)>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn silence_all(&self) -> usize {
        let conns = self.lock_conns();
        for (_, tx) in conns.iter() {
            tx.send_replace(true);
        }
        conns.len()
    }
}

/// A running relay; stops, closing every connection, when dropped.
pub struct TcpRelay {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpRelay {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpRelay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let addr = listener.local_addr().expect("relay address");
        let shared = Arc::new(Shared {
            upstream,
            refuse: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            stats: Mutex::new(RelayStats::default()),
            changed: watch::channel(0).0,
        });
        let accepting = shared.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            let mut next_id = 0u64;
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        accepting.record(|s| s.accepted += 1);
                        if accepting.refuse.load(Ordering::SeqCst) {
                            let _ = client.set_zero_linger();
                            drop(client);
                            accepting.record(|s| s.refused += 1);
                            continue;
                        }
                        next_id += 1;
                        connections.spawn(relay(client, next_id, accepting.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        TcpRelay { addr, shared, task }
    }

    /// `https://127.0.0.1:port`: the relay's address as an https server's URL (TLS passes
    /// through it; the test certificate names 127.0.0.1).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Every open connection stops forwarding both ways, its sockets left open; returns how
    /// many were silenced. Connections made later are forwarded.
    pub fn silence_open(&self) -> usize {
        let n = self.shared.silence_all();
        self.shared.record(|s| s.silenced += n);
        n
    }

    /// Whether new connections are reset at once (`true`) or forwarded (`false`).
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.refuse.store(refuse, Ordering::SeqCst);
    }

    pub fn stats(&self) -> RelayStats {
        let stats = self.shared.stats.lock();
        stats.unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until `cond` holds of the stats, at most `limit`; panics naming `what` otherwise.
    /// Returns the stats that satisfied it.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&RelayStats) -> bool,
    ) -> RelayStats {
        let mut changed = self.shared.changed.subscribe();
        let what = format!("the relay to see {what}");
        let seen = wait::try_watch(&mut changed, limit, &what, |_| self.stats(), cond).await;
        seen.unwrap_or_else(|m| m.fail())
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        // the accept task owns every connection's task: aborting it closes them all
        self.task.abort();
    }
}

/// One connection: forwards until either side ends or the test silences it.
async fn relay(client: TcpStream, id: u64, shared: Arc<Shared>) {
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        shared.record(|s| s.upstream_failed += 1);
        return;
    };
    let _ = server.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let (silence_tx, mut silenced) = watch::channel(false);
    shared.lock_conns().push((id, silence_tx));
    shared.record(|s| {
        s.forwarded += 1;
        s.open += 1;
    });
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let silent = tokio::select! {
        _ = tokio::io::copy(&mut client_read, &mut server_write) => false,
        _ = tokio::io::copy(&mut server_read, &mut client_write) => false,
        r = silenced.wait_for(|s| *s) => r.is_ok(),
    };
    if silent {
        // held open, read by no one, until the relay is dropped
        std::future::pending::<()>().await;
    }
    shared.lock_conns().retain(|(i, _)| *i != id);
    shared.record(|s| s.open -= 1);
}
