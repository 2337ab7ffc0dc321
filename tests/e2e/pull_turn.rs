//! Pre-pulls yield to the node's pods on a real runtime (issue 42, item 3): a NodeImage tag
//! waits while a pod on the node cannot get its own image (`ImagePullBackOff`; containerd's
//! `ImageStatus` says the image is absent), and is pulled once the pod leaves the node.
//!
//! A pre-pull already running when a pod begins to wait is called off, and pulled again after.
//!
//! Repositories: `turn/absent` (never pushed: the pod's image stays absent), `test/busybox`
//! (only pulled, never removed), `bench/img1` and `bench/img5` (made anew, through a relay).

use std::time::Duration;

use crate::pull_progress::{RelayHost, ingests_alone};
use crate::pull_support::{LIMIT, PullNode, fast, waiting_pod};
use crate::support::kubelet::status::update_container;
use crate::support::tcp_relay::TcpRelay;
use crate::support::{Lab, LabRuntime, wait};
use kruised::cri::{ImageService, PullRequest};
use serde_json::json;

#[tokio::test]
async fn a_nodeimage_tag_waits_while_a_pod_cannot_get_its_image_and_is_pulled_once_the_pod_leaves()
{
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let absent = format!("{}/turn/absent:v1", lab.registry);
    let mut pod = waiting_pod("shop", "web-0", &absent);
    update_container(&mut pod, "app", |s| {
        s["state"] = json!({"waiting": {"reason": "ImagePullBackOff"}});
    });
    node.api.create("pods", pod).expect("the pod");
    // two looks at the pod's image: the first one's finding is published
    let looks = |n: usize| {
        let absent = absent.clone();
        let node = &node;
        async move {
            wait::poll(
                LIMIT,
                Duration::from_millis(50),
                "the pod's image looked at",
                || async { node.image_status_calls() },
                |calls: &Vec<String>| calls.iter().filter(|i| **i == absent).count() >= n,
            )
            .await
        }
    };
    looks(2).await;

    let name = format!("{}/test/busybox", lab.registry);
    node.create_node_image(json!({ &name: {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("the tag waiting", |s| s.waiting == 1)
        .await;
    let seen = node
        .image_status_calls()
        .iter()
        .filter(|i| **i == absent)
        .count();
    looks(seen + 1).await;
    let s = node.status().expect("a status");
    assert_eq!((s.waiting, s.pulling), (1, 0), "{s:#?}");
    assert!(
        node.pulls().is_empty(),
        "pulled while the pod waited: {:?}",
        node.pulls()
    );

    node.api
        .delete("pods", "shop", "web-0")
        .expect("the pod deleted");
    node.wait_status("the tag pulled", |s| s.succeeded == 1)
        .await;
    assert_eq!(node.pulls(), [format!("{name}:v1")]);
}

/// The random layer of a bench image.
const LAYER: u64 = 16 << 20;

/// `cri-lab.sh bench-images` with the burst benchmark's five: `bench/img1` and `bench/img5`
/// are this file's (no other e2e test pulls them), made anew.
fn bench_images(lab: &Lab) {
    lab.script_with("bench-images", &[("BENCH_IMAGES", "5")]);
}

fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 20)
}

/// A pre-pull already running when a pod begins to wait is called off: the link is the pod's
/// (what the registry sends meanwhile is about the pod's image alone), the tag stays `Pulling`
/// with no failure, and it is pulled once the pod runs. Bytes through the relay are asserted,
/// never times; the figures are printed (`FIGURES`): what the pre-pull fetched again after
/// (containerd drops a cancelled CRI pull's ingests: `turn.rs`).
#[tokio::test]
async fn a_pods_own_pull_does_not_wait_behind_a_pre_pull_already_running() {
    let Some(lab) = Lab::get() else { return };
    if lab.runtime == LabRuntime::Crio {
        // the relay is a registry host of containerd's (`certs.d`)
        eprintln!("SKIPPED: the slowed registry is set up for containerd only");
        return;
    }
    // its slow pulls would be the progress of another test's (`pull_progress.rs`)
    let _alone = ingests_alone().await;
    bench_images(&lab);
    // 4 MiB/s: a layer takes four seconds
    let relay = TcpRelay::start(lab.registry.parse().expect("the registry's address")).await;
    relay.limit(Some(4 << 20), None);
    let _host = RelayHost::new(&lab, relay.addr);
    let pre = format!("{}/bench/img5", relay.addr);
    let own = format!("{}/bench/img1:v1", relay.addr);
    let node = PullNode::start(fast(), lab.endpoint()).await;
    for image in [format!("{pre}:v1"), own.clone()] {
        let _ = node.runtime.remove_image(&image).await;
    }

    // one attempt: a called-off pull counted as a failed attempt would fail the tag
    node.create_node_image(json!({ &pre: {"tags": [{"tag": "v1", "version": 1,
        "pullPolicy": {"backoffLimit": 0}}]}}));
    let fetched = relay
        .wait_until("a quarter of the pre-pull's layer sent", LIMIT, |s| {
            s.bytes_down >= LAYER / 4
        })
        .await
        .bytes_down;

    // a pod begins to wait for its image, and the kubelet pulls it
    node.api
        .create("pods", waiting_pod("shop", "web-0", &own))
        .expect("the pod");
    let request = PullRequest {
        image: own.clone(),
        ..Default::default()
    };
    node.runtime
        .pull_image(request, LIMIT)
        .await
        .unwrap_or_else(|e| panic!("the pod's pull: {e}"));
    let during = relay.stats().bytes_down - fetched;
    let s = node.status().expect("a status");
    assert_eq!((s.pulling, s.failed), (1, 0), "{s:#?}");
    // alone, the pod's pull moves its layer (and a manifest, a config); beside the pre-pull,
    // the pre-pull's last three quarters too
    assert!(
        during < LAYER + LAYER / 4,
        "the registry sent {during} bytes during the pod's pull of a {LAYER}-byte layer: \
         the pre-pull went on beside it"
    );

    node.api
        .modify("pods", "shop", "web-0", |p| {
            update_container(p, "app", |s| {
                s["state"] = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
            });
        })
        .expect("the pod runs");
    let before = relay.stats().bytes_down;
    let s = node
        .wait_status("the pre-pull done", |s| s.succeeded == 1)
        .await;
    assert_eq!(s.failed, 0, "{s:#?}");
    assert!(
        node.events("PullImageFailed").is_empty(),
        "{:?}",
        node.events("PullImageFailed")
    );
    let after = relay.stats().bytes_down - before;
    eprintln!(
        "FIGURES call-off: the pre-pull had {:.1} MiB sent when the pod began to wait; {:.1} MiB \
         sent during the pod's pull ({:.1} MiB layer); {:.1} MiB sent for the pre-pull after \
         (its layer: {:.1} MiB)",
        mib(fetched),
        mib(during),
        mib(LAYER),
        mib(after),
        mib(LAYER)
    );
    for image in [format!("{pre}:v1"), own] {
        let _ = node.runtime.remove_image(&image).await;
    }
}
