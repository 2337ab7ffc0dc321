//! The admin server over real TCP: its three endpoints, and graceful shutdown on cancellation.
//!
//! The HTTP/1.1 client below is deliberately minimal: it writes one request and reads one response
//! framed by `Content-Length`, which is all the admin server sends.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use kruised::admin::{AdminState, Liveness, METRICS_CONTENT_TYPE, Readiness, serve};
use kruised::metrics::new_registry;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

async fn start(state: AdminState) -> Server {
    let listener = timeout(DEADLINE, TcpListener::bind("127.0.0.1:0"))
        .await
        .expect("binding the listener hung")
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("listener address");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(listener, state, shutdown.clone()));
    Server {
        addr,
        shutdown,
        task,
    }
}

impl Server {
    /// Cancels the token and waits for `serve` to return.
    async fn stop(self) {
        self.shutdown.cancel();
        timeout(DEADLINE, self.task)
            .await
            .expect("serve did not return after cancellation")
            .expect("serve panicked");
    }
}

fn state() -> AdminState {
    state_with(new_registry())
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

// === a minimal HTTP/1.1 client ===

#[derive(Debug)]
struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

async fn connect(addr: SocketAddr) -> TcpStream {
    timeout(DEADLINE, TcpStream::connect(addr))
        .await
        .expect("connecting to the admin server hung")
        .expect("connect to the admin server")
}

async fn send(stream: &mut TcpStream, method: &str, path: &str, keep_alive: bool) {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: {connection}\r\n\r\n");
    timeout(DEADLINE, stream.write_all(request.as_bytes()))
        .await
        .expect("writing the request hung")
        .expect("write the request");
}

/// Reads one response; a `HEAD` response has no body whatever its `Content-Length` says.
async fn read_response(stream: &mut TcpStream, head: bool) -> HttpResponse {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        read_more(stream, &mut buf, "the response head").await;
    };
    let head_text = String::from_utf8(buf[..head_end].to_vec()).expect("utf-8 response head");
    let mut lines = head_text.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (k, v) = line.split_once(':').expect("header line with a colon");
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    let mut response = HttpResponse {
        status,
        headers,
        body: String::new(),
    };
    if head {
        return response;
    }
    let length: usize = response
        .header("content-length")
        .expect("the admin server frames bodies with content-length")
        .parse()
        .expect("numeric content-length");
    let body_start = head_end + 4;
    while buf.len() < body_start + length {
        read_more(stream, &mut buf, "the response body").await;
    }
    response.body =
        String::from_utf8(buf[body_start..body_start + length].to_vec()).expect("utf-8");
    response
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, what: &str) {
    let n = timeout(DEADLINE, stream.read_buf(buf))
        .await
        .unwrap_or_else(|_| panic!("reading {what} hung"))
        .unwrap_or_else(|e| panic!("reading {what}: {e}"));
    assert_ne!(n, 0, "connection closed while reading {what}");
}

/// Waits for the server to close the connection, failing if it sends anything more.
async fn expect_closed(stream: &mut TcpStream, why: &str) {
    let mut rest = Vec::new();
    timeout(DEADLINE, stream.read_to_end(&mut rest))
        .await
        .unwrap_or_else(|_| panic!("the server did not close the connection {why}"))
        .expect("read to end");
    assert!(
        rest.is_empty(),
        "unexpected bytes after the response: {rest:?}"
    );
}

async fn request(addr: SocketAddr, method: &str, path: &str) -> HttpResponse {
    let mut stream = connect(addr).await;
    send(&mut stream, method, path, false).await;
    let response = read_response(&mut stream, method == "HEAD").await;
    expect_closed(&mut stream, "after a Connection: close request").await;
    response
}

// === tests ===

#[tokio::test]
async fn healthz_readyz_and_metrics_answer_over_tcp() {
    let state = state();
    let informers = state.readiness.condition("informers");
    let server = start(state).await;

    let healthz = request(server.addr, "GET", "/healthz").await;
    assert_eq!((healthz.status, healthz.body.as_str()), (200, "ok"));

    let readyz = request(server.addr, "GET", "/readyz").await;
    assert_eq!(readyz.status, 503);
    assert_eq!(
        readyz.body,
        "[-]informers failed: not started\nreadyz check failed\n"
    );
    informers.set_ready();
    let readyz = request(server.addr, "GET", "/readyz").await;
    assert_eq!((readyz.status, readyz.body.as_str()), (200, "ok"));

    let metrics = request(server.addr, "GET", "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert_eq!(metrics.header("content-type"), Some(METRICS_CONTENT_TYPE));
    assert!(
        metrics.body.contains("\nkruised_build_info{"),
        "{}",
        metrics.body
    );
    assert!(
        metrics.body.contains("\nprocess_resident_memory_bytes "),
        "{}",
        metrics.body
    );

    let head = request(server.addr, "HEAD", "/healthz").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("2"));

    let missing = request(server.addr, "GET", "/debug/pprof/").await;
    assert_eq!(missing.status, 404);

    server.stop().await;
}

/// Holds `/metrics` inside the handler until the test releases it, so a request is provably in
/// flight when the shutdown token fires.
#[derive(Debug)]
struct Gate {
    entered: Mutex<Option<oneshot::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl Collector for Gate {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        if let Some(entered) = self.entered.lock().expect("gate lock").take() {
            let _ = entered.send(());
        }
        // Runs on the blocking pool (the handler encodes there), so blocking is allowed; the
        // timeout only keeps a broken test from hanging forever.
        let _ = self
            .release
            .lock()
            .expect("gate lock")
            .recv_timeout(DEADLINE);
        let gauge = ConstGauge::new(1_i64);
        let metric = encoder.encode_descriptor(
            "admin_test_gate",
            "Held until the test releases it.",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

#[tokio::test]
async fn cancelling_stops_the_server_but_a_request_in_flight_still_gets_its_answer() {
    let (entered_tx, entered_rx) = oneshot::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Gate {
        entered: Mutex::new(Some(entered_tx)),
        release: Mutex::new(release_rx),
    }));
    let server = start(state_with(registry)).await;

    let mut stream = connect(server.addr).await;
    send(&mut stream, "GET", "/metrics", true).await;
    timeout(DEADLINE, entered_rx)
        .await
        .expect("the /metrics request never reached the handler")
        .expect("gate dropped");

    server.shutdown.cancel();
    assert!(
        !server.task.is_finished(),
        "serve returned while a request was in flight"
    );
    release_tx.send(()).expect("release the gate");

    let response = read_response(&mut stream, false).await;
    assert_eq!(response.status, 200);
    assert!(
        response.body.contains("admin_test_gate 1\n"),
        "{}",
        response.body
    );
    expect_closed(&mut stream, "after answering during shutdown").await;

    timeout(DEADLINE, server.task)
        .await
        .expect("serve did not return after its last connection closed")
        .expect("serve panicked");
    let refused = timeout(DEADLINE, TcpStream::connect(server.addr))
        .await
        .expect("connecting to the stopped server hung");
    assert!(refused.is_err(), "the listener is still accepting");
}

#[tokio::test]
async fn cancelling_closes_idle_keep_alive_connections() {
    let server = start(state()).await;
    let mut stream = connect(server.addr).await;
    send(&mut stream, "GET", "/healthz", true).await;
    let response = read_response(&mut stream, false).await;
    assert_eq!((response.status, response.body.as_str()), (200, "ok"));

    server.shutdown.cancel();
    expect_closed(&mut stream, "that was idle at shutdown").await;
    timeout(DEADLINE, server.task)
        .await
        .expect("serve did not return after cancellation")
        .expect("serve panicked");
}

/// `/metrics` as the daemon builds its registry: client-go's `rest_client_*` families under
/// their own names (k8s.io/component-base `metrics/prometheus/restclient/metrics.go`), beside
/// kruised's, which keep `kruised_`, the admin server's own and the process metrics.
#[tokio::test]
async fn metrics_serve_client_go_rest_client_families_unprefixed_beside_kruised_ones() {
    use kruised::k8s::client::RestClientMetrics;
    use kruised::k8s::client::metrics::{DurationLabels, RequestLabels};
    use prometheus_client::metrics::gauge::Gauge;

    let mut registry = new_registry();
    let client = RestClientMetrics::register(&mut registry);
    kruised::metrics::kruised(&mut registry)
        .sub_registry_with_prefix("containermeta")
        .register("probe", "A component's gauge.", Gauge::<i64>::default());
    let host = "10.96.0.1:443".to_string();
    client
        .requests
        .get_or_create(&RequestLabels {
            code: "<error>".into(),
            method: "GET".into(),
            host: host.clone(),
        })
        .inc();
    client
        .duration
        .get_or_create(&DurationLabels {
            verb: "GET".into(),
            host,
        })
        .observe(0.2);
    let server = start(state_with(registry)).await;
    let metrics = request(server.addr, "GET", "/metrics").await;
    assert_eq!(metrics.status, 200);
    let body = metrics.body;
    for line in [
        "# HELP rest_client_requests Number of HTTP requests, partitioned by status code, method, and host.\n",
        "# TYPE rest_client_requests counter\n",
        "\nrest_client_requests_total{code=\"<error>\",method=\"GET\",host=\"10.96.0.1:443\"} 1\n",
        "# HELP rest_client_request_duration_seconds Request latency in seconds. Broken down by verb, and host.\n",
        "# TYPE rest_client_request_duration_seconds histogram\n",
        "\nrest_client_request_duration_seconds_count{verb=\"GET\",host=\"10.96.0.1:443\"} 1\n",
        "\nkruised_build_info{",
        "\nkruised_containermeta_probe 0\n",
        "\nkruised_admin_connections ",
        "\nprocess_resident_memory_bytes ",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    assert!(!body.contains("kruised_rest_client"), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    server.stop().await;
}
