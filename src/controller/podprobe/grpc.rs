//! The gRPC health check of gRPC probes (`grpc.health.v1.Health/Check`), with the kubelet's
//! messages (`pkg/probe/grpc`): plain text (no TLS), dial and call within the probe timeout.

use std::time::Duration;

/// Why a health check did not pass: the kubelet's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailed(String);

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    /// The service to check; empty: the server as a whole.
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    /// `ServingStatus`: 0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN.
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// The name of a `ServingStatus`.
fn status_name(s: i32) -> &'static str {
    match s {
        1 => "SERVING",
        2 => "NOT_SERVING",
        3 => "SERVICE_UNKNOWN",
        _ => "UNKNOWN",
    }
}

/// What a healthy server's check says.
pub const HEALTHY: &str = "service healthy";

/// Checks `service` at `addr` (`host:port`), calling as `user_agent`: `Ok` when it is serving.
pub async fn check(
    addr: &str,
    service: &str,
    timeout: Duration,
    user_agent: &str,
) -> Result<(), CheckFailed> {
    let failed = |message: String| Err(CheckFailed(message));
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => {
            return failed(format!("error: failed to connect service at {addr:?}: {e}"));
        }
    };
    let endpoint = match endpoint.user_agent(user_agent.to_string()) {
        Ok(e) => e,
        Err(e) => {
            return failed(format!("error: failed to connect service at {addr:?}: {e}"));
        }
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Err(_) => {
            return failed(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}"
            ));
        }
        Ok(Err(e)) => {
            return failed(format!("error: failed to connect service at {addr:?}: {e}"));
        }
        Ok(Ok(c)) => c,
    };
    let mut client = tonic::client::Grpc::new(channel);
    let call = async {
        client
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        client
            .unary::<HealthCheckRequest, HealthCheckResponse, _>(
                tonic::Request::new(HealthCheckRequest {
                    service: service.to_string(),
                }),
                http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check"),
                tonic_prost::ProstCodec::default(),
            )
            .await
    };
    match tokio::time::timeout(timeout, call).await {
        Err(_) => failed(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => failed(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            s.message()
        )),
        Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => failed(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(s)) => failed(format!("error: health rpc probe failed: {s}")),
        Ok(Ok(r)) if r.get_ref().status == 1 => Ok(()),
        Ok(Ok(r)) => failed(format!(
            "service unhealthy (responded with {:?})",
            status_name(r.get_ref().status)
        )),
    }
}
