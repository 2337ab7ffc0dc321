//! The end-to-end tests that stop or kill the lab's runtime (`cri-lab.sh stop-runtime`,
//! `kill-runtime`, `start-runtime`) while kruised works: a binary of their own, run after
//! `tests/e2e` on the same runtime (they would disturb its tests), and one at a time
//! ([`RUNTIME`]); beside them, the test of pins giving way, which needs the runtime's pins to
//! itself.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kruised_test_support as support;

mod pins_give_way;
mod runtime_crashes;
mod runtime_restart;

/// The tests of this binary stop or kill the lab's runtime (or need its pins to themselves):
/// one at a time.
pub static RUNTIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
