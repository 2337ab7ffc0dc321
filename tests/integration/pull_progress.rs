//! Pull progress and the stall timeout against the doubles: the fake runtime's content service
//! answers the ingests the test sets (as containerd's would while a pull lands), and the
//! API-server double counts the NodeImage status writes. The real thing, on containerd, is
//! `tests/e2e/pull_progress.rs`.

use std::time::Duration;

use crate::pull_support::{LIMIT, NODE, PullNode, create_node_image, fast, tag};
use crate::support::wait;
use kruised::controller::imagepull::Settings;
use kruised::cri::containerd::content::Ingest;
use kruised::cri::fake::FakeRuntime;
use kruised::k8s::crd::ImagePullPhase;
use serde_json::json;

const IMAGE: &str = "r.io/big";

fn layer(offset: u64) -> Vec<Ingest> {
    vec![Ingest {
        reference: "layer-sha256:0123".into(),
        offset,
        total: 1000,
    }]
}

async fn start(settings: Settings) -> (PullNode, FakeRuntime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cri = FakeRuntime::start(&dir.path().join("cri.sock"), "containerd")
        .await
        .unwrap();
    // the content service answers, with nothing in flight yet
    cri.set_ingests(Some(vec![]));
    let node = PullNode::start(settings, cri.endpoint()).await;
    (node, cri, dir)
}

/// Waits until the puller has taken the ingests in flight at the pull's start (someone else's
/// until they move): what the test sets from then on is the pull's.
async fn following(cri: &FakeRuntime) {
    wait::cri(
        cri,
        LIMIT,
        "the puller's first ListStatuses",
        |st| st.calls.get("ListStatuses").copied().unwrap_or(0),
        |&n| n >= 1,
    )
    .await;
}

fn progress_of(s: &kruised::k8s::crd::NodeImageStatus) -> Option<i32> {
    s.image_statuses
        .get(IMAGE)
        .and_then(|i| i.tags.first())
        .filter(|t| t.phase == ImagePullPhase::Pulling)
        .map(|t| t.progress)
}

#[tokio::test]
async fn progress_follows_the_landed_bytes_at_most_once_a_second_and_is_not_written_while_nothing_lands()
 {
    let (node, cri, _dir) = start(fast()).await;
    // the pull lasts 4 s: the layer lands in two steps, then nothing more
    cri.delay("PullImage.body", Duration::from_secs(4));
    create_node_image(
        &node.api,
        json!({IMAGE: {"tags": [{"tag": "v1", "version": 1}]}}),
        None,
    );
    node.wait_status("Pulling", |s| progress_of(s) == Some(0))
        .await;
    following(&cri).await;
    cri.set_ingests(Some(layer(250)));
    node.wait_status("25 %", |s| progress_of(s) == Some(25))
        .await;
    cri.set_ingests(Some(layer(600)));
    node.wait_status("60 %", |s| progress_of(s) == Some(60))
        .await;
    // when the API server received each write (the test may see a status late)
    let written_at = |percent: u32| {
        node.api
            .requests()
            .iter()
            .filter(|r| r.verb == "patch" && r.resource == "nodeimages/status")
            .find(|r| r.body.contains(&format!("\"progress\":{percent}")))
            .and_then(|r| r.at)
            .unwrap_or_else(|| panic!("no write of {percent} %"))
    };
    let between = written_at(60).duration_since(written_at(25));
    let writes = node.api.request_count("patch", "nodeimages/status");
    // the same bytes, polled again and again until the pull ends: no write but the last
    let s = node.wait_status("Succeeded", |s| s.succeeded == 1).await;
    assert_eq!(tag(&s, IMAGE, "v1").progress, 100);
    assert_eq!(
        node.api.request_count("patch", "nodeimages/status"),
        writes + 1,
        "only the final status was written after 60 %"
    );
    assert!(
        between >= Duration::from_millis(900),
        "two progress writes at least a second apart (60 % was written {between:?} \
         after 25 %)"
    );
    let polls = cri.state().calls.get("ListStatuses").copied().unwrap_or(0);
    assert!(
        polls >= 10,
        "the ingests were polled while the pull ran: {polls}"
    );
}

#[tokio::test]
async fn a_pull_whose_bytes_stop_landing_fails_at_the_stall_timeout_whatever_its_timeout() {
    let (node, cri, _dir) = start(Settings {
        stall_timeout: Some(Duration::from_secs(2)),
        ..fast()
    })
    .await;
    // the runtime would take a minute; the tag allows ten
    cri.delay("PullImage.body", Duration::from_secs(60));
    create_node_image(
        &node.api,
        json!({IMAGE: {"tags": [{"tag": "v1", "version": 1,
            "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 0}}]}}),
        None,
    );
    node.wait_status("Pulling", |s| progress_of(s) == Some(0))
        .await;
    following(&cri).await;
    // 300 bytes land, then no more
    cri.set_ingests(Some(layer(300)));
    let s = wait::node_image(&node.api, LIMIT, NODE, "v1 Failed", |s| s.failed == 1).await;
    let t = tag(&s, IMAGE, "v1");
    assert!(
        t.message.contains("stalled")
            && t.message.contains("(300 of 1000 bytes)")
            && t.message.contains("--image-pull-stall-timeout"),
        "{}",
        t.message
    );
}

#[tokio::test]
async fn without_a_content_service_progress_stays_0_until_the_end_and_there_is_no_stall() {
    let dir = tempfile::tempdir().unwrap();
    let cri = FakeRuntime::start(&dir.path().join("cri.sock"), "containerd")
        .await
        .unwrap();
    // no set_ingests: Unimplemented, as CRI-O
    let node = PullNode::start(
        Settings {
            stall_timeout: Some(Duration::from_secs(1)),
            ..fast()
        },
        cri.endpoint(),
    )
    .await;
    cri.delay("PullImage.body", Duration::from_secs(2));
    create_node_image(
        &node.api,
        json!({IMAGE: {"tags": [{"tag": "v1", "version": 1}]}}),
        None,
    );
    let mut seen = Vec::new();
    let s = wait::node_image(&node.api, LIMIT, NODE, "v1 done", |s| {
        if let Some(p) = progress_of(s) {
            seen.push(p);
        }
        s.succeeded + s.failed == 1
    })
    .await;
    assert_eq!(
        s.succeeded, 1,
        "a 2 s pull is not a stall without progress: {s:?}"
    );
    assert!(seen.iter().all(|&p| p == 0), "{seen:?}");
}
