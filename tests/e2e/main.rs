//! The end-to-end layer: the `kruised` binary as its own process against a real runtime of the
//! lab (`tests/cri-lab.sh`: containerd 1.6, containerd 2.3 or CRI-O, chosen by
//! `KRUISED_LAB_RUNTIME`) and a real registry, with the API-server double as control plane and
//! the tests playing the kubelet. `tests/run.sh` runs it once per runtime.
//!
//! The tests that stop or kill the runtime are in `tests/e2e_faults`: they would disturb these.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kruised_test_support as support;
use kruised_test_support::pull as pull_support;

mod admit;
mod containermeta;
mod cri;
mod crictl;
mod daemon;
mod hostile;
mod imagepull;
mod pin;
mod podprobe;
mod pull_dedup;
mod pull_progress;
mod pull_turn;
mod recreate;
mod runtimes;
mod startup_taint;
mod systemd;
