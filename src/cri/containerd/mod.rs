//! containerd's own API, spoken beside CRI on the same socket, for what CRI does not offer:
//! [`content`], the ingests in flight (how far each blob of a pull has landed).
//!
//! Every call names the namespace of the CRI plugin's images ([`NAMESPACE`], in the
//! `containerd-namespace` gRPC header). A runtime that is not containerd (CRI-O) answers
//! `Unimplemented`: [`crate::cri::CriError::Unsupported`].

pub mod content;

/// The generated messages and clients of containerd's services. Private: nothing generated
/// leaves `cri::containerd`. Generated from `proto/containerd/…` by `scripts/gen-cri.sh`.
#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
mod proto {
    pub mod content {
        include!("generated/containerd.services.content.v1.rs");
    }
}

use std::time::Duration;

use tonic::transport::Channel;

use super::endpoint::Endpoint;

/// The containerd namespace of the CRI plugin's images and containers.
pub const NAMESPACE: &str = "k8s.io";
/// The gRPC header that names the namespace of a containerd call.
const NAMESPACE_HEADER: &str = "containerd-namespace";

/// A lazily connecting channel to containerd at `endpoint` (the CRI socket: containerd serves
/// its own API there too), as the CRI client's.
fn channel(endpoint: &Endpoint, connect_timeout: Duration) -> Channel {
    super::grpc::channel(endpoint, connect_timeout)
}

/// A request in [`NAMESPACE`], cut off after `timeout`.
fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request.metadata_mut().insert(
        NAMESPACE_HEADER,
        tonic::metadata::MetadataValue::from_static(NAMESPACE),
    );
    request
}
