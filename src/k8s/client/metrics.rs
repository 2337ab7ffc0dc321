//! client-go's request metrics for kruised's API client, under client-go's names and labels so
//! dashboards and alerts built on them work unchanged (k8s.io/component-base
//! `metrics/prometheus/restclient/metrics.go`):
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `rest_client_requests_total` | counter | `code` (HTTP status, or `<error>`), `method`, `host` |
//! | `rest_client_request_duration_seconds` | histogram | `verb`, `host` |
//!
//! Counted by a tower layer right above the HTTP client, so every attempt is one request, as
//! client-go counts each try; the duration runs until the response's head (a watch's is its
//! start, not its length). `host` is the API server's `host[:port]` as the URL gives it
//! (client-go's `URL.Host`): one series per server, so bounded.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tower::{Layer, Service};

/// client-go's buckets of `rest_client_request_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The `code` of a request that got no response.
pub const ERROR_CODE: &str = "<error>";

/// Labels of `rest_client_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The HTTP status, or [`ERROR_CODE`].
    pub code: String,
    /// The HTTP method.
    pub method: String,
    /// The server's `host[:port]`.
    pub host: String,
}

/// Labels of `rest_client_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabels {
    /// The HTTP method.
    pub verb: String,
    /// The server's `host[:port]`.
    pub host: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The two families. Cloning shares them; [`Default`] makes them unregistered (a client whose
/// requests nobody scrapes, as `kruised explain`'s).
#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    /// `rest_client_requests_total`.
    pub requests: Family<RequestLabels, Counter>,
    /// `rest_client_request_duration_seconds`.
    pub duration: Family<DurationLabels, Histogram>,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        RestClientMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        }
    }
}

impl RestClientMetrics {
    /// Creates the families and registers them on `registry` under client-go's names, which
    /// the registry must not prefix: give it the daemon's unprefixed root
    /// (`metrics::new_registry`).
    pub fn register(registry: &mut Registry) -> Self {
        let m = RestClientMetrics::default();
        registry.register(
            "rest_client_requests",
            // prometheus-client ends every help text with a period itself
            "Number of HTTP requests, partitioned by status code, method, and host",
            m.requests.clone(),
        );
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            m.duration.clone(),
        );
        m
    }

    /// The layer that counts the requests through it.
    pub fn layer(&self) -> RestClientMetricsLayer {
        RestClientMetricsLayer {
            metrics: self.clone(),
        }
    }
}

/// Counts requests into [`RestClientMetrics`].
#[derive(Clone, Debug)]
pub struct RestClientMetricsLayer {
    metrics: RestClientMetrics,
}

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// A service whose requests are counted.
#[derive(Clone, Debug)]
pub struct Counted<S> {
    inner: S,
    metrics: RestClientMetrics,
}

impl<S, B, R> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = host_of(req.uri());
        let metrics = self.metrics.clone();
        let start = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => ERROR_CODE.to_string(),
            };
            metrics
                .duration
                .get_or_create(&DurationLabels {
                    verb: method.clone(),
                    host: host.clone(),
                })
                .observe(start.elapsed().as_secs_f64());
            metrics
                .requests
                .get_or_create(&RequestLabels { code, method, host })
                .inc();
            result
        })
    }
}

/// `host[:port]` of `uri`, without user info (Go's `URL.Host`).
fn host_of(uri: &http::Uri) -> String {
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, h)| h)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    use prometheus_client::encoding::text::encode;
    use tower::ServiceExt;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        encode(&mut out, registry).expect("encoding to a String cannot fail");
        out
    }

    #[tokio::test(start_paused = true)]
    async fn every_response_and_every_failure_is_counted_with_client_go_labels() {
        let mut registry = Registry::default();
        let metrics = RestClientMetrics::register(&mut registry);
        let svc = metrics
            .layer()
            .layer(tower::service_fn(|req: Request<()>| async move {
                match req.uri().path() {
                    "/fail" => Err("connection refused"),
                    "/slow" => {
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        Ok(Response::builder().status(201).body(()).unwrap())
                    }
                    _ => Ok(Response::builder().status(404).body(()).unwrap()),
                }
            }));
        let send = |method: &str, uri: &str| {
            let req = Request::builder().method(method).uri(uri).body(()).unwrap();
            svc.clone().oneshot(req)
        };
        assert!(
            send("GET", "https://10.0.0.1:6443/api/v1/pods")
                .await
                .is_ok()
        );
        assert!(send("PATCH", "https://10.0.0.1:6443/slow").await.is_ok());
        assert!(send("GET", "https://u:p@10.0.0.1:6443/fail").await.is_err());

        let text = exposition(&registry);
        for line in [
            "# TYPE rest_client_requests counter\n",
            "rest_client_requests_total{code=\"404\",method=\"GET\",host=\"10.0.0.1:6443\"} 1\n",
            "rest_client_requests_total{code=\"201\",method=\"PATCH\",host=\"10.0.0.1:6443\"} 1\n",
            "rest_client_requests_total{code=\"<error>\",method=\"GET\",host=\"10.0.0.1:6443\"} 1\n",
            "# TYPE rest_client_request_duration_seconds histogram\n",
            "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"10.0.0.1:6443\"} 2\n",
            // the paused clock advanced exactly the 300 ms the slow answer slept
            "rest_client_request_duration_seconds_sum{verb=\"PATCH\",host=\"10.0.0.1:6443\"} 0.3\n",
            "rest_client_request_duration_seconds_bucket{le=\"0.25\",verb=\"PATCH\",host=\"10.0.0.1:6443\"} 0\n",
            "rest_client_request_duration_seconds_bucket{le=\"0.5\",verb=\"PATCH\",host=\"10.0.0.1:6443\"} 1\n",
            "rest_client_request_duration_seconds_bucket{le=\"60.0\",verb=\"GET\",host=\"10.0.0.1:6443\"} 2\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
