//! Stopping a container the way the kubelet kills one: its preStop hook, then `StopContainer`
//! with what is left of the grace period, at least 2 s. The one way kruised kills a container:
//! container meta takes hook and grace from the kubelet's CRI annotations
//! ([`KillSpec::from_kubelet_annotations`]), recreate requests from the request.
//! Better than kruise-daemon: HTTP hooks reach the pod IP from `PodSandboxStatus` (kruise has
//! none and fails them), and TCP hooks are supported (kruise #2505).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::cri::{Container, CriError, RuntimeService};
use crate::k8s::keys;

/// The kubelet's floor for the time a container gets to stop.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// How to kill one container: its preStop hook, the grace period, and the ports its named
/// hook ports resolve against.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KillSpec {
    /// The preStop hook, if any.
    pub pre_stop: Option<LifecycleHandler>,
    /// The grace period (hook and stop together).
    pub grace: Duration,
    /// The container's ports, for named hook ports.
    pub ports: Vec<ContainerPort>,
}

impl KillSpec {
    /// What the kubelet recorded for `c` in its CRI annotations.
    pub fn from_kubelet_annotations(c: &Container) -> Self {
        KillSpec {
            pre_stop: c
                .annotations
                .get(keys::KUBELET_PRESTOP_HANDLER)
                .and_then(|h| serde_json::from_str::<LifecycleHandler>(h).ok()),
            grace: grace_period(c),
            ports: c
                .annotations
                .get(keys::KUBELET_CONTAINER_PORTS)
                .and_then(|p| serde_json::from_str(p).ok())
                .unwrap_or_default(),
        }
    }
}

/// Why a kill did not happen.
#[derive(Debug, thiserror::Error)]
pub enum KillError {
    /// The runtime failed the stop.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The work was called off (the request ended) before the stop.
    #[error("called off before the stop")]
    Cancelled,
}

/// What happened when a container was stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillOutcome {
    /// The preStop hook's result, if the container has one.
    pub pre_stop: Option<Result<(), String>>,
    /// The grace period given to `StopContainer`.
    pub grace: Duration,
}

/// The grace period the kubelet would use, from the container's annotations: the pod's
/// deletion grace period if it is being deleted, else its termination grace period, else 2 s.
pub fn grace_period(c: &Container) -> Duration {
    let secs = [
        keys::KUBELET_POD_DELETION_GRACE,
        keys::KUBELET_POD_TERMINATION_GRACE,
    ]
    .iter()
    .find_map(|k| c.annotations.get(*k).and_then(|v| v.parse::<u64>().ok()));
    secs.map_or(MIN_GRACE, Duration::from_secs)
}

/// Runs the preStop hook of `spec` (if any), then stops `c`. `pod_ip` is where HTTP and TCP
/// hooks without a host go. A failing hook does not prevent the stop, as with the kubelet.
/// `cancel` calls the kill off while the hook runs (no stop then).
pub async fn kill_container<R: RuntimeService>(
    runtime: &R,
    c: &Container,
    spec: &KillSpec,
    pod_ip: Option<&str>,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<KillOutcome, KillError> {
    let mut grace = spec.grace;
    let pre_stop = match &spec.pre_stop {
        Some(h) => {
            let started = Instant::now();
            let hook =
                tokio::time::timeout(grace, run_hook(runtime, c, h, &spec.ports, pod_ip, grace));
            let result = tokio::select! {
                () = cancel.cancelled() => return Err(KillError::Cancelled),
                r = hook => r.unwrap_or_else(|_| Err(format!("preStop hook did not finish within {grace:?}"))),
            };
            grace = grace.saturating_sub(started.elapsed());
            Some(result)
        }
        None => None,
    };
    if cancel.is_cancelled() {
        return Err(KillError::Cancelled);
    }
    let grace = grace.max(MIN_GRACE);
    runtime.stop_container(&c.id, grace).await?;
    Ok(KillOutcome { pre_stop, grace })
}

async fn run_hook<R: RuntimeService>(
    runtime: &R,
    c: &Container,
    h: &LifecycleHandler,
    ports: &[ContainerPort],
    pod_ip: Option<&str>,
    grace: Duration,
) -> Result<(), String> {
    if let Some(exec) = &h.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let out = runtime
            .exec_sync(&c.id, cmd, grace)
            .await
            .map_err(|e| e.to_string())?;
        return if out.exit_code == 0 {
            Ok(())
        } else {
            Err(format!(
                "exec hook exited with {}: {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        };
    }
    if let Some(http) = &h.http_get {
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .or_else(|| pod_ip.filter(|ip| !ip.is_empty()).map(str::to_string))
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let port = resolve_port(&http.port, ports)?;
        if http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https"))
        {
            return Err("HTTPS preStop hooks are not supported by kruised".into());
        }
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
        return http_get(&host, port, &path, &headers).await;
    }
    if let Some(tcp) = &h.tcp_socket {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .or_else(|| pod_ip.filter(|ip| !ip.is_empty()).map(str::to_string))
            .unwrap_or_else(|| "127.0.0.1".to_string());
        let port = resolve_port(&tcp.port, ports)?;
        return tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map(drop)
            .map_err(|e| format!("tcp {host}:{port}: {e}"));
    }
    if let Some(sleep) = &h.sleep {
        let secs = u64::try_from(sleep.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        return Ok(());
    }
    Err("preStop handler names no action".into())
}

/// A port number, or a named port looked up in the container's ports.
fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port {n}")),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("named port {name:?} not found in the container's ports"))
        }
    }
}

/// A minimal HTTP/1.1 GET: success on 2xx and 3xx, as the kubelet's handler.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<(), String> {
    let target = format!("{host}:{port}");
    let mut s = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("http {target}{path}: {e}"))?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: kruised\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("http {target}{path}: {e}"))?;
    let mut head = vec![0u8; 64];
    let n = s
        .read(&mut head)
        .await
        .map_err(|e| format!("http {target}{path}: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("http {target}{path}: no HTTP status in the answer"))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("http {target}{path}: status {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{ContainerMetadata, ContainerState, StringMap};

    fn container(annotations: &[(&str, &str)]) -> Container {
        Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            },
            image: String::new(),
            image_ref: String::new(),
            state: ContainerState::Running,
            created_at: 0,
            labels: StringMap::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            image_id: String::new(),
            image_spec: Default::default(),
        }
    }

    #[test]
    fn grace_comes_from_deletion_then_termination_grace_then_two_seconds() {
        assert_eq!(grace_period(&container(&[])), MIN_GRACE);
        let c = container(&[(keys::KUBELET_POD_TERMINATION_GRACE, "30")]);
        assert_eq!(grace_period(&c), Duration::from_secs(30));
        let c = container(&[
            (keys::KUBELET_POD_TERMINATION_GRACE, "30"),
            (keys::KUBELET_POD_DELETION_GRACE, "5"),
        ]);
        assert_eq!(grace_period(&c), Duration::from_secs(5));
    }

    #[test]
    fn named_ports_resolve_from_the_kubelets_ports_annotation() {
        let c = container(&[(
            keys::KUBELET_CONTAINER_PORTS,
            r#"[{"name":"http","containerPort":8080,"protocol":"TCP"}]"#,
        )]);
        let ports = KillSpec::from_kubelet_annotations(&c).ports;
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &ports),
            Ok(8080)
        );
        assert_eq!(resolve_port(&IntOrString::Int(81), &ports), Ok(81));
        assert!(resolve_port(&IntOrString::String("grpc".into()), &ports).is_err());
        assert!(resolve_port(&IntOrString::Int(70000), &ports).is_err());
    }

    #[tokio::test]
    async fn http_hook_succeeds_on_2xx_and_fails_on_5xx() {
        for (status, ok) in [("204 No Content", true), ("503 Unavailable", false)] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            });
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                http_get(
                    "127.0.0.1",
                    port,
                    "/quit",
                    &[("X-Why".into(), "restart".into())],
                ),
            )
            .await
            .expect("hook hung");
            assert_eq!(r.is_ok(), ok, "{status}: {r:?}");
            let req = server.await.unwrap();
            assert!(req.starts_with("GET /quit HTTP/1.1\r\n"), "{req}");
            assert!(req.contains("X-Why: restart"), "{req}");
        }
    }
}
