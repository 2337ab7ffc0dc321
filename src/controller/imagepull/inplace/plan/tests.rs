//! Tests of the in-place plan: which images, the bounds, hostile annotations.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;

/// A running pod of a CloneSet as kruise-manager and the kubelet leave it: the controller owner
/// reference, containers `(name, spec image, image the status reports)`.
fn pod(namespace: &str, name: &str, created: i64, containers: &[(&str, &str, &str)]) -> Value {
    let specs: Vec<Value> = containers
        .iter()
        .map(|(c, i, _)| json!({"name": c, "image": i}))
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(c, _, r)| json!({"name": c, "image": r, "imageID": "sha256:x", "ready": true, "restartCount": 0}))
        .collect();
    let created = k8s_openapi::jiff::Timestamp::from_second(created).expect("a time");
    json!({
        "metadata": {"name": name, "namespace": namespace,
                     "creationTimestamp": created.to_string(),
                     "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1",
                         "kind": "CloneSet", "name": "web", "uid": "u-web",
                         "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"containers": specs},
        "status": {"phase": "Running", "containerStatuses": statuses}
    })
}

/// kruise's `UpdateSpec` for `images`, as it writes the grace annotation (kruise 07169cf).
fn grace(images: &[(&str, &str)]) -> String {
    let m: serde_json::Map<String, Value> = images
        .iter()
        .map(|(c, i)| (c.to_string(), json!(i)))
        .collect();
    json!({"revision": "web-r2", "containerImages": m, "graceSeconds": 15,
           "containerRefMetadata": {}, "containerResources": {}})
    .to_string()
}

fn with_grace(mut pod: Value, key: &str, text: &str) -> Value {
    pod["metadata"]["annotations"][key] = json!(text);
    pod
}

fn typed(pods: &[Value]) -> Vec<Pod> {
    pods.iter()
        .map(|p| serde_json::from_value(p.clone()).expect("a pod"))
        .collect()
}

fn plan_of(pods: &[Value]) -> Plan {
    plan(&typed(pods), limits())
}

/// One wanted image: pull key, namespace, `(pod, why)` of the pods asking.
type Wanted = (String, String, Vec<(String, Why)>);

/// Each wanted image.
fn wanted(p: &Plan) -> Vec<Wanted> {
    p.wanted
        .iter()
        .map(|((k, ns), w)| {
            let pods = w.pods.iter().map(|(n, y)| (n.clone(), *y)).collect();
            (k.clone(), ns.clone(), pods)
        })
        .collect()
}

fn one(key: &str, ns: &str, pods: &[(&str, Why)]) -> Wanted {
    let pods = pods.iter().map(|(n, y)| (n.to_string(), *y)).collect();
    (key.to_string(), ns.to_string(), pods)
}

#[test]
fn a_changed_spec_image_is_wanted_and_a_running_one_whatever_its_spelling_is_not() {
    let pods = [pod(
        "t",
        "web-0",
        1,
        &[
            ("main", "r.io/app:v2", "r.io/app:v1"),
            ("sidecar", "nginx:1.25", "docker.io/library/nginx:1.25"),
            ("plain", "busybox", "docker.io/library/busybox:latest"),
        ],
    )];
    let p = plan_of(&pods);
    assert_eq!(
        wanted(&p),
        [one("r.io/app:v2", "t", &[("web-0", Why::SpecChange)])]
    );
    assert!(p.skipped.is_empty(), "{:?}", p.skipped);
    // every image the pod names, for the stop rule
    let named: Vec<&str> = p.named.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        named,
        [
            "docker.io/library/busybox:latest",
            "docker.io/library/nginx:1.25",
            "r.io/app:v2"
        ]
    );
}

#[test]
fn a_container_without_a_status_asks_for_nothing() {
    let mut p = pod("t", "new", 1, &[("main", "r.io/app:v2", "r.io/app:v1")]);
    p["status"] = json!({"phase": "Pending"});
    assert!(plan_of(&[p]).wanted.is_empty());
}

#[test]
fn the_grace_annotation_asks_for_its_images_before_the_spec_changes() {
    let base = pod(
        "t",
        "web-0",
        1,
        &[
            ("main", "r.io/app:v1", "r.io/app:v1"),
            ("log", "r.io/log:v1", "r.io/log:v1"),
        ],
    );
    // the old key still read; the current one wins when both are there
    let text = grace(&[("main", "r.io/app:v2"), ("log", "r.io/log:v1")]);
    let old = with_grace(base.clone(), keys::INPLACE_UPDATE_GRACE_OLD, &text);
    assert_eq!(
        wanted(&plan_of(std::slice::from_ref(&old))),
        [one("r.io/app:v2", "t", &[("web-0", Why::Grace)])],
        "an unchanged container's image asks for nothing"
    );
    let both = with_grace(
        old,
        keys::INPLACE_UPDATE_GRACE,
        &grace(&[("main", "r.io/app:v3")]),
    );
    assert_eq!(
        wanted(&plan_of(&[both])),
        [one("r.io/app:v3", "t", &[("web-0", Why::Grace)])]
    );
}

#[test]
fn pods_asking_for_one_image_share_it_per_namespace() {
    let changed =
        |ns: &str, name: &str, t| pod(ns, name, t, &[("main", "r.io/app:v2", "r.io/app:v1")]);
    let graced = with_grace(
        pod("a", "web-2", 3, &[("main", "r.io/app:v1", "r.io/app:v1")]),
        keys::INPLACE_UPDATE_GRACE,
        &grace(&[("main", "r.io/app:v2")]),
    );
    let p = plan_of(&[changed("a", "web-0", 1), changed("b", "web-1", 2), graced]);
    assert_eq!(
        wanted(&p),
        [
            one(
                "r.io/app:v2",
                "a",
                &[("web-0", Why::SpecChange), ("web-2", Why::Grace)]
            ),
            one("r.io/app:v2", "b", &[("web-1", Why::SpecChange)]),
        ]
    );
    assert_eq!(p.images(), 1);
    let w = &p.wanted[&("r.io/app:v2".to_string(), "a".to_string())];
    assert_eq!(w.describe_pods(1), "a/web-0 (spec change), and 1 more");
}

#[test]
fn a_pod_no_kruise_workload_controls_asks_for_nothing() {
    let graced = with_grace(
        pod("t", "x", 1, &[("c", "r.io/a:v1", "r.io/a:v1")]),
        keys::INPLACE_UPDATE_GRACE,
        &grace(&[("c", "r.io/a:v2")]),
    );
    let changed = pod("t", "y", 1, &[("c", "r.io/b:v2", "r.io/b:v1")]);
    let mut pods = Vec::new();
    for p in [graced, changed] {
        let mut bare = p.clone();
        bare["metadata"]["name"] = json!(format!(
            "{}-bare",
            p["metadata"]["name"].as_str().unwrap_or("")
        ));
        bare["metadata"]
            .as_object_mut()
            .map(|m| m.remove("ownerReferences"));
        let mut replica_set = p.clone();
        replica_set["metadata"]["ownerReferences"][0]["apiVersion"] = json!("apps/v1");
        let mut look_alike = p.clone();
        look_alike["metadata"]["ownerReferences"][0]["apiVersion"] =
            json!("apps.kruise.io.evil.example/v1");
        let mut not_controller = p;
        not_controller["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        pods.extend([bare, replica_set, look_alike, not_controller]);
    }
    let p = plan_of(&pods);
    assert!(p.wanted.is_empty(), "{:?}", p.wanted);
    assert!(p.named.is_empty(), "{:?}", p.named);
    assert_eq!(skipped_counts(&p).not_kruise_owned, 8);
}

fn skipped_counts(p: &Plan) -> crate::controller::imagepull::metrics::Skipped {
    super::super::super::prepull::plan::skipped_counts(&p.skipped)
}

#[test]
fn a_pod_being_deleted_or_ended_asks_for_nothing() {
    let mut deleting = pod("t", "a", 1, &[("c", "r.io/a:v2", "r.io/a:v1")]);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut ended = pod("t", "b", 1, &[("c", "r.io/b:v2", "r.io/b:v1")]);
    ended["status"]["phase"] = json!("Succeeded");
    assert!(plan_of(&[deleting, ended]).wanted.is_empty());
}

#[test]
fn a_malformed_or_oversized_grace_annotation_is_skipped_with_a_message_and_the_spec_still_counts() {
    let base = |name: &str| pod("t", name, 1, &[("main", "r.io/app:v2", "r.io/app:v1")]);
    let huge = grace(&[(
        "main",
        &format!("r.io/app:v3@sha256:{}", "a".repeat(70_000)),
    )]);
    let pods = [
        with_grace(
            base("not-json"),
            keys::INPLACE_UPDATE_GRACE,
            "not json\u{1b}[2J",
        ),
        with_grace(base("huge"), keys::INPLACE_UPDATE_GRACE, &huge),
        with_grace(
            base("bad-ref"),
            keys::INPLACE_UPDATE_GRACE,
            &grace(&[("main", "Not A Ref")]),
        ),
        with_grace(
            base("wrong-type"),
            keys::INPLACE_UPDATE_GRACE,
            r#"{"containerImages": ["r.io/x:v1"]}"#,
        ),
        // null and absent images are kruise's own spellings of "none"
        with_grace(
            base("null"),
            keys::INPLACE_UPDATE_GRACE,
            r#"{"containerImages": null}"#,
        ),
    ];
    let p = plan_of(&pods);
    let reasons: Vec<(&str, &str)> = p
        .skipped
        .iter()
        .map(|s| match s {
            Skip::Invalid { pod, reason } => (pod.as_str(), reason.as_str()),
            other => panic!("{other:?}"),
        })
        .collect();
    // pods created at the same time are taken by namespace and name
    let pods_named: Vec<&str> = reasons.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        pods_named,
        ["t/bad-ref", "t/huge", "t/not-json", "t/wrong-type"],
        "{reasons:?}"
    );
    assert!(
        reasons[1].1.contains("more than the 65536 read"),
        "{reasons:?}"
    );
    assert!(reasons[0].1.contains("Not A Ref"), "{reasons:?}");
    for (_, r) in &reasons {
        assert!(r.len() <= REASON_MAX && !r.contains('\u{1b}'), "{r:?}");
    }
    // each pod's changed spec is still heard
    let w = &p.wanted[&("r.io/app:v2".to_string(), "t".to_string())];
    assert_eq!(w.pods.len(), 5);
}

#[test]
fn grace_images_for_containers_the_pod_does_not_have_are_one_message_and_no_pull() {
    let images: Vec<(String, String)> = (0..300)
        .map(|i| (format!("ghost{i:03}"), format!("r.io/g{i:03}:v1")))
        .collect();
    let mut refs: Vec<(&str, &str)> = images
        .iter()
        .map(|(c, i)| (c.as_str(), i.as_str()))
        .collect();
    refs.push(("main", "r.io/app:v2"));
    let p = plan_of(&[with_grace(
        pod("t", "web-0", 1, &[("main", "r.io/app:v1", "r.io/app:v1")]),
        keys::INPLACE_UPDATE_GRACE,
        &grace(&refs),
    )]);
    assert_eq!(
        wanted(&p),
        [one("r.io/app:v2", "t", &[("web-0", Why::Grace)])]
    );
    assert_eq!(p.skipped.len(), 1, "{:?}", p.skipped);
    let Skip::Invalid { reason, .. } = &p.skipped[0] else {
        panic!("{:?}", p.skipped)
    };
    assert!(
        reason.contains("names 300 container(s) the pod does not have (\"ghost000\", ...)"),
        "{reason}"
    );
    assert!(
        !p.named.iter().any(|(k, _)| k.contains("/g")),
        "{:?}",
        p.named
    );
}

#[test]
fn a_pod_of_hundreds_of_changed_containers_gets_at_most_its_share() {
    let containers: Vec<(String, String, String)> = (0..200)
        .map(|i| {
            (
                format!("c{i:03}"),
                format!("r.io/i{i:03}:v2"),
                format!("r.io/i{i:03}:v1"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = containers
        .iter()
        .map(|(c, s, r)| (c.as_str(), s.as_str(), r.as_str()))
        .collect();
    let p = plan_of(&[pod("t", "greedy", 1, &refs)]);
    let keys: Vec<&str> = p.wanted.keys().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "r.io/i000:v2",
            "r.io/i001:v2",
            "r.io/i002:v2",
            "r.io/i003:v2"
        ],
        "the first containers of the spec"
    );
    assert_eq!(skipped_counts(&p).over_pod_bound, 200 - MAX_IMAGES_PER_POD);
}

#[test]
fn the_node_works_on_at_most_its_bound_of_distinct_images_oldest_pods_first() {
    // 10 pods changing 4 images each: 40 distinct; a shared image costs nothing more
    let mut pods: Vec<Value> = (0..10)
        .rev()
        .map(|n| {
            let c: Vec<(String, String, String)> = (0..4)
                .map(|i| {
                    (
                        format!("c{i}"),
                        format!("r.io/p{n}-{i}:v2"),
                        format!("r.io/p{n}-{i}:v1"),
                    )
                })
                .collect();
            let refs: Vec<(&str, &str, &str)> = c
                .iter()
                .map(|(a, b, d)| (a.as_str(), b.as_str(), d.as_str()))
                .collect();
            pod("t", &format!("p{n}"), n, &refs)
        })
        .collect();
    pods.push(pod(
        "t",
        "late",
        100,
        &[("c", "r.io/p0-0:v2", "r.io/p0-0:v1")],
    ));
    let p = plan_of(&pods);
    assert_eq!(p.images(), MAX_IMAGES_PER_NODE);
    assert!(
        p.wanted
            .keys()
            .all(|(k, _)| ["p0-", "p1-", "p2-", "p3-"].iter().any(|o| k.contains(o))),
        "the four oldest pods: {:?}",
        p.wanted.keys()
    );
    assert_eq!(skipped_counts(&p).over_node_bound, 40 - MAX_IMAGES_PER_NODE);
    let shared = &p.wanted[&("r.io/p0-0:v2".to_string(), "t".to_string())];
    assert!(shared.pods.contains_key("late"), "{shared:?}");
}

/// `pod` with a uid and a `resourceVersion`, as the API server serves it.
fn versioned(mut pod: Value, uid: &str, version: &str) -> Value {
    pod["metadata"]["uid"] = json!(uid);
    pod["metadata"]["resourceVersion"] = json!(version);
    pod
}

#[test]
fn a_plan_reads_again_only_the_pods_changed_since_the_last_and_forgets_pods_gone() {
    let a = |v: &str, image: &str| {
        versioned(pod("ns", "a", 1, &[("app", image, "r.io/app:1")]), "u-a", v)
    };
    let b = |v: &str| {
        versioned(
            pod("ns", "b", 2, &[("app", "r.io/app:1", "r.io/app:1")]),
            "u-b",
            v,
        )
    };
    let mut asks = Asks::default();
    let first = plan_with(
        &typed(&[a("1", "r.io/app:1"), b("1")]),
        limits(),
        &mut asks,
        true,
    );
    assert_eq!((asks.reads(), asks.len()), (2, 2));
    assert!(first.wanted.is_empty());

    // pod a's spec changes (a new version): only a is read again, and the plan sees the change
    let pods = [a("2", "r.io/app:2"), b("1")];
    let second = plan_with(&typed(&pods), limits(), &mut asks, true);
    assert_eq!(asks.reads(), 3, "only the changed pod is read again");
    assert_eq!(
        second,
        plan_of(&pods),
        "the same plan as one made from scratch"
    );
    assert_eq!(
        wanted(&second),
        vec![one("r.io/app:2", "ns", &[("a", Why::SpecChange)])]
    );

    // without a pull running nobody reads the named keys: not built, the rest the same
    let unnamed = plan_with(&typed(&pods), limits(), &mut asks, false);
    assert!(unnamed.named.is_empty(), "{:?}", unnamed.named);
    assert!(!second.named.is_empty());
    assert_eq!(unnamed.wanted, second.wanted);
    assert_eq!(asks.reads(), 3, "nothing changed: nothing read");

    // pod b leaves the node: forgotten
    plan_with(&typed(&[a("2", "r.io/app:2")]), limits(), &mut asks, true);
    assert_eq!((asks.reads(), asks.len()), (3, 1));

    // a pod without a version is read every time
    let bare = pod("ns", "c", 3, &[("app", "r.io/app:3", "r.io/app:1")]);
    plan_with(
        &typed(std::slice::from_ref(&bare)),
        limits(),
        &mut asks,
        true,
    );
    plan_with(&typed(&[bare]), limits(), &mut asks, true);
    assert_eq!((asks.reads(), asks.len()), (5, 1));
}
