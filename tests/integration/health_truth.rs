//! `/readyz` and `/healthz` of the `kruised` binary tell the truth after start: a watch that
//! stops being live after its first sync makes `/readyz` name it until a watch request is
//! accepted again, and a pass of a work queue stuck in a running process fails `/healthz`
//! naming the queue (the chain systemd's watchdog acts on: `tests/e2e/systemd.rs`).

use std::time::Duration;

use crate::support::daemon::{Daemon, http_get};
use crate::support::node::{FakeNode, NODE};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

fn args(node: &FakeNode) -> Vec<String> {
    node.daemon_args()
}

/// Whether a log line is the watch of `resource`'s and its message starts with `message`.
fn watch_line(v: &Value, resource: &str, message: &str) -> bool {
    v["span"]["resource"] == resource
        && v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(message))
}

// Before kruised's own watch loop, kube's watcher retried a failing watch with no word to
// readiness once the first list was in: `/readyz` said ready while the pod watch failed (checked:
// with the old loop this test fails at the first `/readyz`, 200 while every watch of pods
// answers 500).
#[tokio::test]
async fn readyz_names_a_watch_that_fails_after_its_first_sync_and_is_ready_once_it_is_accepted() {
    let node = FakeNode::start().await;
    let args = args(&node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    let (code, body) = http_get(d.admin, "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ok"));

    // every watch of pods answers 500 from now on; the open watches break, so the pod watch
    // must ask again
    node.api
        .fail_next(1_000_000, 500, Some("watch"), Some("pods"));
    node.api.drop_watches();
    d.wait_for_line("the pod watch failing", LIMIT, |v| {
        watch_line(v, "pods", "watch failed")
    })
    .await;
    // readiness is set before the failure is logged
    let (code, body) = http_get(d.admin, "/readyz?verbose").await;
    assert_eq!(code, 503, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("[-]pods failed: "))
        .unwrap_or_else(|| panic!("/readyz does not name the pod watch:\n{body}"));
    assert!(
        line.contains("not live since ") && line.contains("500"),
        "says since when and why: {line}"
    );
    for other in ["nodeimage", "containerrecreaterequests", "nodepodprobe"] {
        assert!(
            body.contains(&format!("[+]{other} ok")),
            "only the failing watch is named: {body}"
        );
    }

    node.api.clear_faults();
    d.wait_for_line("the pod watch live again", LIMIT, |v| {
        watch_line(v, "pods", "watch live again")
    })
    .await;
    let (code, body) = http_get(d.admin, "/readyz").await;
    assert_eq!(
        (code, body.as_str()),
        (200, "ok"),
        "ready again:\n{}",
        d.log_text()
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

// The failpoint (`kruised::controller::failpoint`, test builds only) makes container meta's
// pass over one pod never end, and shortens the stuck-pass limit to 2 s: `/healthz` must fail
// naming the queue and the pod, which is what stops systemd's watchdog pings (checked: without
// the queue's liveness check `/healthz` stays `ok` and the wait below times out).
#[tokio::test]
async fn a_containermeta_pass_that_never_ends_fails_healthz_naming_the_queue_and_the_pod() {
    let mut node = FakeNode::start().await;
    let args = args(&node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start_with_env(
        NODE,
        &args,
        &[
            (
                "KRUISED_FAILPOINT_STUCK_ANNOTATION",
                "test.kruised.io/stuck",
            ),
            ("KRUISED_FAILPOINT_STUCK_PASS_SECS", "2"),
        ],
    );
    d.wait_for_log("test failpoints armed", LIMIT).await;
    d.wait_for_log("daemon ready", LIMIT).await;
    let (code, body) = http_get(d.admin, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok"));

    // a pod created after the start, without kruised's annotation: container meta takes it
    node.add_pod(
        "stuck-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({"test.kruised.io/stuck": "yes"}),
        true,
    );
    d.wait_for_log("failpoint: this pass never ends", LIMIT)
        .await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    let body = loop {
        let (code, body) = http_get(d.admin, "/healthz").await;
        if code != 200 {
            assert_eq!(code, 500, "{body}");
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/healthz still ok {LIMIT:?} after the pass got stuck; log:\n{}",
            d.log_text()
        );
        // polled: liveness is asked, it tells nothing by itself (as systemd's watchdog asks)
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.starts_with("check containermeta failed, err: containermeta: ")
            && body.contains("stuck-0")
            && body.contains("(limit 2s)"),
        "{body}"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
