//! The kubelet's image garbage collector double (`support::image_gc`) against the fake runtime:
//! it follows the kubelet's rule, so the end-to-end pinning test (`tests/e2e/pin.rs`) proves what
//! the kubelet would do.

use crate::pull_support::LIMIT;
use crate::support::image_gc::ImageGc;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::{unique, within};
use kruised::cri::fake::{Dialect, FakeRuntime};

#[tokio::test]
async fn the_collector_removes_unused_unpinned_images_oldest_first_down_to_the_low_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let cri = FakeRuntime::start_as(&dir.path().join("cri.sock"), Dialect::Containerd2)
        .await
        .unwrap();
    let (old, older) = {
        let mut st = cri.state();
        (st.add_image("r.io/old:v1"), st.add_image("r.io/older:v1"))
    };
    let rt = kruised::cri::RemoteRuntime::new(cri.endpoint(), None, Default::default());
    // 1024 bytes an image: a disk of 10 KiB is far from its 85 % threshold
    let mut gc = ImageGc::new(10 * 1024, 85, 50);
    let pass = gc.pass(&rt).await;
    assert!(!pass.over_threshold && pass.removed.is_empty(), "{pass:?}");

    // seen later: newer to the collector
    let (pinned, used, new) = {
        let mut st = cri.state();
        let ids = (
            st.add_image("r.io/pinned:v1"),
            st.add_image("r.io/used:v1"),
            st.add_image("r.io/new:v1"),
        );
        st.images.get_mut(&ids.0).unwrap().pinned = true;
        ids
    };
    let k = Kubelet::new(rt.clone(), dir.path().join("pods"));
    let spec = PodSpec::new(
        &unique("gc"),
        vec![ContainerSpec::sleeper("main", "r.io/used:v1")],
    );
    let _pod = within(LIMIT, "the pod's start", k.run_pod(spec)).await;

    // five images, 5 KiB of 5 KiB: over 85 %; down to 50 % frees 2.5 KiB: three images, oldest
    // first (the pinned one skipped); the used one was used last, so it comes last
    gc.capacity = 5 * 1024;
    let pass = gc.pass(&rt).await;
    assert!(pass.over_threshold, "{pass:?}");
    let ids = |v: &[kruised::cri::Image]| v.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
    let removed = ids(&pass.removed);
    assert_eq!(removed.len(), 3, "{pass:?}");
    assert!(
        removed[..2].contains(&old) && removed[..2].contains(&older),
        "oldest first: {removed:?}"
    );
    assert_eq!(removed[2], new);
    assert_eq!(ids(&pass.skipped_pinned), std::slice::from_ref(&pinned));

    // 2 KiB left on a 2 KiB disk, down to 0 %: everything it may, and the pinned and the used
    // one are all that is left, skipped
    gc.capacity = 2 * 1024;
    gc.low_percent = 0;
    let pass = gc.pass(&rt).await;
    assert!(pass.over_threshold && pass.removed.is_empty(), "{pass:?}");
    assert_eq!(ids(&pass.skipped_pinned), std::slice::from_ref(&pinned));
    assert_eq!(
        ids(&pass.skipped_in_use),
        std::slice::from_ref(&used),
        "{pass:#?}"
    );
    let left: Vec<String> = cri.state().images.keys().cloned().collect();
    assert!(left.contains(&pinned) && left.contains(&used), "{left:?}");
}
