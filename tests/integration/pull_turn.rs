//! The node's pods first (issue 42, item 3), on the API-server double and the fake runtime:
//! NodeImage pre-pulls wait while a pod on the node waits for its own image and start once it
//! runs or leaves; they start in the stated order (the node's pods' images, then oldest
//! `createdAt`); at most `--max-concurrent-prepulls` run at once.

use std::time::Duration;

use crate::pull_support::{LIMIT, PullNode, fast, next_batch_pod, tag};
use crate::support::kubelet::status::update_container;
use crate::support::wait;
use kruised::controller::imagepull::Settings;
use kruised::controller::imagepull::turn::MAX_CALL_OFFS;
use kruised::cri::fake::FakeRuntime;
use kruised::k8s::crd::ImagePullPhase;
use serde_json::{Value, json};

const NS: &str = "shop";

async fn start(settings: Settings) -> (PullNode, FakeRuntime, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cri = FakeRuntime::start(&dir.path().join("cri.sock"), "containerd")
        .await
        .unwrap_or_else(|e| panic!("the fake runtime: {e}"));
    let node = PullNode::start(settings, cri.endpoint()).await;
    (node, cri, dir)
}

/// A pod of the node whose one container waits (`ContainerCreating`) to run `image`.
fn waiting_pod(name: &str, image: &str) -> Value {
    crate::pull_support::waiting_pod(NS, name, image)
}

/// Waits until the runtime was asked `ImageStatus` `n` times (the watcher of the node's waiting
/// pods looks at their images on every change of a pod and every 2 s while one is a candidate).
async fn image_status_calls(cri: &FakeRuntime, n: u64) {
    wait::cri(
        cri,
        LIMIT,
        "the waiting pods' images looked at",
        |st| st.call_count("ImageStatus"),
        |c| *c >= n,
    )
    .await;
}

fn pulls_of(cri: &FakeRuntime, image: &str) -> usize {
    let st = cri.state();
    st.pulls.iter().filter(|p| p.image == image).count()
}

/// The kubelet has pulled the image of pod `web-0` (`r.io/shop:v1`) and started its container.
fn shop_pod_runs(node: &PullNode, cri: &FakeRuntime) {
    cri.state().add_image("r.io/shop:v1");
    node.api
        .modify("pods", NS, "web-0", |p| {
            update_container(p, "app", |s| {
                s["state"] = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
                s["ready"] = json!(true);
            });
        })
        .expect("the pod runs");
}

/// A node with pod `web-1` in an in-place update whose next batch names `r.io/next:v2`, each
/// pull held 300 s at the runtime (until the test changes the delay or ends the pulls).
async fn next_batch_held() -> (PullNode, FakeRuntime, tempfile::TempDir) {
    let (node, cri, dir) = start(fast()).await;
    cri.delay("PullImage.body", Duration::from_secs(300));
    node.api
        .create(
            "pods",
            next_batch_pod(NS, "web-1", &[("app", "r.io/next:v2")], true),
        )
        .expect("the pod in an in-place update");
    (node, cri, dir)
}

/// Waits for `what`, the one pull of `image`, at the runtime; then pod `web-0` begins to wait
/// for its own image (`r.io/shop:v1`): the pull is called off (its call cancelled) and not made
/// again over the pod's next two looks at its image.
async fn called_off_by_a_waiting_pod(node: &PullNode, cri: &FakeRuntime, what: &str, image: &str) {
    wait::cri(
        cri,
        LIMIT,
        &format!("{what} at the runtime"),
        |st| st.pulls_in_flight,
        |n| *n == 1,
    )
    .await;

    node.api
        .create("pods", waiting_pod("web-0", "r.io/shop:v1"))
        .expect("the pod");
    wait::cri(
        cri,
        LIMIT,
        &format!("{what} called off (its call cancelled)"),
        |st| (st.pulls_cancelled, st.pulls_in_flight),
        |(cancelled, in_flight)| (*cancelled, *in_flight) == (1, 0),
    )
    .await;
    let looked = cri.state().call_count("ImageStatus");
    image_status_calls(cri, looked + 2).await;
    assert_eq!(pulls_of(cri, image), 1, "pulled again while the pod waited");
}

#[tokio::test]
async fn a_pre_pull_waits_while_a_pod_on_the_node_waits_for_its_image_and_starts_once_it_runs() {
    let (node, cri, _dir) = start(fast()).await;
    node.api
        .create("pods", waiting_pod("web-0", "r.io/shop:v1"))
        .expect("the pod");
    // its second look: the first one's finding is published
    image_status_calls(&cri, 2).await;
    node.create_node_image(json!({"r.io/warm": {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("the tag waiting", |s| s.waiting == 1)
        .await;
    // two more looks at the pod's image (each RECHECK apart) while the tag waits
    let looked = cri.state().call_count("ImageStatus");
    image_status_calls(&cri, looked + 2).await;
    let s = node.status().expect("a status");
    assert_eq!((s.waiting, s.pulling), (1, 0), "{s:#?}");
    assert_eq!(
        pulls_of(&cri, "r.io/warm:v1"),
        0,
        "pulled while the pod waited"
    );

    // the kubelet pulls the pod's image and starts its container
    shop_pod_runs(&node, &cri);
    let s = node
        .wait_status("the tag pulled", |s| s.succeeded == 1)
        .await;
    assert_eq!(tag(&s, "r.io/warm", "v1").phase, ImagePullPhase::Succeeded);
    assert_eq!(pulls_of(&cri, "r.io/warm:v1"), 1);
}

#[tokio::test]
async fn a_pre_pull_waits_while_a_pods_pull_fails_and_starts_once_the_pod_leaves_the_node() {
    let (node, cri, _dir) = start(fast()).await;
    let mut pod = waiting_pod("web-0", "r.io/typo:v1");
    update_container(&mut pod, "app", |s| {
        s["state"] = json!({"waiting": {"reason": "ImagePullBackOff"}});
    });
    node.api.create("pods", pod).expect("the pod");
    // its second look: the first one's finding is published
    image_status_calls(&cri, 2).await;
    node.create_node_image(json!({"r.io/warm": {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("the tag waiting", |s| s.waiting == 1)
        .await;
    let looked = cri.state().call_count("ImageStatus");
    image_status_calls(&cri, looked + 1).await;
    assert_eq!(
        pulls_of(&cri, "r.io/warm:v1"),
        0,
        "pulled while the pod waited"
    );

    node.api
        .delete("pods", NS, "web-0")
        .expect("the pod deleted");
    node.wait_status("the tag pulled", |s| s.succeeded == 1)
        .await;
    assert_eq!(pulls_of(&cri, "r.io/warm:v1"), 1);
}

#[tokio::test]
async fn a_pod_being_created_with_its_image_on_the_node_holds_no_pre_pull_back() {
    let (node, cri, _dir) = start(fast()).await;
    cri.state().add_image("r.io/shop:v1");
    node.api
        .create("pods", waiting_pod("web-0", "r.io/shop:v1"))
        .expect("the pod");
    // its second look: the first one's finding is published
    image_status_calls(&cri, 2).await;
    node.create_node_image(json!({"r.io/warm": {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("the tag pulled", |s| s.succeeded == 1)
        .await;
    assert_eq!(pulls_of(&cri, "r.io/warm:v1"), 1);
}

#[tokio::test]
async fn tags_start_with_the_node_pods_images_then_the_oldest_created_then_undated_ones() {
    let (node, cri, _dir) = start(Settings {
        max_prepulls: Some(1),
        ..fast()
    })
    .await;
    cri.delay("PullImage.body", Duration::from_millis(30));
    // the pod waits for r.io/d:v1: the tags queue behind it, ranked with it in the store
    node.api
        .create("pods", waiting_pod("web-0", "r.io/d:v1"))
        .expect("the pod");
    // its second look: the first one's finding is published
    image_status_calls(&cri, 2).await;
    let tag_at = |at: Option<&str>| match at {
        Some(t) => json!({"tags": [{"tag": "v1", "version": 1, "createdAt": t}]}),
        None => json!({"tags": [{"tag": "v1", "version": 1}]}),
    };
    node.create_node_image(json!({
        "r.io/a": tag_at(Some("2026-03-01T00:00:00Z")),
        "r.io/b": tag_at(Some("2026-01-01T00:00:00Z")),
        "r.io/c": tag_at(None),
        "r.io/d": tag_at(Some("2026-06-01T00:00:00Z")),
    }));
    node.wait_status("four tags waiting", |s| s.waiting == 4)
        .await;
    assert_eq!(cri.state().call_count("PullImage"), 0);
    // the pod leaves; the kubelet's own pull of r.io/d:v1 is the pre-pull's now
    node.api
        .delete("pods", NS, "web-0")
        .expect("the pod deleted");
    node.wait_status("all pulled", |s| s.succeeded == 4).await;
    let st = cri.state();
    let order: Vec<&str> = st.pulls.iter().map(|p| p.image.as_str()).collect();
    assert_eq!(
        order,
        ["r.io/d:v1", "r.io/b:v1", "r.io/a:v1", "r.io/c:v1"],
        "the pod's image, then oldest first, then undated"
    );
    assert_eq!(st.max_concurrent_pulls, 1);
}

#[tokio::test]
async fn max_concurrent_prepulls_2_with_6_tags_never_runs_more_than_2_pre_pulls_at_once() {
    let (node, cri, _dir) = start(Settings {
        max_prepulls: Some(2),
        ..fast()
    })
    .await;
    cri.delay("PullImage.body", Duration::from_millis(150));
    let tags: Vec<Value> = (1..=6)
        .map(|i| json!({"tag": format!("v{i}"), "version": 1}))
        .collect();
    node.create_node_image(json!({"r.io/app": {"tags": tags}}));
    node.wait_status("2 pulling, 4 waiting", |s| s.pulling == 2 && s.waiting == 4)
        .await;
    let s = node.wait_status("all done", |s| s.succeeded == 6).await;
    assert_eq!((s.pulling, s.waiting, s.failed), (0, 0, 0));
    let st = cri.state();
    assert_eq!(st.pulls.len(), 6);
    assert_eq!(st.max_concurrent_pulls, 2);
}

#[tokio::test]
async fn a_running_pre_pull_is_called_off_when_a_pod_begins_to_wait_and_pulled_again_once_it_runs_with_no_failure()
 {
    let (node, cri, _dir) = start(fast()).await;
    // a pull that would not end within the test
    cri.delay("PullImage.body", Duration::from_secs(300));
    // one attempt only: a called-off pull counted as a failed attempt would fail the tag
    node.create_node_image(json!({"r.io/warm": {"tags": [
        {"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}
    ]}}));
    called_off_by_a_waiting_pod(&node, &cri, "the pre-pull", "r.io/warm:v1").await;
    // still pulling: called off, not failed
    let s = node.status().expect("a status");
    assert_eq!((s.pulling, s.failed), (1, 0), "{s:#?}");
    assert!(tag(&s, "r.io/warm", "v1").message.is_empty(), "{s:#?}");

    // the kubelet pulls the pod's image and starts its container
    cri.delay("PullImage.body", Duration::from_millis(10));
    shop_pod_runs(&node, &cri);
    let s = node
        .wait_status("the tag pulled", |s| s.succeeded == 1)
        .await;
    assert_eq!(s.failed, 0, "{s:#?}");
    assert_eq!(
        pulls_of(&cri, "r.io/warm:v1"),
        2,
        "called off once, then pulled"
    );
    assert!(
        node.events("PullImageFailed").is_empty(),
        "{:?}",
        node.events("PullImageFailed")
    );
}

#[tokio::test]
async fn a_running_next_batch_pre_pull_is_called_off_when_a_pod_begins_to_wait_and_made_again_once_it_leaves()
 {
    let (node, cri, _dir) = next_batch_held().await;
    called_off_by_a_waiting_pod(&node, &cri, "the next batch's pull", "r.io/next:v2").await;

    cri.delay("PullImage.body", Duration::from_millis(10));
    node.api
        .delete("pods", NS, "web-0")
        .expect("the pod deleted");
    wait::cri(
        &cri,
        LIMIT,
        "the next batch's image pulled again",
        |st| {
            let pulls = st.pulls.iter().filter(|p| p.image == "r.io/next:v2");
            (pulls.count(), st.find_image("r.io/next:v2").is_some())
        },
        |(pulls, present)| *pulls == 2 && *present,
    )
    .await;
}

#[tokio::test]
async fn a_next_batch_pre_pull_called_off_three_times_is_let_finish_while_a_pod_waits_for_its_image()
 {
    // a pull that ends only when the test says (`end_pulls_in_flight`)
    let (node, cri, _dir) = next_batch_held().await;
    pulled_and_pulling(
        &cri,
        "r.io/next:v2",
        1,
        "the next batch's pull at the runtime",
    )
    .await;

    // pods keep starting on the node, each waiting for its own image
    for n in 1..=MAX_CALL_OFFS as usize {
        let pod = format!("web-0-{n}");
        node.api
            .create("pods", waiting_pod(&pod, "r.io/shop:v1"))
            .expect("the pod");
        wait::cri(
            &cri,
            LIMIT,
            &format!("the next batch's pull called off the {n}. time"),
            |st| (st.pulls_cancelled, st.pulls_in_flight),
            |seen| *seen == (n, 0),
        )
        .await;
        node.api.delete("pods", NS, &pod).expect("the pod deleted");
        let again = format!("pulled again after call-off {n}");
        pulled_and_pulling(&cri, "r.io/next:v2", n + 1, &again).await;
    }

    node.api
        .create("pods", waiting_pod("web-0-last", "r.io/shop:v1"))
        .expect("the pod");
    // its second look: the first one's finding is published, and the pull runs on
    let looked = cri.state().call_count("ImageStatus");
    image_status_calls(&cri, looked + 2).await;
    {
        let st = cri.state();
        assert_eq!(
            (st.pulls_cancelled, st.pulls_in_flight),
            (MAX_CALL_OFFS as usize, 1),
            "called off a 4th time while the pod waits"
        );
    }
    cri.end_pulls_in_flight();
    wait::cri(
        &cri,
        LIMIT,
        "the next batch's image pulled while the pod waits",
        |st| {
            let pulls = st.pulls.iter().filter(|p| p.image == "r.io/next:v2");
            (
                pulls.count(),
                st.pulls_cancelled,
                st.find_image("r.io/next:v2").is_some(),
            )
        },
        |seen| *seen == (MAX_CALL_OFFS as usize + 1, MAX_CALL_OFFS as usize, true),
    )
    .await;
    assert!(
        node.api.get("pods", NS, "web-0-last").is_some(),
        "the pod still there, waiting"
    );
}

/// Waits until `image` was asked for `n` times and one pull (of it) is in flight.
async fn pulled_and_pulling(cri: &FakeRuntime, image: &str, n: usize, what: &str) {
    wait::cri(
        cri,
        LIMIT,
        what,
        |st| {
            let pulls = st.pulls.iter().filter(|p| p.image == image);
            (pulls.count(), st.pulls_in_flight)
        },
        |seen| *seen == (n, 1),
    )
    .await;
}
