//! The CRI client across a restart of the lab's runtime.

use std::time::{Duration, Instant};

use crate::support::{Lab, within};
use kruised::cri::{CriError, RuntimeService};

#[tokio::test]
async fn the_client_answers_again_as_soon_as_the_runtime_is_back() {
    let Some(lab) = Lab::get() else { return };
    let _alone = super::RUNTIME.lock().await;
    let rt = lab.runtime();
    let before = rt
        .version()
        .await
        .expect("the runtime answers before the restart");

    // take the runtime away under the client; the established connection breaks
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
    // the script returns once the runtime answers CRI: the very next call must succeed,
    // with no reconnect backoff in the way
    let back = Instant::now();
    let after = within(
        Duration::from_secs(10),
        "version after restart",
        rt.version(),
    )
    .await
    .expect("the first call after the runtime is back succeeds");
    eprintln!(
        "first call after the runtime came back answered in {:?}",
        back.elapsed()
    );
    assert_eq!(after.runtime_name, before.runtime_name);
}
