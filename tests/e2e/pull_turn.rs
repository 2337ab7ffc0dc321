//! Pre-pulls yield to the node's pods on a real runtime (issue 42, item 3): a NodeImage tag
//! waits while a pod on the node cannot get its own image (`ImagePullBackOff`; containerd's
//! `ImageStatus` says the image is absent), and is pulled once the pod leaves the node.
//!
//! Repositories: `turn/absent` (never pushed: the pod's image stays absent), `test/busybox`
//! (only pulled, never removed).

use std::time::Duration;

use crate::pull_support::{LIMIT, NODE, PullNode, fast};
use crate::support::kubelet::status::{Report, set_containers, update_container};
use crate::support::{Lab, wait};
use serde_json::json;

#[tokio::test]
async fn a_nodeimage_tag_waits_while_a_pod_cannot_get_its_image_and_is_pulled_once_the_pod_leaves()
{
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let absent = format!("{}/turn/absent:v1", lab.registry);
    let mut pod = json!({
        "metadata": {"namespace": "shop", "name": "web-0", "uid": "uid-web-0"},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": absent}]},
        "status": {"phase": "Pending"}
    });
    let report = Report {
        name: "app".into(),
        image: absent.clone(),
        running: None,
        ..Default::default()
    };
    set_containers(&mut pod, &[report]);
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
