//! The integration layer: the `kruised` binary and library against in-process doubles that
//! speak the real protocols (the API-server double, the fake CRI runtime), the command line,
//! the module layering, and the fuzz targets' seeds. Fast: no lab needed.
//!
//! One test binary for the layer (modules, not one binary per file): each binary links the
//! whole crate, and linking was most of the edit-test loop.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kruised_test_support as support;
use kruised_test_support::pull as pull_support;

mod admin;
mod at_rest;
mod auth;
mod bench_skips;
mod cli;
mod containermeta;
mod crds;
mod crictl;
mod dialects;
mod dropin;
mod faults_api;
mod faults_restart;
mod fuzz_seeds;
mod health_truth;
mod hostile;
mod hostile_probes;
mod image_gc;
mod imagepull;
mod inplace_pull;
mod k8s;
mod kubelet;
mod layers;
mod link_order;
mod manager;
mod provenance;
mod proxy;
mod pull_progress;
mod pull_turn;
mod rbac;
mod recreate;
mod relay;
mod runtimes;
mod settle;
mod silent_api;
mod size_report;
mod startup_taint;
mod swap;
mod test_tree;
mod timeline;
