//! The cluster layer: the `kruised` binary against a real kube-apiserver (RBAC on, kruise's
//! CRDs), etcd, and a real kubelet on its own containerd (see `tests/support/cluster.rs`), with
//! OpenKruise's real kruise-manager beside them (`tests/run.sh`). In `kruise` the tests act as a
//! user and the manager does its part; elsewhere a test plays the manager where it does what the
//! real one cannot (faults, exact timing, every field shape at once), each module says why, on
//! objects the real manager leaves alone.
//!
//! One binary, so that its tests run one at a time ([`KubeLab::serial`]): they share the node.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kruised_test_support as support;

mod containermeta;
mod dropin;
mod hostile;
mod imagepull;
mod kruise;
mod ship;
mod silent_api;

pub use support::cluster::{Scene, meta, runtime_id, status_of};
