//! The tests' one kubelet (`tests/support/kubelet/`) against what the real one does: the pod
//! status it reports (`Ready`, its reasons, its transition times), the env it resolves when it
//! creates a container, its pull policy and its recreate (kill, the image step, start) on the
//! fake runtime.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::ContainerState;
use kruised::hash::kubelet::{format_hash, hash_container};
use kruised::k8s::keys;
use serde_json::{Value, json};

use crate::support::kubelet::{PullPolicy, spec, status};

fn pod_status(pod: &Pod, containers: Vec<Value>) -> Value {
    let pod = serde_json::to_value(pod).expect("a pod's JSON");
    status::pod_status(&pod, &pod, containers)
}

fn pod(gate_status: Option<&str>) -> Pod {
    let mut conditions = vec![json!({"type": "Ready", "status": "False",
                                     "lastTransitionTime": "2026-01-01T00:00:00Z"})];
    if let Some(s) = gate_status {
        conditions.push(json!({"type": "InPlaceUpdateReady", "status": s}));
    }
    serde_json::from_value(json!({
        "metadata": {"name": "web-0", "namespace": "demo", "uid": "u1",
                     "labels": {"tier": "front"}, "annotations": {"app-config": "v1"}},
        "spec": {"nodeName": "n1", "readinessGates": [{"conditionType": "InPlaceUpdateReady"}],
                 "containers": [{"name": "app", "image": "busybox", "env": [
                    {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['app-config']"}}},
                    {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
                    {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "P", "value": "plain"},
                    {"name": "M", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['missing']"}}}]}]},
        "status": {"conditions": conditions}
    }))
    .expect("a pod")
}

fn condition(status: &Value, type_: &str) -> (String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["lastTransitionTime"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn running() -> Vec<Value> {
    vec![json!({"name": "app", "ready": true})]
}

#[test]
fn the_pod_is_ready_only_when_its_containers_run_and_every_readiness_gate_is_true() {
    assert_eq!(
        condition(&pod_status(&pod(Some("True")), running()), "Ready").0,
        "True"
    );
    assert_eq!(
        condition(&pod_status(&pod(Some("False")), running()), "Ready").0,
        "False"
    );
    assert_eq!(
        condition(&pod_status(&pod(None), running()), "Ready").0,
        "False"
    );
    let stopped = vec![json!({"name": "app", "ready": false})];
    let status = pod_status(&pod(Some("True")), stopped);
    assert_eq!(condition(&status, "Ready").0, "False");
    assert_eq!(condition(&status, "ContainersReady").0, "False");
}

#[test]
fn ready_false_gives_the_kubelets_reason_which_kruised_reads() {
    let reason = |status: &Value| {
        status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["reason"].clone())
    };
    let gate = pod_status(&pod(Some("False")), running());
    assert_eq!(reason(&gate), Some(json!("ReadinessGatesNotReady")));
    let stopped = vec![json!({"name": "app", "ready": false})];
    let containers = pod_status(&pod(Some("False")), stopped);
    assert_eq!(reason(&containers), Some(json!("ContainersNotReady")));
    let ready = pod_status(&pod(Some("True")), running());
    assert_eq!(reason(&ready), Some(Value::Null));
}

#[test]
fn a_condition_keeps_its_transition_time_until_its_status_changes() {
    let unchanged = pod_status(&pod(Some("False")), running());
    assert_eq!(
        condition(&unchanged, "Ready"),
        ("False".to_string(), "2026-01-01T00:00:00Z".to_string())
    );
    let changed = pod_status(&pod(Some("True")), running());
    assert_ne!(condition(&changed, "Ready").1, "2026-01-01T00:00:00Z");
}

#[test]
fn env_is_resolved_from_the_pod_as_it_is_when_the_container_is_created() {
    let p = pod(None);
    let c = &p.spec.as_ref().expect("spec").containers[0];
    let config = spec::container_config(&p, c, 2);
    let env: BTreeMap<_, _> = config.envs.iter().cloned().collect();
    assert_eq!(env["A"], "v1");
    assert_eq!(env["L"], "front");
    assert_eq!(env["N"], "web-0");
    assert_eq!(env["H"], "n1");
    assert_eq!(env["P"], "plain");
    assert_eq!(
        env["M"], "",
        "a missing key resolves to empty, as in the kubelet"
    );
    assert_eq!(config.metadata.attempt, 2);
    assert_eq!(
        config.annotations[keys::KUBELET_CONTAINER_RESTART_COUNT],
        "2"
    );
    assert_eq!(
        config.annotations[keys::KUBELET_CONTAINER_HASH],
        format_hash(hash_container(c))
    );
    assert_eq!(config.labels[keys::KUBELET_POD_UID], "u1");
}

#[test]
fn a_missing_pull_policy_is_the_api_servers_default_for_the_image() {
    for (image, want) in [
        ("busybox", PullPolicy::Always),
        ("r.io/busybox:latest", PullPolicy::Always),
        ("r.io:5000/busybox:v1", PullPolicy::IfNotPresent),
        ("r.io/busybox@sha256:ab", PullPolicy::IfNotPresent),
    ] {
        assert_eq!(PullPolicy::of(None, image), want, "{image}");
    }
    assert_eq!(PullPolicy::of(Some("Never"), "busybox"), PullPolicy::Never);
}

#[tokio::test]
async fn a_recreate_kills_then_pulls_as_the_policy_says_then_starts() {
    use kruised_test_support::kubelet::cri::ensure_image_fake;
    let mut node = crate::support::node::FakeNode::start().await;
    let p = node.add_pod(
        "web-0",
        json!([{"name": "app", "image": "busybox"}]),
        json!({}),
        true,
    );
    let obj = node.api.get("pods", "default", "web-0").expect("the pod");
    let reported = status::container(&obj, "app").expect("its status");
    let old = node.runtime_id(reported);
    let mut c = p.spec.as_ref().expect("spec").containers[0].clone();
    c.image = Some("r.io/app:v2".into());
    c.image_pull_policy = Some("Never".into());
    let never = node.recreate_reported(&p, &c, reported, Some(137));
    let e = never.expect_err("a missing image with policy Never");
    assert_eq!(e.reason, "ErrImageNeverPull");
    let cri = &node.cri;
    assert_eq!(
        cri.state().containers[&old].status.state,
        ContainerState::Exited,
        "killed first"
    );
    c.image_pull_policy = Some("IfNotPresent".into());
    let recreated = node.recreate_reported(&p, &c, reported, None);
    let (new, _) = recreated.expect("pulled, started");
    assert!(cri.state().find_image("r.io/app:v2").is_some());
    assert_eq!(cri.state().containers[&new].status.metadata.attempt, 1);
    let pulled = |policy| ensure_image_fake(cri, "r.io/app:v2", policy).map(|s| s.pulled);
    assert!(!pulled(PullPolicy::IfNotPresent).expect("present"));
    assert!(pulled(PullPolicy::Always).expect("pulled again"));
}
