//! A TCP relay the test controls, standing where a load balancer or a proxy stands between
//! kruised and the API server: it listens on loopback and forwards every connection to the
//! upstream address, and on demand
//!
//! - [`TcpRelay::silence_open`]: every open connection stops forwarding, both ways, and its
//!   sockets stay open (the kernel still acknowledges what arrives, as a relay that forgot the
//!   server does: no FIN, no RST, nothing ever answered); connections made later work;
//! - [`TcpRelay::refuse_new`]: new connections are reset at once;
//! - [`TcpRelay::limit`]: a fixed rate (bytes per second) each way, shared by all connections,
//!   as a slow link's (the image benchmark's upstream registry).
//!
//! It counts what it did ([`RelayStats`], bytes each way included) and lets a test wait on the
//! counts. Test infrastructure.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

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
    /// Bytes forwarded from the upstream to clients.
    pub bytes_down: u64,
    /// Bytes forwarded from clients to the upstream.
    pub bytes_up: u64,
}

struct Shared {
    upstream: SocketAddr,
    refuse: AtomicBool,
    /// Each open connection's switch to silence, by id.
    conns: Mutex<Vec<(u64, watch::Sender<bool>)>>,
    stats: Mutex<RelayStats>,
    changed: watch::Sender<u64>,
    /// Each way's (down, up) rate in bytes per second (0: unlimited) and when it is next free.
    pace: [Mutex<(u64, Instant)>; 2],
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

    /// Books `n` bytes on the link of one way; returns when they have passed it.
    fn pace(&self, down: bool, n: usize) -> Option<Instant> {
        let way = &self.pace[usize::from(!down)];
        let mut p = way.lock().unwrap_or_else(|e| e.into_inner());
        let (rate, next) = &mut *p;
        if *rate == 0 {
            return None;
        }
        *next = (*next).max(Instant::now()) + Duration::from_secs_f64(n as f64 / *rate as f64);
        Some(*next)
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
            pace: [(); 2].map(|()| Mutex::new((0, Instant::now()))),
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

    /// Forwards at most `down` bytes per second to the clients and `up` to the upstream, all
    /// connections together (`None`: unlimited).
    pub fn limit(&self, down: Option<u64>, up: Option<u64>) {
        for (p, rate) in self.shared.pace.iter().zip([down, up]) {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            *p = (rate.unwrap_or(0), Instant::now());
        }
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
        () = pump(&mut client_read, &mut server_write, &shared, false) => false,
        () = pump(&mut server_read, &mut client_write, &shared, true) => false,
        r = silenced.wait_for(|s| *s) => r.is_ok(),
    };
    if silent {
        // held open, read by no one, until the relay is dropped: the halves stay alive here,
        // since dropping a write half sends a FIN and closing a socket with unread bytes an
        // RST, and a silent connection sends neither
        let _held = (client_read, client_write, server_read, server_write);
        std::future::pending::<()>().await;
    }
    shared.lock_conns().retain(|(i, _)| *i != id);
    shared.record(|s| s.open -= 1);
}

/// Forwards one way (`down`: to the client) until the reader ends or a write fails, at the
/// way's rate, counting the bytes.
async fn pump(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf, shared: &Shared, down: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if let Some(at) = shared.pace(down, n) {
            tokio::time::sleep_until(at).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        let n = n as u64;
        shared.record(|s| {
            *(if down {
                &mut s.bytes_down
            } else {
                &mut s.bytes_up
            }) += n
        });
    }
}
