//! Running one probe, with the kubelet's semantics (`pkg/probe/{exec,http,tcp,grpc}`): exec
//! through CRI `ExecSync` (exit 0 succeeds; the output is the message), HTTP GET (2xx and 3xx
//! succeed, `User-Agent: kube-probe/<version>`; the GET itself is [`httpget`], which preStop
//! hooks share), TCP connect, and the gRPC health check
//! (`grpc.health.v1.Health/Check`, which kruise-daemon lacks).
//!
//! Network probes go to the pod's own IPs only ([`PodIps`]): a `host` naming anything else fails
//! the probe, saying why. An HTTP answer's body is never the message (the kubelet reports none;
//! kruise-daemon reported it, which let a probe read a node-local service's answer back into a
//! status its author reads).

use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::controller::httpget::{self, Action, Get, join_host_port};
use crate::controller::target::PodIps;
use crate::cri::{CriError, RuntimeService};

/// The longest message kept (kruise's limit), cut at a character boundary.
pub const MESSAGE_LIMIT: usize = 1024;
/// How much of exec output is read (the kubelet's limit, as for HTTP bodies).
const OUTPUT_LIMIT: usize = httpget::BODY_LIMIT;
/// What one network probe holds of its target's answer at most: an HTTP answer's head and body
/// as read ([`httpget::HEAD_LIMIT`] + [`httpget::BODY_LIMIT`]), its read buffer and TLS's
/// records; a gRPC check's HTTP/2 windows, headers and message ([`super::grpc`]). With
/// [`super::slots::NETWORK`]'s 64 probes at once: 8 MiB on the node, whatever the tenants' probes.
pub const NETWORK_PROBE_MEMORY: usize = 128 * 1024;
/// The User-Agent of HTTP probes and gRPC checks.
pub const USER_AGENT: &str = "kube-probe/1.36";

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

/// Where a network probe goes: the pod's IP it names (or its primary one) and its port, a
/// number (kruise-manager resolved the names). A host that is not the pod's fails the probe; a
/// port that is no port keeps it from running.
fn target(ips: &PodIps, host: Option<&str>, port: &IntOrString) -> Result<(String, u16), Outcome> {
    ips.address(host, port, &[]).map_err(|e| {
        if e.is_port() {
            Outcome::Error(e.to_string())
        } else {
            Outcome::Failure(e.to_string())
        }
    })
}

/// Runs `probe` against container `id` of a pod at `ips`, within `timeout`.
pub async fn run<R: RuntimeService>(
    runtime: &R,
    probe: &Probe,
    container_id: &str,
    ips: &PodIps,
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
            // a container that writes more than the daemon takes from an exec (1 MiB), or
            // than the runtime sends (containerd: 16 MiB): the probe fails, saying so (gRPC
            // refused the answer on one side or the other; nothing of it is kept)
            Ok(Err(e))
                if ["message length too large", "larger than max"]
                    .iter()
                    .any(|w| e.to_string().contains(w)) =>
            {
                Outcome::Failure(format!("the command's output is too large: {e}"))
            }
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
        let (host, port) = match target(ips, http.host.as_deref(), &http.port) {
            Ok(a) => a,
            Err(o) => return o,
        };
        let action = Action::of(http);
        let req = action.request(&host, port, USER_AGENT);
        return match tokio::time::timeout(timeout, http_probe(&req)).await {
            Ok(o) => o,
            Err(_) => Outcome::Failure(format!(
                "Get \"{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                req.url(&action.path)
            )),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let (host, port) = match target(ips, tcp.host.as_deref(), &tcp.port) {
            Ok(a) => a,
            Err(o) => return o,
        };
        let addr = join_host_port(&host, port);
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => Outcome::Success(String::new()),
            Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
            Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
        };
    }
    if let Some(grpc) = &probe.grpc {
        let (host, port) = match target(ips, None, &IntOrString::Int(grpc.port)) {
            Ok(a) => a,
            Err(o) => return o,
        };
        let service = grpc.service.clone().unwrap_or_default();
        let addr = join_host_port(&host, port);
        return match super::grpc::check(&addr, &service, timeout, USER_AGENT).await {
            Ok(()) => Outcome::Success(super::grpc::HEALTHY.into()),
            Err(e) => Outcome::Failure(e.to_string()),
        };
    }
    Outcome::Error("missing probe handler".into())
}

/// An HTTP GET with a probe's meaning: 2xx and 3xx succeed. The body is not reported.
async fn http_probe(req: &Get<'_>) -> Outcome {
    match httpget::get(req).await {
        Ok(a) if (200..300).contains(&a.status) => Outcome::Success(String::new()),
        Ok(a) if (300..400).contains(&a.status) => {
            Outcome::Success("Probe terminated redirects".into())
        }
        Ok(a) => Outcome::Failure(format!("HTTP probe failed with statuscode: {}", a.status)),
        Err(e) => Outcome::Failure(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn messages_are_cut_at_1024_bytes_on_a_character_boundary() {
        assert_eq!(truncate("ok"), "ok");
        let long = "é".repeat(600); // 1200 bytes
        let cut = truncate(&long);
        assert!(cut.len() <= MESSAGE_LIMIT && cut.len() >= MESSAGE_LIMIT - 1);
        assert!(cut.chars().all(|c| c == 'é'));
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
    async fn http_2xx_succeeds_without_its_body_and_5xx_fails_with_the_code() {
        let rt = crate::cri::fake::FakeRuntime::start(
            &tempfile::tempdir().unwrap().path().join("cri.sock"),
            "containerd",
        )
        .await
        .unwrap();
        let client = crate::cri::RemoteRuntime::new(rt.endpoint(), None, Default::default());
        let ok = serve("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret").await;
        let bad = serve("HTTP/1.1 503 Unavailable\r\nContent-Length: 0\r\n\r\n").await;
        let t = Duration::from_secs(5);
        let pod = PodIps::new(["127.0.0.1"]);
        // the body is what the server said: the kubelet reports none, and neither does kruised
        // (2c6dc4e put it in the NodePodProbe status, then the pod's condition)
        assert_eq!(
            run(&client, &http_probe_on(ok, "/healthz"), "c", &pod, t).await,
            Outcome::Success(String::new())
        );
        assert_eq!(
            run(&client, &http_probe_on(bad, "/"), "c", &pod, t).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        let tcp: Probe =
            serde_json::from_value(serde_json::json!({"tcpSocket": {"port": ok}})).unwrap();
        assert_eq!(
            run(&client, &tcp, "c", &pod, t).await,
            Outcome::Success(String::new())
        );
        let none: Probe = serde_json::from_value(serde_json::json!({"periodSeconds": 1})).unwrap();
        assert!(matches!(
            run(&client, &none, "c", &pod, t).await,
            Outcome::Error(_)
        ));
    }

    #[tokio::test]
    async fn a_probe_naming_another_host_fails_without_dialling_it() {
        // a PodProbeMarker's httpGet.host / tcpSocket.host, passed on by a manager older than
        // kruise #2309: the node's loopback here stands for any address the node reaches
        let rt = crate::cri::fake::FakeRuntime::start(
            &tempfile::tempdir().unwrap().path().join("cri.sock"),
            "containerd",
        )
        .await
        .unwrap();
        let client = crate::cri::RemoteRuntime::new(rt.endpoint(), None, Default::default());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let pod = PodIps::new(["10.0.0.5"]);
        let t = Duration::from_secs(5);
        for probe in [
            serde_json::json!({"httpGet": {"host": "127.0.0.1", "port": port, "path": "/"}}),
            serde_json::json!({"tcpSocket": {"host": "127.0.0.1", "port": port}}),
            serde_json::json!({"httpGet": {"host": "169.254.169.254", "port": 80}}),
        ] {
            let probe: Probe = serde_json::from_value(probe).unwrap();
            match run(&client, &probe, "c", &pod, t).await {
                Outcome::Failure(m) => assert!(m.contains("is not the pod's"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        // nothing reached the listener: a dial would have left a connection in its backlog
        use futures::FutureExt as _;
        assert!(
            l.accept().now_or_never().is_none(),
            "a connection reached {port}"
        );
    }
}
