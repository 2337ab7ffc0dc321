//! A time limit on every API call but watches ([`CallLimitLayer`]): from the moment the request
//! leaves the client's queue to the last byte of the answer, [`CALL_TIMEOUT`] unless the daemon
//! was told otherwise. A call past it fails with [`CallTimedOut`], which the writers retry
//! (`k8s::write::is_retryable`).
//!
//! Why: a write sent on a connection that went silent (a control-plane failover, a load
//! balancer that forgot the connection while still acknowledging TCP) would otherwise hold its
//! worker, and the key it works on, until the connection is found dead, or forever where
//! nothing finds it (issue 34). Watches are exempt: they are meant to stay open for their
//! `timeoutSeconds`, and HTTP/2 pings ([`super::connect::H2_DEAD_AFTER`]) or, over HTTP/1.1,
//! the watcher's own idle limit say when one is dead. Cutting a call drops its request: over
//! HTTP/1.1 its connection is closed with it; over HTTP/2 the stream is reset and the
//! connection stays for the others until its pings fail.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, Uri};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// How long a call but a watch may take, as client-go's `rest.Config.Timeout` would bound it
/// (`kubectl --request-timeout`): long enough for any LIST a node daemon makes on a loaded
/// server, short enough that a write stuck on a dead connection is retried on a new one well
/// within a minute.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A call took longer than its limit; what it was, for the message.
#[derive(Clone, Debug, thiserror::Error)]
#[error(
    "the API server did not answer {method} {path} within {limit:?} (kruised's limit of a call)"
)]
pub struct CallTimedOut {
    /// The request's method.
    pub method: Method,
    /// The request's path (no query: it may carry selectors, never secrets, but is long).
    pub path: String,
    /// The limit it ran into.
    pub limit: Duration,
}

/// Whether `err`, or any error it was caused by, is a [`CallTimedOut`].
pub fn is_call_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<CallTimedOut>() {
            return true;
        }
        // an io::Error's source() is its inner error's source, skipping the inner error
        next = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

/// Whether the request is a watch: `watch` in the query set to what the API server reads as
/// true (Go's `strconv.ParseBool`), or the deprecated `/watch/` path.
pub fn is_watch(uri: &Uri) -> bool {
    let by_query = uri.query().is_some_and(|q| {
        q.split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == "watch" && matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
        })
    });
    let segments: Vec<&str> = uri.path().trim_start_matches('/').split('/').collect();
    let by_path = matches!(
        segments.as_slice(),
        ["api", _, "watch", ..] | ["apis", _, _, "watch", ..]
    );
    by_query || by_path
}

// === impl CallLimitLayer ===

/// Layer limiting every call but watches to `limit`.
#[derive(Clone, Copy, Debug)]
pub struct CallLimitLayer {
    limit: Duration,
}

impl CallLimitLayer {
    /// Calls but watches may take `limit`, answer included.
    pub fn new(limit: Duration) -> Self {
        CallLimitLayer { limit }
    }
}

impl<S> Layer<S> for CallLimitLayer {
    type Service = CallLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallLimit {
            inner,
            limit: self.limit,
        }
    }
}

/// A service whose calls but watches fail with [`CallTimedOut`] after their limit.
#[derive(Clone, Debug)]
pub struct CallLimit<S> {
    inner: S,
    limit: Duration,
}

type BoxCall<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, ReqBody, B> Service<Request<ReqBody>> for CallLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<LimitedBody<B>>;
    type Error = BoxError;
    type Future = BoxCall<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if is_watch(req.uri()) {
            let call = self.inner.call(req);
            return Box::pin(async move {
                let response = call.await.map_err(Into::into)?;
                Ok(response.map(LimitedBody::unlimited))
            });
        }
        let timed_out = CallTimedOut {
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            limit: self.limit,
        };
        let deadline = Instant::now() + self.limit;
        let call = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(response)) => {
                    Ok(response.map(|body| LimitedBody::until(body, deadline, timed_out)))
                }
                Ok(Err(e)) => Err(e.into()),
                Err(_elapsed) => Err(Box::new(timed_out) as BoxError),
            }
        })
    }
}

// === impl LimitedBody ===

/// A response body that fails with [`CallTimedOut`] once its call's deadline passes (dropping
/// the body under it, so its stream or connection is let go), or never for a watch.
pub struct LimitedBody<B> {
    inner: Option<B>,
    deadline: Option<(Pin<Box<Sleep>>, CallTimedOut)>,
}

impl<B> LimitedBody<B> {
    fn unlimited(inner: B) -> Self {
        LimitedBody {
            inner: Some(inner),
            deadline: None,
        }
    }

    fn until(inner: B, deadline: Instant, timed_out: CallTimedOut) -> Self {
        LimitedBody {
            inner: Some(inner),
            deadline: Some((Box::pin(tokio::time::sleep_until(deadline)), timed_out)),
        }
    }
}

impl<B> Body for LimitedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = Pin::new(inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if let Some((sleep, timed_out)) = this.deadline.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            let err = timed_out.clone();
            this.inner = None;
            this.deadline = None;
            return Poll::Ready(Some(Err(Box::new(err))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use hyper::body::Bytes;
    use tower::ServiceExt;
    use tower::util::BoxService;

    #[test]
    fn watches_are_told_by_their_query_or_their_deprecated_path() {
        let watches = [
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true",
            "/api/v1/pods?watch=1&resourceVersion=5",
            "/apis/apps.kruise.io/v1alpha1/nodeimages?watch=True",
            "/api/v1/watch/pods",
            "/apis/apps.kruise.io/v1alpha1/watch/namespaces/ns/containerrecreaterequests",
        ];
        for w in watches {
            assert!(is_watch(&w.parse().unwrap()), "{w}");
        }
        let calls = [
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn",
            "/api/v1/pods?watch=false",
            "/api/v1/pods?watch=0",
            "/api/v1/pods?watchy=true",
            "/api/v1/namespaces/watch/pods/p",
            "/apis/apps.kruise.io/v1alpha1/namespaces/watch/containerrecreaterequests",
            "/version",
        ];
        for c in calls {
            assert!(!is_watch(&c.parse().unwrap()), "{c}");
        }
    }

    type Chunk = Result<Frame<Bytes>, BoxError>;
    type Chunks = futures::channel::mpsc::UnboundedReceiver<Chunk>;
    type Server = BoxService<Request<()>, Response<StreamBody<Chunks>>, BoxError>;

    /// A server that answers the headers after `head_after` and then streams what the test
    /// sends into the returned sender.
    fn server(head_after: Duration) -> (Server, futures::channel::mpsc::UnboundedSender<Chunk>) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let mut rx = Some(rx);
        let svc = tower::service_fn(move |_req: Request<()>| {
            let rx = rx.take().expect("one call per server");
            async move {
                tokio::time::sleep(head_after).await;
                Ok::<_, BoxError>(Response::new(StreamBody::new(rx)))
            }
        });
        (BoxService::new(svc), tx)
    }

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_answer_does_not_come_fails_at_its_limit_naming_it() {
        let (svc, _tx) = server(Duration::from_secs(3600));
        let svc = CallLimitLayer::new(Duration::from_secs(30)).layer(svc);
        let start = Instant::now();
        let err = svc
            .oneshot(
                Request::patch("/api/v1/namespaces/ns/pods/p/status")
                    .body(())
                    .unwrap(),
            )
            .await
            .err()
            .expect("the call is cut");
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert!(is_call_timeout(err.as_ref()));
        assert_eq!(
            err.to_string(),
            "the API server did not answer PATCH /api/v1/namespaces/ns/pods/p/status within 30s \
             (kruised's limit of a call)"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_stops_halfway_fails_at_the_same_deadline() {
        let (svc, tx) = server(Duration::from_secs(10));
        let svc = CallLimitLayer::new(Duration::from_secs(30)).layer(svc);
        let start = Instant::now();
        let response = svc.oneshot(get("/api/v1/pods")).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(10), "headers in time");
        tx.unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"items\":"))))
            .unwrap();
        let mut body = response.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(
            first.into_data().unwrap(),
            Bytes::from_static(b"{\"items\":")
        );
        let err = body
            .frame()
            .await
            .unwrap()
            .expect_err("the rest never comes");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(30),
            "one deadline for the call"
        );
        assert!(is_call_timeout(err.as_ref()));
        assert!(body.frame().await.is_none(), "nothing after the error");
        assert!(tx.is_closed(), "the body under it was let go");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_answered_in_time_is_untouched() {
        let (svc, tx) = server(Duration::from_secs(29));
        let svc = CallLimitLayer::new(Duration::from_secs(30)).layer(svc);
        let response = svc.oneshot(get("/api/v1/pods")).await.unwrap();
        tx.unbounded_send(Ok(Frame::data(Bytes::from_static(b"{}"))))
            .unwrap();
        drop(tx);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"{}"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_outlives_the_limit() {
        let (svc, tx) = server(Duration::from_secs(45));
        let svc = CallLimitLayer::new(Duration::from_secs(30)).layer(svc);
        let start = Instant::now();
        let response = svc
            .oneshot(get("/api/v1/pods?watch=true&timeoutSeconds=900"))
            .await
            .expect("a watch answered after the limit is not cut");
        let mut body = response.into_body();
        let quiet = tokio::time::timeout(Duration::from_secs(600), body.frame()).await;
        assert!(
            quiet.is_err(),
            "ten quiet minutes later the watch is still open"
        );
        tx.unbounded_send(Ok(Frame::data(Bytes::from_static(b"{\"type\":\"ADDED\"}"))))
            .unwrap();
        let event = body.frame().await.unwrap().unwrap();
        assert_eq!(
            event.into_data().unwrap(),
            Bytes::from_static(b"{\"type\":\"ADDED\"}")
        );
        assert_eq!(start.elapsed(), Duration::from_secs(645));
    }
}
