//! PATCH formats and preconditions (rule 5).

use serde_json::json;

use crate::common::*;

const MERGE: &str = "application/merge-patch+json";
const JSON: &str = "application/json-patch+json";
const SMP: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

#[tokio::test]
async fn merge_patch_merges_maps_and_deletes_keys_set_to_null() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({"x": "1", "y": "2"})))
        .await;
    let r = c
        .patch(
            &format!("{PODS}/a"),
            MERGE,
            &json!({"metadata": {"labels": {"x": null, "z": "3"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"], json!({"y": "2", "z": "3"}));
}

#[tokio::test]
async fn json_patch_applies_operations_and_a_failed_test_answers_422() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({"x": "1"}))).await;
    let ok = c
        .patch(
            &format!("{PODS}/a"),
            JSON,
            &json!([
                {"op": "test", "path": "/metadata/labels/x", "value": "1"},
                {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}},
            ]),
        )
        .await;
    assert_eq!(ok.status, 200, "{}", ok.text);
    assert_eq!(ok.body["metadata"]["annotations"]["k"], "v");
    let failed = c
        .patch(
            &format!("{PODS}/a"),
            JSON,
            &json!([
                {"op": "test", "path": "/metadata/labels/x", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/x"},
            ]),
        )
        .await;
    assert_eq!(failed.status, 422);
    assert_eq!(failed.body["reason"], "Invalid");
    assert_eq!(
        failed.body["message"], "the server rejected our request due to an error in our request",
        "the real server does not say which operation failed"
    );
    assert_eq!(
        c.get(&format!("{PODS}/a")).await.body["metadata"]["labels"]["x"],
        "1",
        "nothing applied"
    );
}

#[tokio::test]
async fn strategic_merge_patch_of_pod_keeps_other_annotations() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    p["metadata"]["annotations"] = json!({"keep": "me", "change": "old"});
    c.post(PODS, &p).await;
    let r = c
        .patch(
            &format!("{PODS}/a"),
            SMP,
            &json!({"metadata": {"annotations": {"change": "new", "add": "x"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["metadata"]["annotations"],
        json!({"keep": "me", "change": "new", "add": "x"})
    );
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name_and_honours_directives() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({"a": "1", "b": "2"}));
    p["spec"]["containers"] =
        json!([{"name": "main", "image": "busybox:1"}, {"name": "side", "image": "envoy:1"}]);
    c.post(PODS, &p).await;
    let r = c
        .patch(
            &format!("{PODS}/a"),
            SMP,
            &json!({
                "metadata": {"labels": {"$patch": "replace", "c": "3"}},
                "spec": {"containers": [{"name": "side", "image": "envoy:2"}]},
            }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"], json!({"c": "3"}));
    assert_eq!(
        r.body["spec"]["containers"],
        json!([{"name": "main", "image": "busybox:1"}, {"name": "side", "image": "envoy:2"}])
    );
}

#[tokio::test]
async fn strategic_merge_patch_on_custom_resource_answers_415() {
    let (_s, c) = start().await;
    c.post(NODEIMAGES, &node_image("n1")).await;
    let r = c
        .patch(&format!("{NODEIMAGES}/n1"), SMP, &json!({"spec": {}}))
        .await;
    assert_eq!(r.status, 415);
    assert_eq!(r.body["reason"], "UnsupportedMediaType");
}

#[tokio::test]
async fn unknown_patch_content_type_answers_415() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c
        .patch(&format!("{PODS}/a"), "application/json", &json!({}))
        .await;
    assert_eq!(r.status, 415);
    assert_eq!(r.body["message"], "415: Unsupported Media Type");
    c.post(NODEIMAGES, &node_image("n1")).await;
    let r = c
        .patch(&format!("{NODEIMAGES}/n1"), "application/json", &json!({}))
        .await;
    assert_eq!(r.status, 415);
    assert_eq!(
        r.body["message"],
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
    );
}

#[tokio::test]
async fn undecodable_patches_answer_400_error_decoding_patch() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c.patch(&format!("{PODS}/a"), MERGE, &json!([1])).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "error decoding patch: json: cannot unmarshal array into Go value of type map[string]interface {}"
    );
    let r = c
        .request(
            hyper::Method::PATCH,
            &format!("{PODS}/a"),
            Some(MERGE),
            Some("{not json".into()),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("error decoding patch: ")),
        "{}",
        r.text
    );
}

fn conditions(pod: &serde_json::Value) -> Vec<(String, String)> {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["type"].as_str().unwrap_or_default().to_string(),
                c["status"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn strategic_merge_orders_merged_lists_like_the_real_server_new_elements_first() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let path = format!("{PODS}/a/status");
    let smp = |conds: serde_json::Value| json!({"status": {"conditions": conds}});
    let step = |r: &Resp| {
        assert_eq!(r.status, 200, "{}", r.text);
        conditions(&r.body)
            .into_iter()
            .map(|(t, s)| format!("{t}={s}"))
            .collect::<Vec<_>>()
    };
    let r = c
        .patch(
            &path,
            SMP,
            &smp(json!([{"type": "A", "status": "True"}, {"type": "B", "status": "True"}])),
        )
        .await;
    assert_eq!(step(&r), ["A=True", "B=True"]);
    let r = c
        .patch(&path, SMP, &smp(json!([{"type": "B", "status": "False"}, {"type": "A", "status": "False"}, {"type": "C", "status": "True"}])))
        .await;
    assert_eq!(step(&r), ["B=False", "A=False", "C=True"], "patch order");
    let r = c
        .patch(
            &path,
            SMP,
            &smp(json!([{"type": "D", "status": "True"}, {"type": "A", "status": "True"}])),
        )
        .await;
    assert_eq!(
        step(&r),
        ["D=True", "B=False", "A=True", "C=True"],
        "a new element goes before the server's"
    );
    let r = c
        .patch(
            &path,
            SMP,
            &smp(json!([{"type": "C", "$patch": "delete"}, {"type": "E", "status": "True"}])),
        )
        .await;
    assert_eq!(step(&r), ["E=True", "D=True", "B=False", "A=True"]);
    let r = c
        .patch(
            &path,
            SMP,
            &json!({"status": {
                "$setElementOrder/conditions": [{"type": "A"}, {"type": "B"}, {"type": "D"}, {"type": "E"}],
                "conditions": [{"type": "B", "status": "True"}]}}),
        )
        .await;
    assert_eq!(
        step(&r),
        ["A=True", "B=True", "D=True", "E=True"],
        "$setElementOrder orders the result"
    );
    let r = c
        .patch(
            &format!("{PODS}/a"),
            SMP,
            &json!({"metadata": {"finalizers": ["x/y"]}}),
        )
        .await;
    assert_eq!(r.status, 200);
    let r = c
        .patch(
            &format!("{PODS}/a"),
            SMP,
            &json!({"metadata": {"finalizers": ["z/z"]}}),
        )
        .await;
    assert_eq!(
        r.body["metadata"]["finalizers"],
        json!(["z/z", "x/y"]),
        "primitive lists too"
    );
}

#[tokio::test]
async fn patch_carrying_a_stale_resource_version_answers_409() {
    let (_s, c) = start().await;
    let v1 = c.post(NODEIMAGES, &node_image("n1")).await.body;
    c.patch(
        &format!("{NODEIMAGES}/n1"),
        MERGE,
        &json!({"metadata": {"labels": {"a": "b"}}}),
    )
    .await;
    let stale = json!({"metadata": {"resourceVersion": v1["metadata"]["resourceVersion"], "labels": {"a": "c"}}});
    let r = c.patch(&format!("{NODEIMAGES}/n1"), MERGE, &stale).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    let current = c.get(&format!("{NODEIMAGES}/n1")).await.body;
    let fresh = json!({"metadata": {"resourceVersion": current["metadata"]["resourceVersion"], "labels": {"a": "c"}}});
    assert_eq!(
        c.patch(&format!("{NODEIMAGES}/n1"), MERGE, &fresh)
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn patch_of_a_missing_object_answers_404() {
    let (_s, c) = start().await;
    let r = c.patch(&format!("{PODS}/nope"), MERGE, &json!({})).await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn apply_patch_creates_then_merges_and_requires_a_field_manager() {
    let (_s, c) = start().await;
    let body = node_image("n1");
    let r = c.patch(&format!("{NODEIMAGES}/n1"), APPLY, &body).await;
    assert_eq!(r.status, 422, "fieldManager is required for apply");
    let r = c
        .patch(
            &format!("{NODEIMAGES}/n1?fieldManager=kruised"),
            APPLY,
            &body,
        )
        .await;
    assert_eq!(r.status, 201, "apply creates: {}", r.text);
    let again = json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
        "metadata": {"name": "n1", "labels": {"a": "b"}}});
    let r = c
        .patch(
            &format!("{NODEIMAGES}/n1?fieldManager=kruised&force=true"),
            APPLY,
            &again,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"]["a"], "b");
    assert!(
        r.body["spec"]["images"]["nginx"].is_object(),
        "approximated as a merge: spec kept"
    );
}
