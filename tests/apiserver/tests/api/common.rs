//! A plain hyper HTTP/1 client for driving the double over real HTTP, plus
//! fixtures. Every await is bounded by [`T`] and panics naming what hung.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use apiserver_double::{ApiServer, Config, Handle};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// Upper bound for any single await in the tests.
pub const T: Duration = Duration::from_secs(10);

/// Await `f`, panicking with `what` if it takes longer than [`T`].
pub async fn bounded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(T, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A server with a fast bookmark interval, and a client for it.
pub async fn start() -> (Handle, Client) {
    start_with(Config {
        bookmark_interval: Duration::from_millis(200),
        too_large_rv_wait: Duration::from_millis(300),
        ..Config::default()
    })
    .await
}

/// A server with explicit settings, and a client for it.
pub async fn start_with(config: Config) -> (Handle, Client) {
    let handle = bounded("server start", ApiServer::start_with(config))
        .await
        .expect("server starts");
    let client = Client {
        addr: handle.addr(),
        token: None,
    };
    (handle, client)
}

/// A response with its body parsed as JSON when possible.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
    pub body: Value,
}

/// Minimal HTTP client: one connection per request, with `Authorization: Bearer <token>`
/// when it has a token.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub addr: SocketAddr,
    pub token: Option<&'static str>,
}

async fn send(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path: &str,
    ctype: Option<&str>,
    body: Option<String>,
) -> hyper::Response<Incoming> {
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the double");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("accept", "application/json");
    if let Some(ct) = ctype {
        req = req.header("content-type", ct);
    }
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .expect("valid request");
    sender.send_request(req).await.expect("send request")
}

impl Client {
    /// The same client sending `token`.
    pub fn with_token(self, token: &'static str) -> Client {
        Client {
            token: Some(token),
            ..self
        }
    }

    /// Send a request and read the whole response.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        ctype: Option<&str>,
        body: Option<String>,
    ) -> Resp {
        let what = format!("{method} {path}");
        bounded(&what, async {
            let resp = send(self.addr, self.token, method.clone(), path, ctype, body).await;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .expect("read body")
                .to_bytes();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let body = serde_json::from_str(&text).unwrap_or(Value::Null);
            Resp {
                status,
                headers,
                text,
                body,
            }
        })
        .await
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.request(Method::GET, path, None, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Resp {
        self.request(
            Method::POST,
            path,
            Some("application/json"),
            Some(body.to_string()),
        )
        .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Resp {
        self.request(
            Method::PUT,
            path,
            Some("application/json"),
            Some(body.to_string()),
        )
        .await
    }

    pub async fn patch(&self, path: &str, ctype: &str, body: &Value) -> Resp {
        self.request(Method::PATCH, path, Some(ctype), Some(body.to_string()))
            .await
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.request(Method::DELETE, path, None, None).await
    }

    /// Open a watch; the returned stream yields events line by line.
    pub async fn watch(&self, path: &str) -> Watch {
        let resp = bounded(
            &format!("watch {path} to start"),
            send(self.addr, self.token, Method::GET, path, None, None),
        )
        .await;
        Watch {
            status: resp.status().as_u16(),
            body: resp.into_body(),
            buf: Vec::new(),
            path: path.to_string(),
        }
    }
}

/// How a watch stream ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// Terminating chunk received.
    Clean,
    /// Connection aborted mid-stream.
    Aborted,
}

/// An open watch response.
pub struct Watch {
    pub status: u16,
    body: Incoming,
    buf: Vec<u8>,
    path: String,
}

impl Watch {
    /// The next event, `Ok(None)` at a clean end, `Err(())` if aborted.
    pub async fn next_raw(&mut self) -> Result<Option<Value>, ()> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Ok(Some(
                    serde_json::from_slice(&line).expect("watch line is JSON"),
                ));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(_)) => return Err(()),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next event; panics naming `what` if none arrives in time.
    pub async fn next(&mut self, what: &str) -> Value {
        let path = self.path.clone();
        bounded(&format!("{what} on watch {path}"), self.next_raw())
            .await
            .unwrap_or_else(|_| panic!("watch {path} aborted while waiting for {what}"))
            .unwrap_or_else(|| panic!("watch {path} ended while waiting for {what}"))
    }

    /// The next event that is not a BOOKMARK.
    pub async fn next_non_bookmark(&mut self, what: &str) -> Value {
        loop {
            let ev = self.next(what).await;
            if ev["type"] != "BOOKMARK" {
                return ev;
            }
        }
    }

    /// Read until the stream ends, returning the skipped events and how it ended.
    pub async fn until_end(&mut self, what: &str) -> (Vec<Value>, End) {
        let path = self.path.clone();
        bounded(&format!("{what} on watch {path}"), async {
            let mut seen = Vec::new();
            loop {
                match self.next_raw().await {
                    Ok(Some(ev)) => seen.push(ev),
                    Ok(None) => return (seen, End::Clean),
                    Err(()) => return (seen, End::Aborted),
                }
            }
        })
        .await
    }
}

/// `(type, metadata.name)` of an event.
pub fn ev(e: &Value) -> (String, String) {
    (
        e["type"].as_str().unwrap_or_default().to_string(),
        e["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// A minimal pod.
pub fn pod(name: &str, node: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1"}]},
    })
}

/// A minimal NodeImage.
pub fn node_image(name: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "NodeImage",
        "metadata": {"name": name},
        "spec": {"images": {"nginx": {"tags": [{"tag": "1.25"}]}}},
    })
}

pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const NODEIMAGES: &str = "/apis/apps.kruise.io/v1alpha1/nodeimages";

/// `metadata.resourceVersion` as a number.
pub fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion is a string")
        .parse()
        .expect("resourceVersion is decimal")
}
