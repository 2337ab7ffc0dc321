//! The container runtime, over the CRI v1 gRPC API: the only module that knows gRPC.
//!
//! - [`clock`]: the runtime's "now", which its timestamps are compared with;
//! - [`endpoint`]: where the runtime listens, and detection over the well-known sockets;
//! - [`RuntimeService`] / [`ImageService`]: the narrow interface the daemon uses, in domain types;
//! - [`RemoteRuntime`]: the tonic client over a unix socket;
//! - [`Runtimes`]: every runtime found on the node, keyed by the name that prefixes container IDs;
//! - [`dialect`]: what containerd 1.6, containerd 2.x and CRI-O answer differently;
//! - [`containerd`]: containerd's own API on the same socket, for what CRI does not offer (pull
//!   progress: the content service; image labels for pinning: the images service);
//! - `fake`: an in-memory CRI server for tests, speaking the real protocol on a unix socket
//!   (feature `test-util`: never in the shipped build).

pub mod clock;
pub mod containerd;
mod convert;
mod convert_detail;
mod detail;
pub mod dial;
pub mod dialect;
pub mod endpoint;
mod error;
#[cfg(feature = "test-util")]
pub mod fake;
mod grpc;
mod parts;
#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
mod proto;
mod runtimes;
mod service;
mod types;

pub use detail::*;
pub use endpoint::{Endpoint, EndpointSource};
pub use error::{CriError, Result};
pub use grpc::{RemoteRuntime, Timeouts};
pub use parts::*;
pub use runtimes::{
    DiscoveryError, NodeRuntime, Probe, RuntimeHandle, RuntimeLookupError, Runtimes,
    split_container_id,
};
#[cfg(feature = "test-util")]
pub use service::KubeletService;
pub use service::{ImageService, RuntimeService};
pub use types::*;
