//! The admin HTTP server: `/healthz` (liveness), `/readyz` (readiness) and `/metrics`.
//!
//! kruise-daemon serves `/healthz` and `/metrics` on `--addr` (default `:10221`); the chart's liveness
//! probe hits `/healthz`. We keep its `/healthz` failure body (`check <name> failed, err: <err>`) but
//! check what liveness should check, that the long-lived loops still make progress ([`Liveness`]),
//! and move "caches synced, CRI reachable" to a separate `/readyz` ([`Readiness`]), so a slow
//! informer sync no longer gets the daemon restarted.

use std::convert::Infallible;
use std::fmt::{self, Write as _};
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
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, debug_span, error, info, warn};

pub use crate::health::{
    ConditionReport, Heartbeat, Liveness, Readiness, ReadinessCondition, Stalled, TaskGuard,
};

/// Liveness endpoint (kruise-daemon's path, probed by the chart's livenessProbe).
pub const HEALTHZ_PATH: &str = "/healthz";
/// Readiness endpoint.
pub const READYZ_PATH: &str = "/readyz";
/// Prometheus scrape endpoint.
pub const METRICS_PATH: &str = "/metrics";

/// Content type of `/metrics` (prometheus-client's text encoder writes OpenMetrics).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A client must send its request head within this long, so idle sockets cannot pile up.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown, in-flight requests get this long before their connections are dropped.
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
    /// The root registry from [`crate::metrics::new_registry`]; `/metrics` adds the process
    /// metrics itself.
    pub registry: Arc<Registry>,
}

/// Answers one admin request. Serves `GET`/`HEAD` on [`HEALTHZ_PATH`], [`READYZ_PATH`] (`?verbose`
/// lists every condition even when ready) and [`METRICS_PATH`]; other paths get 404, other methods
/// 405. The request body is ignored.
pub async fn handle<B>(state: &AdminState, req: Request<B>) -> Response<Full<Bytes>> {
    enum Route {
        Healthz,
        Readyz,
        Metrics,
    }
    let route = match req.uri().path() {
        HEALTHZ_PATH => Route::Healthz,
        READYZ_PATH => Route::Readyz,
        METRICS_PATH => Route::Metrics,
        _ => return text(StatusCode::NOT_FOUND, "404 page not found\n"),
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match route {
        Route::Healthz => healthz(&state.liveness),
        Route::Readyz => readyz(&state.readiness, is_verbose(req.uri())),
        Route::Metrics => metrics(&state.registry).await,
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
/// condition and a verdict line.
fn readyz(readiness: &Readiness, verbose: bool) -> Response<Full<Bytes>> {
    let report = readiness.report();
    let ready = crate::health::all_ready(&report);
    if ready && !verbose {
        return text(StatusCode::OK, "ok");
    }
    let mut body = String::new();
    if report.is_empty() {
        body.push_str("[-]conditions failed: none registered yet\n");
    }
    for c in &report {
        // Writing to a String cannot fail.
        let _ = if c.ready {
            writeln!(body, "[+]{} ok", c.name)
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

/// `?verbose`, `?verbose=1`, `?a=b&verbose` (kube-apiserver only checks that the key is present).
fn is_verbose(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.split_once('=').map_or(kv, |(k, _)| k) == "verbose")
    })
}

async fn metrics(registry: &Arc<Registry>) -> Response<Full<Bytes>> {
    let registry = Arc::clone(registry);
    // Collectors read /proc synchronously; keep that off the runtime's worker threads.
    let encoded = tokio::task::spawn_blocking(move || crate::metrics::exposition(&registry)).await;
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

/// Serves [`handle`] over HTTP/1 on `listener` until `shutdown` is cancelled, one task per
/// connection.
///
/// On cancellation it stops accepting (the listener is dropped), asks every connection to shut down
/// gracefully (idle keep-alive connections close at once, a request in flight still gets its
/// response, then the connection closes), and returns once they are gone, or after
/// `CONNECTION_DRAIN_GRACE` (5 s), dropping the stragglers.
pub async fn serve(listener: TcpListener, state: AdminState, shutdown: CancellationToken) {
    match listener.local_addr() {
        Ok(addr) => info!(%addr, "admin server listening"),
        Err(error) => warn!(%error, "admin server listening on an unknown address"),
    }
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(finished) = connections.join_next(), if !connections.is_empty() => {
                log_connection_end(finished);
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let conn = serve_connection(stream, state.clone(), shutdown.clone());
                    connections.spawn(conn.instrument(debug_span!("admin_conn", %peer)));
                }
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

async fn serve_connection(stream: TcpStream, state: AdminState, shutdown: CancellationToken) {
    let state = Arc::new(state);
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(&state, req).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
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

// === Addresses ===

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::BodyExt as _;
    use tokio::time::{advance, timeout};

    const DEADLINE: Duration = Duration::from_secs(10);

    fn state() -> AdminState {
        AdminState {
            readiness: Readiness::new(),
            liveness: Liveness::new(),
            registry: Arc::new(crate::metrics::new_registry()),
        }
    }

    /// Sends `method path` to the handler; returns the status, content type and body.
    async fn call(state: &AdminState, method: Method, path: &str) -> (StatusCode, String, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("valid request");
        let resp = timeout(DEADLINE, handle(state, req))
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
        let resp = timeout(DEADLINE, handle(&state, req))
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
}
