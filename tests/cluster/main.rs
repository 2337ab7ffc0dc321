//! The cluster layer: the `kruised` binary against a real kube-apiserver (RBAC on, kruise's
//! CRDs), etcd, and a real kubelet on its own containerd (see `tests/support/cluster.rs`). The
//! tests play kruise-manager's part with the real API; the kubelet does its own.
//!
//! One binary, so that its tests run one at a time ([`KubeLab::serial`]): they share the node.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

#[path = "../support/mod.rs"]
mod support;

mod containermeta;
mod dropin;
mod imagepull;
mod podprobe;
mod recreate;
mod ship;

pub use support::cluster::{Scene, meta, runtime_id, status_of};
