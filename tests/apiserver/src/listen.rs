//! Listening and serving connections: plain HTTP/1.1 (the default), or TLS with ALPN `h2` and
//! `http/1.1` and both protocols served as kube-apiserver serves them ([`Config::tls`],
//! [`Tls`]); and the outage a test can cause on demand: [`Control::stop_serving`] closes every
//! connection and the listening socket (new connections are refused), and
//! [`Control::start_serving`] listens again on the same address, the store kept as it was.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::control::Control;
use crate::server::Shared;
use crate::watch::OpenGuard;

/// The test CA that signed [`Tls::test_ca`]'s certificate (PEM), for a kubeconfig's
/// `certificate-authority-data`: kruised's `tests/fixtures/tls/ca.pem`.
pub const TEST_CA_PEM: &str = include_str!("../../fixtures/tls/ca.pem");
const TEST_SERVER_PEM: &str = include_str!("../../fixtures/tls/server.pem");
const TEST_SERVER_KEY_PEM: &str = include_str!("../../fixtures/tls/server-key.pem");

/// How long [`Control::start_serving`] keeps trying to bind the address again while something
/// else holds it (a connection of another process that took the port as its own meanwhile).
const REBIND_FOR: Duration = Duration::from_secs(10);

/// TLS settings of the server ([`Config::tls`](crate::Config::tls)).
#[derive(Clone, Debug)]
pub struct Tls {
    /// The server's certificate chain, PEM.
    pub cert_chain_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The CA a client must trust (put in [`Handle::kubeconfig`](crate::Handle::kubeconfig)).
    pub ca_pem: String,
    /// The protocols offered by ALPN, preferred first.
    pub alpn: Vec<Vec<u8>>,
}

impl Tls {
    /// The test certificate in `tests/fixtures/tls/` (for `127.0.0.1`, `localhost` and
    /// `apiserver.test`, signed by [`TEST_CA_PEM`]), offering `h2` then `http/1.1` as
    /// kube-apiserver does.
    pub fn test_ca() -> Tls {
        Tls {
            cert_chain_pem: TEST_SERVER_PEM.to_string(),
            key_pem: TEST_SERVER_KEY_PEM.to_string(),
            ca_pem: TEST_CA_PEM.to_string(),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }

    /// [`Tls::test_ca`] offering `http/1.1` alone: a server (or a TLS front) without HTTP/2.
    pub fn test_ca_http1_only() -> Tls {
        Tls {
            alpn: vec![b"http/1.1".to_vec()],
            ..Tls::test_ca()
        }
    }

    /// A TLS acceptor with this certificate and these protocols (a test's own TLS front too).
    pub fn acceptor(&self) -> io::Result<tokio_rustls::TlsAcceptor> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{what}: {e}"))
        };
        let certs = CertificateDer::pem_slice_iter(self.cert_chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("the TLS certificate", &e))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| bad("the TLS key", &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("TLS versions", &e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad("the TLS certificate and key", &e))?;
        config.alpn_protocols = self.alpn.clone();
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }
}

/// What the test asks of the accept loop.
pub(crate) enum ServeCommand {
    /// Close the listener and every connection; answer when done.
    Stop(oneshot::Sender<()>),
    /// Listen again on the same address; answer whether it could.
    Start(oneshot::Sender<io::Result<()>>),
}

/// The accept loop's side of [`ServeCommand`]s and its count of open connections.
pub(crate) struct Serving {
    pub commands: mpsc::UnboundedSender<ServeCommand>,
    pub open: Arc<AtomicUsize>,
}

/// Accepts connections on `listener` until shutdown, and obeys `commands`.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut commands: mpsc::UnboundedReceiver<ServeCommand>,
) {
    let mut shutdown = shared.shutdown_rx.clone();
    let mut listener = Some(listener);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            Some(command) = commands.recv() => match command {
                ServeCommand::Stop(done) => {
                    // closed first, so that nothing connects while the connections close
                    listener = None;
                    conns.shutdown().await;
                    tracing::info!(addr = %shared.addr, "apiserver double stopped serving");
                    let _ = done.send(());
                }
                ServeCommand::Start(done) => {
                    if listener.is_none() {
                        match rebind(shared.addr).await {
                            Ok(l) => listener = Some(l),
                            Err(e) => {
                                let _ = done.send(Err(e));
                                continue;
                            }
                        }
                        tracing::info!(addr = %shared.addr, "apiserver double serving again");
                    }
                    let _ = done.send(Ok(()));
                }
            },
            accepted = accept(listener.as_ref()) => match accepted {
                Ok((stream, _)) => {
                    // as Go's net package does on every TCP connection, so kube-apiserver too:
                    // with Nagle on, a watch event written while the previous one is not yet
                    // acknowledged waits for the client's delayed ACK (up to 40 ms)
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY refused");
                    }
                    let counted = OpenGuard::new(shared.serving.open.clone());
                    conns.spawn(serve(stream, shared.clone(), tls.clone(), counted));
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Binds `addr` again; while the port is taken, tries again for [`REBIND_FOR`].
async fn rebind(addr: SocketAddr) -> io::Result<TcpListener> {
    let until = tokio::time::Instant::now() + REBIND_FOR;
    loop {
        match TcpListener::bind(addr).await {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse && tokio::time::Instant::now() < until =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// One connection: HTTP/1.1 on plain TCP (as always), or TLS and then HTTP/1.1 or HTTP/2.
async fn serve(
    stream: TcpStream,
    shared: Arc<Shared>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    _open: OpenGuard,
) {
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(crate::http::handle(shared, req).await) }
    });
    let served = match tls {
        None => http1::Builder::new()
            .serve_connection(TokioIo::new(stream), svc)
            .await
            .map_err(|e| e.to_string()),
        Some(acceptor) => match acceptor.accept(stream).await {
            // both protocols, whatever ALPN chose: hyper tells them apart by the preface
            Ok(tls) => auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("TLS handshake: {e}")),
        },
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

// === impl Control: the outage ===

impl Control {
    /// Stops serving, as a stopped kube-apiserver: closes the listening socket (a new
    /// connection is refused) and every open connection (each watch and request on it ends),
    /// and returns once they are closed. The store, faults and request log stay; the control
    /// API keeps working (changes made now are what the server holds when it serves again).
    /// In-process only: over `/_double/` it would cut its own connection.
    pub async fn stop_serving(&self) {
        let (done, stopped) = oneshot::channel();
        let commands = &self.shared.serving.commands;
        if commands.send(ServeCommand::Stop(done)).is_ok() {
            let _ = stopped.await;
        }
    }

    /// Serves again on the same address after [`Control::stop_serving`] (nothing to do if it
    /// serves). Fails when the address cannot be bound again within 10 s, or the server was
    /// shut down.
    pub async fn start_serving(&self) -> io::Result<()> {
        let (done, started) = oneshot::channel();
        let gone = || io::Error::other("the server was shut down");
        let commands = &self.shared.serving.commands;
        commands
            .send(ServeCommand::Start(done))
            .map_err(|_| gone())?;
        started.await.map_err(|_| gone())?
    }

    /// Connections open now (HTTP/2 carries every request of a client on one).
    pub fn open_connections(&self) -> usize {
        self.shared.serving.open.load(Ordering::SeqCst)
    }
}
