//! kruised under RBAC: the `kruised` binary against the API-server double with authentication
//! and RBAC on, as the ServiceAccount of `deploy/rbac.yaml` and of kruise's Helm chart 1.9
//! (`tests/fixtures/kruise-chart/rbac.yaml`), through every kind of request it makes, with
//! nothing refused; and a role missing one rule, refused and said so. What the cluster layer
//! proved on a real kube-apiserver v1.36 with RBAC (`tests/cluster/dropin.rs`, `ship.rs`),
//! here on the double, whose authorizer and `403` bodies follow kube-apiserver's
//! (`tests/apiserver/CONFORMANCE.md`, "Authentication and RBAC").

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::cluster::Rbac;
use crate::support::daemon::{Daemon, http_get};
use crate::support::node::{FakeNode, NODE};
use crate::support::pull::{CONFIG_NS, create_secret};
use crate::support::rbac::{
    DEPLOY_RBAC_YAML, DoubleIdentity, assert_never_forbidden, assert_nothing_refused,
    identity_on_double, identity_with, is_refusal,
};
use crate::support::wait;
use kruised::k8s::crd::{ContainerRecreateRequest, ProbeState};
use kruised::k8s::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

fn containers() -> Value {
    json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
        {"name": "side", "image": "busybox:v1"}
    ])
}

/// Starts `kruised run` for the node with `identity`'s kubeconfig; waits until it is ready.
async fn start_as(node: &FakeNode, identity: &DoubleIdentity) -> Daemon {
    let args = crate::support::daemon_args(&identity.kubeconfig, &node.endpoint());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// An env restart: the annotation written (`pods/status` patch), the stale container stopped
/// (a `Killing` event), the recreated one annotated.
pub(crate) async fn env_restart(node: &mut FakeNode) {
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::meta(
        &node.api,
        LIMIT,
        "default",
        "web-0",
        "the annotation of web-0 is written",
        |m| m.containers.len() == 2,
    )
    .await;
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    node.cri
        .wait_for(LIMIT, |s| !s.stops.is_empty())
        .await
        .expect("the container with the stale env is stopped");
    let new_id = node.recreate("web-0", "main");
    wait::meta(
        &node.api,
        LIMIT,
        "default",
        "web-0",
        "the annotation names the recreated container",
        |m| {
            m.container("main")
                .is_some_and(|c| c.container_id == format!("containerd://{new_id}"))
        },
    )
    .await;
}

/// A NodeImage tag pulled with the pull secret read from `kruise-daemon-config`.
pub(crate) async fn pull_with_secret(node: &FakeNode) {
    create_secret(
        &node.api,
        "regcred",
        None,
        "r.io",
        "robot",
        "pw-not-printed",
    );
    node.api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                   "metadata": {"name": NODE},
                   "spec": {"images": {"r.io/app": {
                       "pullSecrets": [{"namespace": CONFIG_NS, "name": "regcred", "mode": "batch"}],
                       "tags": [{"tag": "v1", "version": 1}]}}}}),
        )
        .unwrap();
    wait::node_image(&node.api, LIMIT, NODE, "the tag pulled", |s| {
        s.succeeded == 1
    })
    .await;
    let auth = node
        .cri
        .state()
        .pulls
        .iter()
        .find(|p| p.image == "r.io/app:v1")
        .and_then(|p| p.auth.clone())
        .expect("the pull carried the secret's login");
    assert_eq!(auth.username, "robot");
}

/// A ContainerRecreateRequest carried out to `Completed` (the test plays the kubelet and the
/// manager's snapshot, as `recreate.rs` does).
async fn recreate_request(node: &FakeNode) {
    let p = node.api.get("pods", "default", "web-0").unwrap();
    let id = p["status"]["containerStatuses"][1]["containerID"].clone();
    node.api
        .create(
            "containerrecreaterequests",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                   "metadata": {"name": "r", "namespace": "default", "labels": {
                       keys::CRR_NODE_NAME_LABEL: NODE, keys::CRR_ACTIVE_LABEL: "true",
                       keys::CRR_POD_UID_LABEL: p["metadata"]["uid"]}},
                   "spec": {"podName": "web-0",
                            "containers": [{"name": "side", "statusContext": {"containerID": id, "restartCount": 0}}],
                            "strategy": {"terminationGracePeriodSeconds": 30}}}),
        )
        .unwrap();
    wait::crr(
        &node.api,
        LIMIT,
        "default",
        "r",
        "side killed",
        |r: &ContainerRecreateRequest| {
            r.status.as_ref().is_some_and(|s| {
                s.container_recreate_states
                    .iter()
                    .any(|c| c.name == "side" && c.is_killed)
            })
        },
    )
    .await;
    let new_id = node.recreate("web-0", "side");
    node.api
        .modify("containerrecreaterequests", "default", "r", |o| {
            o["status"]["containerStatusSnapshot"] = json!([{"name": "side", "ready": true,
                "restartCount": 1, "containerID": format!("containerd://{new_id}")}]);
        })
        .unwrap();
    wait::crr(&node.api, LIMIT, "default", "r", "Completed", |r| {
        r.is_completed()
    })
    .await;
}

/// The node's NodePodProbe with an exec probe of web-0's main container, reported Succeeded.
async fn pod_probe(node: &FakeNode) {
    let uid = node.api.get("pods", "default", "web-0").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    node.api
        .create(
            "nodepodprobes",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
                   "metadata": {"name": NODE},
                   "spec": {"podProbes": [{"name": "web-0", "namespace": "default", "uid": uid,
                       "IP": "127.0.0.1", "probes": [{"name": "web#ok", "containerName": "main",
                       "probe": {"exec": {"command": ["true"]}, "periodSeconds": 1, "timeoutSeconds": 2}}]}]}}),
        )
        .unwrap();
    let ok = ProbeState::Succeeded;
    wait::probe_state(&node.api, LIMIT, NODE, &uid, "web#ok", ok).await;
}

/// Every kind of request kruised makes, as `(verb, resource)` of the double's log.
const EVERY_REQUEST: &[(&str, &str)] = &[
    ("list", "pods"),
    ("watch", "pods"),
    ("patch", "pods/status"),
    ("create", "events"),
    ("list", "nodeimages"),
    ("watch", "nodeimages"),
    ("patch", "nodeimages/status"),
    ("get", "secrets"),
    ("list", "containerrecreaterequests"),
    ("watch", "containerrecreaterequests"),
    ("patch", "containerrecreaterequests/status"),
    ("list", "nodepodprobes"),
    ("watch", "nodepodprobes"),
    ("patch", "nodepodprobes/status"),
];

/// kruised with `rbac`'s identity through all of its work: nothing refused, all done, every
/// request its ServiceAccount's.
async fn everything_is_allowed_with(rbac: Rbac) {
    let mut node = FakeNode::start().await;
    let identity = identity_on_double(&node.api, rbac, node.dir.path());
    let mut d = start_as(&node, &identity).await;
    env_restart(&mut node).await;
    pull_with_secret(&node).await;
    recreate_request(&node).await;
    pod_probe(&node).await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());

    assert_nothing_refused(&node.api);
    assert_never_forbidden(&d);
    let requests = node.api.requests();
    let seen: BTreeSet<(&str, &str)> = requests
        .iter()
        .map(|r| (r.verb.as_str(), r.resource.as_str()))
        .collect();
    let missing: Vec<_> = EVERY_REQUEST.iter().filter(|k| !seen.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "the scenario made no {missing:?}; made {seen:?}"
    );
    let others: Vec<_> = requests
        .iter()
        .filter(|r| r.user.as_deref() != Some(identity.user.as_str()))
        .map(|r| (&r.path, &r.user))
        .collect();
    assert!(
        others.is_empty(),
        "every request is {}'s: {others:?}",
        identity.user
    );
    let killing = node
        .api
        .list("events", Some("default"))
        .into_iter()
        .filter(|e| e["reason"] == "Killing")
        .count();
    assert!(killing >= 1, "the restarts were reported as Killing events");
}

/// Seen on the cluster layer (kube-apiserver v1.36.2, RBAC on): kruised with deploy/rbac.yaml
/// was never refused; `tests/cluster/containermeta.rs`, `imagepull.rs`, `kruise.rs`.
#[tokio::test]
async fn with_deploy_rbac_every_request_kruised_makes_is_allowed_and_its_work_is_done() {
    everything_is_allowed_with(Rbac::Deploy).await;
}

/// Seen on the cluster layer (kube-apiserver v1.36.2, RBAC on): kruised with the RBAC of
/// kruise's chart 1.9 was never refused; `tests/cluster/dropin.rs`.
#[tokio::test]
async fn with_kruises_chart_rbac_every_request_kruised_makes_is_allowed_and_its_work_is_done() {
    everything_is_allowed_with(Rbac::KruiseChart).await;
}

/// `deploy/rbac.yaml` as JSON documents (YAML's subset) with the rules `drop` picks removed from
/// its ClusterRole; panics unless exactly one rule went.
fn deploy_rbac_without(drop: impl Fn(&Value) -> bool) -> String {
    let mut docs: Vec<Value> =
        serde_saphyr::from_multiple(DEPLOY_RBAC_YAML).expect("deploy/rbac.yaml parses");
    let mut removed = 0;
    for doc in docs.iter_mut().filter(|d| d["kind"] == "ClusterRole") {
        let rules = doc["rules"].as_array_mut().expect("rules");
        let before = rules.len();
        rules.retain(|r| !drop(r));
        removed += before - rules.len();
    }
    assert_eq!(removed, 1, "exactly one rule removed");
    docs.iter()
        .filter(|d| d.is_object())
        .map(|d| format!("---\n{d}\n"))
        .collect()
}

fn grants(rule: &Value, resource: &str) -> bool {
    rule["resources"]
        .as_array()
        .is_some_and(|r| r.iter().any(|x| x == resource))
}

/// What a missing rule looks like, so that the tests above can fail: the annotation's patch is
/// refused with the real `403` (tests/apiserver/CONFORMANCE.md), and kruised logs the refusal.
#[tokio::test]
async fn without_the_pods_status_rule_the_annotation_is_refused_and_kruised_logs_the_refusal() {
    let mut node = FakeNode::start().await;
    let yaml = deploy_rbac_without(|r| grants(r, "pods/status"));
    let identity = identity_with(&node.api, "kruised", &yaml, node.dir.path());
    let mut d = start_as(&node, &identity).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    let line = d
        .wait_for_line("a refused request", LIMIT, |v| is_refusal(&v.to_string()))
        .await
        .to_string();
    assert!(
        line.contains("cannot patch resource \\\"pods/status\\\""),
        "kruised names what was refused: {line}"
    );
    let refused = node.api.refusals();
    assert!(!refused.is_empty());
    assert!(
        refused.iter().all(|r| r.refused == Some(403)
            && (r.verb.as_str(), r.resource.as_str()) == ("patch", "pods/status")
            && r.user.as_deref() == Some(identity.user.as_str())),
        "only the annotation's patch is refused: {refused:#?}"
    );
    assert!(node.meta("web-0").is_none(), "no annotation was written");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// The other way a missing rule shows: a watch kruised cannot start keeps it unready, and
/// `/readyz` says why (kube-apiserver's `[-]<check> failed: <reason>` lines).
#[tokio::test]
async fn without_the_list_of_kruise_resources_kruised_stays_unready_and_readyz_names_the_refusal() {
    let node = FakeNode::start().await;
    let yaml =
        deploy_rbac_without(|r| r["verbs"] == json!(["list", "watch"]) && grants(r, "nodeimages"));
    let identity = identity_with(&node.api, "kruised", &yaml, node.dir.path());
    let args = crate::support::daemon_args(&identity.kubeconfig, &node.endpoint());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    // the second refused list comes after kruised's backoff, so after it took in the first
    node.api
        .wait_for_requests(LIMIT, |log| {
            log.refused()
                .iter()
                .filter(|r| (r.verb.as_str(), r.resource.as_str()) == ("list", "nodeimages"))
                .count()
                >= 2
        })
        .await
        .expect("kruised lists its NodeImage again after the refusal");
    let (code, body) = http_get(d.admin, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("[-]nodeimage failed"))
        .unwrap_or_else(|| panic!("no nodeimage check in {body}"));
    assert!(
        line.contains("nodeimages.apps.kruise.io \"node-a\" is forbidden")
            && line.contains("cannot list resource \"nodeimages\""),
        "{line}"
    );
    assert!(
        d.log().iter().any(|v| v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("watch failed"))
            && is_refusal(&v.to_string())),
        "the refusal is in the log:\n{}",
        d.log_text()
    );
    assert!(!d.logged("daemon ready"));
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// The helper the RBAC checks rely on (moved from `tests/cluster/ship.rs` to run in CI).
#[test]
fn a_refusal_is_told_by_its_reason_or_code_never_by_a_403_inside_an_id() {
    assert!(is_refusal(
        r#"{"error":"ApiError: pods is forbidden: User \"x\" cannot patch: Forbidden"}"#
    ));
    assert!(is_refusal("ErrorResponse { reason: \"X\", code: 403 }"));
    assert!(is_refusal(r#"{"code":403}"#));
    assert!(!is_refusal(r#"{"id":"4038dcbd4b99","lag_ms":403}"#));
}
