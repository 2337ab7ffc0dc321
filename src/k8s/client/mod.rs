//! The Kubernetes API client: kubeconfig or in-cluster config, User-Agent `kruised/<version>`,
//! a client-side token bucket (kruise-daemon's QPS/burst) in front of every request, the
//! version negotiation of kruise's resources ([`ServedVersions`]), proxies as client-go takes
//! them ([`proxy`]), kruised's own connector ([`connect`]: HTTP/2 with pings to https
//! servers), a time limit on every call but watches ([`limit`]) and client-go's request metrics
//! ([`metrics`]).

pub mod auth;
pub mod bucket;
pub mod connect;
pub mod kubeconfig;
pub mod limit;
pub mod metrics;
pub mod proxy;
pub mod tls;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use http::{HeaderValue, Request, header::USER_AGENT};
use kube::client::retry::RetryPolicy;
use kube::client::{ClientBuilder, ConfigExt};

pub use auth::AuthError;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

pub use kubeconfig::KubeconfigReadError;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

pub use bucket::{TokenBucket, TokenBucketLayer};
pub use limit::{CALL_TIMEOUT, CallLimitLayer, CallTimedOut};
pub use metrics::RestClientMetrics;

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

/// The client cannot be configured (no kubeconfig, unreadable file, bad TLS data, a proxy it
/// cannot use).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: KubeconfigReadError,
    },
    /// No configuration was found anywhere.
    #[error(
        "no Kubernetes configuration (set --kubeconfig or KUBECONFIG, or run in a pod): \
         kubeconfig: {kubeconfig}; in-cluster: {in_cluster}"
    )]
    Infer {
        /// Why no kubeconfig could be used.
        kubeconfig: KubeconfigReadError,
        /// Why the in-cluster configuration could not be used.
        in_cluster: kube::config::InClusterError,
    },
    /// The proxy setting (kubeconfig or environment) cannot be used.
    #[error(transparent)]
    Proxy(proxy::ProxyError),
    /// The transport (TLS, proxy credentials) could not be built.
    #[error(transparent)]
    Transport(connect::TransportError),
    /// The client stack could not be built.
    #[error("building the Kubernetes client")]
    Build(#[source] kube::Error),
    /// The kubeconfig's user cannot authenticate (a token file that cannot be read, an exec
    /// plugin that fails).
    #[error("the kubeconfig's user")]
    Auth(#[source] AuthError),
}

impl From<connect::TransportError> for ClientError {
    fn from(e: connect::TransportError) -> Self {
        ClientError::Transport(e)
    }
}

/// Builds the client, its requests counted nowhere, each call but a watch limited to
/// [`CALL_TIMEOUT`] (see [`build_with_metrics`]). Does no I/O against the API server: an
/// unreachable server shows up later, in the watches, which retry with backoff.
pub async fn build(settings: &ClientSettings) -> Result<kube::Client, ClientError> {
    build_with_metrics(settings, &RestClientMetrics::default(), CALL_TIMEOUT).await
}

/// Builds the client, counting its requests into `metrics`, each call but a watch limited to
/// `call_limit`.
///
/// The stack, outermost first: User-Agent, the served-version rewrite, the token bucket, the
/// call limit ([`limit`]), then kube's public layers as its own builder composes them (base
/// URI, retry of 429/503/504), the authentication of [`auth`] (in kube's place: exec plugins
/// and token refresh), kube's extra headers (impersonation), the request metrics, and the
/// transport of [`connect::transport`] (proxy, TLS of [`tls`] with HTTP/2, kruised's TCP
/// connector).
pub async fn build_with_metrics(
    settings: &ClientSettings,
    metrics: &RestClientMetrics,
    call_limit: std::time::Duration,
) -> Result<kube::Client, ClientError> {
    let (config, kubeconfig_proxy) = load_config(settings).await?;
    let proxy = proxy::choose(
        &config.cluster_url,
        kubeconfig_proxy.as_deref(),
        &proxy::ProxyEnv::from_process(),
    )
    .map_err(ClientError::Proxy)?;
    match &proxy {
        Some(p) => tracing::info!(
            proxy = %connect::redacted(&p.url),
            from = %p.origin,
            server = %config.cluster_url,
            "API requests go through a proxy"
        ),
        None => tracing::debug!(server = %config.cluster_url, "API requests go direct"),
    }
    let auth = auth::resolve(&config.auth_info)
        .await
        .map_err(ClientError::Auth)?;
    let transport = connect::transport(&config, auth.identity, proxy.as_ref())?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(auth.layer)
        .layer(config.extra_headers_layer().map_err(ClientError::Build)?)
        .layer(metrics.layer())
        .service(transport);
    let user_agent = HeaderValue::from_static(concat!("kruised/", env!("CARGO_PKG_VERSION")));
    let versions = settings.versions.clone();
    Ok(
        ClientBuilder::new(service, config.default_namespace.clone())
            .with_layer(&CallLimitLayer::new(call_limit))
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
            .build(),
    )
}

/// The configuration, and the kubeconfig cluster's `proxy-url` (which kube merges with
/// `HTTPS_PROXY` into `Config::proxy_url`, so it is read from the kubeconfig itself: client-go
/// uses it for every request, the environment only with its rules).
///
/// `--kubeconfig`: that file. Else as `kube::Config::infer`: `KUBECONFIG` or `~/.kube/config`,
/// else the in-cluster configuration (which has no proxy-url).
async fn load_config(
    settings: &ClientSettings,
) -> Result<(kube::Config, Option<String>), ClientError> {
    let options = KubeConfigOptions::default();
    let configured = |kubeconfig: Kubeconfig| async {
        let proxy = kubeconfig_proxy_url(&kubeconfig);
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok::<_, KubeconfigError>((config, proxy))
    };
    match &settings.kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            };
            let kubeconfig = kubeconfig::read_from(path).map_err(err)?;
            configured(kubeconfig)
                .await
                .map_err(|e| err(KubeconfigReadError::Use(e)))
        }
        None => {
            let kubeconfig = match kubeconfig::read_default() {
                Ok(kubeconfig) => configured(kubeconfig)
                    .await
                    .map_err(KubeconfigReadError::Use),
                Err(e) => Err(e),
            };
            let kubeconfig = match kubeconfig {
                Ok((mut config, proxy)) => {
                    config.apply_debug_overrides();
                    return Ok((config, proxy));
                }
                Err(e) => e,
            };
            // in-cluster (which has no proxy-url), as `kube::Config::infer`
            let mut config =
                kube::Config::incluster().map_err(|in_cluster| ClientError::Infer {
                    kubeconfig,
                    in_cluster,
                })?;
            config.apply_debug_overrides();
            Ok((config, None))
        }
    }
}

/// The `proxy-url` of the current context's cluster.
fn kubeconfig_proxy_url(kubeconfig: &Kubeconfig) -> Option<String> {
    let context_name = kubeconfig.current_context.as_ref()?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| &c.name == context_name)?
        .context
        .as_ref()?;
    kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)?
        .cluster
        .as_ref()?
        .proxy_url
        .clone()
        .filter(|u| !u.is_empty())
}

/// `o`, an object read through an untyped call (`Api<DynamicObject>`), as a `T`: through a
/// `serde_json::Value`, the one reader the watch also uses, so that `T`'s deserialiser is in the
/// binary once (issue 44; `k8s::pods`). An object that cannot be read as a `T` is an error, as a
/// typed call's would be.
pub fn from_dynamic<T: serde::de::DeserializeOwned>(
    o: kube::api::DynamicObject,
) -> Result<T, kube::Error> {
    serde_json::to_value(o)
        .and_then(serde_json::from_value)
        .map_err(kube::Error::SerdeError)
}

/// Sends `request` and reads nothing of the answer but whether it is an error (the API
/// server's, as a typed call's). kube's typed calls read the object written back into its type:
/// for an answer no caller reads, that would put the type's deserialiser from response text into
/// the binary beside the one the watch uses (issue 44; `k8s::pods`).
pub async fn send_unread(
    client: &kube::Client,
    request: Result<Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<(), kube::Error> {
    let request = request.map_err(kube::Error::BuildRequest)?;
    client
        .request::<serde::de::IgnoredAny>(request)
        .await
        .map(drop)
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
}
