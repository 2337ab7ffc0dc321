//! Custom resources as kube-apiserver v1.36 serves kruise's CRDs: two served
//! versions over one storage version (conversion `None`), structural pruning,
//! defaulting and schema validation (see `CONFORMANCE.md`).

use apiserver_double::{Config, default_kinds_v1alpha1_only};
use serde_json::{Value, json};

use crate::common::*;

const MERGE: &str = "application/merge-patch+json";
const G: &str = "/apis/apps.kruise.io";

fn ni(version: &str) -> String {
    format!("{G}/{version}/nodeimages")
}

fn crr(version: &str) -> String {
    format!("{G}/{version}/namespaces/default/containerrecreaterequests")
}

/// A NodeImage with the v1beta1-only `spec.images[*].pullSecrets[*].mode`.
fn node_image_v1beta1(name: &str) -> Value {
    json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
        "metadata": {"name": name},
        "spec": {"images": {"nginx": {
            "tags": [{"tag": "1"}],
            "pullSecrets": [{"name": "s", "namespace": "ns", "mode": "Always"}]}}},
    })
}

fn crr_body(version: &str, name: &str) -> Value {
    json!({
        "apiVersion": format!("apps.kruise.io/{version}"), "kind": "ContainerRecreateRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"podName": "p", "containers": [{"name": "main"}]},
    })
}

fn pull_secret(obj: &Value) -> Value {
    obj["spec"]["images"]["nginx"]["pullSecrets"][0].clone()
}

fn names(list: &Value) -> Vec<&str> {
    list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect()
}

#[tokio::test]
async fn discovery_serves_kruise_at_v1beta1_and_v1alpha1_with_v1beta1_preferred() {
    let (_s, c) = start().await;
    let group = c.get(G).await.body;
    assert_eq!(
        group["versions"],
        json!([{"groupVersion": "apps.kruise.io/v1beta1", "version": "v1beta1"},
            {"groupVersion": "apps.kruise.io/v1alpha1", "version": "v1alpha1"}])
    );
    assert_eq!(group["preferredVersion"]["version"], "v1beta1");
    let beta = c.get(&format!("{G}/v1beta1")).await.body;
    for r in [
        "nodeimages",
        "nodeimages/status",
        "containerrecreaterequests",
        "containerrecreaterequests/status",
        "imagepulljobs",
    ] {
        assert!(names(&beta).contains(&r), "{r} at v1beta1: {beta}");
    }
    assert!(
        !names(&beta).contains(&"nodepodprobes"),
        "NodePodProbe is v1alpha1 only"
    );
    let alpha = c.get(&format!("{G}/v1alpha1")).await.body;
    for r in [
        "nodeimages",
        "containerrecreaterequests",
        "imagepulljobs",
        "nodepodprobes",
        "podprobemarkers",
    ] {
        assert!(names(&alpha).contains(&r), "{r} at v1alpha1");
    }
}

#[tokio::test]
async fn unknown_fields_are_pruned_on_create_with_a_warning_per_field() {
    let (_s, c) = start().await;
    let mut body = node_image_v1beta1("n1");
    body["metadata"]["bogus"] = json!("x");
    body["spec"]["unknownSpec"] = json!(1);
    body["spec"]["images"]["nginx"]["tags"][0]["junk"] = json!(2);
    body["status"] = json!({"desired": 1});
    body["topJunk"] = json!(true);
    let r = c.post(&ni("v1beta1"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.body["spec"],
        node_image_v1beta1("n1")["spec"],
        "unknown fields dropped"
    );
    assert!(r.body["metadata"].get("bogus").is_none());
    assert!(r.body.get("topJunk").is_none());
    assert!(r.body.get("status").is_none(), "status subresource");
    let warnings: Vec<&str> = r
        .headers
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(
        warnings,
        [
            r#"299 - "unknown field \"metadata.bogus\"""#,
            r#"299 - "unknown field \"spec.images.nginx.tags[0].junk\"""#,
            r#"299 - "unknown field \"spec.unknownSpec\"""#,
            r#"299 - "unknown field \"topJunk\"""#,
        ]
    );
}

#[tokio::test]
async fn a_v1alpha1_read_prunes_v1beta1_only_fields_and_says_v1alpha1() {
    let (_s, c) = start().await;
    let mut w = c
        .watch(&format!("{}?watch=true&timeoutSeconds=1", ni("v1alpha1")))
        .await;
    c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await;
    let alpha = c.get(&format!("{}/n1", ni("v1alpha1"))).await.body;
    assert_eq!(alpha["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(pull_secret(&alpha), json!({"name": "s", "namespace": "ns"}));
    let beta = c.get(&format!("{}/n1", ni("v1beta1"))).await.body;
    assert_eq!(beta["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(pull_secret(&beta)["mode"], "Always", "kept in storage");
    let list = c.get(&ni("v1alpha1")).await.body;
    assert_eq!(list["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(list["items"][0]["apiVersion"], "apps.kruise.io/v1alpha1");
    assert!(pull_secret(&list["items"][0]).get("mode").is_none());
    let added = w.next("ADDED through v1alpha1").await;
    assert_eq!(added["object"]["apiVersion"], "apps.kruise.io/v1alpha1");
    assert!(pull_secret(&added["object"]).get("mode").is_none());
}

#[tokio::test]
async fn a_v1alpha1_status_write_prunes_v1beta1_only_fields() {
    let (_s, c) = start().await;
    c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await;
    let r = c
        .patch(
            &format!("{}/n1/status", ni("v1alpha1")),
            MERGE,
            &json!({"status": {"desired": 1}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let beta = c.get(&format!("{}/n1", ni("v1beta1"))).await.body;
    assert_eq!(
        pull_secret(&beta),
        json!({"name": "s", "namespace": "ns"}),
        "a v1alpha1 /status write drops spec's v1beta1-only mode from storage"
    );
    assert_eq!(beta["status"], json!({"desired": 1}));

    c.post(&crr("v1beta1"), &crr_body("v1beta1", "r")).await;
    let snapshot = json!({"status": {"phase": "Recreating",
        "containerStatusSnapshot": [{"name": "main", "ready": true, "restartCount": 1}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "R", "message": "m",
            "lastTransitionTime": "2025-01-01T00:00:00Z"}]}});
    let r = c
        .patch(&format!("{}/r/status", crr("v1beta1")), MERGE, &snapshot)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], snapshot["status"]);
    let r = c
        .patch(
            &format!("{}/r/status", crr("v1alpha1")),
            MERGE,
            &json!({"status": {"message": "hi"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let beta = c.get(&format!("{}/r", crr("v1beta1"))).await.body;
    assert_eq!(
        beta["status"],
        json!({"phase": "Recreating", "message": "hi"}),
        "the snapshot and conditions are gone from storage"
    );
}

#[tokio::test]
async fn any_v1alpha1_write_prunes_v1beta1_only_fields_without_bumping_generation() {
    let (_s, c) = start().await;
    c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await;
    let r = c
        .patch(
            &format!("{}/n1", ni("v1alpha1")),
            MERGE,
            &json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let beta = c.get(&format!("{}/n1", ni("v1beta1"))).await.body;
    assert!(
        pull_secret(&beta).get("mode").is_none(),
        "a label patch through v1alpha1 drops mode: {beta}"
    );
    assert_eq!(
        beta["metadata"]["generation"], 1,
        "the spec changed only in what v1alpha1 cannot see"
    );
    let mut alpha = c.get(&format!("{}/n1", ni("v1alpha1"))).await.body;
    c.patch(
        &format!("{}/n1", ni("v1beta1")),
        MERGE,
        &json!({"spec": {"images": {"nginx": {"pullSecrets": [{"name": "s", "mode": "Always"}]}}}}),
    )
    .await;
    alpha["metadata"]["resourceVersion"] =
        c.get(&format!("{}/n1", ni("v1alpha1"))).await.body["metadata"]["resourceVersion"].clone();
    alpha["metadata"]["labels"]["c"] = json!("d");
    let r = c.put(&format!("{}/n1", ni("v1alpha1")), &alpha).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let beta = c.get(&format!("{}/n1", ni("v1beta1"))).await.body;
    assert!(
        pull_secret(&beta).get("mode").is_none(),
        "a v1alpha1 PUT drops it too"
    );
}

#[tokio::test]
async fn a_body_in_the_other_version_answers_400_and_a_wrong_kind_422() {
    let (_s, c) = start().await;
    let created = c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await.body;
    let r = c.put(&format!("{}/n1", ni("v1alpha1")), &created).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "the API version in the data (apps.kruise.io/v1beta1) does not match the expected API version (apps.kruise.io/v1alpha1)"
    );
    let r = c.post(&ni("v1alpha1"), &node_image_v1beta1("n2")).await;
    assert_eq!(r.status, 400);
    let mut other = node_image_v1beta1("n3");
    other["kind"] = json!("Other");
    let r = c.post(&ni("v1beta1"), &other).await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "Other.apps.kruise.io \"n3\" is invalid: kind: Invalid value: \"Other\": must be NodeImage"
    );
}

#[tokio::test]
async fn schema_validation_reports_required_enum_type_and_format_like_the_real_server() {
    let (_s, c) = start().await;
    c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await;
    let status = |s: Value| json!({ "status": s });
    let path = format!("{}/n1/status", ni("v1beta1"));
    let r = c
        .patch(&path, MERGE, &status(json!({"succeeded": 1})))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "NodeImage.apps.kruise.io \"n1\" is invalid: status.desired: Required value"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );
    let r = c
        .patch(&path, MERGE, &status(json!({"desired": "x"})))
        .await;
    assert_eq!(
        r.body["details"]["causes"][0]["message"],
        "Invalid value: \"string\": desired in body must be of type integer: \"string\""
    );
    let r = c
        .patch(
            &path,
            MERGE,
            &status(
                json!({"desired": 1, "imageStatuses": {"x": {"tags": [{"tag": "1"}]}, "y": {}}}),
            ),
        )
        .await;
    assert_eq!(
        r.body["message"],
        "NodeImage.apps.kruise.io \"n1\" is invalid: [status.imageStatuses.x.tags[0].phase: Required value, status.imageStatuses.y.tags: Required value]"
    );
    let r = c
        .patch(
            &path,
            MERGE,
            &status(json!({"desired": 1, "firstSyncStatus": {"syncAt": "not-a-date"}})),
        )
        .await;
    assert_eq!(
        r.body["details"]["causes"][0]["message"],
        "Invalid value: \"not-a-date\": firstSyncStatus.syncAt in body must be of type date-time: \"not-a-date\""
    );
    let r = c
        .patch(
            &path,
            MERGE,
            &status(json!({"desired": 1, "firstSyncStatus": {"syncAt": "2025-01-01T00:00:00Z"}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    c.post(&crr("v1beta1"), &crr_body("v1beta1", "r")).await;
    let r = c
        .patch(
            &format!("{}/r/status", crr("v1beta1")),
            MERGE,
            &status(json!({"phase": "Bogus"})),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0],
        json!({"field": "status.phase", "reason": "FieldValueNotSupported",
            "message": "Unsupported value: \"Bogus\": supported values: \"Pending\", \"Recreating\", \"Succeeded\", \"Failed\", \"Completed\""})
    );
    let r = c
        .patch(
            &format!("{}/r/status", crr("v1alpha1")),
            MERGE,
            &status(json!({"phase": "Bogus"})),
        )
        .await;
    assert_eq!(r.status, 200, "v1alpha1's schema has no enum: {}", r.text);
}

#[tokio::test]
async fn unchanged_invalid_values_are_ratcheted() {
    let (s, c) = start().await;
    c.post(&crr("v1alpha1"), &crr_body("v1alpha1", "r")).await;
    c.patch(
        &format!("{}/r/status", crr("v1alpha1")),
        MERGE,
        &json!({"status": {"phase": "Bogus"}}),
    )
    .await;
    let r = c
        .patch(
            &format!("{}/r/status", crr("v1beta1")),
            MERGE,
            &json!({"status": {"message": "x"}}),
        )
        .await;
    assert_eq!(
        r.status, 200,
        "the old invalid phase is let through: {}",
        r.text
    );
    let r = c
        .patch(
            &format!("{}/r/status", crr("v1beta1")),
            MERGE,
            &json!({"status": {"phase": "Bogus2"}}),
        )
        .await;
    assert_eq!(r.status, 422, "a changed one is not");
    // objects seeded through the control API need not be valid either
    s.create(
        "containerrecreaterequests",
        json!({"metadata": {"name": "seeded", "namespace": "default"}, "spec": {}}),
    )
    .expect("control create");
    let r = c
        .patch(
            &format!("{}/seeded/status", crr("v1beta1")),
            MERGE,
            &json!({"status": {"phase": "Recreating"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn nulls_are_dropped_and_schema_defaults_applied() {
    let (_s, c) = start().await;
    let mut body = node_image_v1beta1("n1");
    body["spec"]["images"]["nginx"]["tags"][0]["version"] = Value::Null;
    body["spec"]["images"]["nginx"]["pullSecrets"] = Value::Null;
    let r = c.post(&ni("v1beta1"), &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.body["spec"],
        json!({"images": {"nginx": {"tags": [{"tag": "1"}]}}})
    );
    let mut crr = crr_body("v1beta1", "r");
    crr["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80}]);
    let r = c
        .post(
            "/apis/apps.kruise.io/v1beta1/namespaces/default/containerrecreaterequests",
            &crr,
        )
        .await;
    assert_eq!(
        r.body["spec"]["containers"][0]["ports"][0],
        json!({"containerPort": 80, "protocol": "TCP"}),
        "the schema's default"
    );
}

#[tokio::test]
async fn the_control_api_names_the_storage_version() {
    let (s, c) = start().await;
    c.post(&ni("v1beta1"), &node_image_v1beta1("n1")).await;
    let stored = s.get("nodeimages", "", "n1").expect("stored");
    assert_eq!(stored["apiVersion"], "apps.kruise.io/v1beta1");
    assert_eq!(pull_secret(&stored)["mode"], "Always");
    let alpha = s
        .get("apps.kruise.io/v1alpha1/nodeimages", "", "n1")
        .expect("through v1alpha1");
    assert!(pull_secret(&alpha).get("mode").is_none());
}

#[tokio::test]
async fn a_v1alpha1_only_server_serves_and_stores_v1alpha1() {
    let (s, c) = start_with(Config {
        kinds: default_kinds_v1alpha1_only(),
        ..Config::default()
    })
    .await;
    assert_eq!(c.get(&format!("{G}/v1beta1")).await.status, 404);
    assert_eq!(
        c.get(G).await.body["preferredVersion"]["version"],
        "v1alpha1"
    );
    let r = c.post(&ni("v1alpha1"), &node_image("n1")).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        s.get("nodeimages", "", "n1").expect("stored")["apiVersion"],
        "apps.kruise.io/v1alpha1"
    );
}
