//! Running one probe, with the kubelet's semantics (`pkg/probe/{exec,http,tcp,grpc}`): exec
//! through CRI `ExecSync` (exit 0 succeeds; the output is the message), HTTP GET (2xx and 3xx
//! succeed, `User-Agent: kube-probe/<version>`, `Accept: */*`, redirects followed on the same
//! host only, HTTPS without certificate checks), TCP connect, and the gRPC health check
//! (`grpc.health.v1.Health/Check`, which kruise-daemon lacks).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::cri::{CriError, RuntimeService};

/// The longest message kept (kruise's limit), cut at a character boundary.
pub const MESSAGE_LIMIT: usize = 1024;
/// How much of an HTTP body or exec output is read (the kubelet's limit).
const OUTPUT_LIMIT: usize = 10 * 1024;
/// The User-Agent of HTTP probes and gRPC checks.
pub const USER_AGENT: &str = "kube-probe/1.36";
/// Redirects followed on the same host.
const MAX_REDIRECTS: usize = 10;

/// The outcome of one probe run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It passed; the message (exec output, HTTP body, "service healthy").
    Success(String),
    /// It failed; why.
    Failure(String),
    /// It could not run (no handler, a bad port): kept out of the results, as kruise and the
    /// kubelet do.
    Error(String),
}

/// Which handler a probe uses, for metrics and for noticing a handler change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Handler {
    /// `exec`.
    Exec,
    /// `httpGet`.
    Http,
    /// `tcpSocket`.
    Tcp,
    /// `grpc`.
    Grpc,
}

impl Handler {
    /// The handler of `probe` (kruise's order: exec, httpGet, tcpSocket; then gRPC).
    pub fn of(probe: &Probe) -> Option<Handler> {
        if probe.exec.is_some() {
            Some(Handler::Exec)
        } else if probe.http_get.is_some() {
            Some(Handler::Http)
        } else if probe.tcp_socket.is_some() {
            Some(Handler::Tcp)
        } else if probe.grpc.is_some() {
            Some(Handler::Grpc)
        } else {
            None
        }
    }

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Handler::Exec => "exec",
            Handler::Http => "http",
            Handler::Tcp => "tcp",
            Handler::Grpc => "grpc",
        }
    }
}

/// `s` cut to [`MESSAGE_LIMIT`] bytes at a character boundary (kruise cuts bytes and may split
/// a character).
pub fn truncate(s: &str) -> String {
    if s.len() <= MESSAGE_LIMIT {
        return s.to_string();
    }
    let mut end = MESSAGE_LIMIT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The port of a handler: a number; names were resolved to numbers by the manager.
fn port_of(port: &IntOrString) -> Result<u16, String> {
    let n = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => s.parse().unwrap_or(0),
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("invalid port number: {n}"))
}

/// Runs `probe` against container `id` of a pod at `ip`, within `timeout`.
pub async fn run<R: RuntimeService>(
    runtime: &R,
    probe: &Probe,
    container_id: &str,
    ip: &str,
    timeout: Duration,
) -> Outcome {
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let timed_out = || {
            Outcome::Failure(format!(
                "command {:?} timed out after {timeout:?}",
                cmd.join(" ")
            ))
        };
        return match tokio::time::timeout(
            timeout + Duration::from_secs(1),
            runtime.exec_sync(container_id, cmd.clone(), timeout),
        )
        .await
        {
            // a command past its timeout fails the probe, as in the kubelet: however the
            // runtime says so (containerd: DeadlineExceeded; CRI-O: exit -1, cri::dialect)
            Err(_) | Ok(Err(CriError::Timeout { .. })) => timed_out(),
            Ok(Ok(out)) if crate::cri::dialect::exec_timed_out(&out) => timed_out(),
            Ok(Err(e)) => Outcome::Error(e.to_string()),
            Ok(Ok(out)) => {
                let text = |b: &[u8]| {
                    String::from_utf8_lossy(&b[..b.len().min(OUTPUT_LIMIT)]).into_owned()
                };
                if out.exit_code == 0 {
                    Outcome::Success(text(&out.stdout))
                } else {
                    Outcome::Failure(text(&out.stderr))
                }
            }
        };
    }
    if let Some(http) = &probe.http_get {
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| ip.to_string());
        let port = match port_of(&http.port) {
            Ok(p) => p,
            Err(e) => return Outcome::Error(e),
        };
        let https = http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"));
        let path = http
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return match tokio::time::timeout(timeout, http_probe(&host, port, https, &path, &headers))
            .await
        {
            Ok(o) => o,
            Err(_) => Outcome::Failure(format!(
                "Get \"{}://{host}:{port}{path}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                if https { "https" } else { "http" }
            )),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| ip.to_string());
        let port = match port_of(&tcp.port) {
            Ok(p) => p,
            Err(e) => return Outcome::Error(e),
        };
        let addr = join_host_port(&host, port);
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Outcome::Success(String::new()),
            Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
            Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    if let Some(grpc) = &probe.grpc {
        let port = match u16::try_from(grpc.port).ok().filter(|p| *p > 0) {
            Some(p) => p,
            None => return Outcome::Error(format!("invalid port number: {}", grpc.port)),
        };
        let service = grpc.service.clone().unwrap_or_default();
        return super::grpc::check(&join_host_port(ip, port), &service, timeout).await;
    }
    Outcome::Error("missing probe handler".into())
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// An HTTP GET, following redirects on the same host.
async fn http_probe(
    host: &str,
    port: u16,
    https: bool,
    path: &str,
    headers: &[(String, String)],
) -> Outcome {
    let scheme = if https { "https" } else { "http" };
    let mut path = path.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let url = format!("{scheme}://{}{path}", join_host_port(host, port));
        let answer = match get_once(host, port, https, &path, headers).await {
            Ok(a) => a,
            Err(e) => return Outcome::Failure(format!("Get \"{url}\": {e}")),
        };
        match answer.status {
            200..=299 => return Outcome::Success(answer.body),
            300..=399 => {
                // same-host redirects are followed; another host ends the probe, successfully
                let same_host = answer
                    .location
                    .as_deref()
                    .and_then(|l| same_host_path(l, host, port));
                match same_host {
                    Some(next) => path = next,
                    None => {
                        return Outcome::Success(format!(
                            "Probe terminated redirects, Response body: {}",
                            answer.body
                        ));
                    }
                }
            }
            code => return Outcome::Failure(format!("HTTP probe failed with statuscode: {code}")),
        }
    }
    Outcome::Failure(format!(
        "Get \"{scheme}://{host}:{port}{path}\": stopped after {MAX_REDIRECTS} redirects"
    ))
}

/// The path of a redirect `location` if it stays on `host:port`.
fn same_host_path(location: &str, host: &str, port: u16) -> Option<String> {
    if location.starts_with('/') {
        return Some(location.to_string());
    }
    let rest = location
        .strip_prefix("http://")
        .or_else(|| location.strip_prefix("https://"))?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let (h, p) = authority
        .rsplit_once(':')
        .map_or((authority, None), |(h, p)| (h, p.parse::<u16>().ok()));
    (h == host && p.is_none_or(|p| p == port)).then_some(path)
}

struct Answer {
    status: u16,
    location: Option<String>,
    body: String,
}

async fn get_once(
    host: &str,
    port: u16,
    https: bool,
    path: &str,
    headers: &[(String, String)],
) -> Result<Answer, String> {
    let addr = join_host_port(host, port);
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|e| format!("dial tcp {addr}: {e}"))?;
    let mut req = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if !has("host") {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    if !has("user-agent") {
        req.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
    }
    if !has("accept") {
        req.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("accept") && v.is_empty() {
            continue;
        }
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    if https {
        let tls = tls_connector()
            .connect(server_name(host), tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        exchange(tls, &req).await
    } else {
        exchange(tcp, &req).await
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
) -> Result<Answer, String> {
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    // the head and at most OUTPUT_LIMIT of body
    loop {
        let n = s.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = find(&raw, b"\r\n\r\n")
            && raw.len() >= i + 4 + OUTPUT_LIMIT
        {
            break;
        }
    }
    let i = find(&raw, b"\r\n\r\n").ok_or("malformed HTTP response")?;
    let head = String::from_utf8_lossy(&raw[..i]).into_owned();
    let mut body = raw[i + 4..].to_vec();
    body.truncate(OUTPUT_LIMIT);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("malformed HTTP response")?;
    let location = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("location")
            .then(|| v.trim().to_string())
    });
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked { dechunk(&body) } else { body };
    Ok(Answer {
        status,
        location,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = find(body, b"\r\n") {
        let size = std::str::from_utf8(&body[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(n) = size.filter(|n| *n > 0) else {
            break;
        };
        let rest = &body[i + 2..];
        let take = n.min(rest.len());
        out.extend_from_slice(&rest[..take]);
        body = rest.get(take + 2..).unwrap_or_default();
    }
    out
}

/// A TLS client that accepts any certificate (the kubelet's probes skip verification).
fn tls_connector() -> tokio_rustls::TlsConnector {
    use std::sync::OnceLock;
    static CONNECTOR: OnceLock<tokio_rustls::TlsConnector> = OnceLock::new();
    CONNECTOR
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map(|b| {
                    b.dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                        .with_no_client_auth()
                })
                .unwrap_or_else(|_| {
                    // the ring provider always supports the default versions
                    rustls::ClientConfig::builder()
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AnyCertificate(Arc::new(
                            rustls::crypto::ring::default_provider(),
                        ))))
                        .with_no_client_auth()
                });
            tokio_rustls::TlsConnector::from(Arc::new(config))
        })
        .clone()
}

fn server_name(host: &str) -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from(host.to_string()).unwrap_or_else(|_| {
        rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
    })
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_cut_at_1024_bytes_on_a_character_boundary() {
        assert_eq!(truncate("ok"), "ok");
        let long = "é".repeat(600); // 1200 bytes
        let cut = truncate(&long);
        assert!(cut.len() <= MESSAGE_LIMIT && cut.len() >= MESSAGE_LIMIT - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn redirects_are_followed_on_the_same_host_only() {
        assert_eq!(
            same_host_path("/next", "10.0.0.5", 80).as_deref(),
            Some("/next")
        );
        assert_eq!(
            same_host_path("http://10.0.0.5:80/a", "10.0.0.5", 80).as_deref(),
            Some("/a")
        );
        assert_eq!(same_host_path("http://other/a", "10.0.0.5", 80), None);
    }

    async fn serve(answer: &'static str) -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        port
    }

    fn http_probe_on(port: u16, path: &str) -> Probe {
        serde_json::from_value(serde_json::json!({"httpGet": {"port": port, "path": path}}))
            .unwrap()
    }

    #[tokio::test]
    async fn http_2xx_succeeds_with_the_body_and_5xx_fails_with_the_code() {
        let rt = crate::cri::fake::FakeRuntime::start(
            &tempfile::tempdir().unwrap().path().join("cri.sock"),
            "containerd",
        )
        .await
        .unwrap();
        let client = crate::cri::RemoteRuntime::new(rt.endpoint(), None, Default::default());
        let ok = serve("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
        let bad = serve("HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n").await;
        let t = Duration::from_secs(5);
        assert_eq!(
            run(&client, &http_probe_on(ok, "/healthz"), "c", "127.0.0.1", t).await,
            Outcome::Success("ok".into())
        );
        assert_eq!(
            run(&client, &http_probe_on(bad, "/"), "c", "127.0.0.1", t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        let tcp: Probe =
            serde_json::from_value(serde_json::json!({"tcpSocket": {"port": ok}})).unwrap();
        assert_eq!(
            run(&client, &tcp, "c", "127.0.0.1", t).await,
            Outcome::Success(String::new())
        );
        let none: Probe = serde_json::from_value(serde_json::json!({"periodSeconds": 1})).unwrap();
        assert!(matches!(
            run(&client, &none, "c", "127.0.0.1", t).await,
            Outcome::Error(_)
        ));
    }
}
