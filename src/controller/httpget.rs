//! The kubelet's HTTP GET, for probes and lifecycle hooks alike (`pkg/probe/http` and
//! `pkg/kubelet/lifecycle`, one request builder since `ConsistentHTTPGetHandlers`): one
//! connection per request, `User-Agent` and `Accept: */*` unless the handler sets them,
//! redirects followed on the same host only (another host ends the request with the redirect as
//! the answer), HTTPS without certificate checks, at most 10 KiB of body read. What an answer
//! means is the caller's: a probe wants 2xx or 3xx, a hook any answer at all.
//!
//! Every byte here comes from a pod's author, both ways: the request is built from their spec
//! and the answer from their server. So the request refuses a path or header value with a
//! control character (CR, LF, NUL: a second request smuggled into the first), and the answer is
//! read within bounds: a head of at most [`HEAD_LIMIT`] (Go's client, the kubelet's, allows
//! 10 MiB), at most [`BODY_LIMIT`] of body, each byte looked at a bounded number of times, and
//! no more than `Content-Length` or the last chunk asks for.

use std::sync::Arc;

use k8s_openapi::api::core::v1::HTTPGetAction;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How much of an HTTP body is read (the kubelet's limit).
pub const BODY_LIMIT: usize = 10 * 1024;
/// The longest response head (status line and headers) read: a server sending more is refused
/// (no real server's head comes near; Go's server refuses requests past 1 MiB).
pub const HEAD_LIMIT: usize = 64 * 1024;
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
    /// The response's head did not end within [`HEAD_LIMIT`].
    #[error("the response's head is longer than {HEAD_LIMIT} bytes: refused")]
    HeadTooLong,
    /// The handler's path or a header holds a control character (CR, LF, NUL, ...), which
    /// would end the request line or a header early: nothing is sent.
    #[error("the handler's {0} holds a control character (CR, LF, NUL...): not sent")]
    InvalidRequest(&'static str),
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
    let head = request_head(req, path)?;
    let addr = join_host_port(req.host, req.port);
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .map_err(|source| GetErrorKind::Connect {
            addr: addr.clone(),
            source,
        })?;
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

/// A control character (what would end a request line or a header early); a header's
/// value may hold tabs, as HTTP allows.
fn has_control(s: &str, tab_allowed: bool) -> bool {
    s.bytes()
        .any(|b| (b < 0x20 && !(tab_allowed && b == b'\t')) || b == 0x7f)
}

/// The request's head for `path`: the kubelet's headers unless the handler sets them, then the
/// handler's in order. Refused when the path or a header holds a control character; spaces in
/// the path are sent escaped, as Go's client sends them.
pub fn request_head(req: &Get<'_>, path: &str) -> Result<String, GetErrorKind> {
    if has_control(path, false) {
        return Err(GetErrorKind::InvalidRequest("path"));
    }
    if req
        .headers
        .iter()
        .any(|(k, _)| k.is_empty() || has_control(k, false) || k.contains([' ', ':']))
    {
        return Err(GetErrorKind::InvalidRequest("header name"));
    }
    if req.headers.iter().any(|(_, v)| has_control(v, true)) {
        return Err(GetErrorKind::InvalidRequest("header value"));
    }
    let addr = join_host_port(req.host, req.port);
    let mut head = format!(
        "GET {} HTTP/1.1\r\nConnection: close\r\n",
        path.replace(' ', "%20")
    );
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
    Ok(head)
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    req: &str,
) -> Result<(Answer, Option<String>), GetErrorKind> {
    s.write_all(req.as_bytes())
        .await
        .map_err(GetErrorKind::Io)?;
    let mut reader = Reader::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.map_err(GetErrorKind::Io)?;
        if n == 0 || reader.push(&buf[..n])? {
            break;
        }
    }
    reader.finish()
}

/// A response read as it arrives, within bounds: the head up to [`HEAD_LIMIT`], then the body up
/// to [`BODY_LIMIT`] or to where `Content-Length` or the last chunk ends it.
#[derive(Debug, Default)]
pub struct Reader {
    raw: Vec<u8>,
    /// Where the head ends (after its blank line), once found.
    head_end: Option<usize>,
    /// Where the search for the blank line goes on (what was searched is not searched again).
    searched_to: usize,
    /// How many body bytes end the response, once the head is known.
    body_wanted: Option<usize>,
    chunked: bool,
    /// Bytes looked at by the searches for the head's end, in all (bounded by about twice the
    /// bytes taken: what was searched is not searched again).
    looked_at: usize,
    /// Informational (`1xx`) heads skipped so far.
    informational: usize,
}

/// Informational (`1xx`) answers skipped before the answer, at most (Go's client: 5).
const MAX_INFORMATIONAL: usize = 5;

/// Whether `head` (a complete response head) is an informational `1xx` other than `101
/// Switching Protocols`, which is final.
fn is_informational(head: &[u8]) -> bool {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return false;
    };
    version.starts_with(b"HTTP/") && code.len() == 3 && code[0] == b'1' && code != b"101"
}

impl Reader {
    /// Takes `bytes`; true once the response needs no more (its body complete or at the limit).
    pub fn push(&mut self, bytes: &[u8]) -> Result<bool, GetErrorKind> {
        let room = match self.head_end {
            None => (HEAD_LIMIT + BODY_LIMIT).saturating_sub(self.raw.len()),
            Some(end) => (end + BODY_LIMIT).saturating_sub(self.raw.len()),
        };
        self.raw.extend_from_slice(&bytes[..bytes.len().min(room)]);
        while self.head_end.is_none() {
            let from = self.searched_to.saturating_sub(3);
            self.looked_at += self.raw.len() - from;
            match find(&self.raw[from..], b"\r\n\r\n") {
                Some(i) if from + i + 4 <= HEAD_LIMIT => {
                    let end = from + i + 4;
                    if is_informational(&self.raw[..end]) {
                        // a `1xx` before the answer (`103 Early Hints`): skipped, as Go's
                        // client (the kubelet's) skips it, at most [`MAX_INFORMATIONAL`]
                        self.informational += 1;
                        if self.informational > MAX_INFORMATIONAL {
                            return Err(GetErrorKind::Malformed);
                        }
                        self.raw.drain(..end);
                        self.searched_to = 0;
                        continue;
                    }
                    self.head_end = Some(end);
                    let head = String::from_utf8_lossy(&self.raw[..end - 4]).into_owned();
                    self.chunked = header(&head, "transfer-encoding")
                        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
                    self.body_wanted = if self.chunked {
                        None
                    } else {
                        header(&head, "content-length").and_then(|v| v.parse().ok())
                    };
                }
                _ if self.raw.len() >= HEAD_LIMIT => return Err(GetErrorKind::HeadTooLong),
                _ => {
                    self.searched_to = self.raw.len();
                    return Ok(false);
                }
            }
        }
        let end = self.head_end.unwrap_or_default();
        let body = &self.raw[end..];
        Ok(body.len() >= BODY_LIMIT
            || self.body_wanted.is_some_and(|n| body.len() >= n)
            || (self.chunked && body.ends_with(b"0\r\n\r\n")))
    }

    /// Bytes taken so far (at most [`HEAD_LIMIT`] + [`BODY_LIMIT`]).
    pub fn taken(&self) -> usize {
        self.raw.len()
    }

    /// Bytes the searches for the head's end looked at so far.
    pub fn scanned(&self) -> usize {
        self.looked_at
    }

    /// The answer from what was read.
    pub fn finish(self) -> Result<(Answer, Option<String>), GetErrorKind> {
        let end = self.head_end.ok_or(GetErrorKind::Malformed)?;
        let head = String::from_utf8_lossy(&self.raw[..end - 4]).into_owned();
        let mut body = self.raw[end..].to_vec();
        body.truncate(self.body_wanted.unwrap_or(BODY_LIMIT).min(BODY_LIMIT));
        let mut status_line = head.split_whitespace();
        if !status_line.next().is_some_and(|v| v.starts_with("HTTP/")) {
            return Err(GetErrorKind::Malformed);
        }
        let status = status_line
            .next()
            .and_then(|c| c.parse().ok())
            .filter(|c| (100..1000).contains(c))
            .ok_or(GetErrorKind::Malformed)?;
        let body = if self.chunked { dechunk(&body) } else { body };
        let answer = Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        Ok((answer, header(&head, "location")))
    }
}

/// The value of header `name` in `head` (the first, trimmed).
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
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

    /// A stream that answers with `head`, then `fill` without end, counting what was read.
    struct Endless {
        head: Vec<u8>,
        fill: &'static [u8],
        read: usize,
    }

    impl AsyncRead for Endless {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = buf.remaining().min(4096);
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let at = self.read + out.len();
                let b = match self.head.get(at) {
                    Some(b) => *b,
                    None => self.fill[(at - self.head.len()) % self.fill.len()],
                };
                out.push(b);
            }
            self.read += n;
            buf.put_slice(&out);
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Endless {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_server_whose_headers_never_end_is_cut_off_at_the_head_limit() {
        // a probe's target (the pod itself) that sends header lines for ever: 2c6dc4e read
        // them for the whole timeout, looking at the whole buffer again after every read
        let mut s = Endless {
            head: b"HTTP/1.1 200 OK\r\n".to_vec(),
            fill: b"X-Endless: yes\r\n",
            read: 0,
        };
        let e = exchange(&mut s, "GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap_err();
        assert!(matches!(e, GetErrorKind::HeadTooLong), "{e:?}");
        assert!(s.read <= HEAD_LIMIT + 4096, "read {} bytes", s.read);
    }

    #[test]
    fn each_byte_of_a_head_that_trickles_in_is_looked_at_a_bounded_number_of_times() {
        let mut r = Reader::default();
        let head = b"HTTP/1.1 200 OK\r\nX-Long: ".iter().chain(&[b'a'; 60_000]);
        for b in head {
            assert!(!r.push(std::slice::from_ref(b)).unwrap());
        }
        // one byte at a time: each search looks at the new byte and the three before it
        assert!(
            r.scanned() <= 4 * r.taken(),
            "{} of {}",
            r.scanned(),
            r.taken()
        );
        r.push(b"\r\n\r\nok").unwrap();
        assert_eq!(r.finish().unwrap().0.status, 200);
    }

    #[tokio::test]
    async fn a_64_mib_body_is_read_only_to_the_body_limit() {
        let mut s = Endless {
            head: b"HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\n\r\n".to_vec(),
            fill: b"0123456789abcdef",
            read: 0,
        };
        let (answer, _) = exchange(&mut s, "GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(answer.body.len(), BODY_LIMIT);
        assert!(s.read <= 4096 + BODY_LIMIT + 4096, "read {} bytes", s.read);
    }

    #[tokio::test]
    async fn a_complete_answer_ends_the_read_though_the_server_keeps_the_connection_open() {
        let mut s = Endless {
            head: b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\nok".to_vec(),
            // what a keep-alive server would never send: a next response is no part of this one
            fill: b"HTTP/1.1 500 Nope\r\n",
            read: 0,
        };
        let (answer, _) = exchange(&mut s, "GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(
            answer,
            Answer {
                status: 204,
                body: "ok".into()
            }
        );
    }

    #[test]
    fn cr_lf_or_nul_in_a_path_or_header_value_is_refused_before_anything_is_sent() {
        // the API server checks header names only: a pod's author could smuggle a second
        // request into a hook's or probe's GET (2c6dc4e wrote these raw)
        let split = [("X-A".to_string(), "1\r\nX-Injected: 2".to_string())];
        for (path, headers) in [
            ("/a\r\nGET /admin HTTP/1.1", &[][..]),
            ("/a\nb", &[]),
            ("/a\0", &[]),
            ("/", &split[..]),
            ("/", &[("X-A".to_string(), "nul\0".to_string())]),
            ("/", &[("X-A\r\nB".to_string(), "1".to_string())]),
        ] {
            let e = request_head(&get_of(80, path, headers), path).unwrap_err();
            assert!(
                matches!(e, GetErrorKind::InvalidRequest(_)),
                "{path:?}: {e:?}"
            );
        }
        let ok = [("X-A".to_string(), "a\tb".to_string())];
        let head = request_head(&get_of(80, "/a b", &ok), "/a b").unwrap();
        assert!(head.starts_with("GET /a%20b HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("X-A: a\tb\r\n"), "{head}");
    }

    /// Issue 43, row 16: a `103 Early Hints` before a `200` was taken as the answer (a failed
    /// probe: 1xx is not success), where the kubelet's Go client skips it.
    #[test]
    fn an_early_hints_answer_before_the_real_one_is_skipped_as_the_kubelet_skips_it() {
        let mut r = Reader::default();
        let done = r
            .push(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .expect("read");
        assert!(done);
        let (answer, _) = r.finish().expect("an answer");
        assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));

        let mut r = Reader::default();
        let endless = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(6);
        assert!(
            r.push(&endless).is_err(),
            "six informational heads are refused"
        );
    }

    #[test]
    fn a_response_without_a_status_line_is_malformed() {
        for raw in [
            &b"\r\n\r\n"[..],
            b"FOO 200\r\n\r\n",
            b"HTTP/1.1 abc\r\n\r\n",
        ] {
            let mut r = Reader::default();
            r.push(raw).unwrap();
            assert!(
                matches!(r.finish(), Err(GetErrorKind::Malformed)),
                "{raw:?}"
            );
        }
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
