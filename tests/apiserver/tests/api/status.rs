//! The `/status` subresource (rule 6).

use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn custom_resource_create_drops_status() {
    let (_s, c) = start().await;
    let mut ni = node_image("n1");
    ni["status"] = json!({"desired": 5});
    let r = c.post(NODEIMAGES, &ni).await;
    assert!(r.body.get("status").is_none(), "{}", r.text);
}

#[tokio::test]
async fn custom_resource_status_put_changes_only_status() {
    let (_s, c) = start().await;
    let mut obj = c.post(NODEIMAGES, &node_image("n1")).await.body;
    obj["status"] = json!({"desired": 1});
    obj["spec"] = json!({"images": {}});
    obj["metadata"]["labels"] = json!({"ignored": "yes"});
    let r = c.put(&format!("{NODEIMAGES}/n1/status"), &obj).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], json!({"desired": 1}));
    assert!(
        r.body["spec"]["images"]["nginx"].is_object(),
        "spec untouched"
    );
    assert!(
        r.body["metadata"].get("labels").is_none(),
        "metadata untouched"
    );
}

#[tokio::test]
async fn custom_resource_main_writes_ignore_status() {
    let (_s, c) = start().await;
    let mut obj = c.post(NODEIMAGES, &node_image("n1")).await.body;
    obj["status"] = json!({"desired": 1});
    let r = c.put(&format!("{NODEIMAGES}/n1"), &obj).await;
    assert_eq!(r.status, 200);
    assert!(r.body.get("status").is_none());
    let r = c
        .patch(
            &format!("{NODEIMAGES}/n1"),
            "application/merge-patch+json",
            &json!({"status": {"desired": 2}}),
        )
        .await;
    assert!(r.body.get("status").is_none());
}

#[tokio::test]
async fn status_writes_still_check_the_resource_version() {
    let (_s, c) = start().await;
    let v1 = c.post(NODEIMAGES, &node_image("n1")).await.body;
    c.patch(
        &format!("{NODEIMAGES}/n1/status"),
        "application/merge-patch+json",
        &json!({"status": {"desired": 1}}),
    )
    .await;
    let mut stale = v1.clone();
    stale["status"] = json!({"desired": 9});
    let r = c.put(&format!("{NODEIMAGES}/n1/status"), &stale).await;
    assert_eq!(r.status, 409);
    let r = c
        .patch(&format!("{NODEIMAGES}/n1/status"), "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": v1["metadata"]["resourceVersion"]}, "status": {"desired": 9}}))
        .await;
    assert_eq!(r.status, 409);
}

#[tokio::test]
async fn pods_status_patch_changes_annotations_but_not_spec() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    p["metadata"]["annotations"] = json!({"keep": "1"});
    c.post(PODS, &p).await;
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/strategic-merge-patch+json",
            &json!({
                "metadata": {"annotations": {"apps.kruise.io/runtime-containers-meta": "{}"}},
                "spec": {"nodeName": "elsewhere"},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["metadata"]["annotations"],
        json!({"keep": "1", "apps.kruise.io/runtime-containers-meta": "{}"})
    );
    assert_eq!(
        r.body["spec"]["nodeName"], "n1",
        "status writes never change spec"
    );
    assert_eq!(r.body["status"]["phase"], "Running");
}

#[tokio::test]
async fn pod_main_writes_ignore_status() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"l": "1"}}}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"]["phase"], "Pending");
    assert_eq!(r.body["metadata"]["labels"]["l"], "1");
    assert_eq!(
        s.get("pods", "default", "a").unwrap()["status"]["phase"],
        "Pending"
    );
}

#[tokio::test]
async fn status_subresource_of_a_kind_without_one_is_404() {
    let (_s, c) = start().await;
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {}});
    let r = c.post("/api/v1/namespaces/default/secrets", &secret).await;
    assert_eq!(r.body["type"], "Opaque");
    let r = c.get("/api/v1/namespaces/default/secrets/s/status").await;
    assert_eq!(r.status, 404);
    let r = c.get(&format!("{NODEIMAGES}/x/status")).await;
    assert_eq!(r.status, 404, "missing object");
}
