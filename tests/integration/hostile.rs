//! What a tenant (a user with rights in one namespace) can write, against the daemon: each test
//! is named after an attack on 2c6dc4e and shows it no longer works, on the fake runtime and the
//! API double (the same attacks on real containerd are in `tests/e2e/hostile.rs`).

use std::time::Duration;

use crate::support::crr::Request;
use crate::support::daemon::Daemon;
use crate::support::hostile::fat_recreate_requests;
use crate::support::node::{FakeNode, NODE};
use crate::support::wait;
use kruised::k8s::crd::ContainerRecreateRequestPhase as Phase;
use kruised::k8s::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

async fn start(node: &FakeNode) -> Daemon {
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// A request for `pod`'s container `main`, as kruise's webhook fills it, in `namespace`.
fn request(node: &FakeNode, namespace: &str, name: &str, pod: &str, hook: Option<Value>) -> Value {
    let p = node.api.get("pods", "default", pod).unwrap();
    let id = p["status"]["containerStatuses"][0]["containerID"].as_str();
    let uid = p["metadata"]["uid"].as_str().unwrap();
    Request::new(name, namespace, NODE, pod, uid)
        .container("main", id, hook)
        .grace(600)
        .json()
}

fn main_container() -> Value {
    json!([{"name": "main", "image": "busybox:v1"}])
}

#[tokio::test]
async fn a_recreate_request_without_a_spec_does_not_stop_the_nodes_watch() {
    // kruise's CRD requires no spec: a tenant's request of metadata alone (where the webhook is
    // down or bypassed; its failurePolicy is often Ignore) made 2c6dc4e's typed list fail whole,
    // so no request of the node was served and kruised never became ready
    let mut node = FakeNode::start().await;
    node.add_pod("web-0", main_container(), json!({}), true);
    node.api
        .create(
            "containerrecreaterequests",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                   "metadata": {"name": "bare", "namespace": "tenant", "labels": {
                       keys::CRR_NODE_NAME_LABEL: NODE, keys::CRR_ACTIVE_LABEL: "true"}}}),
        )
        .unwrap();
    let d = start(&node).await;
    // the node's other requests are served
    node.api
        .create(
            "containerrecreaterequests",
            request(&node, "default", "real", "web-0", None),
        )
        .unwrap();
    wait::crr(
        &node.api,
        LIMIT,
        "default",
        "real",
        "the real request recreating",
        |r| r.phase() == Phase::Recreating,
    )
    .await;
    node.api
        .wait_for_value(LIMIT, |_| (!node.stopped_ids().is_empty()).then_some(()))
        .await
        .expect("the real request's container stopped");
    // and the bare one ended, saying why, instead of hanging the node's watch (read as JSON:
    // it has no spec to read it into the typed request)
    let message = node
        .api
        .wait_for_value(LIMIT, |v| {
            let o = v.get("containerrecreaterequests", "tenant", "bare")?;
            (o["status"]["phase"] == "Completed").then(|| o["status"]["message"].to_string())
        })
        .await
        .expect("the bare request completed");
    assert!(message.contains("pod-uid"), "{message}");
    drop(d);
}

#[tokio::test]
async fn a_request_naming_another_namespaces_pod_by_its_uid_is_refused() {
    // the containers were chosen by the pod-uid label alone: a request that came past kruise's
    // webhook, in the tenant's namespace, with the uid of another tenant's pod, stopped that
    // pod's container on 2c6dc4e
    let mut node = FakeNode::start().await;
    node.add_pod("web-0", main_container(), json!({}), true);
    let mut d = start(&node).await;
    node.api
        .create(
            "containerrecreaterequests",
            request(&node, "tenant", "borrowed", "web-0", None),
        )
        .unwrap();
    let r = wait::crr(
        &node.api,
        LIMIT,
        "tenant",
        "borrowed",
        "the request refused",
        |r| r.phase() == Phase::Completed,
    )
    .await;
    let message = r
        .status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("names pod default/web-0, not this request's tenant/web-0"),
        "{message:?}"
    );
    assert!(node.stopped_ids().is_empty(), "no container was stopped");
    assert!(!d.logged("stopping container for the recreate request"));
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn eight_hanging_prestop_hooks_do_not_hold_up_another_pods_request() {
    // a request's preStop hook ran inside its pass, on one of 8 workers, for as long as its
    // creator's grace (here 600 s): 8 of them, and no other pod's request moved on 2c6dc4e
    let mut node = FakeNode::start().await;
    for i in 0..8 {
        node.add_pod(&format!("hang-{i}"), main_container(), json!({}), true);
    }
    node.add_pod("other", main_container(), json!({}), true);
    let mut d = start(&node).await;
    node.cri.delay("ExecSync", Duration::from_secs(600));
    let hook = json!({"exec": {"command": ["sleep", "600"]}});
    for i in 0..8 {
        let pod = format!("hang-{i}");
        node.api
            .create(
                "containerrecreaterequests",
                request(&node, "default", &pod, &pod, Some(hook.clone())),
            )
            .unwrap();
    }
    for i in 0..8 {
        let pod = format!("hang-{i}");
        wait::crr(
            &node.api,
            LIMIT,
            "default",
            &pod,
            "each hanging request recreating",
            |r| r.phase() == Phase::Recreating,
        )
        .await;
    }
    d.wait_for_logged_times("stopping container for the recreate request", 8, LIMIT)
        .await;
    // the other pod's request (no hook): its container is stopped while the 8 hooks hang
    node.api
        .create(
            "containerrecreaterequests",
            request(&node, "default", "other", "other", None),
        )
        .unwrap();
    let other = node.api.get("pods", "default", "other").unwrap()["status"]["containerStatuses"][0]
        ["containerID"]
        .as_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    node.api
        .wait_for_value(LIMIT, |_| node.stopped_ids().contains(&other).then_some(()))
        .await
        .expect("the other pod's container stopped while 8 hooks hang");
    assert_eq!(
        node.stopped_ids(),
        [other],
        "the hanging ones are not stopped yet"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_request_listing_one_container_thousands_of_times_costs_one_runtime_call_per_name() {
    // kruise's webhook checks `containers` on create only: a tenant's update to 10,000 copies
    // of one name made every pass call the runtime once per entry, one after another, until the
    // pass outlived the stuck check and kruised was restarted in a loop (issue 43, row 6)
    let mut node = FakeNode::start().await;
    node.add_pod("web-0", main_container(), json!({}), true);
    let d = start(&node).await;
    let mut r = request(&node, "default", "copies", "web-0", None);
    let one = r["spec"]["containers"][0].clone();
    r["spec"]["containers"] = Value::Array(vec![one; 2_000]);
    let before = node.cri.state().call_count("ContainerStatus");
    node.api.create("containerrecreaterequests", r).unwrap();
    wait::crr(
        &node.api,
        LIMIT,
        "default",
        "copies",
        "the request recreating its one container",
        |r| r.phase() == Phase::Recreating,
    )
    .await;
    node.api
        .wait_for_value(LIMIT, |_| (!node.stopped_ids().is_empty()).then_some(()))
        .await
        .expect("the container stopped");
    let calls = node.cri.state().call_count("ContainerStatus") - before;
    assert!(
        calls < 100,
        "{calls} ContainerStatus calls for a request of one distinct container"
    );
    assert_eq!(node.stopped_ids().len(), 1, "one container, stopped once");
    drop(d);
}

/// The peak resident memory of a daemon started on a node where 200 recreate requests for one
/// pod wait, each with `kib` KiB of a tenant's annotations.
async fn peak_at_start_with_requests_of(kib: usize) -> f64 {
    let mut node = FakeNode::start().await;
    node.add_pod("web-0", main_container(), json!({}), true);
    fat_recreate_requests(&node.api, NODE, "default", "web-0", "fat", 200, kib);
    let d = start(&node).await;
    let peak = d.rss_peak_bytes().expect("the daemon's memory");
    peak as f64 / (1024.0 * 1024.0)
}

/// Issue 43, row 5: a tenant's recreate requests, each with 200 KiB of annotations, were cached
/// whole and listed in one body: 200 of them put a fresh kruised 78 MiB above the same start
/// with thin ones (the debug build: 117.7 against 39.8 MiB), and more took it out of memory at
/// every start. Now the list is read in pages of 10, each pruned to what the daemon reads
/// before the next: about 9 MiB above.
#[tokio::test]
async fn two_hundred_recreate_requests_with_200_kib_of_annotations_each_do_not_swell_a_starting_daemon()
 {
    let thin = peak_at_start_with_requests_of(0).await;
    let fat = peak_at_start_with_requests_of(200).await;
    eprintln!(
        "peak resident memory at start with 200 requests: {thin:.1} MiB thin, {fat:.1} MiB with 200 KiB of annotations each"
    );
    // the annotations are 39 MiB: a daemon that kept them, or read one list body of them,
    // would be far past this
    assert!(
        fat - thin < 16.0,
        "the fat requests cost {:.1} MiB more at start ({thin:.1} -> {fat:.1})",
        fat - thin
    );
}
