//! Restart provenance ("why did my container restart?", kruise #910 and #1044: in-place
//! restarts, recreate requests and crashes look alike afterwards): the `kruised` binary against
//! the API-server double and the fake runtime, with the test playing the kubelet, and
//! `kruised explain` run afterwards as its own process, as a user runs it.

use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::kubelet::status;
use crate::support::node::{FakeNode, NODE};
use crate::support::wait;
use apiserver_double::StoreView;
use kruised::controller::provenance::{self, NOT_BY_KRUISED, RECREATE_REQUEST, Restart};
use kruised::k8s::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

fn containers() -> Value {
    json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
        {"name": "side", "image": "busybox:v1"}
    ])
}

async fn start(node: &FakeNode) -> Daemon {
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// The runtime ID of the pod's current container `name`, as the kubelet reports it.
fn current_id(node: &FakeNode, pod: &str, name: &str) -> String {
    let p = node.api.get("pods", "default", pod).unwrap();
    p["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .and_then(|s| s["containerID"].as_str())
        .unwrap()
        .to_string()
}

/// The pod's record of kruised's stops, as the store holds it (read inside a wait).
fn recorded(v: &StoreView<'_>, pod: &str) -> Vec<Restart> {
    v.get("pods", "default", pod)
        .and_then(|p| {
            Some(provenance::parse(
                p["metadata"]["annotations"][keys::LAST_RESTARTS].as_str()?,
            ))
        })
        .unwrap_or_default()
}

/// The record's entry for the container `id`.
fn entry(restarts: Vec<Restart>, id: &str) -> Option<Restart> {
    restarts.into_iter().find(|r| r.container_id == id)
}

/// `kruised explain default/<pod>` with `args`, its standard output.
async fn explain(node: &FakeNode, pod: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"))
        .args(["explain", &format!("default/{pod}"), "--kubeconfig"])
        .arg(node.kubeconfig())
        .args(["--runtime-endpoint", &node.endpoint()])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A recreate request for the pod's container `container`, as kruise's webhook leaves it.
fn recreate_request(node: &FakeNode, name: &str, pod: &str, container: &str) -> Value {
    let p = node.api.get("pods", "default", pod).unwrap();
    let status = p["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == container)
        .unwrap()
        .clone();
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": name, "namespace": "default", "labels": {
            keys::CRR_NODE_NAME_LABEL: NODE, keys::CRR_ACTIVE_LABEL: "true",
            keys::CRR_POD_UID_LABEL: p["metadata"]["uid"]}},
        "spec": {"podName": pod,
                 "containers": [{"name": container, "statusContext": {
                     "containerID": status["containerID"], "restartCount": status["restartCount"]}}],
                 "strategy": {"terminationGracePeriodSeconds": 30}}
    })
}

/// What the kubelet does after a crash it did not cause and kruised did not either: the
/// container died (137, the OOM killer's SIGKILL), and the kubelet starts the next attempt and
/// reports it with the dead one in `lastState`.
fn crash(node: &FakeNode, pod: &str, container: &str) -> String {
    let old = current_id(node, pod, container);
    let old_raw = old.split_once("://").unwrap().1.to_string();
    node.cri.exit_container(&old_raw, 137);
    let obj = node.api.get("pods", "default", pod).unwrap();
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(obj).unwrap();
    let spec = p
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == container);
    let new = node.start_container(&p, &node.sandboxes[pod], spec.unwrap(), 1, true, true);
    node.api
        .modify("pods", "default", pod, |p| {
            status::update_container(p, container, |s| {
                s["containerID"] = json!(node.kubelet_id(&new));
                s["restartCount"] = json!(1);
                s["lastState"] = json!({"terminated": {"containerID": old, "exitCode": 137,
                    "reason": "OOMKilled"}});
            });
        })
        .unwrap();
    old
}

/// The restarts `kruised explain -o json` lists for `container`.
fn restarts_of(view: &Value, container: &str) -> Vec<Value> {
    view["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("{container} in {view:#}"))["restarts"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn an_env_restart_a_recreate_request_and_a_crash_each_show_in_explain_with_their_reason() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::meta(
        &node.api,
        LIMIT,
        "default",
        "web-0",
        "the first annotation",
        |m| m.containers.len() == 2,
    )
    .await;

    // an in-place update of the env from metadata: kruised stops main, the kubelet recreates it
    let first = current_id(&node, "web-0", "main");
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    let what = "the env restart recorded";
    let has = |r: &Vec<Restart>| r.iter().any(|r| r.container_id == first);
    let seen = wait::store(&node.api, LIMIT, what, |v| recorded(v, "web-0"), has).await;
    let env = entry(seen, &first).expect("seen");
    assert_eq!(env.reason, "env-from-metadata");
    assert_eq!(env.detail, "ROLE (annotation role)", "the env that changed");
    node.recreate("web-0", "main");

    // a recreate request for main: kruised stops it, the kubelet recreates it
    let second = current_id(&node, "web-0", "main");
    node.api
        .create(
            "containerrecreaterequests",
            recreate_request(&node, "restart-main", "web-0", "main"),
        )
        .unwrap();
    let what = "the recreate request's stop recorded";
    let has = |r: &Vec<Restart>| r.iter().any(|r| r.container_id == second);
    let seen = wait::store(&node.api, LIMIT, what, |v| recorded(v, "web-0"), has).await;
    let crr = entry(seen, &second).expect("seen");
    assert_eq!(
        (crr.reason.as_str(), crr.detail.as_str()),
        (RECREATE_REQUEST, "restart-main")
    );
    node.recreate("web-0", "main");

    // a crash of side: no stop of kruised's
    let crashed = crash(&node, "web-0", "side");

    let view: Value =
        serde_json::from_str(&explain(&node, "web-0", &["-o", "json"]).await).unwrap();
    let main = restarts_of(&view, "main");
    let main: Vec<(u64, bool, &str, &str, &str)> = main
        .iter()
        .map(|r| {
            (
                r["restart"].as_u64().unwrap(),
                r["byKruised"].as_bool().unwrap(),
                r["reason"].as_str().unwrap(),
                r["detail"].as_str().unwrap_or_default(),
                r["stopped"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        main,
        [
            (2, true, RECREATE_REQUEST, "restart-main", second.as_str()),
            (
                1,
                true,
                "env-from-metadata",
                "ROLE (annotation role)",
                first.as_str()
            ),
        ],
        "{view:#}"
    );
    let side = restarts_of(&view, "side");
    assert_eq!(side.len(), 1, "{view:#}");
    assert_eq!(side[0]["restart"], 1);
    assert_eq!(side[0]["byKruised"], false);
    assert_eq!(side[0]["reason"], NOT_BY_KRUISED);
    assert_eq!(side[0]["stopped"], crashed.as_str());
    assert_eq!(side[0]["exit"], "exit code 137");

    // and the table a user reads says the same
    let table = explain(&node, "web-0", &[]).await;
    assert!(
        table.contains("#2    stopped by kruised: recreate-request (restart-main)")
            && table
                .contains("#1    stopped by kruised: env-from-metadata (ROLE (annotation role))")
            && table.contains(&format!("#1    {NOT_BY_KRUISED}; {crashed}, exit code 137")),
        "{table}"
    );
    // every stop counted by its reason
    let (_, metrics) = crate::support::daemon::http_get(d.admin, "/metrics").await;
    for reason in ["env-from-metadata", RECREATE_REQUEST] {
        assert!(
            metrics.contains(&format!(
                "kruised_container_stops_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_record_the_pods_author_wrote_is_kept_bounded_and_kruiseds_own_stop_is_added() {
    // the annotation is writable by whoever can patch the pod: garbage there never stops
    // kruised from recording, and explain credits no restart to a forged record
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    let forged: Vec<Value> = (0..20)
        .map(|i| {
            json!({"container": "side", "containerID": format!("containerd://forged-{i}"),
                         "reason": "recreate-request", "detail": "x".repeat(500)})
        })
        .collect();
    let annotations =
        json!({"role": "blue", keys::LAST_RESTARTS: Value::Array(forged).to_string()});
    node.add_pod("web-0", containers(), annotations, true);
    wait::meta(
        &node.api,
        LIMIT,
        "default",
        "web-0",
        "the first annotation",
        |m| m.containers.len() == 2,
    )
    .await;
    let first = current_id(&node, "web-0", "main");
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    let what = "kruised's stop recorded beside the forged ones";
    let has = |r: &Vec<Restart>| r.iter().any(|r| r.container_id == first);
    wait::store(&node.api, LIMIT, what, |v| recorded(v, "web-0"), has).await;
    let p = node.api.get("pods", "default", "web-0").unwrap();
    let written = provenance::parse(
        p["metadata"]["annotations"][keys::LAST_RESTARTS]
            .as_str()
            .unwrap(),
    );
    assert_eq!(written.len(), provenance::MAX_ENTRIES);
    assert_eq!(
        written.last().unwrap().container_id,
        first,
        "kruised's, the newest"
    );
    assert!(
        written
            .iter()
            .all(|r| r.detail.len() <= provenance::MAX_DETAIL + 3)
    );
    // the kubelet restarts side for a reason of its own; a forged record does not claim it
    crash(&node, "web-0", "side");
    let view: Value =
        serde_json::from_str(&explain(&node, "web-0", &["-o", "json"]).await).unwrap();
    let side = restarts_of(&view, "side");
    assert_eq!(side[0]["reason"], NOT_BY_KRUISED, "{view:#}");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
