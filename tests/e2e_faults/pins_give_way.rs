//! Pins give way to a full disk (issue 42, item 1), on containerd 2.x: past the kubelet's image
//! GC high threshold, kruised unpins its unused images oldest first, as many bytes as are
//! missing, and the collector following the kubelet's rule (`support::image_gc`) reclaims them.
//!
//! Here and not in `tests/e2e`: kruised takes up at its start every image a kruised pinned in
//! its runtime (its label), and the daemons of the tests running beside pin what they pull, so
//! which images are the oldest would depend on them. It runs alone ([`super::RUNTIME`]) after
//! them, and first unpins what they left pinned.
//!
//! Repository used here and nowhere else: `pin/giveway` (the collector removes it). The image
//! filesystem kruised reads is a small loop-mounted ext4 (`--image-fs-path`, as in the size
//! admission's test): containerd's root stays in the lab, and the test fills the stand-in.

use std::time::Duration;

use crate::support::image_gc::ImageGc;
use crate::support::loop_fs::LoopFs;
use crate::support::pull::{LIMIT, NODE, create_one_tag};
use crate::support::{Lab, LabRuntime, Plane, daemon, wait};
use kruised::controller::imagepull::disk;
use kruised::controller::imagepull::pin::{ContainerdPins, PinStore};
use kruised::cri::ImageService;
use serde_json::json;

/// Seconds since the epoch, as containerd stamps an image's record.
fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `/readyz?verbose`'s line on the pins giving way.
async fn pins_line(d: &daemon::Daemon) -> String {
    let (_, body) = daemon::http_get(d.admin, "/readyz?verbose").await;
    body.lines()
        .find(|l| l.contains("image-pins"))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn pre_pulled_images_give_way_when_the_disk_passes_the_kubelets_threshold() {
    let Some(lab) = Lab::get() else { return };
    if lab.runtime != LabRuntime::Containerd2 {
        eprintln!(
            "SKIPPED: {} offers no pinning, so no pin gives way",
            lab.runtime.lab_name()
        );
        return;
    }
    let _alone = super::RUNTIME.lock().await;
    let Some(fs) = LoopFs::new(32 << 20) else {
        return;
    };
    let rt = lab.runtime();
    // what the daemons of earlier tests left pinned: this daemon would take it up, older than
    // its own
    let store = ContainerdPins::new(rt.clone(), None);
    for stale in store.pinned().await.unwrap() {
        store.unpin(&stale.id).await.unwrap();
    }
    let name = format!("{}/pin/giveway", lab.registry);
    let (v1, v2) = (format!("{name}:v1"), format!("{name}:v2"));
    for i in [&v1, &v2] {
        rt.remove_image(i).await.unwrap();
    }
    let plane = Plane::start().await;
    let api = &plane.api;
    create_one_tag(api, &name, "v1");
    let path = fs.mount.display().to_string();
    let mut d = plane
        .start_daemon(&lab, NODE, &["--image-fs-path", &path], LIMIT)
        .await;
    wait::node_image(api, LIMIT, NODE, "v1 Succeeded", |s| s.succeeded == 1).await;
    // v2 pulled in a later second than v1: containerd stamps records in seconds
    let v1_done = epoch_secs();
    wait::poll(
        LIMIT,
        Duration::from_millis(50),
        "the next second",
        || async { epoch_secs() },
        |now| *now > v1_done,
    )
    .await;
    api.modify("nodeimages", "", NODE, |o| {
        o["spec"]["images"][&name]["tags"]
            .as_array_mut()
            .unwrap()
            .push(json!({"tag": "v2", "version": 1}));
    })
    .unwrap();
    wait::node_image(api, LIMIT, NODE, "v2 Succeeded", |s| s.succeeded == 2).await;
    let first = rt.image_status(&v1).await.unwrap().expect("v1 on the node");
    assert!(first.pinned, "{first:?}");
    assert!(
        rt.image_status(&v2).await.unwrap().expect("v2").pinned,
        "both pinned"
    );

    // the image filesystem filled to half the oldest image short of what 85 % leaves free
    let start = fs.space();
    let least = start.capacity * 15 / 100 + 1;
    let short = least - first.size / 2;
    fs.fill("other", start.free - short);
    let full = fs.space();
    assert!(
        full.free < least && least - full.free < first.size,
        "{full:?}, {least} to keep free, the oldest image {} B",
        first.size
    );
    wait::unpinned(&rt, LIMIT, "the oldest image unpinned", &v1).await;
    let line = d
        .wait_for_log("image unpinned: the image filesystem has", LIMIT)
        .await;
    let message = line["message"].as_str().unwrap_or_default().to_string();
    for part in [
        format!(
            "{} free of {}",
            disk::human(full.free),
            disk::human(full.capacity)
        ),
        format!("less than the {}", disk::human(least)),
        "the kubelet's image GC high threshold (85 %)".to_string(),
    ] {
        assert!(message.contains(&part), "{part:?} missing from {message:?}");
    }
    assert_eq!(line["size"].as_u64(), Some(first.size), "{line}");

    // the kubelet's collector takes the unpinned image and skips the newer, still pinned
    // a filesystem of one byte: every pass is far over the threshold, and with a low threshold
    // of 0 it frees all it may
    let pass = ImageGc::new(1, 85, 0).scope(&[&name]).pass(&rt).await;
    assert!(
        pass.removed_named(&v1) && !pass.removed_named(&v2) && pass.skipped_pinned.len() == 1,
        "{pass:?}"
    );
    // what it reclaimed shows on the stand-in: the next look unpins nothing more
    std::fs::remove_file(fs.mount.join("other")).unwrap();
    fs.fill("other", start.free - short - first.size);
    let relieved = disk::human(fs.space().free);
    let seen = wait::poll(
        LIMIT,
        Duration::from_millis(250),
        "a look at the relieved filesystem",
        || pins_line(&d),
        |l| l.contains(&format!("{relieved} free of")),
    )
    .await;
    assert!(
        rt.image_status(&v2).await.unwrap().expect("v2").pinned,
        "the newer image stays pinned: {seen}"
    );
    eprintln!(
        "pins giving way on a {} ext4: {} free, less than the {} 85 % leaves: the oldest \
         ({}) unpinned and reclaimed, the newer kept pinned; after the collector: {}",
        disk::human(full.capacity),
        disk::human(full.free),
        disk::human(least),
        disk::human(first.size),
        seen.trim(),
    );
    let gave = format!(
        "{} unpinned for it since the start",
        disk::human(first.size)
    );
    assert!(seen.contains(&gave), "{gave:?} missing from {seen:?}");
    d.terminate();
    let status = d.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}");
}
