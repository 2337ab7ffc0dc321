//! The generated messages and clients of containerd's services (and the servers, for the fake
//! runtime of the tests). Nothing generated leaves `cri`. Generated from `proto/containerd/…`
//! by `scripts/gen-cri.sh` (tools/cri-gen), not by the build.

#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
pub mod content {
    include!("generated/containerd.services.content.v1.rs");
}

#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
pub mod images {
    include!("generated/containerd.services.images.v1.rs");
}
