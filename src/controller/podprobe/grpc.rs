//! The gRPC health check of gRPC probes (`grpc.health.v1.Health/Check`), with the kubelet's
//! messages (`pkg/probe/grpc`): plain text (no TLS), dial and call within the probe timeout.
//!
//! What the tenant's server sends is held within bounds: HTTP/2 flow-control windows of
//! [`WINDOW`] for the stream and the connection (hyper's defaults, 2 and 5 MiB, let a server
//! have that much buffered in kruised), headers of at most [`HEADER_LIMIT`], and an answer
//! message of at most [`ANSWER_LIMIT`] (tonic's default, 4 MiB; a health answer is a few bytes).

use std::time::Duration;

/// HTTP/2 flow-control window of the stream and of the connection: what the server may send
/// before kruised reads it (HTTP/2's initial window).
pub const WINDOW: u32 = 65_535;
/// The largest header list taken from the server (hyper's default, said here).
pub const HEADER_LIMIT: u32 = 16 * 1024;
/// The largest answer message decoded: a health answer is a few bytes.
pub const ANSWER_LIMIT: usize = 16 * 1024;

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
        Ok(e) => e
            .connect_timeout(timeout)
            .timeout(timeout)
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .http2_max_header_list_size(HEADER_LIMIT),
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
    // the runtime's connector (`cri::dial`): tonic's channel compiled once for both
    let dial = crate::cri::dial::Dial::Tcp(addr.to_string());
    let channel = match tokio::time::timeout(timeout, endpoint.connect_with_connector(dial)).await {
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
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(ANSWER_LIMIT);
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

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::{Bytes, Frame};

    /// A health answer padded with an unknown field: any size a server may send.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PaddedAnswer {
        #[prost(int32, tag = "1")]
        status: i32,
        #[prost(bytes = "vec", tag = "2")]
        padding: Vec<u8>,
    }

    /// A gRPC server on loopback answering every health check SERVING, padded to `padding`
    /// bytes; its port.
    async fn serve_health(padding: usize) -> u16 {
        let answer = prost::Message::encode_to_vec(&PaddedAnswer {
            status: 1,
            padding: vec![b'x'; padding],
        });
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(answer.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&answer);
        let framed = Bytes::from(framed);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let framed = framed.clone();
                let service = hyper::service::service_fn(move |_req| {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    let frames = futures::stream::iter([
                        Ok::<_, std::convert::Infallible>(Frame::data(framed.clone())),
                        Ok(Frame::trailers(trailers)),
                    ]);
                    let body = http_body_util::StreamBody::new(frames);
                    let answer = http::Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body);
                    async move { answer }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(s), service),
                );
            }
        });
        port
    }

    #[tokio::test]
    async fn a_grpc_target_answering_a_mebibyte_is_refused_at_the_answer_limit_not_decoded() {
        // issue 43, row 3: tonic's default decode limit let each gRPC probe hold a 4 MiB answer
        // (and hyper's windows 2 MiB a stream), against the DaemonSet's 128 MiB
        let t = Duration::from_secs(10);
        let fine = serve_health(16).await;
        assert_eq!(
            check(&format!("127.0.0.1:{fine}"), "", t, "kube-probe/test").await,
            Ok(()),
            "a health answer of a few bytes"
        );
        let huge = serve_health(1 << 20).await;
        let refused = check(&format!("127.0.0.1:{huge}"), "", t, "kube-probe/test")
            .await
            .expect_err("a mebibyte answer refused");
        assert!(
            refused.to_string().contains(&ANSWER_LIMIT.to_string()),
            "{refused}"
        );
    }
}
