//! The end-to-end tests that stop or kill the lab's runtime (`cri-lab.sh stop-runtime`,
//! `kill-runtime`, `start-runtime`) while kruised works: a binary of their own, run after
//! `tests/e2e` on the same runtime (they would disturb its tests), and one at a time
//! ([`RUNTIME`]).

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kruised_test_support as support;

mod runtime_crashes;
mod runtime_restart;

/// The tests of this binary stop or kill the lab's runtime: one at a time.
pub static RUNTIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
