//! Authentication and RBAC, as kube-apiserver v1.36 does them (CONFORMANCE.md, "Authentication
//! and RBAC"): bearer tokens to users, `401` for a token nobody issued, every request
//! authorized by the RBAC objects in the store, and the `403` body of
//! k8s.io/apiserver `pkg/endpoints/handlers/responsewriters/errors.go` (`forbiddenMessage`)
//! with k8s.io/apimachinery `pkg/api/errors` `NewForbidden`.

use std::collections::BTreeMap;

use apiserver_double::{Config, Handle, UserInfo};
use hyper::Method;
use serde_json::{Value, json};

use crate::common::*;

const KRUISED: &str = "kruised-token";
const ADMIN: &str = "admin-token";
const KRUISED_USER: &str = "system:serviceaccount:kruise-system:kruised";
/// The project's RBAC for `kruised run` (ServiceAccount `kruise-system/kruised`).
const DEPLOY_RBAC: &str = include_str!("../../../../deploy/rbac.yaml");

/// A server with authentication and RBAC on: `KRUISED` is the ServiceAccount
/// `kruise-system/kruised`, `ADMIN` a `system:masters` admin.
async fn start_rbac() -> (Handle, Client) {
    start_with(Config {
        tokens: Some(BTreeMap::from([
            (
                KRUISED.to_string(),
                UserInfo::service_account("kruise-system", "kruised"),
            ),
            (ADMIN.to_string(), UserInfo::admin()),
        ])),
        rbac: true,
        ..Config::default()
    })
    .await
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": {"name": name}, "rules": rules})
}

fn bind_cluster_role(name: &str, role: &str, subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": name},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": subjects})
}

fn kruised_subject() -> Value {
    json!([{"kind": "ServiceAccount", "name": "kruised", "namespace": "kruise-system"}])
}

/// Grants kruised `rules` cluster-wide.
fn grant(s: &Handle, name: &str, rules: Value) {
    s.create("clusterroles", cluster_role(name, rules))
        .expect("create the ClusterRole");
    s.create(
        "clusterrolebindings",
        bind_cluster_role(name, name, kruised_subject()),
    )
    .expect("create the ClusterRoleBinding");
}

const MERGE: &str = "application/merge-patch+json";
const SMP: &str = "application/strategic-merge-patch+json";

#[tokio::test]
async fn a_service_account_without_the_right_gets_the_real_forbidden_status() {
    let (s, c) = start_rbac().await;
    s.create("pods", pod("x", "node-a", json!({}))).unwrap();
    let r = c
        .with_token(KRUISED)
        .patch(
            &format!("{PODS}/x/status"),
            SMP,
            &json!({"metadata": {"annotations": {"a": "b"}}}),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    // as kube-apiserver answers it: forbiddenMessage (k8s.io/apiserver responsewriters/errors.go)
    // inside apierrors.NewForbidden, details naming the object and the plain resource
    assert_eq!(
        r.body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"pods \"x\" is forbidden: User \"system:serviceaccount:kruise-system:kruised\" cannot patch resource \"pods/status\" in API group \"\" in the namespace \"default\"",
               "reason":"Forbidden","details":{"name":"x","kind":"pods"},"code":403})
    );
    assert!(
        s.get("pods", "default", "x").unwrap()["metadata"]["annotations"].is_null(),
        "a refused patch changes nothing"
    );
}

#[tokio::test]
async fn a_refused_custom_resource_names_its_group_and_a_watch_by_name_names_the_object() {
    let (_s, c) = start_rbac().await;
    let k = c.with_token(KRUISED);
    // kube-rs's watch of one object: a field selector on metadata.name, which the real
    // request-info factory turns into the request's name
    let r = k
        .get("/apis/apps.kruise.io/v1beta1/nodeimages?watch=true&fieldSelector=metadata.name%3Dnode-a")
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(
        r.body["message"],
        "nodeimages.apps.kruise.io \"node-a\" is forbidden: User \"system:serviceaccount:kruise-system:kruised\" cannot watch resource \"nodeimages\" in API group \"apps.kruise.io\" at the cluster scope"
    );
    assert_eq!(
        r.body["details"],
        json!({"name": "node-a", "group": "apps.kruise.io", "kind": "nodeimages"})
    );
    // a list of everything names no object
    let r = k
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a")
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body["message"],
        "pods is forbidden: User \"system:serviceaccount:kruise-system:kruised\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
    );
    assert_eq!(r.body["details"], json!({"kind": "pods"}));
}

#[tokio::test]
async fn a_token_nobody_issued_is_401_even_where_anonymous_requests_are_allowed() {
    let (s, c) = start_rbac().await;
    let r = c.with_token("forged").get("/version").await;
    assert_eq!(r.status, 401);
    // apierrors.NewUnauthorized("Unauthorized"), as the authentication filter answers
    assert_eq!(
        r.body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"Unauthorized","reason":"Unauthorized","code":401})
    );
    // no credentials at all: anonymous, which may read the version
    assert_eq!(c.get("/version").await.status, 200);
    let refused = s.refusals();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (refused[0].refused, refused[0].user.as_deref()),
        (Some(401), None)
    );
}

#[tokio::test]
async fn discovery_is_open_to_every_authenticated_user_and_health_and_version_to_anyone() {
    let (_s, c) = start_rbac().await;
    let k = c.with_token(KRUISED);
    // system:discovery, bound to system:authenticated by the real server's bootstrap policy
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps.kruise.io",
        "/apis/apps.kruise.io/v1beta1",
        "/version",
    ] {
        assert_eq!(k.get(path).await.status, 200, "{path} as kruised");
    }
    // system:public-info-viewer: also system:unauthenticated
    for path in ["/version", "/healthz", "/readyz"] {
        assert_eq!(c.get(path).await.status, 200, "{path} anonymously");
    }
    let r = c.get("/apis").await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"forbidden: User \"system:anonymous\" cannot get path \"/apis\"",
               "reason":"Forbidden","details":{},"code":403})
    );
}

#[tokio::test]
async fn a_cluster_role_binding_grants_everywhere_and_a_role_binding_only_in_its_namespace() {
    let (s, c) = start_rbac().await;
    let k = c.with_token(KRUISED);
    s.create(
        "secrets",
        json!({"metadata": {"namespace": "default", "name": "s"}}),
    )
    .unwrap();
    s.create(
        "secrets",
        json!({"metadata": {"namespace": "kube-system", "name": "s"}}),
    )
    .unwrap();
    s.apply_manifests(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: read, namespace: default}
rules: [{apiGroups: [''], resources: [secrets], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: read, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: read}
# no namespace: the binding's
subjects: [{kind: ServiceAccount, name: kruised, namespace: kruise-system}]
",
    )
    .unwrap();
    assert_eq!(
        k.get("/api/v1/namespaces/default/secrets/s").await.status,
        200
    );
    let r = k.get("/api/v1/namespaces/kube-system/secrets/s").await;
    assert_eq!(r.status, 403);
    assert!(
        r.body["message"].as_str().unwrap().ends_with(
            "cannot get resource \"secrets\" in API group \"\" in the namespace \"kube-system\""
        ),
        "{}",
        r.text
    );
    // a ClusterRole through a ClusterRoleBinding: every namespace
    grant(
        &s,
        "read-secrets",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
    );
    assert_eq!(
        k.get("/api/v1/namespaces/kube-system/secrets/s")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn verbs_subresources_and_wildcards_match_as_the_rbac_authorizer_matches_them() {
    let (s, c) = start_rbac().await;
    let k = c.with_token(KRUISED);
    s.create(
        "nodeimages",
        json!({"metadata": {"name": "node-a"}, "spec": {"images": {}}}),
    )
    .unwrap();
    grant(
        &s,
        "status-writer",
        json!([{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]}]),
    );
    let status = "/apis/apps.kruise.io/v1beta1/nodeimages/node-a/status";
    let main = "/apis/apps.kruise.io/v1beta1/nodeimages/node-a";
    assert_eq!(
        k.patch(status, MERGE, &json!({"status": {"desired": 0}}))
            .await
            .status,
        200,
        "*/status matches every status subresource"
    );
    let r = k
        .patch(main, MERGE, &json!({"metadata": {"labels": {"a": "b"}}}))
        .await;
    assert_eq!(r.status, 403, "*/status is no grant on the object itself");
    let r = k
        .request(
            Method::PUT,
            status,
            Some("application/json"),
            Some("{}".into()),
        )
        .await;
    assert_eq!(r.status, 403, "patch is no grant to update");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("cannot update resource \"nodeimages/status\""),
        "{}",
        r.text
    );
    grant(
        &s,
        "everything-kruise",
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["*"], "verbs": ["*"]}]),
    );
    assert_eq!(k.get(main).await.status, 200);
    assert_eq!(
        k.get("/api/v1/pods").await.status,
        403,
        "apiGroups name the group"
    );
}

#[tokio::test]
async fn resource_names_allow_that_object_and_a_list_or_watch_selecting_it_by_name_only() {
    let (s, c) = start_rbac().await;
    let k = c.with_token(KRUISED);
    for n in ["node-a", "node-b"] {
        s.create(
            "nodeimages",
            json!({"metadata": {"name": n}, "spec": {"images": {}}}),
        )
        .unwrap();
    }
    grant(
        &s,
        "own-node",
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["nodeimages"],
                "resourceNames": ["node-a"], "verbs": ["get", "list", "watch"]}]),
    );
    let base = "/apis/apps.kruise.io/v1beta1/nodeimages";
    assert_eq!(k.get(&format!("{base}/node-a")).await.status, 200);
    assert_eq!(k.get(&format!("{base}/node-b")).await.status, 403);
    let r = k
        .get(&format!("{base}?fieldSelector=metadata.name%3Dnode-a"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(k.get(base).await.status, 403, "a list of all names none");
    let w = k
        .watch(&format!(
            "{base}?watch=true&fieldSelector=metadata.name%3Dnode-a"
        ))
        .await;
    assert_eq!(w.status, 200);
}

#[tokio::test]
async fn a_binding_to_a_missing_role_is_told_in_the_reason() {
    let (s, c) = start_rbac().await;
    s.create(
        "clusterrolebindings",
        bind_cluster_role("kruised", "kruised", kruised_subject()),
    )
    .unwrap();
    let r = c.with_token(KRUISED).get("/api/v1/pods").await;
    assert_eq!(r.status, 403);
    assert!(
        r.body["message"].as_str().unwrap().ends_with(
            "at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io \"kruised\" not found"
        ),
        "{}",
        r.text
    );
}

#[tokio::test]
async fn system_masters_may_do_anything_and_rbac_objects_it_creates_take_effect_at_once() {
    let (_s, c) = start_rbac().await;
    let a = c.with_token(ADMIN);
    assert_eq!(a.get("/api/v1/secrets").await.status, 200);
    let roles = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
    let r = a
        .post(
            roles,
            &cluster_role(
                "pods-reader",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let k = c.with_token(KRUISED);
    assert_eq!(k.get("/api/v1/pods").await.status, 403);
    let r = a
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &bind_cluster_role("pods-reader", "pods-reader", kruised_subject()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(k.get("/api/v1/pods").await.status, 200);
    // the reader cannot read RBAC itself
    assert_eq!(k.get(roles).await.status, 403);
}

#[tokio::test]
async fn the_projects_rbac_loads_from_its_manifest_and_grants_only_what_it_lists() {
    let (s, c) = start_rbac().await;
    let applied = s.apply_manifests(DEPLOY_RBAC).unwrap();
    let kinds: Vec<&str> = applied.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Namespace",
            "Role",
            "RoleBinding"
        ]
    );
    // applying again updates in place
    s.apply_manifests(DEPLOY_RBAC).unwrap();
    s.create("pods", pod("x", "node-a", json!({}))).unwrap();
    s.create(
        "secrets",
        json!({"metadata": {"namespace": "kruise-daemon-config", "name": "pull"}}),
    )
    .unwrap();
    let k = c.with_token(KRUISED);
    let ok = [
        k.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a").await,
        k.patch(&format!("{PODS}/x/status"), SMP, &json!({"metadata": {"annotations": {"a": "b"}}}))
            .await,
        k.get("/api/v1/namespaces/kruise-daemon-config/secrets/pull").await,
        k.post(
            "/api/v1/namespaces/default/events",
            &json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "namespace": "default", "name": "x"}}),
        )
        .await,
    ];
    for r in &ok {
        assert!(r.status < 300, "{} {}", r.status, r.text);
    }
    let refused = [
        k.get(&format!("{PODS}/x")).await,
        k.get("/api/v1/namespaces/default/secrets/pull").await,
        k.get("/api/v1/namespaces/kruise-daemon-config/secrets")
            .await,
        k.request(
            Method::PUT,
            &format!("{PODS}/x/status"),
            Some("application/json"),
            Some(pod("x", "node-a", json!({})).to_string()),
        )
        .await,
    ];
    for r in &refused {
        assert_eq!(r.status, 403, "{}", r.text);
    }
    assert_eq!(s.refusals().len(), refused.len());
}

#[tokio::test]
async fn each_request_is_recorded_with_its_user_and_counted_per_user() {
    let (s, c) = start_rbac().await;
    c.with_token(ADMIN).get("/api/v1/pods").await;
    c.with_token(KRUISED).get("/api/v1/pods").await;
    c.with_token(KRUISED).get("/version").await;
    c.get("/version").await;
    assert_eq!(s.request_count_by_user(KRUISED_USER), 2);
    assert_eq!(s.request_count_by_user("kubernetes-admin"), 1);
    assert_eq!(s.request_count_by_user("system:anonymous"), 1);
    let users: Vec<(Option<String>, Option<u16>)> = s
        .requests()
        .into_iter()
        .map(|r| (r.user, r.refused))
        .collect();
    assert_eq!(
        users,
        [
            (Some("kubernetes-admin".into()), None),
            (Some(KRUISED_USER.into()), Some(403)),
            (Some(KRUISED_USER.into()), None),
            (Some("system:anonymous".into()), None),
        ]
    );
}

#[tokio::test]
async fn without_authentication_any_token_is_accepted_and_no_user_is_recorded() {
    let (s, c) = start().await;
    assert_eq!(
        c.with_token("anything").get("/api/v1/pods").await.status,
        200
    );
    assert_eq!(c.get("/api/v1/pods").await.status, 200);
    assert!(
        s.requests()
            .iter()
            .all(|r| r.user.is_none() && r.refused.is_none())
    );
    assert!(s.refusals().is_empty());
    assert!(
        s.list("clusterroles", None).is_empty(),
        "no default roles without RBAC"
    );
}

#[tokio::test]
async fn rbac_and_tokens_can_be_turned_on_while_the_server_runs_also_over_http() {
    let (s, c) = start().await;
    // the standalone binary's way: the control API over HTTP
    let r = c
        .put(
            "/_double/tokens",
            &json!({KRUISED: {"name": KRUISED_USER, "groups": ["system:authenticated"]}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = c.put("/_double/rbac", &json!({"enabled": true})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let k = c.with_token(KRUISED);
    assert_eq!(k.get("/api/v1/pods").await.status, 403);
    let r = c
        .request(
            Method::POST,
            "/_double/manifests",
            Some("application/yaml"),
            Some(DEPLOY_RBAC.to_string()),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(k.get("/api/v1/pods").await.status, 200);
    let refused = c.get("/_double/refusals").await;
    assert_eq!(refused.body["requests"].as_array().unwrap().len(), 1);
    // in-process: a token added later keeps the default kubeconfig's token the admin's
    s.add_token("other", UserInfo::service_account("default", "other"));
    assert_eq!(
        c.with_token("apiserver-double-token")
            .get("/api/v1/secrets")
            .await
            .status,
        401,
        "the tokens set over HTTP replaced every other token"
    );
    s.set_tokens(None);
    s.add_token("other", UserInfo::service_account("default", "other"));
    assert_eq!(
        c.with_token("apiserver-double-token")
            .get("/api/v1/secrets")
            .await
            .status,
        200,
        "turned on by add_token, the default token is the admin's"
    );
    s.set_rbac(false).unwrap();
    assert_eq!(
        c.with_token("other").get("/api/v1/secrets").await.status,
        200
    );
}

#[tokio::test]
async fn a_manifest_of_a_kind_the_double_does_not_serve_applies_nothing() {
    let (s, _c) = start_rbac().await;
    let before = s.list("serviceaccounts", None).len();
    let e = s
        .apply_manifests(
            "apiVersion: v1
kind: ServiceAccount
metadata: {name: a, namespace: default}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: default}
",
        )
        .unwrap_err();
    assert!(e.message.contains("Deployment"), "{e}");
    assert_eq!(s.list("serviceaccounts", None).len(), before);
}

#[tokio::test]
async fn rbac_names_are_path_segments_not_dns_names() {
    let (s, c) = start_rbac().await;
    assert!(s.get("clusterroles", "", "system:discovery").is_some());
    let r = c
        .with_token(ADMIN)
        .post(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &cluster_role("a/b", json!([])),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("may not contain '/'"), "{}", r.text);
}
