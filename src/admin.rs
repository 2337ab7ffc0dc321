//! The admin HTTP server: `/healthz` (liveness), `/readyz` (readiness) and `/metrics`.
//!
//! kruise-daemon serves `/healthz` and `/metrics` on `--addr` (default `:10221`); the chart's liveness
//! probe hits `/healthz`. We keep its `/healthz` failure body (`check <name> failed, err: <err>`) but
//! check what liveness should check, that the long-lived loops still make progress ([`Liveness`]),
//! and move "caches synced, CRI reachable" to a separate `/readyz` ([`Readiness`]), so a slow
//! informer sync no longer gets the daemon restarted.
//!
//! The port is reachable by whatever reaches the pod's IP (the node's, under host network),
//! tenants' pods included, so the server bounds what a client can make it hold
//! ([`limits`]): connections in all and per peer address (when every slot is taken, the oldest
//! idle connection of the busiest peer gives its slot to a newcomer; failing that, the newcomer
//! is reset at once, counted and logged at most once a minute), with slots kept for the node's
//! own addresses, where the kubelet's probes come from ([`peers`]), hyper's buffers (a request head larger than
//! 16 KiB gets 431), the time to send a head (also between kept-alive requests), a connection's
//! age, and the `/metrics` renderings at once.
//!
//! `/debug/inplace-updates/<namespace>/<pod>` serves a pod's in-place update timelines (what
//! `kruised explain` shows) to the node itself only: a peer that is not loopback gets 403, so a
//! tenant's pod learns nothing of other pods from it. The answer is read from memory (no API or
//! runtime call), two timelines at most: nothing a client sends makes the daemon do more.

use std::convert::Infallible;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, debug_span, error, info, warn};

pub use crate::health::{
    ConditionReport, Heartbeat, Liveness, Readiness, ReadinessCondition, Stalled, TaskGuard,
};

mod limits;
mod peers;
#[cfg(test)]
mod tests;

use limits::{AdminMetrics, Limits, REFUSAL_LOG_INTERVAL, Refusal, RefusalLog, Slot, Slots};
use peers::NodePeers;

/// Liveness endpoint (kruise-daemon's path, probed by the chart's livenessProbe).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness endpoint.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus scrape endpoint.
pub const METRICS_PATH: &str = "/metrics";
/// A pod's in-place update timelines: `<this>/<namespace>/<name>`, loopback peers only.
pub const TIMELINES_PATH: &str = "/debug/inplace-updates/";

/// A pod's in-place update timelines as JSON, by namespace and name (`None`: the pod is not
/// known): the daemon's timelines, which this module cannot name (it sits below the
/// controllers).
#[derive(Clone)]
pub struct TimelineSource(pub Arc<TimelineLookup>);

/// What a [`TimelineSource`] calls: namespace and name to JSON.
pub type TimelineLookup = dyn Fn(&str, &str) -> Option<String> + Send + Sync;

impl fmt::Debug for TimelineSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TimelineSource")
    }
}

/// The peer address of a connection, and whether it is the node's ([`peers`]), as its requests
/// carry it (an extension the server always inserts; a request without it is the daemon's own,
/// in tests).
#[derive(Clone, Copy, Debug)]
struct Peer(std::net::IpAddr, bool);

/// Content type of `/metrics` (prometheus-client's text encoder writes OpenMetrics).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// After shutdown, in-flight requests get this long before their connections are dropped; so
/// does a connection that reached its maximum age.
const CONNECTION_DRAIN_GRACE: Duration = Duration::from_secs(5);
/// Pause after an accept error such as EMFILE, which would otherwise fail again at once.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_secs(1);

// === Handler ===

/// What the admin server serves. Cloning is cheap (all shared).
#[derive(Debug, Clone)]
pub struct AdminState {
    /// Backs `/readyz`.
    pub readiness: Readiness,
    /// Backs `/healthz`.
    pub liveness: Liveness,
    /// The root registry from [`crate::metrics::new_registry`]; `/metrics` adds the admin
    /// server's own metrics and the process metrics itself.
    pub registry: Arc<Registry>,
    /// Backs [`TIMELINES_PATH`]; `None`: 404.
    pub timelines: Option<TimelineSource>,
    /// The node's IPs (`--node-ips`): with loopback and the pod's default gateways, the peers
    /// that always get a connection slot (the kubelet's probes; `admin::peers`).
    pub node_ips: Vec<std::net::IpAddr>,
}

/// Answers admin requests for one server: its [`AdminState`], plus the bound on `/metrics`
/// renderings at once and the admin server's own metrics. Cloning shares them.
#[derive(Debug, Clone)]
struct Handler {
    state: AdminState,
    renders: Arc<Semaphore>,
    render_wait: Duration,
    metrics: AdminMetrics,
}

impl Handler {
    fn new(state: AdminState, limits: &Limits, metrics: AdminMetrics) -> Self {
        Handler {
            state,
            renders: Arc::new(Semaphore::new(limits.concurrent_renders)),
            render_wait: limits.render_wait,
            metrics,
        }
    }

    /// Answers one admin request. Serves `GET`/`HEAD` on [`HEALTHZ_PATH`], [`READYZ_PATH`]
    /// (`?verbose` lists every condition even when ready) and [`METRICS_PATH`]; other paths get
    /// 404, other methods 405. The request body is ignored.
    async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        enum Route<'a> {
            Healthz,
            Readyz,
            Metrics,
            Timelines(&'a str),
        }
        let route = match req.uri().path() {
            HEALTHZ_PATH => Route::Healthz,
            READYZ_PATH => Route::Readyz,
            METRICS_PATH => Route::Metrics,
            path => match path.strip_prefix(TIMELINES_PATH) {
                Some(pod) => Route::Timelines(pod),
                None => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
            },
        };
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        match route {
            Route::Healthz => healthz(&self.state.liveness),
            Route::Readyz => {
                // the conditions' details (runtime endpoints, errors) to the node only: a
                // tenant's pod gets the verdict
                let node = req.extensions().get::<Peer>().is_none_or(|p| p.1);
                readyz(&self.state.readiness, is_verbose(req.uri()), node)
            }
            Route::Metrics => self.metrics().await,
            Route::Timelines(pod) => {
                let peer = req.extensions().get::<Peer>().map(|p| p.0);
                timelines(self.state.timelines.as_ref(), peer, pod)
            }
        }
    }

    /// Renders `/metrics` once a rendering slot is free, or answers 503 after `render_wait`.
    async fn metrics(&self) -> Response<Full<Bytes>> {
        let renders = Arc::clone(&self.renders);
        let permit = match tokio::time::timeout(self.render_wait, renders.acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            // the semaphore is never closed; a closed one is as busy as a full one
            Ok(Err(_)) | Err(_) => {
                self.metrics.scrapes_refused.inc();
                debug!("scrape refused: the renderings at once are at their limit");
                let mut response = text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "metrics busy: too many scrapes at once\n",
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return response;
            }
        };
        let registry = Arc::clone(&self.state.registry);
        let admin = Arc::clone(&self.metrics.registry);
        // Collectors read /proc synchronously; keep that off the runtime's worker threads. The
        // permit goes with the rendering: a scraper that hangs up does not free its slot before
        // the rendering it started is done.
        let encoded = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            exposition(&registry, &admin)
        })
        .await;
        match encoded {
            Ok(Ok(body)) => {
                let mut response = Response::new(Full::new(Bytes::from(body)));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(METRICS_CONTENT_TYPE),
                );
                response
            }
            Ok(Err(fmt::Error)) => {
                error!("a metric failed to encode");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed to encode metrics\n",
                )
            }
            Err(join_error) => {
                error!(error = %join_error, "metrics encoding task failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "failed to encode metrics\n",
                )
            }
        }
    }
}

/// kruise-daemon's format: `ok`, or 500 with `check <name> failed, err: <err>` for the first failure.
fn healthz(liveness: &Liveness) -> Response<Full<Bytes>> {
    match liveness.check() {
        Ok(()) => text(StatusCode::OK, "ok"),
        Err(stalled) => {
            let body = format!("check {} failed, err: {stalled}", stalled.name);
            warn!(check = stalled.name, error = %stalled, "liveness check failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, body)
        }
    }
}

/// kube-apiserver's format: `ok`, or one `[+]name ok` / `[-]name failed: <detail>` line per
/// condition and a verdict line; a condition that holds with a note (which runtime, and why)
/// has it after `ok: `.
fn readyz(readiness: &Readiness, verbose: bool, node: bool) -> Response<Full<Bytes>> {
    let report = readiness.report();
    let ready = crate::health::all_ready(&report);
    if ready && (!verbose || !node) {
        return text(StatusCode::OK, "ok");
    }
    if !node {
        return text(StatusCode::SERVICE_UNAVAILABLE, "readyz check failed\n");
    }
    let mut body = String::new();
    if report.is_empty() {
        body.push_str("[-]conditions failed: none registered yet\n");
    }
    for c in &report {
        // Writing to a String cannot fail.
        let _ = if c.ready && c.detail.is_empty() {
            writeln!(body, "[+]{} ok", c.name)
        } else if c.ready {
            writeln!(body, "[+]{} ok: {}", c.name, c.detail)
        } else {
            writeln!(body, "[-]{} failed: {}", c.name, c.detail)
        };
    }
    if ready {
        body.push_str("readyz check passed\n");
        text(StatusCode::OK, body)
    } else {
        body.push_str("readyz check failed\n");
        text(StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

/// A pod's timelines (`pod`: `<namespace>/<name>`) for a loopback `peer`.
fn timelines(
    source: Option<&TimelineSource>,
    peer: Option<std::net::IpAddr>,
    pod: &str,
) -> Response<Full<Bytes>> {
    if !peer.is_some_and(|p| p.to_canonical().is_loopback()) {
        return text(
            StatusCode::FORBIDDEN,
            "in-place update timelines are served to the node itself only (loopback)\n",
        );
    }
    // a namespace and a name as the API allows them (DNS subdomain: lower case, digits, '-', '.')
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    let Some((namespace, name)) = pod.split_once('/').filter(|(ns, n)| valid(ns) && valid(n))
    else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("expected {TIMELINES_PATH}<namespace>/<name>\n"),
        );
    };
    match source.and_then(|s| (s.0)(namespace, name)) {
        Some(json) => {
            let mut response = Response::new(Full::new(Bytes::from(json)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        None => text(
            StatusCode::NOT_FOUND,
            format!("no in-place update timeline of {namespace}/{name} on this node\n"),
        ),
    }
}

/// `?verbose`, `?verbose=1`, `?a=b&verbose` (kube-apiserver only checks that the key is present).
fn is_verbose(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split_once('=').map_or(kv, |(k, _)| k) == "verbose")
    })
}

/// The `/metrics` body: the daemon's registry, then the admin server's, then (from
/// [`crate::metrics::exposition`]) the process metrics and `# EOF`.
fn exposition(daemon: &Registry, admin: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode_registry(&mut out, daemon)?;
    out.push_str(&crate::metrics::exposition(admin)?);
    Ok(out)
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(TEXT_CONTENT_TYPE),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

// === Server ===

/// Serves the admin endpoints over HTTP/1 on `listener` until `shutdown` is cancelled, one task
/// per connection, within the limits of [`limits`] (64 connections and 8 more for the node, 8 per
/// peer address, the busiest peer's idle connection evicted for a newcomer, 16 KiB buffers, 5 s
/// to send a head, 60 s per connection, 2 renderings of `/metrics` at once).
///
/// On cancellation it stops accepting (the listener is dropped), asks every connection to shut down
/// gracefully (idle keep-alive connections close at once, a request in flight still gets its
/// response, then the connection closes), and returns once they are gone, or after
/// `CONNECTION_DRAIN_GRACE` (5 s), dropping the stragglers.
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: CancellationToken) {
    Server::new(state, Limits::default())
        .run(listener, shutdown)
        .await;
}

/// One admin server: its handler, limits and connection slots.
struct Server {
    handler: Handler,
    limits: Limits,
    slots: Slots,
    node: NodePeers,
}

impl Server {
    fn new(state: AdminState, limits: Limits) -> Self {
        let node = NodePeers::discover(&state.node_ips);
        Self::with_node(state, limits, node)
    }

    fn with_node(state: AdminState, limits: Limits, node: NodePeers) -> Self {
        let metrics = AdminMetrics::new();
        Server {
            slots: Slots::new(&limits, metrics.open.clone()),
            handler: Handler::new(state, &limits, metrics),
            limits,
            node,
        }
    }

    async fn run(self, listener: TcpListener, shutdown: CancellationToken) {
        match listener.local_addr() {
            Ok(addr) => info!(%addr, node = ?self.node.addresses(), "admin server listening"),
            Err(error) => warn!(%error, "admin server listening on an unknown address"),
        }
        let mut refusals = RefusalLog::new(REFUSAL_LOG_INTERVAL);
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some(finished) = connections.join_next(), if !connections.is_empty() => {
                    log_connection_end(finished);
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => match self.slots.try_take(peer.ip(), self.node.contains(peer.ip())) {
                        Ok(limits::Taken { slot, evicted }) => {
                            if let Some(evicted) = evicted {
                                self.handler.metrics.evicted.inc();
                                debug!(%peer, %evicted, "every admin slot taken: an idle connection of the busiest peer gives its slot up");
                            }
                            let conn = serve_connection(
                                stream,
                                self.handler.clone(),
                                self.limits,
                                shutdown.clone(),
                                slot,
                            );
                            connections.spawn(conn.instrument(debug_span!("admin_conn", %peer)));
                        }
                        Err(reason) => self.refuse(stream, peer, reason, &mut refusals),
                    },
                    Err(error) if is_connection_error(&error) => {
                        debug!(%error, "connection failed before accept");
                    }
                    Err(error) => {
                        warn!(%error, "accept failed");
                        tokio::select! {
                            () = shutdown.cancelled() => break,
                            () = tokio::time::sleep(ACCEPT_ERROR_BACKOFF) => {}
                        }
                    }
                },
            }
        }
        drop(listener);

        let drain = async {
            while let Some(finished) = connections.join_next().await {
                log_connection_end(finished);
            }
        };
        if tokio::time::timeout(CONNECTION_DRAIN_GRACE, drain)
            .await
            .is_err()
        {
            warn!(
                connections = connections.len(),
                "admin connections did not finish in time; dropping them"
            );
            connections.shutdown().await;
        }
        info!("admin server stopped");
    }

    /// Resets a connection over a limit at once (the listen backlog never fills, so a probe
    /// gets in as soon as a slot frees), counts it, and logs it unless one was logged less than
    /// a minute ago.
    fn refuse(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
        reason: Refusal,
        refusals: &mut RefusalLog,
    ) {
        self.handler.metrics.count_refusal(reason);
        // reset, not closed: no TIME_WAIT left behind per refused connection
        if let Err(error) = stream.set_zero_linger() {
            debug!(%error, "cannot set SO_LINGER on a refused connection");
        }
        drop(stream);
        if let Some(unlogged) = refusals.refused(tokio::time::Instant::now()) {
            let limit = match reason {
                Refusal::ServerFull => self.limits.max_connections,
                Refusal::PeerFull => self.limits.max_connections_per_peer,
            };
            warn!(
                %peer,
                reason = reason.as_str(),
                limit,
                refused_since_last_line = unlogged,
                "admin connection refused: too many connections open"
            );
        }
    }
}

/// Serves one connection while it holds `slot`: until the client closes it, it breaks a limit
/// (hyper answers 431 to a head larger than the buffer and closes a connection whose head does
/// not come in time), it reaches its maximum age (asked to close after the request in flight,
/// dropped `CONNECTION_DRAIN_GRACE` later), or shutdown.
async fn serve_connection<I>(
    io: I,
    handler: Handler,
    limits: Limits,
    shutdown: CancellationToken,
    slot: Slot,
) where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let peer = Peer(slot.peer(), slot.is_node());
    let state = slot.state().clone();
    let requests = state.clone();
    let _slot = slot;
    let service = service_fn(move |mut req: Request<hyper::body::Incoming>| {
        let handler = handler.clone();
        req.extensions_mut().insert(peer);
        // busy until the answer is made: an evicted connection finishes it first
        let busy = requests.busy();
        async move {
            let response = handler.handle(req).await;
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_buf_size);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = state.evicted() => {
            debug!("admin connection idle while every slot was taken; closing it for a newcomer");
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(CONNECTION_DRAIN_GRACE, conn).await {
                Ok(result) => result,
                Err(_) => return,
            }
        }
        () = tokio::time::sleep(limits.max_connection_age) => {
            debug!("admin connection reached its maximum age; closing it");
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(CONNECTION_DRAIN_GRACE, conn).await {
                Ok(result) => result,
                Err(_) => {
                    debug!("admin connection did not close in time; dropping it");
                    return;
                }
            }
        }
    };
    if let Err(error) = result {
        debug!(%error, "admin connection ended with an error");
    }
}

fn log_connection_end(finished: Result<(), tokio::task::JoinError>) {
    if let Err(error) = finished
        && error.is_panic()
    {
        error!(%error, "admin connection task panicked");
    }
}

/// Errors about one connection, not the listener; retrying at once is right.
fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        error.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}
