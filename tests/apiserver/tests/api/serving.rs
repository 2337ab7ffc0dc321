//! How the double serves: TLS with HTTP/2 and HTTP/1.1 as kube-apiserver does
//! ([`Config::tls`]), and the outage a test causes on demand: [`Control::stop_serving`] closes
//! every connection and refuses new ones, [`Control::start_serving`] serves again on the same
//! address with the store kept.

use std::net::SocketAddr;
use std::sync::Arc;

use apiserver_double::{ApiServer, Config, Handle, TEST_CA_PEM, Tls};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::common::bounded;

async fn start(tls: Option<Tls>) -> Handle {
    bounded(
        "server start",
        ApiServer::start_with(Config {
            tls,
            ..Config::default()
        }),
    )
    .await
    .expect("server starts")
}

/// A TLS connection to `addr` trusting the test CA, offering `alpn`; and what the server chose.
async fn tls_connect(addr: SocketAddr, alpn: &[&[u8]]) -> (TlsStream<TcpStream>, Option<Vec<u8>>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(TEST_CA_PEM.as_bytes()) {
        roots.add(cert.expect("the test CA")).expect("the test CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = bounded("TCP connect", TcpStream::connect(addr))
        .await
        .expect("connect");
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let tls = bounded("TLS handshake", connector.connect(name, tcp))
        .await
        .expect("the double's certificate is the test CA's, for 127.0.0.1");
    let chosen = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    (tls, chosen)
}

/// One HTTP connection of either version.
enum Conn {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Conn {
    /// HTTP/2 over `io` if `h2` (TLS chose it), else HTTP/1.1.
    async fn over<I>(io: I, h2: bool) -> Conn
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        if h2 {
            let (sender, conn) = bounded(
                "h2 handshake",
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io),
            )
            .await
            .expect("h2 handshake");
            tokio::spawn(conn);
            Conn::H2(sender)
        } else {
            let (sender, conn) = bounded("h1 handshake", hyper::client::conn::http1::handshake(io))
                .await
                .expect("h1 handshake");
            tokio::spawn(conn);
            Conn::H1(sender)
        }
    }

    async fn get(&mut self, addr: SocketAddr, path: &str) -> Response<Incoming> {
        let req = Request::get(format!("https://{addr}{path}"))
            .header("accept", "application/json")
            .body(Empty::new())
            .expect("request");
        bounded(&format!("GET {path}"), async {
            match self {
                Conn::H1(s) => {
                    s.ready().await.expect("h1 ready");
                    let mut req = req;
                    *req.uri_mut() = path.parse().expect("path");
                    req.headers_mut()
                        .insert("host", addr.to_string().parse().expect("host"));
                    s.send_request(req).await
                }
                Conn::H2(s) => {
                    s.ready().await.expect("h2 ready");
                    s.send_request(req).await
                }
            }
        })
        .await
        .expect("an answer")
    }
}

async fn json_of(resp: Response<Incoming>) -> Value {
    let bytes = bounded("the body", resp.into_body().collect())
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&bytes).expect("JSON")
}

/// Reads one watch event (a JSON line) from `body`; `None` when the stream ends or breaks.
async fn next_event(body: &mut Incoming, buf: &mut Vec<u8>) -> Option<Value> {
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return Some(serde_json::from_slice(&line).expect("a watch line is JSON"));
        }
        let frame = body.frame().await?.ok()?;
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
        }
    }
}

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"},
           "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]}})
}

#[tokio::test]
async fn a_tls_double_speaks_http2_to_a_client_offering_it_and_http1_to_one_that_does_not() {
    let api = start(Some(Tls::test_ca())).await;
    assert_eq!(api.url(), format!("https://{}", api.addr()));
    // offered by the client, chosen by the server, the version of the answer
    type Case = (&'static [&'static [u8]], Option<&'static [u8]>, Version);
    let cases: [Case; 3] = [
        (&[b"h2", b"http/1.1"], Some(b"h2"), Version::HTTP_2),
        (&[b"http/1.1"], Some(b"http/1.1"), Version::HTTP_11),
        (&[], None, Version::HTTP_11),
    ];
    for (offered, want, version) in cases {
        let (tls, chosen) = tls_connect(api.addr(), offered).await;
        assert_eq!(chosen.as_deref(), want, "offered {offered:?}");
        let mut conn = Conn::over(tls, chosen.as_deref() == Some(&b"h2"[..])).await;
        let resp = conn
            .get(api.addr(), "/api/v1/namespaces/default/pods")
            .await;
        assert_eq!(resp.status(), 200, "offered {offered:?}");
        assert_eq!(resp.version(), version, "offered {offered:?}");
        assert_eq!(json_of(resp).await["kind"], "PodList");
    }
}

#[tokio::test]
async fn a_double_serving_tls_without_http2_answers_http1_to_a_client_offering_h2() {
    let api = start(Some(Tls::test_ca_http1_only())).await;
    let (tls, chosen) = tls_connect(api.addr(), &[b"h2", b"http/1.1"]).await;
    assert_eq!(chosen.as_deref(), Some(&b"http/1.1"[..]));
    let mut conn = Conn::over(tls, chosen.as_deref() == Some(&b"h2"[..])).await;
    let resp = conn.get(api.addr(), "/version").await;
    assert_eq!(resp.version(), Version::HTTP_11);
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn watches_stream_over_one_http2_connection_as_over_http1() {
    let api = start(Some(Tls::test_ca())).await;
    let (tls, chosen) = tls_connect(api.addr(), &[b"h2", b"http/1.1"]).await;
    let mut conn = Conn::over(tls, chosen.as_deref() == Some(&b"h2"[..])).await;
    let paths = [
        "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-a",
        "/api/v1/namespaces/default/pods?watch=1",
        "/api/v1/namespaces?watch=true",
    ];
    let mut watches = Vec::new();
    for path in paths {
        let resp = conn.get(api.addr(), path).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert_eq!(resp.version(), Version::HTTP_2, "{path}");
        let mut body = resp.into_body();
        let mut buf = Vec::new();
        // the current objects first: drain them up to the namespace list's last one
        if path.starts_with("/api/v1/namespaces?") {
            for _ in 0..4 {
                let e = bounded("an initial namespace", next_event(&mut body, &mut buf)).await;
                assert_eq!(e.expect("an event")["type"], "ADDED");
            }
        }
        watches.push((path, body, buf));
    }
    // each watch is counted before its answer's head is sent
    assert_eq!(api.open_watches(), 3);
    assert_eq!(api.open_connections(), 1, "every watch on one connection");

    api.create("pods", pod("web-0")).expect("pod");
    api.create("namespaces", json!({"metadata": {"name": "team-a"}}))
        .expect("namespace");
    for (path, body, buf) in &mut watches {
        let event = bounded(&format!("an event on {path}"), next_event(body, buf))
            .await
            .unwrap_or_else(|| panic!("{path} ended"));
        assert_eq!(event["type"], "ADDED", "{path}");
        let want = if path.starts_with("/api/v1/namespaces?") {
            "team-a"
        } else {
            "web-0"
        };
        assert_eq!(event["object"]["metadata"]["name"], want, "{path}");
    }
}

/// An open watch and the connection it came on.
struct OpenWatch {
    body: Incoming,
    buf: Vec<u8>,
    _conn: Conn,
}

impl OpenWatch {
    /// Opens `path` as a watch: over TLS with HTTP/2 when `tls`, else plain HTTP/1.1.
    async fn open(addr: SocketAddr, tls: bool, path: &str) -> OpenWatch {
        let mut conn = if tls {
            let (stream, chosen) = tls_connect(addr, &[b"h2", b"http/1.1"]).await;
            assert_eq!(chosen.as_deref(), Some(&b"h2"[..]));
            Conn::over(stream, true).await
        } else {
            let tcp = bounded("TCP connect", TcpStream::connect(addr))
                .await
                .expect("connect");
            Conn::over(tcp, false).await
        };
        let resp = conn.get(addr, path).await;
        assert_eq!(resp.status(), 200, "{path}");
        OpenWatch {
            body: resp.into_body(),
            buf: Vec::new(),
            _conn: conn,
        }
    }

    /// The next event, `None` once the stream ended or broke.
    async fn next(&mut self, what: &str) -> Option<Value> {
        bounded(what, next_event(&mut self.body, &mut self.buf)).await
    }
}

#[tokio::test]
async fn stopping_closes_every_connection_and_refuses_new_ones_and_serving_again_keeps_the_store() {
    for tls in [false, true] {
        let what = if tls {
            "TLS and HTTP/2"
        } else {
            "plain HTTP/1.1"
        };
        let api = start(tls.then(Tls::test_ca)).await;
        let addr = api.addr();
        api.create("pods", pod("before")).expect("pod");
        let rv_before_outage = api.resource_version();
        let mut watch = OpenWatch::open(addr, tls, "/api/v1/pods?watch=true").await;
        let first = watch.next("the existing pod").await.expect("an event");
        assert_eq!(first["object"]["metadata"]["name"], "before", "{what}");

        bounded("stopping", api.stop_serving()).await;
        assert_eq!(
            watch.next("the watch to end").await,
            None,
            "{what}: the watch ends"
        );
        assert_eq!(api.open_connections(), 0, "{what}: every connection closed");
        let refused = bounded("a refused connect", TcpStream::connect(addr)).await;
        assert_eq!(
            refused.expect_err("nothing listens").kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{what}"
        );

        // the control API works meanwhile; the server holds it when it serves again
        api.create("pods", pod("during"))
            .expect("a pod created while stopped");
        bounded("serving again", api.start_serving())
            .await
            .expect("the same address is bound again");
        assert_eq!(api.addr(), addr);
        // a watch resumed from before the outage gets what happened during it
        let path = format!("/api/v1/pods?watch=true&resourceVersion={rv_before_outage}");
        let mut resumed = OpenWatch::open(addr, tls, &path).await;
        let event = resumed.next("the replayed event").await.expect("an event");
        assert_eq!(event["type"], "ADDED", "{what}");
        assert_eq!(event["object"]["metadata"]["name"], "during", "{what}");
        assert_eq!(api.open_connections(), 1, "{what}");
    }
}

#[tokio::test]
async fn the_kubeconfig_of_a_tls_double_names_an_https_server_and_carries_the_ca() {
    use base64::Engine as _;
    let api = start(Some(Tls::test_ca())).await;
    let kubeconfig = api.kubeconfig();
    assert!(
        kubeconfig.contains(&format!("    server: https://{}\n", api.addr())),
        "{kubeconfig}"
    );
    let ca = base64::engine::general_purpose::STANDARD.encode(TEST_CA_PEM);
    assert!(
        kubeconfig.contains(&format!("    certificate-authority-data: {ca}\n")),
        "{kubeconfig}"
    );
    let plain = start(None).await;
    assert!(!plain.kubeconfig().contains("certificate-authority"));
}
