//! A small forward proxy on loopback for the API client's proxy tests, speaking what corporate
//! proxies speak: HTTP `CONNECT` tunnels, absolute-form HTTP requests (`GET http://host/…`,
//! forwarded), and SOCKS5 (RFC 1928, with RFC 1929 user/password), told apart by the first
//! byte. It resolves names from its own table first (the tests give the API server a name only
//! the proxy knows, `apiserver.test`, so a request that bypassed the proxy cannot succeed), and
//! counts what it opened. Also a TLS front for the API double (which serves plain HTTP) with
//! the test CA in `tests/fixtures/tls`. Test infrastructure.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::wait;

/// The name the tests give the API server: RFC 6761 reserves `.test`, so nothing but the
/// proxy's own table resolves it.
pub const API_NAME: &str = "apiserver.test";

/// The test CA, as a kubeconfig's `certificate-authority-data` wants it (PEM).
pub use apiserver_double::TEST_CA_PEM as CA_PEM;

/// What the proxy did so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Tunnels opened: `CONNECT`s and SOCKS5 connects that reached their target.
    pub tunnels: usize,
    /// Connections whose absolute-form requests were forwarded.
    pub forwarded: usize,
    /// Every target asked for (`host:port` as the client wrote it), in order.
    pub targets: Vec<String>,
    /// `Proxy-Authorization` values seen (CONNECT and forwarded heads).
    pub proxy_authorization: Vec<String>,
    /// SOCKS5 user/password pairs seen.
    pub socks_credentials: Vec<(String, String)>,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    stats: watch::Receiver<Stats>,
    _task: AbortOnDropHandle<()>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port that resolves the names in `hosts` itself.
    pub async fn start(hosts: &[(&str, SocketAddr)]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let hosts: Arc<HashMap<String, SocketAddr>> = Arc::new(
            hosts
                .iter()
                .map(|(name, a)| (name.to_string(), *a))
                .collect(),
        );
        let (tx, stats) = watch::channel(Stats::default());
        let tx = Arc::new(tx);
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (hosts, tx) = (hosts.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = serve(client, &hosts, &tx).await;
                });
            }
        }));
        Proxy {
            addr,
            stats,
            _task: task,
        }
    }

    /// `scheme://127.0.0.1:port` (`http` or `socks5`).
    pub fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }

    pub fn stats(&self) -> Stats {
        self.stats.borrow().clone()
    }

    /// Waits until `cond` holds of the stats, at most `limit`; panics naming `what` otherwise.
    pub async fn wait_until(&mut self, what: &str, limit: Duration, cond: impl Fn(&Stats) -> bool) {
        let what = format!("the proxy to see {what}");
        let seen = wait::try_watch(&mut self.stats, limit, &what, Stats::clone, cond).await;
        seen.unwrap_or_else(|m| m.fail());
    }
}

async fn serve(
    mut client: TcpStream,
    hosts: &HashMap<String, SocketAddr>,
    stats: &watch::Sender<Stats>,
) -> std::io::Result<()> {
    let mut first = [0u8; 1];
    client.read_exact(&mut first).await?;
    if first[0] == 5 {
        return socks5(client, hosts, stats).await;
    }
    // an HTTP head: read up to its blank line
    let mut buf = first.to_vec();
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return Ok(());
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (
        request_line.next().unwrap_or_default(),
        request_line.next().unwrap_or_default().to_string(),
    );
    let auth = lines.find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("proxy-authorization")
            .then(|| value.trim().to_string())
    });
    if method == "CONNECT" {
        let Ok(mut upstream) = dial(&target, hosts).await else {
            client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                .await?;
            return Ok(());
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        stats.send_modify(|s| {
            s.tunnels += 1;
            s.targets.push(target);
            s.proxy_authorization.extend(auth);
        });
        upstream.write_all(&buf[end..]).await?;
        splice(client, upstream).await;
        return Ok(());
    }
    // absolute-form: http://host[:port]/path
    let Some(rest) = target.strip_prefix("http://") else {
        client
            .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            .await?;
        return Ok(());
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let mut upstream = dial(&authority, hosts).await?;
    stats.send_modify(|s| {
        s.forwarded += 1;
        s.targets.push(authority);
        s.proxy_authorization.extend(auth);
    });
    // the API double reads absolute-form targets as a server must (RFC 9112 section 3.2.2)
    upstream.write_all(&buf).await?;
    splice(client, upstream).await;
    Ok(())
}

/// Connects to `host:port`, the host from the table if it is there.
async fn dial(target: &str, hosts: &HashMap<String, SocketAddr>) -> std::io::Result<TcpStream> {
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| std::io::Error::other("no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match hosts.get(host) {
        Some(addr) => TcpStream::connect(addr).await,
        None => TcpStream::connect(format!("{host}:{port}")).await,
    }
}

async fn splice(mut a: TcpStream, mut b: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

/// SOCKS5 after its version byte: no authentication or user/password, then `CONNECT`.
async fn socks5(
    mut client: TcpStream,
    hosts: &HashMap<String, SocketAddr>,
    stats: &watch::Sender<Stats>,
) -> std::io::Result<()> {
    let n = client.read_u8().await?;
    let mut methods = vec![0u8; usize::from(n)];
    client.read_exact(&mut methods).await?;
    let mut credentials = None;
    if methods.contains(&2) {
        client.write_all(&[5, 2]).await?;
        let _version = client.read_u8().await?;
        let user = read_short(&mut client).await?;
        let pass = read_short(&mut client).await?;
        client.write_all(&[1, 0]).await?;
        credentials = Some((user, pass));
    } else if methods.contains(&0) {
        client.write_all(&[5, 0]).await?;
    } else {
        client.write_all(&[5, 0xff]).await?;
        return Ok(());
    }
    let mut head = [0u8; 4];
    client.read_exact(&mut head).await?;
    let host = match head[3] {
        1 => {
            let mut a = [0u8; 4];
            client.read_exact(&mut a).await?;
            std::net::Ipv4Addr::from(a).to_string()
        }
        3 => read_short(&mut client).await?,
        4 => {
            let mut a = [0u8; 16];
            client.read_exact(&mut a).await?;
            format!("[{}]", std::net::Ipv6Addr::from(a))
        }
        _ => return Ok(()),
    };
    let port = client.read_u16().await?;
    let target = format!("{host}:{port}");
    if head[1] != 1 {
        // only CONNECT: "command not supported"
        client.write_all(&[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return Ok(());
    }
    let Ok(upstream) = dial(&target, hosts).await else {
        // "host unreachable"
        client.write_all(&[5, 4, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
        return Ok(());
    };
    client.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
    stats.send_modify(|s| {
        s.tunnels += 1;
        s.targets.push(target);
        s.socks_credentials.extend(credentials);
    });
    splice(client, upstream).await;
    Ok(())
}

async fn read_short(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<String> {
    let len = r.read_u8().await?;
    let mut s = vec![0u8; usize::from(len)];
    r.read_exact(&mut s).await?;
    Ok(String::from_utf8_lossy(&s).into_owned())
}

// === TLS front ===

/// TLS in front of a plain-HTTP server (the API double): the test CA's certificate for
/// [`API_NAME`], `localhost` and `127.0.0.1`; stops when dropped.
pub struct TlsFront {
    pub addr: SocketAddr,
    _task: AbortOnDropHandle<()>,
}

impl TlsFront {
    /// Serves TLS on a free loopback port, each connection relayed to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TlsFront {
        // no ALPN: HTTP/1.1
        let tls = apiserver_double::Tls {
            alpn: Vec::new(),
            ..apiserver_double::Tls::test_ca()
        };
        let acceptor = tls.acceptor().expect("the fixture certificate and key");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the TLS front");
        let addr = listener.local_addr().expect("TLS front address");
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        }));
        TlsFront { addr, _task: task }
    }
}

/// A kubeconfig for `server` with the API double's default token, `ca_pem` as the cluster's
/// `certificate-authority-data` if given, and `proxy_url` as its `proxy-url` if given.
pub fn kubeconfig(server: &str, ca_pem: Option<&str>, proxy_url: Option<&str>) -> String {
    use apiserver_double::{DEFAULT_TOKEN, kubeconfig_for, kubeconfig_with_ca};
    let text = match ca_pem {
        Some(ca) => kubeconfig_with_ca(server, DEFAULT_TOKEN, ca),
        None => kubeconfig_for(server),
    };
    let line = format!("server: {server}");
    match proxy_url {
        Some(p) => text.replacen(&line, &format!("{line}\n    proxy-url: {p}"), 1),
        None => text,
    }
}
