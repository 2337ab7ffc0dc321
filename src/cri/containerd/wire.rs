//! What every call to containerd needs: the channel (the CRI socket, as the CRI client's) and
//! the namespace of the CRI plugin's images in the `containerd-namespace` header.

use std::time::Duration;

use tonic::transport::Channel;

use crate::cri::endpoint::Endpoint;

/// The containerd namespace of the CRI plugin's images and containers.
pub const NAMESPACE: &str = "k8s.io";
/// The gRPC header that names the namespace of a containerd call.
pub const NAMESPACE_HEADER: &str = "containerd-namespace";

/// A lazily connecting channel to containerd at `endpoint` (the CRI socket: containerd serves
/// its own API there too), as the CRI client's.
pub(super) fn channel(endpoint: &Endpoint, connect_timeout: Duration) -> Channel {
    crate::cri::grpc::channel(endpoint, connect_timeout)
}

/// A request in [`NAMESPACE`], cut off after `timeout`.
pub(super) fn request<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request.metadata_mut().insert(
        NAMESPACE_HEADER,
        tonic::metadata::MetadataValue::from_static(NAMESPACE),
    );
    request
}
