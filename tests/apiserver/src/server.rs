//! Starting and stopping the server: [`Config`], [`ApiServer`], [`Handle`],
//! the accept loop and the state shared by every connection.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::auth::{AuthState, DEFAULT_TOKEN, UserInfo};
use crate::control::{Control, Faults, RequestLog};
use crate::hold::Holds;
use crate::kinds::{KindInfo, Kinds, default_kinds};
use crate::listen::{Serving, Tls};
use crate::ops::{self, Origin};
use crate::store::{State, Store};

/// Server settings. `Config::default()` serves the default kinds on `127.0.0.1:0`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to bind; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Served kinds; push more to extend.
    pub kinds: Vec<KindInfo>,
    /// Period of BOOKMARK events on watches that allow them (a minute, like
    /// the real watch cache; each is sent only if the RV moved).
    pub bookmark_interval: Duration,
    /// HTTP creates in a missing namespace answer 404 (real behaviour); the
    /// control API creates the namespace instead.
    pub require_namespaces: bool,
    /// Namespaces that exist at start (like a fresh cluster).
    pub initial_namespaces: Vec<String>,
    /// Events retained for watch replay; older ones are compacted away.
    pub history_limit: usize,
    /// How long a LIST/WATCH with a resourceVersion newer than the store waits
    /// before answering `504 Timeout` ("Too large resource version").
    pub too_large_rv_wait: Duration,
    /// `gitVersion` reported by `/version`.
    pub git_version: String,
    /// Bearer tokens and who each is ([`UserInfo::service_account`], [`UserInfo::admin`]):
    /// with `Some`, authentication is on: a request with another bearer token gets `401`, one
    /// without credentials is `system:anonymous`, and each request's user is recorded.
    /// `None` (the default): any token or none is accepted and no user is recorded.
    pub tokens: Option<BTreeMap<String, UserInfo>>,
    /// Authorize every request with RBAC over the ClusterRoles, ClusterRoleBindings, Roles and
    /// RoleBindings in the store (load them with [`Control::apply_manifests`] or create them
    /// through the API), answering `403` as the real server does. The real server's default
    /// discovery roles are created at start. Off by default. Without [`Config::tokens`] every
    /// request is `system:anonymous`.
    pub rbac: bool,
    /// How long a watch lasts against the `timeoutSeconds` it asked for: it ends after
    /// `timeoutSeconds × watch_timeout_scale` (1.0, the real server's, by default). Below 1 a
    /// short real window stands for a long one (a test of renewals at rest: 0.01 makes a
    /// 10-minute watch end after 6 s); above 1 a watch outlives its timeout, as behind a dead
    /// connection. Not a positive finite number: 1.0.
    pub watch_timeout_scale: f64,
    /// Serve TLS instead of plain HTTP, with HTTP/2 and HTTP/1.1 as kube-apiserver does
    /// ([`Tls::test_ca`]): [`Handle::url`] is then `https://…` and [`Handle::kubeconfig`]
    /// carries the CA. `None` (the default): plain HTTP/1.1.
    pub tls: Option<Tls>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            kinds: default_kinds(),
            bookmark_interval: Duration::from_secs(60),
            require_namespaces: true,
            initial_namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            history_limit: 100_000,
            too_large_rv_wait: Duration::from_secs(3),
            git_version: "v1.36.2".to_string(),
            tokens: None,
            rbac: false,
            watch_timeout_scale: 1.0,
            tls: None,
        }
    }
}

/// State shared by the accept loop, every request and the control API.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub kinds: Arc<Kinds>,
    pub config: Config,
    pub addr: SocketAddr,
    pub faults: Mutex<Faults>,
    pub requests: Mutex<RequestLog>,
    pub requests_tx: watch::Sender<u64>,
    pub drop_tx: watch::Sender<u64>,
    pub shutdown_rx: watch::Receiver<bool>,
    pub open_watches: Arc<AtomicUsize>,
    pub auth: RwLock<AuthState>,
    pub holds: Mutex<Holds>,
    /// The accept loop's commands (stop and start serving) and open connections.
    pub serving: Serving,
}

/// Entry point: `ApiServer::start(addr)` or `ApiServer::start_with(config)`.
pub struct ApiServer;

impl ApiServer {
    /// Serve the default kinds on `addr` (use `127.0.0.1:0` for a free port).
    pub async fn start(addr: SocketAddr) -> io::Result<Handle> {
        ApiServer::start_with(Config {
            addr,
            ..Config::default()
        })
        .await
    }

    /// Serve with explicit settings.
    pub async fn start_with(config: Config) -> io::Result<Handle> {
        // bad TLS settings fail the start
        let tls = config.tls.as_ref().map(Tls::acceptor).transpose()?;
        let listener = TcpListener::bind(config.addr).await?;
        let addr = listener.local_addr()?;
        let kinds = Arc::new(Kinds::new(config.kinds.clone()));
        let mut state = State::new(
            kinds.clone(),
            config.history_limit,
            config.require_namespaces,
        );
        if let Some(ns_idx) = kinds.find("", "v1", "namespaces") {
            for ns in &config.initial_namespaces {
                let namespace = json!({"metadata": {"name": ns}});
                ops::create(&mut state, ns_idx, None, namespace, Origin::Control, false)
                    .map_err(|e| io::Error::other(e.to_string()))?;
            }
        }
        if config.rbac {
            crate::rbac::bootstrap(&mut state).map_err(|e| io::Error::other(e.to_string()))?;
        }
        let auth = RwLock::new(AuthState {
            tokens: config.tokens.clone(),
            rbac: config.rbac,
        });
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            store: Arc::new(Store::new(state)),
            kinds,
            config,
            addr,
            faults: Mutex::new(Faults::default()),
            requests: Mutex::new(RequestLog::default()),
            requests_tx: watch::channel(0).0,
            drop_tx: watch::channel(0).0,
            shutdown_rx,
            open_watches: Arc::new(AtomicUsize::new(0)),
            auth,
            holds: Mutex::new(Holds::default()),
            serving: Serving {
                commands: commands_tx,
                open: Arc::new(AtomicUsize::new(0)),
            },
        });
        let task = tokio::spawn(crate::listen::accept_loop(
            listener,
            shared.clone(),
            tls,
            commands,
        ));
        tracing::info!(%addr, "apiserver double listening");
        Ok(Handle {
            control: Control { shared },
            shutdown_tx,
            task: Some(task),
        })
    }
}

/// A running server. Dropping it (or [`Handle::shutdown`]) stops the server and
/// closes every connection. Derefs to [`Control`] for the test control API.
pub struct Handle {
    control: Control,
    shutdown_tx: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Handle {
    /// `http://127.0.0.1:PORT`, or `https://…` with [`Config::tls`].
    pub fn url(&self) -> String {
        let scheme = match self.control.shared.config.tls {
            Some(_) => "https",
            None => "http",
        };
        format!("{scheme}://{}", self.control.shared.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.control.shared.addr
    }

    /// A cloneable control handle that stays usable while the server runs.
    pub fn control(&self) -> Control {
        self.control.clone()
    }

    /// A kubeconfig (YAML) whose current context points at this server with a
    /// dummy bearer token and namespace `default` (and, with [`Config::tls`], its CA).
    pub fn kubeconfig(&self) -> String {
        match &self.control.shared.config.tls {
            Some(tls) => kubeconfig_with_ca(&self.url(), DEFAULT_TOKEN, &tls.ca_pem),
            None => kubeconfig_for(&self.url()),
        }
    }

    /// Write [`Handle::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// Stop serving and wait until every connection is closed.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown_tx.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl std::ops::Deref for Handle {
    type Target = Control;

    fn deref(&self) -> &Control {
        &self.control
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown_tx.send(true);
    }
}

/// A kubeconfig for a plain-HTTP server at `url`, with the default token
/// ([`DEFAULT_TOKEN`](crate::DEFAULT_TOKEN)).
pub fn kubeconfig_for(url: &str) -> String {
    kubeconfig_with_token(url, DEFAULT_TOKEN)
}

/// A kubeconfig for a plain-HTTP server at `url` whose user sends `token` (one of
/// [`Config::tokens`] when authentication is on).
pub fn kubeconfig_with_token(url: &str, token: &str) -> String {
    kubeconfig_yaml(url, token, "")
}

/// A kubeconfig for a TLS server at `url` (the double with [`Config::tls`], or anything that
/// forwards to it, such as a relay on another port: the test certificate names `127.0.0.1`,
/// `localhost` and `apiserver.test`), trusting `ca_pem` ([`TEST_CA_PEM`](crate::TEST_CA_PEM)),
/// whose user sends `token`.
pub fn kubeconfig_with_ca(url: &str, token: &str, ca_pem: &str) -> String {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    kubeconfig_yaml(
        url,
        token,
        &format!("\n    certificate-authority-data: {data}"),
    )
}

fn kubeconfig_yaml(url: &str, token: &str, cluster_extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: apiserver-double
  cluster:
    server: {url}{cluster_extra}
contexts:
- name: apiserver-double
  context:
    cluster: apiserver-double
    user: apiserver-double
    namespace: default
current-context: apiserver-double
users:
- name: apiserver-double
  user:
    token: {token}
preferences: {{}}
"
    )
}
