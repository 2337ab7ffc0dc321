//! The kubelet's HTTP GET, for probes and lifecycle hooks alike (`pkg/probe/http` and
//! `pkg/kubelet/lifecycle`, one request builder since `ConsistentHTTPGetHandlers`): one
//! connection per request, `User-Agent` and `Accept: */*` unless the handler sets them,
//! redirects followed on the same host only (another host ends the request with the redirect as
//! the answer), HTTPS without certificate checks, at most 10 KiB of body read. What an answer
//! means is the caller's: a probe wants 2xx or 3xx, a hook any answer at all.

use std::sync::Arc;

use k8s_openapi::api::core::v1::HTTPGetAction;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How much of an HTTP body is read (the kubelet's limit).
pub const BODY_LIMIT: usize = 10 * 1024;
/// Redirects followed on the same host.
const MAX_REDIRECTS: usize = 10;

/// What a handler's `httpGet` asks besides where to: HTTPS or HTTP, the path (`/` when it has
/// none) and its headers in order, read the same way for probes and hooks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    /// `scheme: HTTPS` (any case).
    pub https: bool,
    /// The path.
    pub path: String,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
}

impl Action {
    /// The parts of `action`.
    pub fn of(action: &HTTPGetAction) -> Self {
        Action {
            https: action
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("https")),
            path: action
                .path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "/".into()),
            headers: action
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        }
    }

    /// This GET to `host:port`, sent as `user_agent`.
    pub fn request<'a>(&'a self, host: &'a str, port: u16, user_agent: &'a str) -> Get<'a> {
        Get {
            host,
            port,
            https: self.https,
            path: &self.path,
            headers: &self.headers,
            user_agent,
        }
    }
}

/// One GET as a handler describes it.
#[derive(Clone, Copy, Debug)]
pub struct Get<'a> {
    /// The host (the pod IP unless the handler names one).
    pub host: &'a str,
    /// The port.
    pub port: u16,
    /// HTTPS instead of HTTP.
    pub https: bool,
    /// The path, `/` when the handler has none.
    pub path: &'a str,
    /// The handler's headers, in order.
    pub headers: &'a [(String, String)],
    /// The `User-Agent` unless the headers set one (`kube-probe/<version>`,
    /// `kube-lifecycle/<version>`).
    pub user_agent: &'a str,
}

impl Get<'_> {
    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// The URL of the request to `path`, as Go prints it.
    pub fn url(&self, path: &str) -> String {
        format!(
            "{}://{}{path}",
            self.scheme(),
            join_host_port(self.host, self.port)
        )
    }
}

/// The last answer: a success or failure status, or a redirect to another host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// At most [`BODY_LIMIT`] of the body, chunked encoding undone.
    pub body: String,
}

/// Why no answer came.
#[derive(Debug, thiserror::Error)]
#[error("Get \"{url}\": {kind}")]
pub struct GetError {
    /// The URL of the request that failed.
    pub url: String,
    /// What failed.
    pub kind: GetErrorKind,
}

/// What failed in a GET.
#[derive(Debug, thiserror::Error)]
pub enum GetErrorKind {
    /// No connection.
    #[error("dial tcp {addr}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("tls: {0}")]
    Tls(std::io::Error),
    /// The connection failed after it was made.
    #[error("{0}")]
    Io(std::io::Error),
    /// The server's bytes are no HTTP response.
    #[error("malformed HTTP response")]
    Malformed,
    /// Same-host redirects without end.
    #[error("stopped after {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
}

impl GetErrorKind {
    /// The server answered the TLS handshake in plain HTTP (Go's "server gave HTTP response
    /// to HTTPS client"): a record that is no TLS at all.
    pub fn is_http_answer_to_https(&self) -> bool {
        let GetErrorKind::Tls(e) = self else {
            return false;
        };
        e.get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .is_some_and(|e| matches!(e, rustls::Error::InvalidMessage(_)))
    }
}

/// `host:port`, an IPv6 host in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Runs the GET, following redirects on the same host; the answer that was not a same-host
/// redirect.
pub async fn get(req: &Get<'_>) -> Result<Answer, GetError> {
    let mut path = req.path.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let (answer, location) = get_once(req, &path).await.map_err(|kind| GetError {
            url: req.url(&path),
            kind,
        })?;
        let next = location
            .as_deref()
            .filter(|_| (300..400).contains(&answer.status))
            .and_then(|l| same_host_path(l, req.host, req.port));
        match next {
            Some(next) => path = next,
            None => return Ok(answer),
        }
    }
    Err(GetError {
        url: req.url(&path),
        kind: GetErrorKind::TooManyRedirects,
    })
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

/// One request; the answer and its `Location`.
async fn get_once(req: &Get<'_>, path: &str) -> Result<(Answer, Option<String>), GetErrorKind> {
    let addr = join_host_port(req.host, req.port);
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|source| GetErrorKind::Connect {
            addr: addr.clone(),
            source,
        })?;
    let mut head = format!("GET {path} HTTP/1.1\r\nConnection: close\r\n");
    let has = |name: &str| {
        req.headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(name))
    };
    if !has("host") {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    if !has("user-agent") {
        head.push_str(&format!("User-Agent: {}\r\n", req.user_agent));
    }
    if !has("accept") {
        head.push_str("Accept: */*\r\n");
    }
    for (k, v) in req.headers {
        if k.eq_ignore_ascii_case("accept") && v.is_empty() {
            continue;
        }
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    if req.https {
        let tls = tls_connector()
            .connect(server_name(req.host), tcp)
            .await
            .map_err(GetErrorKind::Tls)?;
        exchange(tls, &head).await
    } else {
        exchange(tcp, &head).await
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
) -> Result<(Answer, Option<String>), GetErrorKind> {
    s.write_all(req.as_bytes())
        .await
        .map_err(GetErrorKind::Io)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    // the head and at most BODY_LIMIT of body
    loop {
        let n = s.read(&mut buf).await.map_err(GetErrorKind::Io)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = find(&raw, b"\r\n\r\n")
            && raw.len() >= i + 4 + BODY_LIMIT
        {
            break;
        }
    }
    let i = find(&raw, b"\r\n\r\n").ok_or(GetErrorKind::Malformed)?;
    let head = String::from_utf8_lossy(&raw[..i]).into_owned();
    let mut body = raw[i + 4..].to_vec();
    body.truncate(BODY_LIMIT);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(GetErrorKind::Malformed)?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let location = header("location");
    let chunked =
        header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked { dechunk(&body) } else { body };
    let answer = Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    Ok((answer, location))
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

/// A TLS client that accepts any certificate (the kubelet's probes and hooks skip verification).
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

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk(b"2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n"), b"ok!!!");
    }

    /// A server that answers every connection with `answer`; its port and the requests it got.
    async fn serve(answer: &'static str) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        (port, rx)
    }

    #[test]
    fn an_action_reads_its_scheme_in_any_case_its_path_as_slash_when_empty_and_headers_in_order() {
        let action: HTTPGetAction = serde_json::from_value(serde_json::json!({
            "port": 80, "scheme": "https", "path": "",
            "httpHeaders": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]
        }))
        .unwrap();
        let a = Action::of(&action);
        assert!(a.https);
        assert_eq!(a.path, "/");
        assert_eq!(
            a.headers,
            [("B".to_string(), "2".to_string()), ("A".into(), "1".into())]
        );
        let get = a.request("10.0.0.1", 8443, "kube-probe/1.36");
        assert_eq!(get.url("/"), "https://10.0.0.1:8443/");
        let plain = Action::of(&HTTPGetAction::default());
        assert_eq!((plain.https, plain.path.as_str()), (false, "/"));
    }

    fn get_of<'a>(port: u16, path: &'a str, headers: &'a [(String, String)]) -> Get<'a> {
        Get {
            host: "127.0.0.1",
            port,
            https: false,
            path,
            headers,
            user_agent: "kube-probe/1.36",
        }
    }

    #[tokio::test]
    async fn a_get_sends_the_kubelets_headers_unless_the_handler_sets_them() {
        let (port, mut requests) = serve("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
        let answer = get(&get_of(port, "/healthz", &[])).await.unwrap();
        assert_eq!(
            answer,
            Answer {
                status: 200,
                body: "ok".into()
            }
        );
        let sent = requests.recv().await.unwrap();
        assert!(sent.starts_with("GET /healthz HTTP/1.1\r\n"), "{sent}");
        assert!(sent.contains("User-Agent: kube-probe/1.36\r\n"), "{sent}");
        assert!(sent.contains("Accept: */*\r\n"), "{sent}");
        let own = [("User-Agent".to_string(), "mine".to_string())];
        get(&get_of(port, "/", &own)).await.unwrap();
        let sent = requests.recv().await.unwrap();
        assert!(
            sent.contains("User-Agent: mine\r\n") && !sent.contains("kube-probe"),
            "{sent}"
        );
    }

    #[tokio::test]
    async fn a_redirect_to_another_host_is_the_answer() {
        let (port, _) =
            serve("HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n")
                .await;
        let answer = get(&get_of(port, "/", &[])).await.unwrap();
        assert_eq!(answer.status, 302);
    }

    #[tokio::test]
    async fn endless_same_host_redirects_stop_after_ten() {
        let (port, _) =
            serve("HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\n\r\n").await;
        let e = get(&get_of(port, "/", &[])).await.unwrap_err();
        assert!(matches!(e.kind, GetErrorKind::TooManyRedirects), "{e}");
        assert_eq!(
            e.to_string(),
            format!("Get \"http://127.0.0.1:{port}/again\": stopped after 10 redirects")
        );
    }

    #[tokio::test]
    async fn https_to_a_plain_http_server_is_told_apart_from_other_failures() {
        let (port, _) = serve("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
        let e = get(&Get {
            https: true,
            ..get_of(port, "/", &[])
        })
        .await
        .unwrap_err();
        assert!(e.kind.is_http_answer_to_https(), "{e:?}");
        let closed = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let e = get(&Get {
            https: true,
            ..get_of(closed, "/", &[])
        })
        .await
        .unwrap_err();
        assert!(!e.kind.is_http_answer_to_https(), "{e:?}");
    }
}
