//! The Kubernetes API client: kubeconfig or in-cluster config, User-Agent `kruised/<version>`,
//! a client-side token bucket (kruise-daemon's QPS/burst) in front of every request, and the
//! version negotiation of kruise's resources ([`ServedVersions`]).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, header::USER_AGENT};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

use crate::k8s::keys::KRUISE_GROUP;

/// The field manager recorded on every write.
pub const FIELD_MANAGER: &str = "kruised";

/// The version kruised's typed resources are written in.
pub const TYPED_VERSION: &str = "v1alpha1";
/// The newer version kruised also understands, preferred where the server serves it.
pub const NEWER_VERSION: &str = "v1beta1";
/// The kruise resources that exist in [`NEWER_VERSION`] with a superset of the fields of
/// [`TYPED_VERSION`]: NodeImage (1.9 added `spec.images[*].pullSecrets[*].mode`) and
/// ContainerRecreateRequest (HEAD added `status.containerStatusSnapshot` and
/// `status.conditions`). kruised's types carry those fields too.
pub const NEGOTIATED: [&str; 2] = ["nodeimages", "containerrecreaterequests"];

/// Which version of each negotiated kruise resource the server serves, found by discovery once.
///
/// kruised's types are `v1alpha1`, but a write through `v1alpha1` makes the API server prune what
/// only `v1beta1` has (a NodeImage's `mode`, a CRR's snapshot), and on a kruise 1.9+ cluster every
/// `v1alpha1` request goes through kruise-manager's conversion webhook. So where the server
/// serves `v1beta1`, the client's requests for these resources go there instead: the JSON is
/// the same apart from the added fields. Requests wait for nothing: the CR watches start only
/// after [`ServedVersions::discover`] succeeded ([`ServedVersions::wait`]).
#[derive(Clone, Debug, Default)]
pub struct ServedVersions {
    newer: Arc<Mutex<Vec<String>>>,
    done: Arc<tokio::sync::Notify>,
    known: Arc<std::sync::atomic::AtomicBool>,
}

impl ServedVersions {
    /// Nothing known yet: requests keep [`TYPED_VERSION`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the server which negotiated resources it serves in [`NEWER_VERSION`] (discovery
    /// needs no RBAC). A group or version that is not served is an answer (stay on
    /// [`TYPED_VERSION`]); any other failure is an error to retry.
    pub async fn discover(&self, client: &kube::Client) -> Result<Vec<String>, kube::Error> {
        let newer = match client
            .list_api_group_resources(&format!("{KRUISE_GROUP}/{NEWER_VERSION}"))
            .await
        {
            Ok(list) => NEGOTIATED
                .iter()
                .filter(|r| list.resources.iter().any(|x| x.name == **r))
                .map(|r| r.to_string())
                .collect(),
            Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
            Err(e) => return Err(e),
        };
        *crate::sync::lock(&self.newer) = newer.clone();
        self.known.store(true, std::sync::atomic::Ordering::Release);
        self.done.notify_waiters();
        Ok(newer)
    }

    /// Waits until discovery succeeded.
    pub async fn wait(&self) {
        loop {
            let notified = self.done.notified();
            if self.known.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// The version requests for `resource` use.
    pub fn version_of(&self, resource: &str) -> &'static str {
        let newer = crate::sync::lock(&self.newer);
        if newer.iter().any(|r| r == resource) {
            NEWER_VERSION
        } else {
            TYPED_VERSION
        }
    }

    /// `path` with the version of a negotiated resource replaced by the served one.
    pub fn rewrite_path(&self, path: &str) -> Option<String> {
        let prefix = format!("/apis/{KRUISE_GROUP}/{TYPED_VERSION}/");
        let rest = path.strip_prefix(&prefix)?;
        let mut segments = rest.split('/');
        let mut resource = segments.next()?;
        if resource == "namespaces" {
            resource = segments.nth(1)?;
        }
        let version = self.version_of(resource);
        (version != TYPED_VERSION).then(|| format!("/apis/{KRUISE_GROUP}/{version}/{rest}"))
    }
}

/// What the client is built from.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// kubeconfig file; `None`: `KUBECONFIG`, in-cluster, `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Requests per second, sustained.
    pub qps: f64,
    /// Requests allowed at once above the sustained rate.
    pub burst: u32,
    /// The versions to speak for kruise's resources (empty until discovered).
    pub versions: ServedVersions,
}

/// The client cannot be configured (no kubeconfig, unreadable file, bad TLS data).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No configuration was found anywhere.
    #[error("no Kubernetes configuration: {0} (set --kubeconfig or KUBECONFIG, or run in a pod)")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client stack could not be built.
    #[error("building the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
}

/// Builds the client. Does no I/O against the API server: an unreachable server shows up later,
/// in the watches, which retry with backoff.
pub async fn build(settings: &ClientSettings) -> Result<kube::Client, ClientError> {
    let config = match &settings.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    let user_agent = HeaderValue::from_static(concat!("kruised/", env!("CARGO_PKG_VERSION")));
    let builder = ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    let versions = settings.versions.clone();
    Ok(builder
        .with_layer(&TokenBucketLayer::new(settings.qps, settings.burst))
        .with_layer(&tower::util::MapRequestLayer::new(
            move |mut req: Request<kube::client::Body>| {
                let rewritten = versions.rewrite_path(req.uri().path()).and_then(|path| {
                    let pq = match req.uri().query() {
                        Some(q) => format!("{path}?{q}"),
                        None => path,
                    };
                    let mut parts = req.uri().clone().into_parts();
                    parts.path_and_query = pq.parse().ok();
                    http::Uri::from_parts(parts).ok()
                });
                if let Some(uri) = rewritten {
                    *req.uri_mut() = uri;
                }
                req
            },
        ))
        .with_layer(&tower::util::MapRequestLayer::new(
            move |mut req: Request<kube::client::Body>| {
                req.headers_mut().insert(USER_AGENT, user_agent.clone());
                req
            },
        ))
        .build())
}

// === impl TokenBucket ===

/// A token bucket shared by clones of the service: `burst` tokens, refilled at `qps`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    capacity: f64,
    rate: f64,
    last: Instant,
}

impl Bucket {
    /// Takes a token if one is there; else says how long until one is.
    fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Layer adding a client-side rate limit.
#[derive(Clone, Debug)]
pub struct TokenBucketLayer {
    bucket: Arc<Mutex<Bucket>>,
}

impl TokenBucketLayer {
    /// `qps` sustained, `burst` at once (both at least 1).
    pub fn new(qps: f64, burst: u32) -> Self {
        let capacity = f64::from(burst.max(1));
        TokenBucketLayer {
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: capacity,
                capacity,
                rate: qps.max(0.001),
                last: Instant::now(),
            })),
        }
    }
}

impl<S> Layer<S> for TokenBucketLayer {
    type Service = TokenBucket<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBucket {
            inner,
            bucket: self.bucket.clone(),
            has_token: false,
            sleep: None,
        }
    }
}

/// A service that waits for a token before each request.
pub struct TokenBucket<S> {
    inner: S,
    bucket: Arc<Mutex<Bucket>>,
    has_token: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for TokenBucket<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_take(Instant::now());
            match taken {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_negotiated_resources_served_in_the_newer_version_are_rewritten() {
        let v = ServedVersions::new();
        let path = "/apis/apps.kruise.io/v1alpha1/nodeimages/node-a/status";
        assert_eq!(v.rewrite_path(path), None, "nothing known yet");
        *v.newer.lock().unwrap() = vec!["nodeimages".into()];
        assert_eq!(
            v.rewrite_path(path).as_deref(),
            Some("/apis/apps.kruise.io/v1beta1/nodeimages/node-a/status")
        );
        assert_eq!(
            v.rewrite_path("/apis/apps.kruise.io/v1alpha1/nodeimages")
                .as_deref(),
            Some("/apis/apps.kruise.io/v1beta1/nodeimages")
        );
        assert_eq!(
            v.rewrite_path("/apis/apps.kruise.io/v1alpha1/nodepodprobes/node-a"),
            None
        );
        let crr = "/apis/apps.kruise.io/v1alpha1/namespaces/ns/containerrecreaterequests/r/status";
        assert_eq!(v.rewrite_path(crr), None);
        v.newer
            .lock()
            .unwrap()
            .push("containerrecreaterequests".into());
        assert_eq!(
            v.rewrite_path(crr).as_deref(),
            Some("/apis/apps.kruise.io/v1beta1/namespaces/ns/containerrecreaterequests/r/status"),
            "CRRs are namespaced: the resource comes after the namespace"
        );
        assert_eq!(v.rewrite_path("/api/v1/pods"), None);
    }

    #[test]
    fn bucket_allows_a_burst_then_the_sustained_rate() {
        let start = Instant::now();
        let mut b = Bucket {
            tokens: 3.0,
            capacity: 3.0,
            rate: 10.0,
            last: start,
        };
        for _ in 0..3 {
            assert_eq!(b.try_take(start), Ok(()));
        }
        let wait = b.try_take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.try_take(start + Duration::from_millis(100)), Ok(()));
        // a long idle refills to the burst, not beyond
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.try_take(later), Ok(()));
        }
        assert!(b.try_take(later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_tokens() {
        use tower::ServiceExt;
        let layer = TokenBucketLayer::new(2.0, 2);
        let svc = layer.layer(tower::service_fn(|_: ()| async {
            Ok::<_, ()>(Instant::now())
        }));
        let start = Instant::now();
        let mut svc = svc;
        let mut times = Vec::new();
        for _ in 0..4 {
            let t = svc.ready().await.unwrap().call(()).await.unwrap();
            times.push(t.duration_since(start));
        }
        assert_eq!(times[0], Duration::ZERO);
        assert_eq!(times[1], Duration::ZERO);
        assert_eq!(times[2], Duration::from_millis(500));
        assert_eq!(times[3], Duration::from_millis(1000));
    }
}
