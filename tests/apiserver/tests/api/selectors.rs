//! Field and label selectors on LIST and WATCH (rule 2).

use serde_json::{Value, json};

use crate::common::*;

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            i["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    n.sort();
    n
}

async fn seed(c: &Client) {
    c.post(PODS, &pod("a", "n1", json!({"app": "web", "tier": "fe"})))
        .await;
    c.post(PODS, &pod("b", "n2", json!({"app": "db"}))).await;
    c.post(PODS, &pod("c", "n1", json!({}))).await;
}

#[tokio::test]
async fn list_filters_by_field_selector_with_eq_double_eq_and_not_eq() {
    let (_s, c) = start().await;
    seed(&c).await;
    assert_eq!(
        names(
            &c.get(&format!("{PODS}?fieldSelector=spec.nodeName%3Dn1"))
                .await
                .body
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            &c.get(&format!("{PODS}?fieldSelector=spec.nodeName%3D%3Dn2"))
                .await
                .body
        ),
        ["b"]
    );
    assert_eq!(
        names(
            &c.get(&format!("{PODS}?fieldSelector=spec.nodeName!%3Dn1"))
                .await
                .body
        ),
        ["b"]
    );
    assert_eq!(
        names(
            &c.get(&format!(
                "{PODS}?fieldSelector=spec.nodeName%3Dn1,metadata.name!%3Da"
            ))
            .await
            .body
        ),
        ["c"]
    );
    assert_eq!(
        names(
            &c.get(&format!(
                "{PODS}?fieldSelector=metadata.namespace%3Ddefault"
            ))
            .await
            .body
        ),
        ["a", "b", "c"]
    );
}

#[tokio::test]
async fn list_filters_by_label_selector_equality_and_set_requirements() {
    let (_s, c) = start().await;
    seed(&c).await;
    let q = |sel: &str| {
        format!(
            "{PODS}?labelSelector={}",
            sel.replace('=', "%3D").replace(' ', "%20")
        )
    };
    assert_eq!(names(&c.get(&q("app=web")).await.body), ["a"]);
    assert_eq!(names(&c.get(&q("app==db")).await.body), ["b"]);
    assert_eq!(
        names(&c.get(&q("app!=web")).await.body),
        ["b", "c"],
        "!= matches objects without the label"
    );
    assert_eq!(names(&c.get(&q("app")).await.body), ["a", "b"]);
    assert_eq!(names(&c.get(&q("!app")).await.body), ["c"]);
    assert_eq!(names(&c.get(&q("app in (web,db)")).await.body), ["a", "b"]);
    assert_eq!(names(&c.get(&q("app notin (web)")).await.body), ["b", "c"]);
    assert_eq!(names(&c.get(&q("app=web,tier=fe")).await.body), ["a"]);
    assert_eq!(c.get(&q("app in (web")).await.status, 400);
}

#[tokio::test]
async fn unsupported_field_selector_answers_400_like_the_real_server() {
    let (_s, c) = start().await;
    let r = c.get(&format!("{PODS}?fieldSelector=spec.foo%3Dbar")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.body["reason"], "BadRequest");
    assert_eq!(r.body["message"], "field label not supported: spec.foo");
    let r = c
        .get(&format!("{NODEIMAGES}?fieldSelector=spec.nodeName%3Dx"))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"], "field label not supported: spec.nodeName",
        "custom resources word it like built-in kinds"
    );
    let w = c
        .watch(&format!("{PODS}?watch=true&fieldSelector=spec.foo%3Dbar"))
        .await;
    assert_eq!(w.status, 400, "watches reject unsupported keys too");
}

#[tokio::test]
async fn cluster_wide_list_covers_every_namespace() {
    let (s, c) = start().await;
    seed(&c).await;
    let mut z = pod("z", "n1", json!({}));
    z["metadata"]["namespace"] = json!("other");
    s.create("pods", z)
        .expect("control create in a new namespace");
    assert_eq!(
        names(
            &c.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
                .await
                .body
        ),
        ["a", "c", "z"]
    );
    assert_eq!(
        names(
            &c.get(&format!("{PODS}?fieldSelector=spec.nodeName%3Dn1"))
                .await
                .body
        ),
        ["a", "c"]
    );
}

#[tokio::test]
async fn watch_applies_label_and_field_selectors() {
    let (_s, c) = start().await;
    let list = c.get(PODS).await.body;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn1&labelSelector=app"))
        .await;
    assert_eq!(w.status, 200);
    seed(&c).await;
    c.post(PODS, &pod("d", "n1", json!({"app": "x"}))).await;
    assert_eq!(ev(&w.next("ADDED a").await), ("ADDED".into(), "a".into()));
    assert_eq!(
        ev(&w.next("ADDED d").await),
        ("ADDED".into(), "d".into()),
        "b (n2) and c (no label) are filtered out"
    );
}

#[tokio::test]
async fn cluster_scoped_kinds_do_not_support_a_metadata_namespace_field_selector() {
    let (_s, c) = start().await;
    for path in [NODEIMAGES, "/api/v1/nodes"] {
        let r = c
            .get(&format!("{path}?fieldSelector=metadata.namespace%3D"))
            .await;
        assert_eq!(r.status, 400, "{path}");
        assert_eq!(
            r.body["message"],
            "field label not supported: metadata.namespace"
        );
    }
    c.post(NODEIMAGES, &node_image("n1")).await;
    c.post(NODEIMAGES, &node_image("n2")).await;
    assert_eq!(
        names(
            &c.get(&format!("{NODEIMAGES}?fieldSelector=metadata.name%3Dn2"))
                .await
                .body
        ),
        ["n2"]
    );
    let r = c
        .get(
            "/apis/apps.kruise.io/v1alpha1/namespaces/default/containerrecreaterequests?fieldSelector=metadata.namespace%3Ddefault",
        )
        .await;
    assert_eq!(r.status, 200, "namespaced custom resources support it");
}
