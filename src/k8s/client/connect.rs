//! The API client's transport, built from public pieces instead of kube's default builder:
//! kruised's own TCP connector (keepalive probes that find a dead peer in about a minute,
//! `TCP_USER_TIMEOUT`, a connect timeout), the proxy hop as client-go takes it (`CONNECT` or
//! absolute-form through an HTTP(S) proxy, SOCKS5), TLS from the kubeconfig as kube builds it
//! with ALPN `h2` then `http/1.1`, and hyper's pooled client over them: HTTP/2 with pings where
//! an https server agrees to it (one connection for every request, a silent one found within
//! [`H2_DEAD_AFTER`]), HTTP/1.1 elsewhere.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::PROXY_AUTHORIZATION;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::proxy::{SocksV5, Tunnel};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::Body;
use tower::util::{BoxCloneService, BoxCloneSyncService};
use tower::{BoxError, Service, ServiceExt};

use super::proxy::{Proxy, ProxyScheme};
use super::tls::{self, Roots, TlsError};

/// Idle time before the first keepalive probe (kube-apiserver's own connections use 15 s, Go's
/// dialer 15 s; 30 s keeps an idle watch cheap).
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes before the kernel drops the connection: idle + 3 × interval, a minute.
pub const KEEPALIVE_PROBES: u32 = 3;
/// How long sent data may stay unacknowledged before the kernel drops the connection
/// (`TCP_USER_TIMEOUT`, Linux): the same minute as the probes, so a server that vanished while
/// a request was being written is found as soon as one that vanished while idle.
pub const USER_TIMEOUT: Duration =
    Duration::from_secs(KEEPALIVE_IDLE.as_secs() + KEEPALIVE_INTERVAL.as_secs() * 3);

/// How long an HTTP/2 connection may go without receiving a frame before kruised pings the
/// server (client-go's `ReadIdleTimeout` is 30 s). Pings are sent only when nothing was read
/// for this long, idle connections included: one 17-byte PING and its ACK per 15 s on a quiet
/// connection.
pub const H2_PING_INTERVAL: Duration = Duration::from_secs(15);
/// How long a ping may go unanswered before the connection is closed and every request on it
/// fails (client-go's `PingTimeout` is 15 s). A live kube-apiserver answers a PING from its
/// read loop, before any handler runs: 10 s allows for a loaded server, a GC pause and a slow
/// link, and is still far below the minute keepalive needs.
pub const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an HTTP/2 connection that receives nothing stays in use: a ping is sent
/// [`H2_PING_INTERVAL`] after the last frame read and its answer awaited [`H2_PING_TIMEOUT`].
/// Where the peer still acknowledges TCP (a relay or load balancer that forgot the server),
/// keepalive and `TCP_USER_TIMEOUT` never fire, and this is what finds the connection dead
/// (client-go: about 45 s, kubernetes #48638).
pub const H2_DEAD_AFTER: Duration =
    Duration::from_secs(H2_PING_INTERVAL.as_secs() + H2_PING_TIMEOUT.as_secs());
/// The longest `timeoutSeconds` a watch of kruised asks for (`k8s::watch`): the server ends a
/// healthy watch by then.
pub const LONGEST_WATCH: Duration = Duration::from_secs(15 * 60);
/// The read limit of an HTTP/1.1 connection (an `http://` server, or an https one that does
/// not speak HTTP/2): a connection that delivers no byte for this long is closed. It bounds
/// what pings bound on HTTP/2, so it must outlast the quietest healthy watch, which may
/// receive nothing until the server ends it after [`LONGEST_WATCH`]; a minute more covers the
/// server's own lateness. HTTP/2 connections have no read limit: their pings say whether the
/// server is there. (kube 5 sets no read limit at all; its watcher gives up on a watch that
/// delivered nothing for its `timeoutSeconds` + 5 s.)
pub const HTTP1_READ_TIMEOUT: Duration = Duration::from_secs(LONGEST_WATCH.as_secs() + 60);

/// The hyper client under the tower stack, whichever route it takes.
pub type Transport = BoxCloneService<Request<Body>, Response<Incoming>, BoxError>;

/// The transport cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// An https peer the kubeconfig gives no CA for, on a system without CA certificates.
    #[error(
        "{peer} is reached over https and the kubeconfig gives no certificate-authority for it, \
         so its certificate must be checked against the system's CA certificates, and none were \
         found ({reason}); give the cluster certificate-authority or certificate-authority-data, \
         or install the system's CA certificates (SSL_CERT_FILE or SSL_CERT_DIR name others)"
    )]
    NoSystemRoots {
        /// What was to be reached: the API server or the proxy, with its URL.
        peer: String,
        /// Why none was found: the first error of reading the system's bundle, if any.
        reason: String,
    },
    /// The TLS settings (client certificate, key, CA data) cannot be used.
    #[error("TLS settings of the kubeconfig")]
    Tls(#[source] TlsError),
    /// The proxy's user info makes no valid header.
    #[error("the proxy's user info cannot be sent")]
    ProxyCredentials(#[source] http::header::InvalidHeaderValue),
}

/// kruised's TCP connector: keepalive ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`],
/// [`KEEPALIVE_PROBES`]), [`USER_TIMEOUT`] where Linux has it, `TCP_NODELAY` (as Go sets on every
/// TCP connection), and `connect_timeout` for the TCP handshake.
pub fn tcp_connector(connect_timeout: Option<Duration>) -> HttpConnector {
    let mut c = HttpConnector::new();
    c.enforce_http(false);
    c.set_nodelay(true);
    c.set_connect_timeout(connect_timeout);
    c.set_keepalive(Some(KEEPALIVE_IDLE));
    c.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    c.set_keepalive_retries(Some(KEEPALIVE_PROBES));
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    c.set_tcp_user_timeout(Some(USER_TIMEOUT));
    c
}

/// The transport to `config.cluster_url`, through `proxy` if given.
///
/// | server | proxy | route |
/// |---|---|---|
/// | http | none | TCP |
/// | https | none | TCP, TLS |
/// | http | http(s) | TCP (+ TLS to the proxy), absolute-form requests |
/// | https | http(s) | TCP (+ TLS to the proxy), `CONNECT`, TLS |
/// | any | socks5 | TCP, SOCKS5 handshake (+ TLS) |
///
/// TLS is only set up where a hop is https: an http server needs no CA certificates at all.
///
/// `identity` is the client key and certificate (PEM) an exec plugin answered with; else the
/// kubeconfig's are used, if it has them.
pub fn transport(
    config: &kube::Config,
    identity: Option<Vec<u8>>,
    proxy: Option<&Proxy>,
) -> Result<Transport, TransportError> {
    let identity = match identity {
        Some(pem) => Some(pem),
        None => tls::identity_of(&config.auth_info).map_err(TransportError::Tls)?,
    };
    let config = &Settings {
        config,
        identity: identity.as_deref(),
    };
    let tcp = tcp_connector(config.connect_timeout);
    let https = config.cluster_url.scheme_str() == Some("https");
    let Some(proxy) = proxy else {
        return if https {
            Ok(hyper_client(cluster_tls(config, tcp)?, config))
        } else {
            Ok(hyper_client(tcp, config))
        };
    };
    let dial = proxy_dial_uri(proxy);
    let basic = proxy
        .credentials()
        .map(|(user, pass)| basic_auth(&user, &pass))
        .transpose()?;
    match (proxy.scheme, https) {
        (ProxyScheme::Socks5, _) => {
            let mut socks = SocksV5::new(dial, tcp);
            if let Some((user, pass)) = proxy.credentials() {
                socks = socks.with_auth(user, pass);
            }
            // hyper-util's SOCKS5 connector takes a URI without a port as :443
            let socks = socks.map_request(with_explicit_port as fn(Uri) -> Uri);
            if https {
                Ok(hyper_client(cluster_tls(config, socks)?, config))
            } else {
                Ok(hyper_client(socks, config))
            }
        }
        (ProxyScheme::Http, true) => {
            let tunnel = with_tunnel_auth(Tunnel::new(dial, tcp), basic);
            Ok(hyper_client(cluster_tls(config, tunnel)?, config))
        }
        (ProxyScheme::Https, true) => {
            let tunnel = with_tunnel_auth(Tunnel::new(dial, proxy_tls(config, proxy, tcp)?), basic);
            Ok(hyper_client(cluster_tls(config, tunnel)?, config))
        }
        (ProxyScheme::Http, false) => Ok(with_proxy_auth(forwarded(tcp, dial, config), basic)),
        (ProxyScheme::Https, false) => {
            let inner = proxy_tls(config, proxy, tcp)?;
            Ok(with_proxy_auth(forwarded(inner, dial, config), basic))
        }
    }
}

/// hyper's pooled client over `connector`, whichever route it is ([`pooled`]).
fn hyper_client<C>(connector: C, config: &Settings<'_>) -> Transport
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Read + Write + Connection + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    let client = pooled(any(connector), config.connect_timeout, config.write_timeout);
    BoxCloneService::new(client)
}

/// hyper's pooled client through the forwarding proxy at `proxy`, reached over `inner`'s
/// connections ([`Forward`]).
fn forwarded<C>(inner: C, proxy: Uri, config: &Settings<'_>) -> Transport
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Read + Write + Connection + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    let forward = Forward { inner, proxy }.map_err(Into::into);
    let client = pooled(
        BoxCloneSyncService::new(forward),
        config.connect_timeout,
        config.write_timeout,
    );
    BoxCloneService::new(client)
}

/// A connector of any route, its connections as [`AnyIo`].
pub type AnyConnector = BoxCloneSyncService<Uri, AnyIo, BoxError>;

/// `connector`, its connections as [`AnyIo`].
pub fn any<C>(connector: C) -> AnyConnector
where
    C: Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: Read + Write + Connection + Send + Unpin + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    let connector = connector
        .map_response(|io| AnyIo::new(io, false))
        .map_err(Into::into);
    BoxCloneSyncService::new(connector)
}

/// hyper's pooled client, shareable between threads.
pub type Pooled = BoxCloneSyncService<Request<Body>, Response<Incoming>, BoxError>;

/// hyper's pooled client over `connector`: HTTP/2 where TLS negotiated it (one connection
/// shared by every request, pinged after [`H2_PING_INTERVAL`] without a frame, closed after
/// [`H2_PING_TIMEOUT`] without an answer, idle or not), else HTTP/1.1 with a read limit of
/// [`HTTP1_READ_TIMEOUT`]; `connect_timeout` and `write_timeout` on both. The API client's and
/// the registry reader's (`controller::imagepull::registry`).
///
/// Not generic: hyper's client, its pool, its HTTP/1.1 and HTTP/2 connections (h2) and the
/// timeouts are compiled once, where one copy for each connection type (TCP, TLS, SOCKS5, a
/// tunnel, TLS in a tunnel to an https proxy, ...) cost the shipped binary 0.5 MB (issue 44);
/// the price is one indirect call for each read and write.
pub fn pooled(
    connector: AnyConnector,
    connect_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
) -> Pooled {
    let mut connector = TimeoutConnector::new(connector);
    connector.set_connect_timeout(connect_timeout);
    connector.set_read_timeout(Some(HTTP1_READ_TIMEOUT));
    connector.set_write_timeout(write_timeout);
    // the read limit counts from the request, not from when a pooled connection went idle
    connector.set_reset_reader_on_write(true);
    // an HTTP/2 connection is known once TLS is done: its pings are its liveness, and a read
    // limit would close a connection whose watches are all quiet
    let connector = connector.map_response(|mut io| {
        let limit = read_limit(&io.connected());
        io.as_mut().set_read_timeout_pinned(limit);
        io
    });
    let mut builder = hyper_util::client::legacy::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(H2_PING_INTERVAL)
        .http2_keep_alive_timeout(H2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true);
    let client = builder.build::<_, Body>(connector);
    BoxCloneSyncService::new(client.map_err(BoxError::from))
}

/// A connection of any route, behind one type ([`pooled`]); `proxied` when it goes to a
/// forwarding proxy ([`Forward`]).
pub struct AnyIo {
    io: Pin<Box<dyn Io>>,
    proxied: bool,
}

impl AnyIo {
    fn new(io: impl Io + 'static, proxied: bool) -> AnyIo {
        AnyIo {
            io: Box::pin(io),
            proxied,
        }
    }
}

/// What hyper's client needs of a connection.
trait Io: Read + Write + Connection + Send {}

impl<T: Read + Write + Connection + Send> Io for T {}

impl Read for AnyIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl Write for AnyIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write_vectored(cx, bufs)
    }
}

impl Connection for AnyIo {
    fn connected(&self) -> Connected {
        let connected = self.io.connected();
        if self.proxied {
            connected.proxy(true)
        } else {
            connected
        }
    }
}

/// The read limit of a connection: none over HTTP/2, whose pings say whether the server is
/// there; [`HTTP1_READ_TIMEOUT`] over HTTP/1.1.
fn read_limit(connected: &Connected) -> Option<Duration> {
    (!connected.is_negotiated_h2()).then_some(HTTP1_READ_TIMEOUT)
}

/// The kubeconfig's settings, and the client identity to present in TLS.
struct Settings<'a> {
    config: &'a kube::Config,
    identity: Option<&'a [u8]>,
}

impl std::ops::Deref for Settings<'_> {
    type Target = kube::Config;

    fn deref(&self) -> &kube::Config {
        self.config
    }
}

/// TLS to the API server: the kubeconfig's CA, client certificate and key (or an exec
/// plugin's), `tls-server-name` and `insecure-skip-tls-verify` ([`tls::client_config`]), over
/// `inner`, offering `h2` then `http/1.1` (kube-apiserver serves both, and picks `h2`).
fn cluster_tls<H>(
    config: &Settings<'_>,
    inner: H,
) -> Result<hyper_rustls::HttpsConnector<H>, TransportError> {
    let peer = format!("the API server {}", config.cluster_url);
    let name = config.tls_server_name.as_deref();
    tls_over(config, inner, peer, Alpn::H2AndHttp1, name)
}

/// TLS to an https proxy: the same settings, but the proxy's own name (Go's transport dials an
/// https proxy with a clone of the client's TLS config, so its CA too).
fn proxy_tls<H>(
    config: &Settings<'_>,
    proxy: &Proxy,
    inner: H,
) -> Result<hyper_rustls::HttpsConnector<H>, TransportError> {
    let peer = format!("the proxy {} ({})", redacted(&proxy.url), proxy.origin);
    // the hop to the proxy carries a CONNECT or absolute-form requests: HTTP/1.1 only
    tls_over(config, inner, peer, Alpn::Http1, None)
}

/// The protocols offered in the TLS handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alpn {
    /// None: HTTP/1.1, as kube's own connector does.
    Http1,
    /// `h2`, then `http/1.1` for a server without HTTP/2.
    H2AndHttp1,
}

fn tls_over<H>(
    config: &Settings<'_>,
    inner: H,
    peer: String,
    alpn: Alpn,
    server_name: Option<&str>,
) -> Result<hyper_rustls::HttpsConnector<H>, TransportError> {
    let roots = match &config.root_cert {
        // nothing is verified: no CA needed, not even the system's
        _ if config.accept_invalid_certs => Roots::Insecure,
        Some(ders) => Roots::Given(ders, config.root_cert_file.as_deref()),
        None => Roots::System,
    };
    let tls = tls::client_config(config.identity, roots).map_err(|e| match e {
        TlsError::NoSystemRoots(reason) => TransportError::NoSystemRoots { peer, reason },
        e => TransportError::Tls(e),
    })?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = server_name {
        let name = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|e| TransportError::Tls(TlsError::ServerName(e.to_string())))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    Ok(match alpn {
        Alpn::Http1 => builder.enable_http1().wrap_connector(inner),
        Alpn::H2AndHttp1 => builder.enable_all_versions().wrap_connector(inner),
    })
}

/// Where the TCP connection to the proxy goes: `http://host:port` (`https://` for TLS to it),
/// the port explicit.
fn proxy_dial_uri(proxy: &Proxy) -> Uri {
    let scheme = match proxy.scheme {
        ProxyScheme::Https => "https",
        ProxyScheme::Http | ProxyScheme::Socks5 => "http",
    };
    let uri = format!("{scheme}://{}", proxy.authority());
    uri.parse().unwrap_or_else(|_| proxy.url.clone())
}

/// `uri` with its scheme's port written out.
fn with_explicit_port(uri: Uri) -> Uri {
    if uri.port().is_some() {
        return uri;
    }
    let port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let Some(host) = uri.host() else {
        return uri;
    };
    let scheme = uri.scheme_str().unwrap_or("http");
    format!("{scheme}://{host}:{port}").parse().unwrap_or(uri)
}

/// `Proxy-Authorization: Basic …` for `user` and `pass`.
fn basic_auth(user: &str, pass: &str) -> Result<HeaderValue, TransportError> {
    super::auth::basic(user, pass).map_err(TransportError::ProxyCredentials)
}

fn with_tunnel_auth<C>(tunnel: Tunnel<C>, basic: Option<HeaderValue>) -> Tunnel<C> {
    match basic {
        Some(v) => tunnel.with_auth(v),
        None => tunnel,
    }
}

/// Absolute-form requests carry the proxy's credentials themselves (Go's transport adds
/// `Proxy-Authorization` to each request it forwards).
fn with_proxy_auth(transport: Transport, basic: Option<HeaderValue>) -> Transport {
    match basic {
        None => transport,
        Some(v) => BoxCloneService::new(transport.map_request(move |mut req: Request<Body>| {
            req.headers_mut().insert(PROXY_AUTHORIZATION, v.clone());
            req
        })),
    }
}

/// The URL without its user info, for messages.
pub fn redacted(url: &Uri) -> String {
    match (url.scheme_str(), url.host()) {
        (Some(scheme), Some(host)) => match url.port_u16() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        },
        _ => "<proxy>".to_string(),
    }
}

// === impl Forward ===

/// Connects to the proxy whatever the destination, and marks the connection proxied, so that
/// hyper writes absolute-form request targets (`GET http://server/path`): how Go's transport
/// sends an http request through an HTTP proxy, no tunnel.
#[derive(Clone, Debug)]
struct Forward<C> {
    inner: C,
    proxy: Uri,
}

type BoxConnecting<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<C> Service<Uri> for Forward<C>
where
    C: Service<Uri>,
    C::Future: Send + 'static,
    C::Response: Read + Write + Connection + Send + 'static,
    C::Error: 'static,
{
    type Response = AnyIo;
    type Error = C::Error;
    type Future = BoxConnecting<Self::Response, C::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, _dst: Uri) -> Self::Future {
        let connecting = self.inner.call(self.proxy.clone());
        Box::pin(async move { connecting.await.map(|io| AnyIo::new(io, true)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http2_pings_find_a_silent_connection_in_25s_well_before_keepalive_would() {
        assert_eq!(H2_DEAD_AFTER, Duration::from_secs(25));
        assert!(
            H2_DEAD_AFTER < USER_TIMEOUT,
            "and keepalive never would behind a relay"
        );
        // client-go's ReadIdleTimeout + PingTimeout
        assert!(H2_DEAD_AFTER < Duration::from_secs(30 + 15));
    }

    #[test]
    fn only_http1_connections_have_a_read_limit_and_it_outlasts_the_quietest_watch() {
        assert_eq!(read_limit(&Connected::new().negotiated_h2()), None);
        assert_eq!(read_limit(&Connected::new()), Some(HTTP1_READ_TIMEOUT));
        assert!(HTTP1_READ_TIMEOUT >= LONGEST_WATCH + Duration::from_secs(60));
    }

    #[test]
    fn keepalive_finds_a_dead_peer_within_about_a_minute() {
        let detection = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES;
        assert_eq!(detection, Duration::from_secs(60));
        assert_eq!(USER_TIMEOUT, detection);
    }

    /// The options are read back from the socket the connector made: what the kernel was
    /// told, not what the connector was asked.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_tcp_connector_sets_keepalive_user_timeout_and_nodelay_on_its_sockets() {
        use rustix::net::sockopt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connector = tcp_connector(Some(Duration::from_secs(5)));
        let uri: Uri = format!("http://{addr}").parse().unwrap();
        let io = tokio::time::timeout(Duration::from_secs(10), connector.call(uri))
            .await
            .expect("the connection to a loopback listener was not made within 10 s")
            .expect("connect");
        let stream = io.inner();
        assert!(sockopt::socket_keepalive(stream).unwrap(), "SO_KEEPALIVE");
        assert_eq!(sockopt::tcp_keepidle(stream).unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sockopt::tcp_keepintvl(stream).unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sockopt::tcp_keepcnt(stream).unwrap(), KEEPALIVE_PROBES);
        let user_timeout_ms = u32::try_from(USER_TIMEOUT.as_millis()).unwrap();
        assert_eq!(sockopt::tcp_user_timeout(stream).unwrap(), user_timeout_ms);
        assert!(sockopt::tcp_nodelay(stream).unwrap(), "TCP_NODELAY");
    }

    #[test]
    fn a_destination_without_a_port_gets_its_schemes_port() {
        let cases = [
            ("http://api.example.com", "http://api.example.com:80/"),
            ("https://api.example.com", "https://api.example.com:443/"),
            ("http://[::1]", "http://[::1]:80/"),
            (
                "https://api.example.com:6443",
                "https://api.example.com:6443/",
            ),
        ];
        for (uri, want) in cases {
            let got = with_explicit_port(uri.parse().unwrap());
            assert_eq!(got.to_string(), want, "{uri}");
        }
    }

    #[test]
    fn basic_proxy_credentials_are_base64_of_user_colon_password() {
        // RFC 7617 section 2's example
        let v = basic_auth("Aladdin", "open sesame").unwrap();
        assert_eq!(v.to_str().unwrap(), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(v.is_sensitive());
    }

    #[test]
    fn messages_name_a_proxy_without_its_password() {
        let url: Uri = "http://user:secret@proxy.corp:3128".parse().unwrap();
        assert_eq!(redacted(&url), "http://proxy.corp:3128");
    }
}
