//! A warm set for new nodes on a real runtime: `kruised run --startup-taint` against the
//! API-server double and the lab's runtime and registry keeps the node's startup taint until
//! the NodeImage's tags have finished in the runtime (one pulled from the registry, one the
//! registry does not have, failed for good), then removes it and only it.

use std::time::Duration;

use crate::support::wait;
use crate::support::{Lab, Plane, unique};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const KEY: &str = "kruised.io/warm-set";

#[tokio::test]
async fn a_new_node_is_untainted_once_its_node_images_tags_have_finished_in_the_runtime() {
    let Some(lab) = Lab::get() else { return };
    let plane = Plane::start().await;
    let node = unique("warm");
    let dedicated = json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"});
    plane
        .api
        .create(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                   "spec": {"taints": [{"key": KEY, "effect": "NoSchedule"}, dedicated]}}),
        )
        .unwrap();
    let name = format!("{}/test/busybox", lab.registry);
    // no pull policy: Always, so v1 comes from the registry whatever the node has
    plane
        .api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
            "metadata": {"name": node},
            "spec": {"images": {&name: {"tags": [
                {"tag": "v1", "version": 1},
                {"tag": "no-such-tag", "version": 1, "pullPolicy": {"backoffLimit": 0}}
            ]}}}}),
        )
        .unwrap();
    let mut d = plane
        .start_daemon(&lab, &node, &["--startup-taint", KEY], LIMIT)
        .await;

    let left = wait::store(
        &plane.api,
        LIMIT,
        "the startup taint removed",
        |v| {
            v.get("nodes", "", &node)
                .and_then(|n| n["spec"]["taints"].as_array().cloned())
                .unwrap_or_default()
        },
        |t: &Vec<Value>| !t.iter().any(|t| t["key"] == KEY),
    )
    .await;
    assert_eq!(left, [dedicated], "someone else's taint stays");
    let status = wait::node_image_status(plane.api.get("nodeimages", "", &node)).unwrap();
    assert_eq!(
        (status.succeeded, status.failed),
        (1, 1),
        "removed only once both tags had finished"
    );
    let line = d.wait_for_log("Removed taint", LIMIT).await;
    let said = line["message"].as_str().unwrap();
    assert!(
        said.contains(
            "the 2 NodeImage tags listed at start are finished: 1 pulled, 1 failed for good"
        ) && said.contains(&format!("{name}:no-such-tag")),
        "{said}"
    );
    let events = wait::events(&plane.api, LIMIT, "StartupTaintRemoved", 1).await;
    assert_eq!(events[0]["type"], "Warning", "a tag failed: {events:#?}");
    assert_eq!(events[0]["involvedObject"]["name"], node.as_str());
}
