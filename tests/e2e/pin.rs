//! End-to-end: the images kruised pre-pulls are pinned until their first use, against a garbage
//! collector that follows the kubelet's rule (`support::image_gc`), on the lab's real runtime.
//! containerd 2.x pins; containerd 1.6 (and CRI-O) do not, and kruised says so.
//!
//! Repository used here and nowhere else: `pin/busybox` (the collector removes it). The collector
//! is kept to it, so a pass never removes what the tests running beside use.

use std::time::Duration;

use crate::pull_support::{LIMIT, NODE, create_one_tag};
use crate::support::image_gc::ImageGc;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::{Lab, LabRuntime, Plane, daemon, unique, wait, within};
use kruised::cri::ImageService;

/// A filesystem of one byte: every pass is far over the kubelet's high threshold (85 %) and,
/// with a low threshold of 0, frees all it may.
fn collector(name: &str) -> ImageGc {
    ImageGc::new(1, 85, 0).scope(&[name])
}

/// What `kruised version` says of pinning on the lab's runtime.
fn version_says(lab: &Lab) -> String {
    let out = std::process::Command::new(daemon::kruised_bin())
        .args(["version", "--runtime-endpoint"])
        .arg(lab.endpoint().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ImagePinning:  "))
        .unwrap_or_else(|| panic!("kruised version says nothing of pinning: {stdout}"))
        .to_string()
}

#[tokio::test]
async fn a_pre_pulled_image_survives_the_kubelets_garbage_collection_until_its_pod_starts() {
    let Some(lab) = Lab::get() else { return };
    let rt = lab.runtime();
    let name = format!("{}/pin/busybox", lab.registry);
    let image = format!("{name}:v1");
    rt.remove_image(&image).await.unwrap();
    let gc = collector(&name);

    let pins = version_says(&lab);
    let offered = lab.runtime == LabRuntime::Containerd2;
    assert_eq!(pins.starts_with("offered"), offered, "{pins}");

    let plane = Plane::start().await;
    let api = &plane.api;
    create_one_tag(api, &name, "v1");
    let mut d = plane.start_daemon(&lab, NODE, &[], LIMIT).await;
    wait::node_image(api, LIMIT, NODE, "v1 Succeeded", |s| s.succeeded == 1).await;
    let (_, ready) = daemon::http_get(d.admin, "/readyz?verbose").await;
    assert!(ready.contains(&format!("image pinning {pins}")), "{ready}");

    let pass = gc.pass(&rt).await;
    assert!(pass.over_threshold, "{pass:?}");
    if !offered {
        eprintln!(
            "SKIPPED the pin assertions: {} offers no pinning, as kruised version says: {pins}",
            lab.runtime.lab_name()
        );
        // what every node without pinning sees: gone at the first pass, before any use
        assert!(pass.removed_named(&name), "{pass:?}");
        return;
    }
    assert!(
        !pass.removed_named(&name) && pass.skipped_pinned.len() == 1,
        "the pre-pulled image is kept, as pinned: {pass:?}"
    );
    let status = rt.image_status(&image).await.unwrap().expect("on the node");
    assert!(status.pinned, "{status:?}");

    // its pod starts: kruised unpins the image at its first use
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    let spec = PodSpec::new(
        &unique("pinned"),
        vec![ContainerSpec::sleeper("main", &image)],
    );
    let pod = within(LIMIT, "the pod's start", k.run_pod(spec)).await;
    wait::unpinned(
        &rt,
        LIMIT,
        "the image unpinned once its container runs",
        &image,
    )
    .await;
    d.wait_for_log("image unpinned", LIMIT).await;
    let pass = gc.pass(&rt).await;
    assert!(
        !pass.removed_named(&name) && pass.skipped_in_use.len() == 1,
        "in use, kept: {pass:?}"
    );

    // unused again, unpinned: the collector may take it
    within(LIMIT, "the pod's removal", k.remove_pod(&pod)).await;
    let pass = gc.pass(&rt).await;
    assert!(pass.removed_named(&name), "{pass:?}");
    d.terminate();
    let status = d.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}");
}
