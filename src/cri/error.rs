//! Errors of the CRI client, classified so callers can tell what to do about them.

use std::time::Duration;

/// Result of a CRI call.
pub type Result<T, E = CriError> = std::result::Result<T, E>;

/// An error talking to the container runtime.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CriError {
    /// The socket is missing, refuses connections, or the runtime went away mid-call.
    #[error("runtime at {endpoint} is unreachable: {message}")]
    Unreachable {
        /// The endpoint that was dialled.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// The runtime answers, but not the CRI v1 API (`runtime.v1`), or not this call.
    #[error(
        "runtime at {endpoint} does not implement {call} of CRI v1 (too old, or CRI disabled): {message}"
    )]
    Unsupported {
        /// The endpoint that was dialled.
        endpoint: String,
        /// The RPC that was refused.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The container, sandbox or image does not exist.
    #[error("{call}: not found: {message}")]
    NotFound {
        /// The RPC that was made.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The call did not finish in time.
    #[error("{call} timed out after {after:?}")]
    Timeout {
        /// The RPC that was made.
        call: &'static str,
        /// The time allowed.
        after: Duration,
    },
    /// The runtime called the call off itself (gRPC `Cancelled` that this daemon did not ask
    /// for): containerd 2 answers so for calls that meet it while it restarts.
    #[error("{call} was called off by the runtime: {message}")]
    Interrupted {
        /// The RPC that was made.
        call: &'static str,
        /// The runtime's message.
        message: String,
    },
    /// The runtime failed the call for another reason.
    #[error("{call} failed: {code}: {message}")]
    Other {
        /// The RPC that was made.
        call: &'static str,
        /// The gRPC status code name.
        code: String,
        /// The runtime's message.
        message: String,
    },
    /// The endpoint string cannot be used.
    #[error("invalid runtime endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is refused.
        reason: String,
    },
    /// The runtime answered something that breaks the CRI contract.
    #[error("{call}: malformed response: {message}")]
    Malformed {
        /// The RPC that was made.
        call: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl CriError {
    /// Whether retrying the same call later may succeed (the runtime may come back, or a
    /// transient failure may clear). "Not found" and contract violations are final.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CriError::Unreachable { .. }
                | CriError::Timeout { .. }
                | CriError::Interrupted { .. }
                | CriError::Other { .. }
        )
    }

    /// Whether the runtime did not answer at all (its socket is missing or refuses, or it went
    /// away during the call): it is away, not refusing.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, CriError::Unreachable { .. })
    }

    /// The same error with every text in it (the runtime's message, the endpoint, the reason)
    /// passed through `f`; the kind and the call stay. For scrubbing secrets a runtime may
    /// echo back.
    pub fn map_text(self, f: impl Fn(&str) -> String) -> Self {
        match self {
            CriError::Unreachable { endpoint, message } => CriError::Unreachable {
                endpoint: f(&endpoint),
                message: f(&message),
            },
            CriError::Unsupported {
                endpoint,
                call,
                message,
            } => CriError::Unsupported {
                endpoint: f(&endpoint),
                call,
                message: f(&message),
            },
            CriError::NotFound { call, message } => CriError::NotFound {
                call,
                message: f(&message),
            },
            CriError::Timeout { call, after } => CriError::Timeout { call, after },
            CriError::Interrupted { call, message } => CriError::Interrupted {
                call,
                message: f(&message),
            },
            CriError::Other {
                call,
                code,
                message,
            } => CriError::Other {
                call,
                code,
                message: f(&message),
            },
            CriError::InvalidEndpoint { endpoint, reason } => CriError::InvalidEndpoint {
                endpoint: f(&endpoint),
                reason: f(&reason),
            },
            CriError::Malformed { call, message } => CriError::Malformed {
                call,
                message: f(&message),
            },
        }
    }

    /// Whether the object the call was about does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CriError::NotFound { .. })
    }

    pub(crate) fn from_status(endpoint: &str, call: &'static str, status: tonic::Status) -> Self {
        use tonic::Code;
        let message = status.message().to_string();
        match status.code() {
            Code::Unavailable => CriError::Unreachable {
                endpoint: endpoint.to_string(),
                message: describe_unavailable(&status),
            },
            // the connection broke during the call (the runtime crashed or restarted): tonic
            // reports that as Unknown "transport error", with the transport error as source;
            // and a runtime still starting is as good as unreachable
            Code::Unknown
                if broken_transport(&status) || super::dialect::runtime_starting(&status) =>
            {
                CriError::Unreachable {
                    endpoint: endpoint.to_string(),
                    message: describe_unavailable(&status),
                }
            }
            Code::Unimplemented => CriError::Unsupported {
                endpoint: endpoint.to_string(),
                call,
                message,
            },
            Code::NotFound => CriError::NotFound { call, message },
            Code::DeadlineExceeded => CriError::Timeout {
                call,
                after: Duration::ZERO,
            },
            // tonic's own `grpc-timeout` enforcement
            Code::Cancelled if super::dialect::deadline_expired(&status) => CriError::Timeout {
                call,
                after: Duration::ZERO,
            },
            Code::Cancelled => CriError::Interrupted { call, message },
            code => CriError::Other {
                call,
                code: format!("{code:?}"),
                message,
            },
        }
    }
}

/// Whether a status is tonic's report of a connection that failed under the call, rather
/// than the runtime's own answer.
fn broken_transport(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::transport::Error>() || err.is::<hyper::Error>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// tonic reports a failed dial as `Unavailable` with the transport error as its source; the
/// message alone ("tcp connect error") hides whether the socket is missing or refusing.
fn describe_unavailable(status: &tonic::Status) -> String {
    let mut parts = vec![status.message().to_string()];
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.retain(|p| !p.is_empty());
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_status_the_runtime_sent_is_not_taken_for_a_broken_connection() {
        let e = CriError::from_status("unix:///x", "StopContainer", tonic::Status::unknown("boom"));
        assert!(matches!(e, CriError::Other { .. }), "{e}");
        let e = CriError::from_status(
            "unix:///x",
            "StopContainer",
            tonic::Status::unavailable("gone"),
        );
        assert!(matches!(e, CriError::Unreachable { .. }), "{e}");
    }

    #[test]
    fn a_call_the_runtime_cancelled_is_an_interruption_to_retry_not_a_failure() {
        // what containerd 2.3 answered a StopContainer that met its restart
        let status = tonic::Status::cancelled("operation was canceled");
        let e = CriError::from_status("unix:///x", "StopContainer", status);
        assert!(matches!(e, CriError::Interrupted { .. }), "{e}");
        assert!(e.is_retryable());
    }

    #[test]
    fn tonics_own_deadline_is_a_timeout_and_a_cancel_of_the_runtimes_is_not() {
        let e = CriError::from_status(
            "unix:///x",
            "ExecSync",
            tonic::Status::cancelled("Timeout expired"),
        );
        assert!(matches!(e, CriError::Timeout { .. }), "{e}");
        let e = CriError::from_status(
            "unix:///x",
            "ExecSync",
            tonic::Status::cancelled("Timeout expired soon"),
        );
        assert!(matches!(e, CriError::Interrupted { .. }), "{e}");
    }

    #[test]
    fn a_texts_change_keeps_the_kind_and_the_call() {
        let e = CriError::Other {
            call: "PullImage",
            code: "Unknown".into(),
            message: "auth hunter2 refused".into(),
        };
        let scrubbed = e.map_text(|t| t.replace("hunter2", "<redacted>"));
        assert_eq!(
            scrubbed,
            CriError::Other {
                call: "PullImage",
                code: "Unknown".into(),
                message: "auth <redacted> refused".into(),
            }
        );
    }

    #[test]
    fn containerd_starting_up_is_unreachable_not_a_failure_of_the_call() {
        let status = tonic::Status::unknown("server is not initialized yet");
        let e = CriError::from_status("unix:///x", "ListContainers", status);
        assert!(matches!(e, CriError::Unreachable { .. }), "{e}");
        assert!(e.is_retryable());
    }
}
