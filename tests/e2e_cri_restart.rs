//! The CRI client across a containerd restart (its own test binary: restarting containerd would
//! disturb the other end-to-end tests, and cargo runs test binaries one at a time).

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::time::{Duration, Instant};

use kruised::cri::{CriError, RuntimeService};
use support::{Lab, within};

#[tokio::test]
async fn the_client_answers_again_as_soon_as_containerd_is_back() {
    let Some(lab) = Lab::get() else { return };
    let rt = lab.runtime();
    let before = rt
        .version()
        .await
        .expect("containerd answers before the restart");

    // take containerd away under the client; the established connection breaks
    let lab2 = lab.clone();
    tokio::task::spawn_blocking(move || lab2.script("stop-runtime"))
        .await
        .unwrap();
    let err = rt.version().await.expect_err("nothing listens now");
    assert!(matches!(err, CriError::Unreachable { .. }), "{err}");
    assert!(err.is_retryable());

    let lab2 = lab.clone();
    tokio::task::spawn_blocking(move || lab2.script("start-runtime"))
        .await
        .unwrap();
    // the script returns once containerd's CRI plugin answers: the very next call must succeed,
    // with no reconnect backoff in the way
    let back = Instant::now();
    let after = within(
        Duration::from_secs(10),
        "version after restart",
        rt.version(),
    )
    .await
    .expect("the first call after containerd is back succeeds");
    eprintln!(
        "first call after containerd came back answered in {:?}",
        back.elapsed()
    );
    assert_eq!(after.runtime_name, before.runtime_name);
}
