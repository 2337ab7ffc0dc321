//! Object metadata, CRUD semantics and Status errors (rules 1, 4 and 7).

use serde_json::{Value, json};

use crate::common::*;

#[tokio::test]
async fn create_assigns_uid_creation_timestamp_and_increasing_resource_versions() {
    let (_s, c) = start().await;
    let a = c.post(PODS, &pod("a", "n1", json!({}))).await;
    assert_eq!(a.status, 201, "{}", a.text);
    let b = c.post(PODS, &pod("b", "n1", json!({}))).await;
    let meta = &a.body["metadata"];
    assert!(
        meta["uid"].as_str().is_some_and(|u| u.len() == 36),
        "uid: {meta}"
    );
    assert!(
        meta["creationTimestamp"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );
    assert!(rv(&b.body) > rv(&a.body));
    assert_ne!(a.body["metadata"]["uid"], b.body["metadata"]["uid"]);
    assert_eq!(
        a.body["status"]["phase"], "Pending",
        "pods start Pending like the real server"
    );
    assert_eq!(a.body["status"]["qosClass"], "BestEffort");
}

#[tokio::test]
async fn custom_resources_start_at_generation_1_and_bump_only_on_spec_changes() {
    let (_s, c) = start().await;
    let created = c.post(NODEIMAGES, &node_image("n1")).await.body;
    assert_eq!(created["metadata"]["generation"], 1);
    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"a": "b"});
    let after_label = c.put(&format!("{NODEIMAGES}/n1"), &labelled).await.body;
    assert_eq!(
        after_label["metadata"]["generation"], 1,
        "metadata changes keep generation"
    );
    let mut spec = after_label.clone();
    spec["spec"]["images"]["redis"] = json!({"tags": [{"tag": "7"}]});
    let after_spec = c.put(&format!("{NODEIMAGES}/n1"), &spec).await.body;
    assert_eq!(
        after_spec["metadata"]["generation"], 2,
        "spec changes bump generation"
    );
    let mut status = after_spec.clone();
    status["status"] = json!({"desired": 2});
    let after_status = c
        .put(&format!("{NODEIMAGES}/n1/status"), &status)
        .await
        .body;
    assert_eq!(
        after_status["metadata"]["generation"], 2,
        "status writes keep generation"
    );
}

#[tokio::test]
async fn list_reports_kind_list_with_current_resource_version_and_typed_items() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    c.post(NODEIMAGES, &node_image("n1")).await;
    let list = c.get(PODS).await.body;
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(
        list["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert_eq!(list["items"][0]["kind"], "Pod");
    assert_eq!(list["items"][0]["apiVersion"], "v1");
    let list = c.get(NODEIMAGES).await.body;
    assert_eq!(list["kind"], "NodeImageList");
    assert_eq!(list["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(list["items"][0]["kind"], "NodeImage");
}

#[tokio::test]
async fn create_twice_answers_409_already_exists() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let again = c.post(PODS, &pod("a", "n1", json!({}))).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.body["reason"], "AlreadyExists");
    assert_eq!(again.body["message"], "pods \"a\" already exists");
}

#[tokio::test]
async fn get_missing_object_answers_404_with_a_not_found_status() {
    let (_s, c) = start().await;
    let r = c.get(&format!("{PODS}/nope")).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"nope\" not found", "reason": "NotFound",
            "details": {"name": "nope", "kind": "pods"}, "code": 404})
    );
    let r = c.get(&format!("{NODEIMAGES}/nope")).await;
    assert_eq!(
        r.body["message"],
        "nodeimages.apps.kruise.io \"nope\" not found"
    );
    assert_eq!(
        r.body["details"],
        json!({"name": "nope", "group": "apps.kruise.io", "kind": "nodeimages"})
    );
}

#[tokio::test]
async fn put_with_stale_resource_version_answers_409() {
    let (_s, c) = start().await;
    let v1 = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    let mut v2 = v1.clone();
    v2["metadata"]["labels"] = json!({"x": "1"});
    assert_eq!(c.put(&format!("{PODS}/a"), &v2).await.status, 200);
    let mut stale = v1.clone();
    stale["metadata"]["labels"] = json!({"x": "2"});
    let r = c.put(&format!("{PODS}/a"), &stale).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "Conflict");
    assert_eq!(
        r.body["message"],
        "Operation cannot be fulfilled on pods \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(r.body["details"], json!({"name": "a", "kind": "pods"}));
}

#[tokio::test]
async fn put_without_resource_version_on_custom_resource_answers_422() {
    let (_s, c) = start().await;
    let mut obj = c.post(NODEIMAGES, &node_image("n1")).await.body;
    obj["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let r = c.put(&format!("{NODEIMAGES}/n1"), &obj).await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(r.body["reason"], "Invalid");
    assert_eq!(
        r.body["message"],
        "nodeimages.apps.kruise.io \"n1\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    );
    assert_eq!(r.body["details"]["kind"], "nodeimages", "named by resource");
}

#[tokio::test]
async fn put_without_resource_version_on_pod_is_accepted_unconditionally() {
    let (_s, c) = start().await;
    let mut obj = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    obj["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    obj["metadata"]["labels"] = json!({"y": "1"});
    let r = c.put(&format!("{PODS}/a"), &obj).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"]["y"], "1");
}

#[tokio::test]
async fn no_op_update_keeps_the_resource_version_like_etcd() {
    let (_s, c) = start().await;
    let obj = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    let r = c.put(&format!("{PODS}/a"), &obj).await;
    assert_eq!(r.status, 200);
    assert_eq!(rv(&r.body), rv(&obj));
}

#[tokio::test]
async fn pod_spec_changes_other_than_images_are_forbidden() {
    let (_s, c) = start().await;
    let obj = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    let mut image = obj.clone();
    image["spec"]["containers"][0]["image"] = json!("busybox:2");
    let r = c.put(&format!("{PODS}/a"), &image).await;
    assert_eq!(r.status, 200, "image updates are allowed: {}", r.text);
    let mut node = r.body.clone();
    node["spec"]["nodeName"] = json!("n2");
    let r = c.put(&format!("{PODS}/a"), &node).await;
    assert_eq!(r.status, 422);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("pod updates may not change fields")
    );
}

#[tokio::test]
async fn delete_without_finalizers_removes_the_object() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c.delete(&format!("{PODS}/a")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["metadata"]["name"], "a");
    assert_eq!(c.get(&format!("{PODS}/a")).await.status, 404);
    assert_eq!(c.delete(&format!("{PODS}/a")).await.status, 404);
}

#[tokio::test]
async fn delete_with_finalizers_sets_deletion_timestamp_until_the_last_finalizer_goes() {
    let (_s, c) = start().await;
    let mut crr = json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": "r", "finalizers": ["a/x", "a/y"]},
        "spec": {"podName": "p", "containers": [{"name": "main"}]}});
    let path = "/apis/apps.kruise.io/v1alpha1/namespaces/default/containerrecreaterequests";
    assert_eq!(c.post(path, &crr).await.status, 201);
    let r = c.delete(&format!("{path}/r")).await;
    assert_eq!(
        r.status, 200,
        "deletion pending finalizers answers 200 with the object, like the real server"
    );
    assert!(r.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        r.body["metadata"]["generation"], 2,
        "marking for deletion bumps generation"
    );
    crr = r.body.clone();
    crr["metadata"]["finalizers"] = json!(["a/x", "a/y", "a/z"]);
    let r = c.put(&format!("{path}/r"), &crr).await;
    assert_eq!(r.status, 422, "no new finalizers once deleting: {}", r.text);
    let r = c
        .patch(
            &format!("{path}/r"),
            "application/json-patch+json",
            &json!([{"op": "remove", "path": "/metadata/finalizers/0"}]),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        c.get(&format!("{path}/r")).await.status,
        200,
        "one finalizer left"
    );
    let r = c
        .patch(
            &format!("{path}/r"),
            "application/merge-patch+json",
            &json!({"metadata": {"finalizers": null}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        c.get(&format!("{path}/r")).await.status,
        404,
        "removing the last finalizer deletes"
    );
}

#[tokio::test]
async fn delete_honours_uid_and_resource_version_preconditions() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let body =
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "other"}});
    let r = c
        .request(
            hyper::Method::DELETE,
            &format!("{PODS}/a"),
            Some("application/json"),
            Some(body.to_string()),
        )
        .await;
    assert_eq!(r.status, 409);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed: UID in precondition: other")
    );
}

#[tokio::test]
async fn create_in_a_missing_namespace_answers_404() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    p["metadata"]["namespace"] = json!("ghost");
    let r = c.post("/api/v1/namespaces/ghost/pods", &p).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["message"], "namespaces \"ghost\" not found");
}

#[tokio::test]
async fn create_rejects_set_resource_version_bad_names_and_bad_labels() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    p["metadata"]["resourceVersion"] = json!("5");
    assert_eq!(c.post(PODS, &p).await.status, 500);
    let r = c.post(PODS, &pod("Bad_Name", "n1", json!({}))).await;
    assert_eq!(r.status, 422);
    let r = c.post(PODS, &pod("ok", "n1", json!({"k": "-bad"}))).await;
    assert_eq!(r.status, 422);
    let mut p = pod("", "n1", json!({}));
    p["metadata"]["generateName"] = json!("gen-");
    let r = c.post(PODS, &p).await;
    assert_eq!(r.status, 201);
    assert!(
        r.body["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("gen-")
    );
}

#[tokio::test]
async fn events_k8s_io_events_share_storage_with_core_events() {
    let (_s, c) = start().await;
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"},
        "regarding": {"kind": "Pod", "name": "p", "namespace": "default"},
        "note": "pulled", "reason": "Pulled", "type": "Normal",
        "reportingController": "kruised", "reportingInstance": "n1", "action": "Pull",
        "eventTime": "2025-01-01T00:00:00.000000Z"});
    let r = c
        .post("/apis/events.k8s.io/v1/namespaces/default/events", &ev)
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["note"], "pulled");
    let core = c.get("/api/v1/namespaces/default/events/e1").await.body;
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "pulled");
    assert_eq!(core["involvedObject"]["name"], "p");
    assert_eq!(core["reportingComponent"], "kruised");
    let sel = c
        .get("/api/v1/events?fieldSelector=involvedObject.name%3Dp,reason%3DPulled")
        .await
        .body;
    assert_eq!(sel["items"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn errors_are_metav1_status_objects_for_unknown_paths_and_methods() {
    let (_s, c) = start().await;
    let r = c.get("/api/v1/widgets").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["status"], "Failure");
    let r = c
        .request(
            hyper::Method::POST,
            "/api/v1/pods",
            Some("application/json"),
            Some("{}".into()),
        )
        .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.body["reason"], "MethodNotAllowed");
    let r = c
        .request(
            hyper::Method::POST,
            PODS,
            Some("application/json"),
            Some("{not json".into()),
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["reason"], "BadRequest");
    let body: Value = json!({"metadata": {"name": "x"}});
    let r = c.post(NODEIMAGES, &body).await;
    assert_eq!(r.status, 400, "kind is required for custom resources");
    assert_eq!(
        r.body["message"],
        "the object provided is unrecognized (must be of type NodeImage): Object 'Kind' is missing in '{\"metadata\":{\"name\":\"x\"}}'"
    );
}

#[tokio::test]
async fn delete_answers_a_success_status_except_for_pods_and_namespaces() {
    let (_s, c) = start().await;
    let created = c.post(NODEIMAGES, &node_image("n1")).await.body;
    let r = c.delete(&format!("{NODEIMAGES}/n1")).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": "n1", "group": "apps.kruise.io", "kind": "nodeimages",
                "uid": created["metadata"]["uid"]}})
    );
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    c.post("/api/v1/namespaces/default/secrets", &secret).await;
    let r = c.delete("/api/v1/namespaces/default/secrets/s").await;
    assert_eq!(r.body["kind"], "Status");
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c.delete(&format!("{PODS}/a")).await;
    assert_eq!(r.body["kind"], "Pod", "pods answer with the object");
}

#[tokio::test]
async fn create_with_a_resource_version_answers_a_bare_500() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    p["metadata"]["resourceVersion"] = json!("5");
    let r = c.post(PODS, &p).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "resourceVersion should not be set on objects to be created", "code": 500}),
        "no reason, no details"
    );
}

#[tokio::test]
async fn core_kinds_default_a_missing_kind_and_api_version() {
    let (_s, c) = start().await;
    let mut p = pod("a", "n1", json!({}));
    let m = p.as_object_mut().unwrap();
    m.remove("kind");
    m.remove("apiVersion");
    let r = c.post(PODS, &p).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        (r.body["kind"].as_str(), r.body["apiVersion"].as_str()),
        (Some("Pod"), Some("v1"))
    );
    let mut v2 = pod("b", "n1", json!({}));
    v2["apiVersion"] = json!("v2");
    let r = c.post(PODS, &v2).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "Pod in version \"v2\" cannot be handled as a Pod: no kind \"Pod\" is registered for version \"v2\" in scheme \"kubernetes/pkg/api/legacyscheme/scheme.go:30\""
    );
}

#[tokio::test]
async fn pods_track_generation_and_forbid_adding_containers() {
    let (_s, c) = start().await;
    let created = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    assert_eq!(created["metadata"]["generation"], 1);
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"labels": {"x": "1"}}, "spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}),
        )
        .await;
    assert_eq!(r.body["metadata"]["generation"], 2, "spec changes bump it");
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(r.body["metadata"]["generation"], 2, "status writes do not");
    let r = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}, {"name": "side", "image": "x"}]}}),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "Pod \"a\" is invalid: spec.containers: Forbidden: pod updates may not add or remove containers"
    );
}

#[tokio::test]
async fn core_events_must_be_in_the_namespace_of_their_object() {
    let (_s, c) = start().await;
    let events = "/api/v1/namespaces/default/events";
    let ev = |name: &str, involved: Value| {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": involved, "reason": "R", "message": "m", "type": "Normal",
            "source": {"component": "kruise-daemon"}, "count": 1})
    };
    let r = c
        .post(
            events,
            &ev(
                "e1",
                json!({"kind": "Pod", "namespace": "other", "name": "p"}),
            ),
        )
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "Event \"e1\" is invalid: involvedObject.namespace: Invalid value: \"other\": does not match event.namespace"
    );
    let r = c
        .post(
            events,
            &ev(
                "e2",
                json!({"kind": "Pod", "namespace": "default", "name": "p"}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = c
        .post(
            events,
            &ev("e3", json!({"kind": "NodeImage", "name": "n1"})),
        )
        .await;
    assert_eq!(
        r.status, 201,
        "cluster-scoped objects' events go to default: {}",
        r.text
    );
    let r = c
        .post(
            "/api/v1/namespaces/kube-system/events",
            &ev("e4", json!({"kind": "NodeImage", "name": "n1"})),
        )
        .await;
    assert_eq!(r.status, 422, "but nowhere else");
    let r = c
        .patch(
            &format!("{events}/e2"),
            "application/strategic-merge-patch+json",
            &json!({"count": 2, "message": "m2"}),
        )
        .await;
    assert_eq!((r.status, r.body["count"].as_u64()), (200, Some(2)));
}
