//! A hostile tenant's tools (issue 43), shared by the hostile tests
//! (`tests/integration/hostile*.rs`, `tests/e2e/hostile.rs`) and the benchmark that runs their
//! attacks at once (`benches/hostile.rs`): a probe target trickling its answers
//! ([`trickling_server`]), pods holding idle connections to the admin port and reopening each
//! one closed ([`IdlePeers`]), recreate requests fat with annotations
//! ([`fat_recreate_requests`]); and the tests' memory bound on kruised ([`assert_memory_under`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use apiserver_double::Handle;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::task::JoinHandle;

use crate::crr::Request;

/// Connections a server holds now, the most it held at once, and how many it took in all.
#[derive(Default)]
pub struct Counts {
    /// Held now.
    pub open: AtomicUsize,
    /// The most held at once.
    pub most: AtomicUsize,
    /// Taken in all.
    pub taken: AtomicUsize,
}

/// The tenant's trickling server on loopback (issue 43, row 3): an HTTP request gets the start
/// of an answer, then one byte of a header every 500 ms; a gRPC client (HTTP/2) gets nothing at
/// all; each until the peer goes. Its port and its counts.
pub async fn trickling_server() -> (u16, Arc<Counts>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the trickling server");
    let port = l.local_addr().expect("its address").port();
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let c = c.clone();
            c.taken.fetch_add(1, Ordering::SeqCst);
            let open = c.open.fetch_add(1, Ordering::SeqCst) + 1;
            c.most.fetch_max(open, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let first = s.read(&mut buf).await.unwrap_or(0);
                let http2 = buf[..first].starts_with(b"PRI * HTTP/2.0");
                let mut tick = tokio::time::interval(Duration::from_millis(500));
                let mut head = b"HTTP/1.1 200 OK\r\nX-Trickle: ".iter();
                let mut connected = first > 0;
                while connected {
                    tokio::select! {
                        r = s.read(&mut buf) => connected = !matches!(r, Ok(0) | Err(_)),
                        _ = tick.tick(), if !http2 => {
                            let byte = head.next().copied().unwrap_or(b'a');
                            connected = s.write_all(&[byte]).await.is_ok();
                        }
                    }
                }
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, counts)
}

/// How long a tenant's pod waits before it reopens a connection the server closed or refused
/// (its own pace: an attacker reopening in a tight loop only burns its own CPU too).
pub const REOPEN_PAUSE: Duration = Duration::from_millis(100);

/// Pods holding idle connections to a server (issue 43, row 1: the admin port), each from its
/// own address, reopening each one the server closes or refuses after [`REOPEN_PAUSE`]. The
/// connections go when this is dropped.
pub struct IdlePeers {
    held: Arc<AtomicUsize>,
    opened: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl IdlePeers {
    /// `per_peer` connections to `addr` from each of `peers` (loopback addresses other than the
    /// node's, for a tenant's pods on one machine).
    pub fn hold(addr: SocketAddr, peers: &[IpAddr], per_peer: usize) -> IdlePeers {
        let held = Arc::new(AtomicUsize::new(0));
        let opened = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for &peer in peers {
            for _ in 0..per_peer {
                let (held, opened) = (held.clone(), opened.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        if let Some(mut stream) = connect_from(peer, addr).await {
                            opened.fetch_add(1, Ordering::SeqCst);
                            held.fetch_add(1, Ordering::SeqCst);
                            // idle: sends nothing, reads until the server closes it
                            let mut buf = [0u8; 256];
                            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                            held.fetch_sub(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(REOPEN_PAUSE).await;
                    }
                }));
            }
        }
        IdlePeers {
            held,
            opened,
            tasks,
        }
    }

    /// Connections held now (connected and not yet closed by the server).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Connections opened in all (the first ones and every reopening).
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::SeqCst)
    }
}

impl Drop for IdlePeers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn connect_from(peer: IpAddr, addr: SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = match peer {
        IpAddr::V4(_) => TcpSocket::new_v4(),
        IpAddr::V6(_) => TcpSocket::new_v6(),
    }
    .ok()?;
    socket.bind(SocketAddr::new(peer, 0)).ok()?;
    socket.connect(addr).await.ok()
}

/// Creates `count` recreate requests `<prefix>-<i>` in `namespace` (issue 43, row 5), each for
/// the pod `pod`'s container `main` (the node's `node`) as kruise's webhook fills them, with
/// `kib` KiB of a tenant's annotation.
pub fn fat_recreate_requests(
    api: &Handle,
    node: &str,
    namespace: &str,
    pod: &str,
    prefix: &str,
    count: usize,
    kib: usize,
) {
    let p = api.get("pods", namespace, pod).expect("the requests' pod");
    let id = p["status"]["containerStatuses"][0]["containerID"].as_str();
    let uid = p["metadata"]["uid"].as_str().expect("the pod's UID");
    let junk = "x".repeat(kib * 1024);
    for i in 0..count {
        let mut r = Request::new(&format!("{prefix}-{i}"), namespace, node, pod, uid)
            .container("main", id, None)
            .grace(600)
            .json();
        r["metadata"]["annotations"] = json!({ "tenant/junk": junk });
        api.create("containerrecreaterequests", r)
            .expect("create a fat recreate request");
    }
}

/// Prints kruised's `kind` memory (`resident`, `anonymous`: `bytes`) after `what`, and fails
/// unless it is under `bound`.
pub fn assert_memory_under(what: &str, kind: &str, bytes: u64, bound: u64) {
    eprintln!(
        "{what}: kruised {kind} {:.1} MiB",
        bytes as f64 / f64::from(1 << 20)
    );
    assert!(
        bytes < bound,
        "{what}: kruised's {kind} memory {} MiB, bound {} MiB",
        bytes >> 20,
        bound >> 20
    );
}
