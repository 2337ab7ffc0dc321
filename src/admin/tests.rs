//! The admin handler's answers, and the admin server's limits against the attacks they are for
//! (the "flood the admin port": a tenant's pod reaches the port and must not be able to
//! starve the kubelet's probes or the node's memory through it).

use super::*;

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Condvar, Mutex};

use http_body_util::BodyExt as _;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, advance, timeout};

use super::limits::Occupancy;

const DEADLINE: Duration = Duration::from_secs(10);

fn state() -> AdminState {
    state_with(crate::metrics::new_registry())
}

fn state_with(registry: Registry) -> AdminState {
    AdminState {
        readiness: Readiness::new(),
        liveness: Liveness::new(),
        registry: Arc::new(registry),
        timelines: None,
        node_ips: Vec::new(),
    }
}

/// A handler for `state` with the default limits.
fn handler(state: &AdminState) -> Handler {
    Handler::new(state.clone(), &Limits::default(), AdminMetrics::new())
}

/// Sends `method path` to a handler for `state`; returns the status, content type and body.
async fn call(state: &AdminState, method: Method, path: &str) -> (StatusCode, String, String) {
    call_on(&handler(state), method, path).await
}

/// Sends `method path` to `handler`; returns the status, content type and body.
async fn call_on(handler: &Handler, method: Method, path: &str) -> (StatusCode, String, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(())
        .expect("valid request");
    let resp = timeout(DEADLINE, handler.handle(req))
        .await
        .expect("handler hung");
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().expect("ascii content type").to_owned())
        .unwrap_or_default();
    let body = timeout(DEADLINE, resp.into_body().collect())
        .await
        .expect("collecting the response body hung")
        .expect("full body")
        .to_bytes();
    let body = String::from_utf8(body.to_vec()).expect("utf-8 body");
    (status, content_type, body)
}

#[tokio::test]
async fn readyz_lists_conditions_when_not_ready_and_says_ok_when_ready() {
    let state = state();
    let (status, _, body) = call(&state, Method::GET, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        body,
        "[-]conditions failed: none registered yet\nreadyz check failed\n"
    );

    let informers = state.readiness.condition("informers");
    let cri = state.readiness.condition("cri");
    informers.set_ready();
    let (status, content_type, body) = call(&state, Method::GET, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(content_type, TEXT_CONTENT_TYPE);
    assert_eq!(
        body,
        "[+]informers ok\n[-]cri failed: not started\nreadyz check failed\n"
    );

    cri.set_ready();
    assert_eq!(
        call(&state, Method::GET, "/readyz").await,
        (
            StatusCode::OK,
            TEXT_CONTENT_TYPE.to_owned(),
            "ok".to_owned()
        )
    );
    let (status, _, body) = call(&state, Method::GET, "/readyz?verbose").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "[+]informers ok\n[+]cri ok\nreadyz check passed\n");
}

#[tokio::test(start_paused = true)]
async fn a_silent_heartbeat_makes_healthz_fail_in_kruise_daemons_format() {
    let state = state();
    let _other = state.liveness.register("crr", Duration::from_secs(60));
    let imagepuller = state
        .liveness
        .register("imagepuller", Duration::from_secs(30));
    assert_eq!(
        call(&state, Method::GET, "/healthz").await,
        (
            StatusCode::OK,
            TEXT_CONTENT_TYPE.to_owned(),
            "ok".to_owned()
        )
    );

    advance(Duration::from_secs(30)).await;
    assert!(
        state.liveness.is_healthy(),
        "exactly at the limit is healthy"
    );

    advance(Duration::from_secs(1)).await;
    let (status, _, body) = call(&state, Method::GET, "/healthz").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        body,
        "check imagepuller failed, err: no heartbeat for 31s (limit 30s)"
    );

    imagepuller.beat();
    let (status, _, body) = call(&state, Method::GET, "/healthz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn metrics_serve_build_info_and_a_nonzero_resident_memory() {
    let (status, content_type, body) = call(&state(), Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, METRICS_CONTENT_TYPE);
    assert!(body.contains("\nkruised_build_info{version=\""), "{body}");
    let rss: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .unwrap_or_else(|| panic!("no unprefixed process_resident_memory_bytes in {body}"))
        .parse()
        .expect("numeric sample");
    assert!(rss > 0.0);
    assert!(body.ends_with("# EOF\n"), "{body}");
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_are_405() {
    let state = state();
    let (status, _, _) = call(&state, Method::GET, "/debug/pprof").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = call(&state, Method::POST, "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let req = Request::post("/healthz").body(()).expect("valid request");
    let resp = timeout(DEADLINE, handler(&state).handle(req))
        .await
        .expect("handler hung");
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(resp.headers()[header::ALLOW], "GET, HEAD");

    let (status, _, _) = call(&state, Method::HEAD, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

#[test]
fn verbose_is_recognised_anywhere_in_the_query() {
    for (uri, verbose) in [
        ("/readyz", false),
        ("/readyz?verbose", true),
        ("/readyz?verbose=1", true),
        ("/readyz?exclude=x&verbose", true),
        ("/readyz?verbosely", false),
    ] {
        let uri: Uri = uri.parse().expect("valid uri");
        assert_eq!(is_verbose(&uri), verbose, "{uri}");
    }
}

// === the limits, against the attacks they are for ===

/// Small limits for a test: `connections` in all and `per_peer` per address; heads get far
/// longer than [`DEADLINE`], so a connection the server did not refuse is never closed by the
/// header timer before a test gives up on it.
fn limits(connections: usize, per_peer: usize) -> Limits {
    Limits {
        max_connections: connections,
        max_connections_per_peer: per_peer,
        header_read_timeout: DEADLINE * 6,
        ..Limits::default()
    }
}

/// An admin server on 127.0.0.1 with `limits`, its slots and metrics in view.
struct Running {
    addr: SocketAddr,
    occupancy: watch::Receiver<Occupancy>,
    metrics: AdminMetrics,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(limits: Limits) -> Running {
    start_with(state(), limits).await
}

async fn start_with(state: AdminState, limits: Limits) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("listener address");
    let server = Server::with_node(state, limits, NodePeers::of(&[NODE.into()]));
    let occupancy = server.slots.subscribe();
    let metrics = server.handler.metrics.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(listener, shutdown.clone()));
    Running {
        addr,
        occupancy,
        metrics,
        shutdown,
        task,
    }
}

impl Running {
    /// Waits until exactly `n` connections hold a slot.
    async fn wait_open(&mut self, n: usize, what: &str) {
        let waited = timeout(DEADLINE, self.occupancy.wait_for(|o| o.open == n))
            .await
            .map(|r| r.map(|_| ()));
        let now = self.occupancy.borrow().clone();
        waited
            .unwrap_or_else(|_| panic!("{what}: never {n} open connections (now {now:?})"))
            .expect("the server's slots outlive the test");
    }

    async fn stop(self) {
        self.shutdown.cancel();
        timeout(DEADLINE, self.task)
            .await
            .expect("serve did not return after cancellation")
            .expect("serve panicked");
    }
}

/// A connection to `addr` from the source address `from`.
async fn connect_from(from: IpAddr, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    timeout(DEADLINE, socket.connect(addr))
        .await
        .expect("connect hung")
        .expect("connect")
}

async fn connect(addr: SocketAddr) -> TcpStream {
    connect_from(Ipv4Addr::LOCALHOST.into(), addr).await
}

/// The server resets `stream` without waiting for a request (a connection it holds would
/// stay open: [`limits`]' heads may take a minute).
async fn assert_reset_at_once(mut stream: TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    let read = timeout(DEADLINE, stream.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what}: the server held the connection"));
    match read {
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("{what}: want a reset, got {other:?}"),
    }
}

/// `GET path` on `stream`, `Connection: close`; the status code and body.
async fn get(mut stream: TcpStream, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    timeout(DEADLINE, stream.write_all(request.as_bytes()))
        .await
        .expect("writing the request hung")
        .expect("write the request");
    let mut response = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut response))
        .await
        .expect("reading the response hung")
        .expect("read the response");
    parse_response(&response)
}

/// The status code and body of one HTTP/1.1 response.
fn parse_response(response: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {text:?}"));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, body.to_owned())
}

/// The "flood the admin port" (before this, no connection cap: every idle connection
/// held a task and hyper's ~400 KiB buffer, and the kubelet's probe queued behind them):
/// connections up to the cap are held, every one beyond it is reset at once and counted, and
/// as soon as one idle client goes the next probe is answered.
#[tokio::test]
async fn a_flood_of_idle_connections_is_reset_beyond_the_cap_and_healthz_answers_as_soon_as_one_closes()
 {
    let mut server = start(limits(4, 4)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(connect(server.addr).await);
    }
    server.wait_open(4, "four idle clients").await;

    // far more than the cap, one after the other: each is accepted and reset, none queues
    for i in 0..100 {
        assert_reset_at_once(connect(server.addr).await, &format!("flood connection {i}")).await;
    }
    assert_eq!(server.metrics.refusals(Refusal::ServerFull), 100);
    assert_eq!(server.metrics.refusals(Refusal::PeerFull), 0);
    assert_eq!(server.metrics.open.get(), 4);

    drop(idle.pop());
    server.wait_open(3, "one idle client gone").await;
    assert_eq!(
        get(connect(server.addr).await, "/healthz").await,
        (200, "ok".into())
    );
    server.stop().await;
}

/// The tenant pod: its connections all come from its one address, so it takes at
/// most its share of the slots, and the kubelet (the node's address) still gets `/healthz`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn one_address_flooding_the_port_gets_only_its_share_and_another_address_still_gets_healthz()
{
    let tenant: IpAddr = Ipv4Addr::new(127, 0, 0, 2).into();
    let mut server = start(limits(4, 2)).await;
    let _held = [
        connect_from(tenant, server.addr).await,
        connect_from(tenant, server.addr).await,
    ];
    server.wait_open(2, "the tenant's two").await;
    assert_reset_at_once(
        connect_from(tenant, server.addr).await,
        "the tenant's third",
    )
    .await;
    assert_eq!(server.metrics.refusals(Refusal::PeerFull), 1);
    assert_eq!(
        get(connect(server.addr).await, "/healthz").await,
        (200, "ok".into())
    );
    server.stop().await;
}

/// The node's address in these tests (the kubelet probes from it); 127.0.0.1 is a tenant.
const NODE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);

/// Tenant pod `n`'s address.
fn pod(n: u8) -> IpAddr {
    Ipv4Addr::new(127, 0, 0, 10 + n).into()
}

/// Whether the server closed `stream` (end of stream or reset) within [`DEADLINE`].
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        timeout(DEADLINE, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Issue 43, row 1: four pods each keep 16 idle connections open to a node's admin port,
/// reopening any that closes. Before, 64 in all and 16 a peer: every slot was theirs and the
/// kubelet's probes were reset, so kruised was restarted in a loop. Now each pod holds its
/// share, the node has slots of its own, and past those it takes a tenant's idle one.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn four_pods_holding_all_the_idle_connections_they_can_never_lock_the_kubelets_probes_out() {
    let limits = Limits {
        node_reserve: 2,
        ..limits(8, 2)
    };
    let mut server = start(limits).await;
    let mut held = Vec::new();
    for n in 0..4 {
        for _ in 0..16 {
            // one refused at once may be reset before its connect returns
            let socket = TcpSocket::new_v4().expect("socket");
            socket.bind(SocketAddr::new(pod(n), 0)).expect("bind");
            if let Ok(Ok(stream)) = timeout(DEADLINE, socket.connect(server.addr)).await {
                held.push(stream);
            }
        }
    }
    server.wait_open(8, "each pod its two").await;
    let refused =
        server.metrics.refusals(Refusal::PeerFull) + server.metrics.refusals(Refusal::ServerFull);
    assert_eq!(refused, 4 * 14, "past their two, every one reset");

    // the kubelet's probes, one connection each, while every tenant slot is taken
    for i in 0..100 {
        let answer = get(connect_from(NODE.into(), server.addr).await, "/healthz").await;
        assert_eq!(answer, (200, "ok".into()), "probe {i}");
    }
    // the node keeps two idle connections (its reserve) and probes again: a tenant's idle
    // connection gives its slot up
    let _node_idle = [
        connect_from(NODE.into(), server.addr).await,
        connect_from(NODE.into(), server.addr).await,
    ];
    server
        .wait_open(10, "the tenants' eight and the node's two")
        .await;
    let answer = get(connect_from(NODE.into(), server.addr).await, "/healthz").await;
    assert_eq!(
        answer,
        (200, "ok".into()),
        "a probe past the node's reserve"
    );
    assert_eq!(server.metrics.evicted.get(), 1);
    // the tenant reopens it: no peer holds more than it would, so it is reset
    assert_reset_at_once(
        connect_from(pod(0), server.addr).await,
        "a tenant reopening what it lost",
    )
    .await;
    assert_eq!(
        server.metrics.evicted.get(),
        1,
        "a tenant never evicts an equal"
    );
    server.stop().await;
}

/// When every slot is taken, a newcomer from a pod holding fewer does not wait: the oldest idle
/// connection of the peer that holds the most is closed, and the newcomer served.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_newcomer_takes_the_slot_of_the_busiest_peers_oldest_idle_connection() {
    let mut server = start(limits(4, 4)).await;
    let mut hog = Vec::new();
    for _ in 0..4 {
        hog.push(connect_from(pod(0), server.addr).await);
        server
            .wait_open(hog.len(), "the hog's connections, one by one")
            .await;
    }
    let answer = get(connect_from(pod(1), server.addr).await, "/healthz").await;
    assert_eq!(answer, (200, "ok".into()), "the newcomer is served");
    assert!(
        closed_by_server(&mut hog[0]).await,
        "the hog's oldest connection was closed"
    );
    // the newcomer's connection closed after its answer: the hog's three others remain
    server
        .wait_open(3, "the hog's three later connections")
        .await;
    assert_eq!(server.metrics.evicted.get(), 1);
    assert_eq!(server.metrics.refusals(Refusal::ServerFull), 0);
    server.stop().await;
}

/// Issue 43, row 16: `/readyz?verbose` told any peer the daemon's conditions (its runtime's
/// endpoint, the API server's errors). A tenant's pod now gets the verdict alone; the node
/// (the kubelet, an operator on it) the details.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn readyz_details_are_for_the_node_and_a_tenants_pod_gets_the_verdict_alone() {
    let server = start(limits(8, 4)).await;
    let (code, body) = get(connect_from(pod(0), server.addr).await, "/readyz?verbose").await;
    assert_eq!((code, body.as_str()), (503, "readyz check failed\n"));
    let (code, body) = get(
        connect_from(NODE.into(), server.addr).await,
        "/readyz?verbose",
    )
    .await;
    assert_eq!(code, 503);
    assert!(
        body.contains("[-]conditions failed: none registered yet"),
        "{body}"
    );
    server.stop().await;
}

/// Sends `GET /healthz` with one header padded so that the head is `size` bytes long, reading
/// while it writes; the answer's status (a failed write is expected when the server stops
/// reading early).
async fn get_with_head_of(addr: SocketAddr, size: usize) -> u16 {
    let (mut reader, mut writer) = connect(addr).await.into_split();
    let flood = tokio::spawn(async move {
        let mut head =
            b"GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\nX-Pad: ".to_vec();
        head.resize(size - 4, b'a');
        head.extend_from_slice(b"\r\n\r\n");
        let _ = writer.write_all(&head).await;
        writer
    });
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match timeout(DEADLINE, reader.read(&mut buf))
            .await
            .expect("the server neither answered nor closed the connection")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
        }
    }
    drop(
        timeout(DEADLINE, flood)
            .await
            .expect("the padded write hung"),
    );
    parse_response(&response).0
}

/// The "hyper's default buffers": hyper buffers up to ~400 KiB of request head per
/// connection by default (a 32 KiB head would be served). With 16 KiB a 1 MiB head, and a
/// 32 KiB one, are answered 431 (hyper's status for a head too large) and closed, while a head
/// of a few KiB (a probe with `httpHeaders`) is served, and so is the next client.
#[tokio::test]
async fn a_one_mebibyte_request_head_is_refused_with_431_and_the_server_goes_on_answering() {
    let mut server = start(limits(4, 4)).await;
    for size in [1024 * 1024, 32 * 1024] {
        assert_eq!(
            get_with_head_of(server.addr, size).await,
            431,
            "{size} bytes"
        );
        server.wait_open(0, "the padded connection closed").await;
    }
    assert_eq!(get_with_head_of(server.addr, 4 * 1024).await, 200, "4 KiB");
    assert_eq!(
        get(connect(server.addr).await, "/healthz").await,
        (200, "ok".into())
    );
    server.stop().await;
}

/// Serves one in-memory connection with `limits` (paused time drives the timers); the client's
/// end, and the task that ends when the server lets the connection go.
fn serve_in_memory(limits: Limits, buffer: usize) -> (tokio::io::DuplexStream, JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(buffer);
    let slot = Slots::new(&limits, Gauge::default())
        .try_take(Ipv4Addr::LOCALHOST.into(), false)
        .expect("a free slot")
        .slot;
    let handler = Handler::new(state(), &limits, AdminMetrics::new());
    let conn = serve_connection(server, handler, limits, CancellationToken::new(), slot);
    (client, tokio::spawn(conn))
}

/// Waits for the server to let the connection go; how long after `since` that was.
async fn closed_after(task: JoinHandle<()>, since: Instant, bound: Duration) -> Duration {
    timeout(bound, task)
        .await
        .unwrap_or_else(|_| panic!("the connection was still served after {bound:?}"))
        .expect("the connection task panicked");
    since.elapsed()
}

const HEALTHZ_REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n";

/// Slowloris, and the idle connections: a head that never completes, and a kept-alive
/// connection that sends no next request, each give their slot back after the header read
/// timeout (hyper 1.12 restarts that timer whenever it waits for a head, `proto/h1/conn.rs`
/// `poll_read_head`), so an idle client cannot hold a slot for longer.
#[tokio::test(start_paused = true)]
async fn a_head_that_never_completes_and_an_idle_kept_alive_connection_are_closed_after_the_header_read_timeout()
 {
    let limits = Limits::default();
    let bound = limits.header_read_timeout + Duration::from_secs(1);

    let (mut client, task) = serve_in_memory(limits, 64 * 1024);
    let since = Instant::now();
    client
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: adm")
        .await
        .expect("write half a head");
    assert_eq!(
        closed_after(task, since, bound).await,
        limits.header_read_timeout,
        "half a head"
    );

    let (mut client, task) = serve_in_memory(limits, 64 * 1024);
    client
        .write_all(HEALTHZ_REQUEST)
        .await
        .expect("write a request");
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\nok") {
        let mut buf = [0u8; 1024];
        let n = timeout(DEADLINE, client.read(&mut buf))
            .await
            .expect("the response never came")
            .expect("read the response");
        assert_ne!(n, 0, "closed before the response: {response:?}");
        response.extend_from_slice(&buf[..n]);
    }
    assert_eq!(parse_response(&response), (200, "ok".into()));
    let since = Instant::now();
    assert_eq!(
        closed_after(task, since, bound).await,
        limits.header_read_timeout,
        "kept alive with no next request"
    );
}

/// A client that pipelines requests and never reads the answers blocks hyper's writes, where no
/// read timer runs: the connection's age limit asks it to close and, the response in flight
/// never leaving, drops it `CONNECTION_DRAIN_GRACE` later, giving the slot back.
#[tokio::test(start_paused = true)]
async fn a_client_that_never_reads_its_answers_holds_its_slot_only_until_the_age_limit_and_the_grace()
 {
    let limits = Limits::default();
    // room for the requests, not for two answers
    let (mut client, task) = serve_in_memory(limits, 256);
    let since = Instant::now();
    for _ in 0..4 {
        client
            .write_all(HEALTHZ_REQUEST)
            .await
            .expect("write a pipelined request");
    }
    let held = closed_after(
        task,
        since,
        limits.max_connection_age + CONNECTION_DRAIN_GRACE + Duration::from_secs(1),
    )
    .await;
    assert_eq!(held, limits.max_connection_age + CONNECTION_DRAIN_GRACE);
    drop(client);
}

/// Blocks every rendering that reaches it until released; says when one has.
#[derive(Debug)]
struct BlockingCollector {
    entered: mpsc::UnboundedSender<()>,
    released: Arc<(Mutex<bool>, Condvar)>,
}

impl Collector for BlockingCollector {
    fn encode(&self, _encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let _ = self.entered.send(());
        let (lock, cv) = &*self.released;
        let released = lock.lock().expect("release lock");
        let (released, _) = cv
            .wait_timeout_while(released, DEADLINE, |r| !*r)
            .expect("release lock");
        assert!(*released, "the test never released the rendering");
        Ok(())
    }
}

/// The "`/metrics` on the blocking pool": every scrape took a blocking thread, as many
/// at once as connections. Now two render at once; a third waits `render_wait` and gets 503;
/// a scraper that hangs up keeps its slot until the rendering it started ends.
#[tokio::test]
async fn scrapes_beyond_two_renderings_at_once_get_503_and_a_scraper_that_hangs_up_keeps_its_slot_until_its_rendering_ends()
 {
    let (entered, mut entries) = mpsc::unbounded_channel();
    let released = Arc::new((Mutex::new(false), Condvar::new()));
    let mut registry = crate::metrics::new_registry();
    registry.register_collector(Box::new(BlockingCollector {
        entered,
        released: Arc::clone(&released),
    }));
    let limits = Limits {
        render_wait: Duration::from_millis(100),
        ..Limits::default()
    };
    let handler = Handler::new(state_with(registry), &limits, AdminMetrics::new());
    let scrape = || {
        let handler = handler.clone();
        tokio::spawn(async move { call_on(&handler, Method::GET, METRICS_PATH).await })
    };
    let hung_up = scrape();
    let patient = scrape();
    for n in 1..=2 {
        timeout(DEADLINE, entries.recv())
            .await
            .unwrap_or_else(|_| panic!("rendering {n} never started"))
            .expect("the collector is alive");
    }
    hung_up.abort();

    let (status, _, body) = call_on(&handler, Method::GET, METRICS_PATH).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body, "metrics busy: too many scrapes at once\n");
    assert_eq!(handler.metrics.scrapes_refused.get(), 1);

    {
        let (lock, cv) = &*released;
        *lock.lock().expect("release lock") = true;
        cv.notify_all();
    }
    let (status, _, _) = timeout(DEADLINE, patient)
        .await
        .expect("the patient scrape never finished")
        .expect("the patient scrape panicked");
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = call_on(&handler, Method::GET, METRICS_PATH).await;
    assert_eq!(status, StatusCode::OK, "a freed slot renders again");
    assert!(
        body.contains("\nkruised_admin_scrapes_refused_total 1\n"),
        "the admin server's own metrics are served: {body}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
}

/// Writes one gauge with a long help text: a `/metrics` body far larger than the buffers.
#[derive(Debug)]
struct LargeCollector;

impl Collector for LargeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::gauge::ConstGauge;
        let help = "x".repeat(256 * 1024);
        let gauge = ConstGauge::new(1i64);
        let metric = encoder.encode_descriptor("large", &help, None, gauge.metric_type())?;
        gauge.encode(metric)
    }
}

/// The small buffers bound what hyper reads and queues, not what it sends: a scrape whose body
/// is sixteen times the buffer (a node's metrics run to tens of KiB) arrives whole.
#[tokio::test]
async fn a_metrics_body_far_larger_than_the_buffers_is_served_whole() {
    let mut registry = crate::metrics::new_registry();
    crate::metrics::kruised(&mut registry).register_collector(Box::new(LargeCollector));
    let server = start_with(state_with(registry), Limits::default()).await;
    let (status, body) = get(connect(server.addr).await, METRICS_PATH).await;
    assert_eq!(status, 200);
    assert!(
        body.len() > 16 * limits::MAX_BUF_SIZE,
        "{} bytes",
        body.len()
    );
    assert!(body.contains("\nkruised_large 1\n"), "the large metric");
    assert!(body.ends_with("# EOF\n"), "the body's end");
    server.stop().await;
}

/// A state whose timelines know `default/web-0` only.
fn with_timelines() -> AdminState {
    AdminState {
        node_ips: Vec::new(),
        timelines: Some(TimelineSource(Arc::new(|ns, name| {
            (ns == "default" && name == "web-0").then(|| "{\"updates\":[]}".to_string())
        }))),
        ..state()
    }
}

#[test]
fn the_timelines_are_served_to_loopback_peers_only() {
    let path = "default/web-0";
    let source = with_timelines().timelines;
    for loopback in [
        "127.0.0.1".parse().expect("an address"),
        "::1".parse().expect("an address"),
        "::ffff:127.0.0.1".parse().expect("an address"),
    ] {
        assert_eq!(
            timelines(source.as_ref(), Some(loopback), path).status(),
            StatusCode::OK,
            "{loopback}"
        );
    }
    for other in [Some("10.0.0.7".parse().expect("an address")), None] {
        assert_eq!(
            timelines(source.as_ref(), other, path).status(),
            StatusCode::FORBIDDEN,
            "{other:?}"
        );
    }
}

#[tokio::test]
async fn a_request_without_its_peer_gets_no_timeline_and_bad_names_are_refused() {
    // through the handler, as a connection would call it but with no peer recorded: refused
    let (status, _, body) = call(
        &with_timelines(),
        Method::GET,
        "/debug/inplace-updates/default/web-0",
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let local = Some("127.0.0.1".parse().expect("an address"));
    let source = with_timelines().timelines;
    for bad in [
        "default",
        "default/",
        "/web-0",
        "Default/web-0",
        "default/web 0",
        "a/b/c",
    ] {
        assert_eq!(
            timelines(source.as_ref(), local, bad).status(),
            StatusCode::BAD_REQUEST,
            "{bad}"
        );
    }
    assert_eq!(
        timelines(source.as_ref(), local, "default/web-1").status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        timelines(None, local, "default/web-0").status(),
        StatusCode::NOT_FOUND,
        "a daemon without timelines"
    );
}
