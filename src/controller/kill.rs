//! Stopping a container the way the kubelet kills one: its preStop hook, then `StopContainer`
//! with what is left of the grace period, at least 2 s. The one way kruised kills a container:
//! container meta takes hook and grace from the kubelet's CRI annotations
//! ([`KillSpec::from_kubelet_annotations`]), recreate requests from the request.
//! Hooks have the kubelet's meaning (`pkg/kubelet/lifecycle`): an exec hook must exit 0; an
//! HTTP hook succeeds on any answer (the status is not looked at), HTTPS without certificate
//! checks and, when the server answers the handshake in plain HTTP, again over HTTP; a TCP hook
//! must connect. Better than kruise-daemon: HTTP hooks reach the pod IP from `PodSandboxStatus`
//! (kruise has none and fails them), and TCP hooks are supported (kruise #2505). HTTP and TCP
//! hooks go to the pod's own IPs only ([`PodIps`]: a host-network pod's is its status IP, as
//! the kubelet's; a `host` naming anything else fails the hook, saying why), and what a failing
//! exec hook wrote to stderr is kept to its first [`STDERR_LIMIT`] bytes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, LifecycleHandler, ObjectReference};
use tokio::time::Instant;

use crate::controller::httpget::{self, Action, Get, GetError, join_host_port};
use crate::controller::target::{PodIps, TargetError};
use crate::cri::{Container, CriError, RuntimeService};
use crate::k8s::keys;
use crate::k8s::write::{EventSink, EventSpec};

/// The reason of the event recorded as a container is stopped (the kubelet's).
pub const REASON_KILLING: &str = "Killing";
/// The reason of the warning recorded when a container's preStop hook failed (the kubelet's).
pub const REASON_FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";

/// The `User-Agent` of HTTP hooks (the kubelet's `kube-lifecycle/<version>`).
pub const HOOK_USER_AGENT: &str = "kube-lifecycle/1.36";

/// How much of a failed exec hook's stderr is kept for its event and log line.
pub const STDERR_LIMIT: usize = 512;

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

/// Why a preStop hook failed (the container is stopped all the same).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The runtime could not run the command.
    #[error("exec hook: {0}")]
    Exec(CriError),
    /// The command ran and failed.
    #[error("exec hook exited with {code}: {stderr}")]
    Exited {
        /// Its exit code.
        code: i32,
        /// The start of its stderr.
        stderr: String,
    },
    /// No HTTP answer.
    #[error("http hook: {0}")]
    Http(GetError),
    /// No TCP connection.
    #[error("tcp hook: dial tcp {addr}: {source}")]
    Tcp {
        /// `host:port`.
        addr: String,
        /// The socket's error.
        source: std::io::Error,
    },
    /// The grace period ended first.
    #[error("preStop hook did not finish within {0:?}")]
    TimedOut(Duration),
    /// The hook names a host that is not the pod's, the pod has no IP, or the hook's port is
    /// no port of the container.
    #[error("preStop hook: {0}")]
    Target(#[from] TargetError),
    /// A handler without an action.
    #[error("preStop handler names no action")]
    NoAction,
}

/// What happened when a container was stopped.
#[derive(Debug)]
pub struct KillOutcome {
    /// The preStop hook's result, if the container has one.
    pub pre_stop: Option<Result<(), HookError>>,
    /// The grace period given to `StopContainer`.
    pub grace: Duration,
}

impl KillOutcome {
    /// The `FailedPreStopHook` warning about `container` when its hook failed (the container
    /// was stopped all the same, as by the kubelet), logged as it is returned.
    fn failed_hook_event(&self, regarding: &ObjectReference, container: &str) -> Option<EventSpec> {
        let Some(Err(hook)) = &self.pre_stop else {
            return None;
        };
        tracing::warn!(%container, error = %hook, "preStop hook failed; the container was stopped all the same");
        Some(EventSpec {
            regarding: regarding.clone(),
            warning: true,
            reason: REASON_FAILED_PRE_STOP_HOOK.into(),
            note: format!("preStop hook of {container} failed: {hook}"),
            action: "PreStop".into(),
        })
    }
}

/// The grace period the kubelet would use, from the container's annotations: the pod's
/// deletion grace period if it is being deleted, else its termination grace period, else 2 s;
/// at most [`MAX_API_DURATION`](crate::k8s::crd::MAX_API_DURATION) (the pod's author writes it,
/// up to the int64 maximum).
pub fn grace_period(c: &Container) -> Duration {
    let secs = [
        keys::KUBELET_POD_DELETION_GRACE,
        keys::KUBELET_POD_TERMINATION_GRACE,
    ]
    .iter()
    .find_map(|k| c.annotations.get(*k).and_then(|v| v.parse::<i64>().ok()));
    secs.map_or(MIN_GRACE, crate::k8s::crd::api_seconds)
}

/// The IPs HTTP and TCP hooks of a container in sandbox `sandbox_id` may reach: the sandbox's
/// (asked of the runtime) and the pod's `status.podIPs`. Asked only when the container has a
/// hook: no extra call on the hot path otherwise.
pub async fn pod_ips<R: RuntimeService>(
    runtime: &R,
    sandbox_id: &str,
    has_hook: bool,
    status_ips: &[String],
) -> PodIps {
    if !has_hook {
        return PodIps::default();
    }
    let sandbox = runtime.pod_sandbox_status(sandbox_id, false).await.ok();
    PodIps::of(sandbox.as_ref(), status_ips)
}

/// A reference to container `name` of the pod `pod` refers to: what the kubelet's events
/// about a container name (`spec.containers{name}`).
pub fn container_ref(pod: &ObjectReference, name: &str) -> ObjectReference {
    ObjectReference {
        field_path: Some(format!("spec.containers{{{name}}}")),
        ..pod.clone()
    }
}

/// How a stop is told in its `Killing` event: who asked and why.
#[derive(Clone, Debug)]
pub struct Announcement {
    /// The container, in its pod ([`container_ref`]).
    pub regarding: ObjectReference,
    /// The container's name.
    pub container: String,
    /// The event's note.
    pub note: String,
    /// Whether the event is a warning.
    pub warning: bool,
    /// The event's action (`Restart`, `Recreate`).
    pub action: &'static str,
}

/// The one way a controller stops a container: the pod's IPs found where its hook needs them
/// ([`pod_ips`]; `status_ips`, the pod's status IPs), the `Killing` event recorded, the kill
/// made ([`kill_container`]), and a failed preStop hook reported in a `FailedPreStopHook`
/// warning (the container stopped all the same).
pub async fn kill_announced<R: RuntimeService>(
    runtime: &R,
    c: &Container,
    spec: &KillSpec,
    status_ips: &[String],
    cancel: &tokio_util::sync::CancellationToken,
    events: &EventSink,
    announcement: Announcement,
) -> Result<KillOutcome, KillError> {
    let ips = pod_ips(
        runtime,
        &c.pod_sandbox_id,
        spec.pre_stop.is_some(),
        status_ips,
    )
    .await;
    let Announcement {
        regarding,
        container,
        note,
        warning,
        action,
    } = announcement;
    events.record(EventSpec {
        regarding: regarding.clone(),
        warning,
        reason: REASON_KILLING.into(),
        note,
        action: action.into(),
    });
    let outcome = kill_container(runtime, c, spec, &ips, cancel).await?;
    if let Some(event) = outcome.failed_hook_event(&regarding, &container) {
        events.record(event);
    }
    Ok(outcome)
}

/// Runs the preStop hook of `spec` (if any), then stops `c`. HTTP and TCP hooks go to `ips`
/// (the pod's). A failing hook does not prevent the stop, as with the kubelet. `cancel` calls
/// the kill off while the hook runs (no stop then).
pub async fn kill_container<R: RuntimeService>(
    runtime: &R,
    c: &Container,
    spec: &KillSpec,
    ips: &PodIps,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<KillOutcome, KillError> {
    let mut grace = spec.grace;
    let pre_stop = match &spec.pre_stop {
        Some(h) => {
            let started = Instant::now();
            let hook =
                tokio::time::timeout(grace, run_hook(runtime, c, h, &spec.ports, ips, grace));
            let result = tokio::select! {
                () = cancel.cancelled() => return Err(KillError::Cancelled),
                r = hook => r.unwrap_or(Err(HookError::TimedOut(grace))),
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
    ips: &PodIps,
    grace: Duration,
) -> Result<(), HookError> {
    if let Some(exec) = &h.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let out = runtime
            .exec_sync(&c.id, cmd, grace)
            .await
            .map_err(HookError::Exec)?;
        return if out.exit_code == 0 {
            Ok(())
        } else {
            Err(HookError::Exited {
                code: out.exit_code,
                stderr: crate::controller::text::bounded_text(&out.stderr, STDERR_LIMIT),
            })
        };
    }
    if let Some(http) = &h.http_get {
        let (host, port) = ips.address(http.host.as_deref(), &http.port, ports)?;
        let action = Action::of(http);
        let req = action.request(&host, port, HOOK_USER_AGENT);
        return http_hook(&req).await;
    }
    if let Some(tcp) = &h.tcp_socket {
        let (host, port) = ips.address(tcp.host.as_deref(), &tcp.port, ports)?;
        let addr = join_host_port(&host, port);
        return tokio::net::TcpStream::connect(&addr)
            .await
            .map(drop)
            .map_err(|source| HookError::Tcp { addr, source });
    }
    if let Some(sleep) = &h.sleep {
        let secs = u64::try_from(sleep.seconds).unwrap_or(0);
        tokio::time::sleep(Duration::from_secs(secs)).await;
        return Ok(());
    }
    Err(HookError::NoAction)
}

/// An HTTP hook: any answer will do, as with the kubelet; an HTTPS hook whose server answers
/// in plain HTTP is sent again over HTTP (the kubelet's fallback, without the
/// `Authorization` header).
async fn http_hook(req: &Get<'_>) -> Result<(), HookError> {
    match httpget::get(req).await {
        Ok(_) => Ok(()),
        Err(e) if req.https && e.kind.is_http_answer_to_https() => {
            let headers: Vec<(String, String)> = req
                .headers
                .iter()
                .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
                .cloned()
                .collect();
            let plain = Get {
                https: false,
                headers: &headers,
                ..*req
            };
            httpget::get(&plain)
                .await
                .map(drop)
                .map_err(HookError::Http)
        }
        Err(e) => Err(HookError::Http(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{ContainerMetadata, ContainerState, StringMap};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    #[tokio::test]
    async fn an_http_hook_succeeds_on_any_answer_as_the_kubelets() {
        for status in ["204 No Content", "503 Unavailable"] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            let server = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 1024];
                let n = s.read(&mut buf).await.unwrap();
                s.write_all(answer.as_bytes()).await.unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            });
            let headers = [("X-Why".to_string(), "restart".to_string())];
            let req = Get {
                host: "127.0.0.1",
                port,
                https: false,
                path: "/quit",
                headers: &headers,
                user_agent: HOOK_USER_AGENT,
            };
            let r = tokio::time::timeout(Duration::from_secs(5), http_hook(&req))
                .await
                .expect("hook hung");
            assert!(r.is_ok(), "{status}: {r:?}");
            let sent = server.await.unwrap();
            assert!(sent.starts_with("GET /quit HTTP/1.1\r\n"), "{sent}");
            assert!(sent.contains("X-Why: restart"), "{sent}");
            assert!(sent.contains("User-Agent: kube-lifecycle/1.36"), "{sent}");
        }
    }

    #[tokio::test]
    async fn an_https_hook_on_a_plain_http_server_is_sent_again_over_http_without_authorization() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 2048];
                let n = s.read(&mut buf).await.unwrap();
                seen.push(buf[..n].to_vec());
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await
                    .unwrap();
            }
            seen
        });
        let headers = [("Authorization".to_string(), "Bearer x".to_string())];
        let req = Get {
            host: "127.0.0.1",
            port,
            https: true,
            path: "/",
            headers: &headers,
            user_agent: HOOK_USER_AGENT,
        };
        let r = tokio::time::timeout(Duration::from_secs(5), http_hook(&req))
            .await
            .expect("hook hung");
        assert!(r.is_ok(), "{r:?}");
        let seen = server.await.unwrap();
        assert_eq!(seen[0][0], 0x16, "first a TLS handshake record");
        let plain = String::from_utf8_lossy(&seen[1]);
        assert!(plain.starts_with("GET / HTTP/1.1\r\n"), "{plain}");
        assert!(!plain.contains("Authorization"), "{plain}");
    }

    #[tokio::test]
    async fn an_http_hook_with_no_answer_fails_with_the_url() {
        let port = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let req = Get {
            host: "127.0.0.1",
            port,
            https: false,
            path: "/quit",
            headers: &[],
            user_agent: HOOK_USER_AGENT,
        };
        let e = http_hook(&req).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "http hook: Get \"http://127.0.0.1:{port}/quit\": dial tcp"
            )),
            "{text}"
        );
    }
}
