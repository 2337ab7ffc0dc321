//! The in-place update timeline (issue 41, item 2) on the doubles: the manager double updates a
//! CloneSet's pod in place (`InPlaceUpdateReady` False, then the spec), the kubelet stand-in
//! recreates the container on the fake runtime, and `kruised` (its own process) records each
//! step: in `/metrics`, in its admin endpoint, in `kruised explain`, and, past the threshold,
//! in one event on the pod.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::daemon::{Daemon, http_get};
use crate::support::kubelet::KubeletTiming;
use crate::support::manager::scene::{LIMIT, Scene, WORKLOAD};
use crate::support::manager::{Template, Timing};
use crate::support::node::{FakeNode, NODE};
use crate::support::wait;

const SLOW_REASON: &str = "InPlaceUpdateSlow";

fn template(image: &str) -> Template {
    Template::new(json!([{"name": "main", "image": image}])).label("app", "demo")
}

fn raw_id(pod: &Value) -> String {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_else(|| panic!("main's container ID in {pod:#}"));
    id.split_once("://").map_or(id, |(_, id)| id).to_string()
}

/// Waits until the daemon's admin endpoint shows pod `web-0`'s update finished; returns the
/// timelines.
async fn finished_timeline(d: &Daemon) -> Value {
    let (_, body) = wait::poll(
        LIMIT,
        Duration::from_millis(50),
        "web-0's update finished on the daemon's timeline",
        || http_get(d.admin, "/debug/inplace-updates/default/web-0"),
        |(code, body): &(u16, String)| *code == 200 && body.contains("\"state\":\"finished\""),
    )
    .await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `kruised explain default/web-0` with `format` (`json` or `table`) against the node and the
/// daemon's admin address `daemon`.
async fn explain(s: &Scene, daemon: std::net::SocketAddr, format: &str) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"))
        .args(["explain", "default/web-0", "-o", format, "--kubeconfig"])
        .arg(s.node.kubeconfig())
        .args(["--runtime-endpoint", &s.node.endpoint()])
        .args(["--daemon-addr", &daemon.to_string()])
        .output()
        .await
        .expect("run kruised explain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Waits until the daemon's `/metrics` has `line` (an update is measured just after its
/// timeline shows it ended); returns them.
async fn metrics_with(d: &Daemon, line: &str) -> String {
    let (_, metrics) = wait::poll(
        LIMIT,
        Duration::from_millis(50),
        &format!("{line} in /metrics"),
        || http_get(d.admin, "/metrics"),
        |(code, body): &(u16, String)| *code == 200 && body.contains(line),
    )
    .await;
    metrics
}

fn step<'a>(update: &'a Value, name: &str) -> &'a Value {
    update["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["step"] == name))
        .unwrap_or_else(|| panic!("step {name} in {update:#}"))
}

fn slow_events(s: &Scene) -> Vec<Value> {
    s.node
        .api
        .list("events", None)
        .into_iter()
        .filter(|e| e["reason"] == SLOW_REASON)
        .collect()
}

#[tokio::test]
async fn an_in_place_image_update_is_timed_step_by_step_in_metrics_explain_and_no_event_under_the_threshold()
 {
    let s = Scene::start(
        &[("web-0", &template("busybox:v1"))],
        Timing::as_in_the_cluster_lab(),
    )
    .await;
    let d = s.kruised().await;
    let before = s.pod("web-0");
    s.manager.set_template(WORKLOAD, template("busybox:v2"));
    let after = s.updated("web-0", "the image v2 in place").await;

    let timelines = finished_timeline(&d).await;
    assert_eq!(timelines["pod"], "default/web-0");
    let update = &timelines["updates"][0];
    assert_eq!(
        update["seenBy"], "gate",
        "the manager's InPlaceUpdateReady=False comes before the spec: {update:#}"
    );
    assert_eq!(update["joinedLate"], false);
    let main = &update["containers"][0];
    assert_eq!(main["name"], "main");
    assert_eq!(main["image"], "busybox:v2");
    assert_eq!(main["oldContainer"], raw_id(&before).as_str());
    assert_eq!(main["newContainer"], raw_id(&after).as_str());
    for name in [
        "image_present",
        "container_stopped",
        "container_started",
        "ready",
        "meta_written",
    ] {
        let s = step(update, name);
        assert!(
            s["at"].is_string() && s["afterSeconds"].as_f64().is_some(),
            "{name} recorded: {update:#}"
        );
    }
    let after_seen = |name| step(update, name)["afterSeconds"].as_f64().unwrap_or(-1.0);
    assert!(
        after_seen("container_stopped") <= after_seen("container_started")
            && after_seen("container_started") <= after_seen("ready"),
        "stopped, then started, then ready: {update:#}"
    );
    assert!(update["unreadySeconds"].as_f64().is_some(), "{update:#}");

    // the histograms, one update each
    let metrics = metrics_with(
        &d,
        "kruised_inplace_update_timelines_total{seen_by=\"gate\",result=\"finished\"} 1",
    )
    .await;
    for line in [
        "kruised_inplace_update_step_seconds_count{step=\"image_present\"} 1",
        "kruised_inplace_update_step_seconds_count{step=\"container_stopped\"} 1",
        "kruised_inplace_update_step_seconds_count{step=\"container_started\"} 1",
        "kruised_inplace_update_step_seconds_count{step=\"ready\"} 1",
        "kruised_inplace_update_step_seconds_count{step=\"meta_written\"} 1",
        "kruised_inplace_update_unready_seconds_count{seen_by=\"gate\"} 1",
        "kruised_inplace_update_timelines_total{seen_by=\"gate\",result=\"finished\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    // explain shows the daemon's timeline
    let view: Value = serde_json::from_str(&explain(&s, d.admin, "json").await).expect("JSON");
    let shown = &view["inPlaceUpdates"];
    assert!(
        shown["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("from the daemon at")),
        "{shown:#}"
    );
    assert_eq!(shown["updates"][0]["state"], "finished");
    assert_eq!(shown["updates"][0]["containers"], update["containers"]);
    let text = explain(&s, d.admin, "table").await;
    assert!(
        text.contains("In-place updates (from the daemon at")
            && text.contains("finished: seen by gate")
            && text.contains("container stopped")
            && text.contains("unready window"),
        "{text}"
    );
    // the update took far less than the default threshold: no event
    assert_eq!(slow_events(&s), Vec::<Value>::new());

    // without the daemon, explain says so and reads the update back from the runtime and pod
    let admin = d.admin;
    d.terminate();
    let mut d = d;
    assert!(d.wait_exit(LIMIT).await.success());
    let view: Value = serde_json::from_str(&explain(&s, admin, "json").await).expect("JSON");
    let shown = &view["inPlaceUpdates"];
    assert!(
        shown["source"].as_str().is_some_and(|s| {
            s.starts_with(&format!("no daemon answered at {admin}")) && s.contains("read back")
        }),
        "{shown:#}"
    );
    let read_back = &shown["updates"][0];
    assert_eq!(read_back["state"], "read back");
    assert_eq!(
        read_back["containers"][0]["newContainer"],
        raw_id(&after).as_str()
    );
    for name in ["container_stopped", "container_started", "ready"] {
        assert!(
            step(read_back, name)["at"].is_string(),
            "{name}: {read_back:#}"
        );
    }
}

#[tokio::test]
async fn an_update_whose_unready_window_passes_the_threshold_is_told_in_one_event_on_its_pod() {
    let s = Scene::start(
        &[("web-0", &template("busybox:v1"))],
        Timing::as_in_the_cluster_lab(),
    )
    .await;
    let mut args = s.node.daemon_args();
    // any real update takes longer than a millisecond
    args.extend(["--slow-in-place-update-threshold".into(), "1ms".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    s.manager.set_template(WORKLOAD, template("busybox:v2"));
    s.updated("web-0", "the image v2 in place").await;
    finished_timeline(&d).await;

    let events = wait::events(&s.node.api, LIMIT, SLOW_REASON, 1).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["kind"], "Pod");
    assert_eq!(e["involvedObject"]["name"], "web-0");
    let note = e["message"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("in-place update unready for")
            && note.contains("(threshold 1ms)")
            && note.contains("seen by gate")
            && note.contains("container started +"),
        "{note}"
    );
    metrics_with(&d, "kruised_inplace_update_slow_events_total 1").await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn the_timeline_endpoint_refuses_a_malformed_pod_and_says_when_it_knows_none() {
    let s = Scene::start(
        &[("web-0", &template("busybox:v1"))],
        Timing::as_in_the_cluster_lab(),
    )
    .await;
    let mut d = s.kruised().await;
    let (code, body) = http_get(d.admin, "/debug/inplace-updates/default/Not_A_Name").await;
    assert_eq!(
        (code, body.as_str()),
        (400, "expected /debug/inplace-updates/<namespace>/<name>\n")
    );
    let (code, body) = http_get(d.admin, "/debug/inplace-updates/default/nobody").await;
    assert_eq!(code, 404, "{body}");
    // a pod without an update yet: known once the daemon has seen it, nothing to show
    let (_, body) = wait::poll(
        LIMIT,
        Duration::from_millis(50),
        "web-0 known to the daemon's timelines",
        || http_get(d.admin, "/debug/inplace-updates/default/web-0"),
        |(code, _): &(u16, String)| *code == 200,
    )
    .await;
    let timelines: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(timelines["updates"], json!([]));
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// The manager's grace period by hand (the manager double has none yet): the annotation with
/// the coming image, then the spec with it and the annotation gone, as kruise's
/// `finishGracePeriod` writes them.
#[tokio::test]
async fn an_update_announced_by_the_grace_annotation_is_seen_by_it_and_a_bare_pod_has_no_timeline()
{
    let mut node = FakeNode::start().await;
    let main = json!([{"name": "main", "image": "busybox:v1"}]);
    node.add_pod("web-0", main.clone(), json!({}), true);
    node.add_owned_pod("bare", main, json!({}), true, json!([]));
    // the new image is on the node already
    node.cri.state().add_image("busybox:v2");
    let node = std::sync::Arc::new(node);
    let _kubelet = KubeletTiming::at_once(node.clone());
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    // known once the daemon has seen it
    wait::poll(
        LIMIT,
        Duration::from_millis(50),
        "web-0 known to the daemon's timelines",
        || http_get(d.admin, "/debug/inplace-updates/default/web-0"),
        |(code, _): &(u16, String)| *code == 200,
    )
    .await;

    let grace =
        "{\"revision\":\"r2\",\"containerImages\":{\"main\":\"busybox:v2\"},\"graceSeconds\":15}";
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["annotations"]["apps.kruise.io/inplace-update-grace"] = json!(grace)
        })
        .expect("the grace annotation written");
    let (_, body) = wait::poll(
        LIMIT,
        Duration::from_millis(50),
        "web-0's update seen by the grace annotation, its image found on the node",
        || http_get(d.admin, "/debug/inplace-updates/default/web-0"),
        |(_, body): &(u16, String)| {
            body.contains("\"seenBy\":\"grace-annotation\"")
                && body.contains("\"source\":\"already on the node\"")
        },
    )
    .await;
    let shown: Value = serde_json::from_str(&body).expect("JSON");
    let update = &shown["updates"][0];
    assert_eq!(update["state"], "in progress");
    assert_eq!(update["containers"][0]["image"], "busybox:v2");
    let present = step(update, "image_present");
    assert_eq!(
        present["source"], "already on the node",
        "the runtime had it when the annotation came: {update:#}"
    );
    assert_eq!(step(update, "ready")["at"], Value::Null);

    // the grace period over: the spec, the annotation gone
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["spec"]["containers"][0]["image"] = json!("busybox:v2");
            p["metadata"]["annotations"]
                .as_object_mut()
                .expect("annotations")
                .remove("apps.kruise.io/inplace-update-grace");
        })
        .expect("the spec patched");
    let timelines = finished_timeline(&d).await;
    let update = &timelines["updates"][0];
    assert_eq!(update["seenBy"], "grace-annotation", "{update:#}");
    for name in [
        "container_stopped",
        "container_started",
        "ready",
        "meta_written",
    ] {
        assert!(step(update, name)["at"].is_string(), "{name}: {update:#}");
    }
    // found on the node before anything was done to the container (an order, not a time: the
    // step is stamped when the runtime answered, a millisecond or more after the annotation
    // was seen on a busy machine)
    let after = |name: &str| {
        step(update, name)["afterSeconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} has afterSeconds: {update:#}"))
    };
    assert!(
        after("image_present") <= after("container_stopped"),
        "the image was found before the container was stopped: {update:#}"
    );
    metrics_with(
        &d,
        "kruised_inplace_update_timelines_total{seen_by=\"grace-annotation\",result=\"finished\"} 1",
    )
    .await;

    // a pod no kruise workload controls: no timeline
    let (code, body) = http_get(d.admin, "/debug/inplace-updates/default/bare").await;
    assert_eq!(code, 404, "{body}");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
