//! Admission hooks in place of webhooks: called on creates and updates of the main resource
//! before the write is stored, able to change the object or refuse it as kube-apiserver refuses
//! a request a webhook denied (`k8s.io/apiserver` `pkg/admission/plugin/webhook/errors/
//! statuserror.go`, `ToStatusErr`: `admission webhook "<name>" denied the request: <message>`,
//! the webhook's code, at least 400, and its reason, none from controller-runtime's
//! `admission.Errored`).

use std::sync::{Arc, Mutex};

use apiserver_double::{Denial, Operation};
use serde_json::{Value, json};

use crate::common::*;

const MERGE: &str = "application/merge-patch+json";
const G: &str = "apps.kruise.io";
const BOTH: &[Operation] = &[Operation::Create, Operation::Update];

fn crrs(version: &str) -> String {
    format!("/apis/{G}/{version}/namespaces/default/containerrecreaterequests")
}

fn crr(version: &str, name: &str) -> Value {
    json!({
        "apiVersion": format!("{G}/{version}"), "kind": "ContainerRecreateRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"podName": "p", "containers": [{"name": "main"}]},
    })
}

#[tokio::test]
async fn a_mutating_hook_changes_the_created_object_before_it_is_stored_and_watched() {
    let (s, c) = start().await;
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, |r| {
        r.object["metadata"]["labels"] = json!({"added": "yes"});
        Ok(())
    });
    let mut w = c.watch(&format!("{}?watch=true", crrs("v1beta1"))).await;
    let created = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    assert_eq!(created.status, 201, "{}", created.text);
    assert_eq!(created.body["metadata"]["labels"]["added"], "yes");
    let stored = c.get(&format!("{}/r", crrs("v1beta1"))).await.body;
    assert_eq!(stored["metadata"]["labels"]["added"], "yes");
    let event = w.next_non_bookmark("the ADDED event").await;
    assert_eq!(event["type"], "ADDED");
    assert_eq!(
        event["object"]["metadata"]["labels"]["added"], "yes",
        "watchers never see the object as it was before admission"
    );
}

#[tokio::test]
async fn a_refusal_is_answered_as_kube_apiserver_answers_a_webhooks_denial_and_nothing_is_stored() {
    let (s, c) = start().await;
    s.add_mutating_admission(
        "mcontainerrecreaterequest.kb.io",
        G,
        "containerrecreaterequests",
        BOTH,
        |_| Err(Denial::errored(400, "podName can not be empty")),
    );
    let rv_before = s.resource_version();
    let r = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(
        r.body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "admission webhook \"mcontainerrecreaterequest.kb.io\" denied the \
                           request: podName can not be empty",
               "code": 400}),
        "controller-runtime's Errored gives no reason, so the Status has none"
    );
    assert!(s.get("containerrecreaterequests", "default", "r").is_none());
    assert_eq!(s.resource_version(), rv_before, "nothing was written");
}

#[tokio::test]
async fn a_denied_answer_keeps_its_forbidden_reason_and_a_code_below_400_becomes_400() {
    let (s, c) = start().await;
    s.add_validating_admission("v.test", G, "nodeimages", BOTH, |r| {
        match r.object["metadata"]["name"].as_str() {
            Some("forbidden") => Err(Denial::denied("not this one")),
            _ => Err(Denial::errored(200, "")),
        }
    });
    let r = c.post(NODEIMAGES, &node_image("forbidden")).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.body["reason"], "Forbidden");
    assert_eq!(
        r.body["message"],
        "admission webhook \"v.test\" denied the request: not this one"
    );
    let r = c.post(NODEIMAGES, &node_image("other")).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(
        r.body["message"],
        "admission webhook \"v.test\" denied the request without explanation"
    );
}

#[tokio::test]
async fn hooks_see_updates_by_put_and_patch_with_the_old_object_but_not_status_writes() {
    let (s, c) = start().await;
    let seen: Arc<Mutex<Vec<(Operation, Value, Value)>>> = Arc::default();
    let log = seen.clone();
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, move |r| {
        log.lock().unwrap().push((
            r.operation,
            r.object["metadata"]["labels"].clone(),
            r.old_object
                .as_ref()
                .map_or(Value::Null, |o| o["metadata"]["labels"].clone()),
        ));
        Ok(())
    });
    let path = format!("{}/r", crrs("v1beta1"));
    let created = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await.body;
    let mut put = created.clone();
    put["metadata"]["labels"] = json!({"step": "put"});
    assert_eq!(c.put(&path, &put).await.status, 200);
    let patched = c
        .patch(
            &path,
            MERGE,
            &json!({"metadata": {"labels": {"step": "patch"}}}),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    let status = c
        .patch(
            &format!("{path}/status"),
            MERGE,
            &json!({"status": {"phase": "Pending"}}),
        )
        .await;
    assert_eq!(status.status, 200, "{}", status.text);
    s.merge_patch(
        "containerrecreaterequests",
        "default",
        "r",
        &json!({"metadata": {"labels": {"step": "control"}}}),
    )
    .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (Operation::Create, Value::Null, Value::Null),
            (Operation::Update, json!({"step": "put"}), Value::Null),
            (
                Operation::Update,
                json!({"step": "patch"}),
                json!({"step": "put"})
            ),
        ],
        "the status write and the control API's write were not admitted"
    );
}

#[tokio::test]
async fn a_hook_may_refuse_an_update_by_comparing_with_the_old_object() {
    let (s, c) = start().await;
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, |r| {
        let old = r.old_object.as_ref();
        if old.is_some_and(|o| o["spec"] != r.object["spec"]) {
            return Err(Denial::errored(
                403,
                "spec of ContainerRecreateRequest is immutable",
            ));
        }
        Ok(())
    });
    let path = format!("{}/r", crrs("v1beta1"));
    c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    let r = c
        .patch(&path, MERGE, &json!({"spec": {"podName": "q"}}))
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body.get("reason").is_none(), "{}", r.text);
    assert_eq!(
        s.get("containerrecreaterequests", "default", "r").unwrap()["spec"]["podName"],
        "p"
    );
    let r = c
        .patch(&path, MERGE, &json!({"metadata": {"labels": {"a": "b"}}}))
        .await;
    assert_eq!(r.status, 200, "other changes pass: {}", r.text);
}

#[tokio::test]
async fn a_hook_sees_the_requests_version_and_reads_other_objects_through_its_view() {
    let (s, c) = start().await;
    s.create("pods", pod("p", "node-a", json!({}))).unwrap();
    let versions: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = versions.clone();
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, move |r| {
        log.lock().unwrap().push(r.version.to_string());
        let pod_name = r.object["spec"]["podName"].as_str().unwrap_or_default();
        let Some(pod) = r.store.get("pods", r.namespace, pod_name) else {
            return Err(Denial::errored(
                400,
                format!("no found Pod named {pod_name}"),
            ));
        };
        r.object["metadata"]["labels"] = json!({"node": pod["spec"]["nodeName"]});
        Ok(())
    });
    let made = c.post(&crrs("v1alpha1"), &crr("v1alpha1", "a")).await;
    assert_eq!(made.status, 201, "{}", made.text);
    assert_eq!(made.body["apiVersion"], "apps.kruise.io/v1alpha1");
    assert_eq!(made.body["metadata"]["labels"]["node"], "node-a");
    let mut missing = crr("v1beta1", "b");
    missing["spec"]["podName"] = json!("gone");
    let r = c.post(&crrs("v1beta1"), &missing).await;
    assert_eq!(
        r.body["message"],
        "admission webhook \"m.test\" denied the request: no found Pod named gone"
    );
    assert_eq!(*versions.lock().unwrap(), ["v1alpha1", "v1beta1"]);
}

#[tokio::test]
async fn what_a_mutating_hook_adds_is_pruned_and_defaulted_by_the_schema_then_validated() {
    let (s, c) = start().await;
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, |r| {
        r.object["spec"]["unknownField"] = json!(1);
        r.object["spec"]["activeDeadlineSeconds"] = json!("soon");
        Ok(())
    });
    let validated: Arc<Mutex<Option<Value>>> = Arc::default();
    let log = validated.clone();
    s.add_validating_admission("v.test", G, "containerrecreaterequests", BOTH, move |r| {
        *log.lock().unwrap() = Some(r.object["spec"].clone());
        Ok(())
    });
    let r = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    assert_eq!(
        r.status, 422,
        "the schema still checks the result: {}",
        r.text
    );
    assert!(
        validated.lock().unwrap().is_none(),
        "validating hooks run after the schema's validation"
    );
    s.add_mutating_admission("m2.test", G, "containerrecreaterequests", BOTH, |r| {
        r.object["spec"]["activeDeadlineSeconds"] = json!(30);
        Ok(())
    });
    let r = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    assert_eq!(r.status, 201, "a later hook sees and fixes it: {}", r.text);
    let spec = validated.lock().unwrap().clone().unwrap();
    assert!(spec.get("unknownField").is_none(), "pruned: {spec}");
    assert_eq!(spec["activeDeadlineSeconds"], 30);
}

#[tokio::test]
async fn a_dry_run_is_admitted_and_stores_nothing() {
    let (s, c) = start().await;
    s.add_mutating_admission("m.test", G, "containerrecreaterequests", BOTH, |r| {
        assert!(r.dry_run, "the hook is told");
        r.object["metadata"]["labels"] = json!({"added": "yes"});
        Ok(())
    });
    let r = c
        .post(
            &format!("{}?dryRun=All", crrs("v1beta1")),
            &crr("v1beta1", "r"),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["metadata"]["labels"]["added"], "yes");
    assert!(s.get("containerrecreaterequests", "default", "r").is_none());
}

#[tokio::test]
async fn hooks_match_their_resource_and_operation_only() {
    let (s, c) = start().await;
    s.add_mutating_admission(
        "m.test",
        G,
        "containerrecreaterequests",
        &[Operation::Update],
        |_| Err(Denial::errored(400, "no updates")),
    );
    let created = c.post(&crrs("v1beta1"), &crr("v1beta1", "r")).await;
    assert_eq!(created.status, 201, "creates pass: {}", created.text);
    assert_eq!(
        c.post(NODEIMAGES, &node_image("n")).await.status,
        201,
        "other resources pass"
    );
    let r = c
        .patch(
            &format!("{}/r", crrs("v1beta1")),
            MERGE,
            &json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
}
