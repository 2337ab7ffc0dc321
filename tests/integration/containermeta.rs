//! Container meta and env-from-metadata restarts: the `kruised` binary against the API-server
//! double and the fake runtime, with the test playing the kubelet.

use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::kubelet::status;
use crate::support::node::{FakeNode, NODE};
use crate::support::wait;
use kruised::cri::ContainerState;
use kruised::hash::env::expected_env_hash;
use kruised::hash::kubelet::hash_container;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(20);

fn containers() -> Value {
    json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}},
                 {"name": "PLAIN", "value": "x"}]},
        {"name": "side", "image": "busybox:v1"}
    ])
}

async fn start(node: &FakeNode) -> Daemon {
    start_with(node, &[]).await
}

async fn start_with(node: &FakeNode, extra: &[&str]) -> Daemon {
    let mut args = node.daemon_args();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// How many lines of the daemon's log start with `message`.
fn count_logged(d: &Daemon, message: &str) -> usize {
    d.log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        })
        .count()
}

fn set_role(node: &FakeNode, pod: &str, role: &str, ready: Option<&str>) {
    node.api
        .modify("pods", "default", pod, |p| {
            p["metadata"]["annotations"]["role"] = json!(role);
            if let Some(r) = ready {
                p["status"]["conditions"][0]["status"] = json!(r);
            }
        })
        .unwrap();
}

fn stops(node: &FakeNode) -> Vec<String> {
    node.cri
        .state()
        .stops
        .iter()
        .map(|(id, _)| id.clone())
        .collect()
}

#[tokio::test]
async fn a_managed_pod_gets_a_truthful_annotation_and_others_are_left_alone() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    // pods created after start: the first event of a managed pod writes its annotation
    let deployment = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                             "uid": "rs-1", "controller": true}]);
    node.add_owned_pod("plain", containers(), json!({}), true, deployment);
    let pod = node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    let meta = wait::pod_meta(&node.api, LIMIT, "web-0", "annotation written", |m| {
        m.containers.len() == 2
    })
    .await;

    let status = node.api.get("pods", "default", "web-0").unwrap();
    let spec = &pod.spec.as_ref().unwrap().containers;
    for (i, s) in status["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let entry = &meta.containers[i];
        assert_eq!(entry.name, s["name"].as_str().unwrap(), "status order");
        assert_eq!(entry.container_id, s["containerID"].as_str().unwrap());
        let c = spec.iter().find(|c| c.name == entry.name).unwrap();
        assert_eq!(
            entry.hashes.plain_hash,
            hash_container(c),
            "the kubelet's hash, from the runtime"
        );
        let labels = pod.metadata.labels.clone().unwrap();
        let annotations = pod.metadata.annotations.clone().unwrap();
        assert_eq!(
            entry.hashes.extracted_env_from_metadata_hash,
            expected_env_hash(c, &labels, &annotations),
            "the running env matches the pod's metadata"
        );
    }
    assert!(
        node.meta("plain").is_none(),
        "a pod kruise does not manage gets no annotation"
    );
    assert!(stops(&node).is_empty());
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn pods_present_at_start_are_not_written_until_they_change() {
    let mut node = FakeNode::start().await;
    for i in 0..5 {
        node.add_pod(
            &format!("old-{i}"),
            containers(),
            json!({"role": "blue"}),
            true,
        );
    }
    let mut d = start(&node).await;
    // a change to one pod writes that pod only
    node.api
        .modify("pods", "default", "old-3", |p| {
            p["metadata"]["labels"]["touched"] = json!("yes")
        })
        .unwrap();
    wait::pod_meta(
        &node.api,
        LIMIT,
        "old-3",
        "annotation of the changed pod",
        |m| m.containers.len() == 2,
    )
    .await;
    for i in [0, 1, 2, 4] {
        assert!(
            node.meta(&format!("old-{i}")).is_none(),
            "old-{i} was written on start"
        );
    }
    assert_eq!(
        node.api.request_count("patch", "pods/status"),
        1,
        "no patch storm"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// Seen with the real kruise-manager: it starts an in-place update (the pod out of service, the
/// new annotation) on a node where no daemon runs yet, a rollout or a reboot of it. Left alone as
/// the patch-storm rule would leave it, the update never finishes: nothing else changes the pod.
#[tokio::test]
async fn an_in_place_update_begun_before_the_daemon_started_is_finished_when_it_starts() {
    let mut node = FakeNode::start().await;
    node.add_pod("waiting", containers(), json!({"role": "blue"}), true);
    node.add_pod("idle", containers(), json!({"role": "blue"}), true);
    set_role(&node, "waiting", "green", Some("False"));
    let status = node.api.get("pods", "default", "waiting").unwrap();
    let main = status["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let mut d = start(&node).await;
    node.cri
        .wait_for(LIMIT, |s| !s.stops.is_empty())
        .await
        .expect("the stale container of the waiting pod is stopped");
    assert_eq!(stops(&node), vec![main], "that container only");
    let new_id = node.recreate("waiting", "main");
    wait::pod_meta(
        &node.api,
        LIMIT,
        "waiting",
        "the annotation of the new container",
        |m| m.container("main").unwrap().container_id == format!("containerd://{new_id}"),
    )
    .await;
    assert!(
        node.meta("idle").is_none(),
        "a pod present at start and not waiting is still left alone"
    );
    assert_eq!(stops(&node).len(), 1, "stopped once");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn stale_env_restarts_exactly_that_container_once_while_in_place_update_is_pending() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    let before = wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    let main_id = before.container("main").unwrap().container_id.clone();
    let main_raw = main_id.strip_prefix("containerd://").unwrap().to_string();

    // the controller marks the pod not ready and changes the annotation the env refers to
    set_role(&node, "web-0", "green", Some("False"));
    node.cri
        .wait_for(LIMIT, |s| !s.stops.is_empty())
        .await
        .expect("the stale container is stopped");
    assert_eq!(
        stops(&node),
        vec![main_raw.clone()],
        "only the container whose env is stale"
    );

    // the kubelet recreates it with the new value; the annotation follows
    let new_id = node.recreate("web-0", "main");
    let after = wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "annotation of the new container",
        |m| m.container("main").unwrap().container_id == format!("containerd://{new_id}"),
    )
    .await;
    let env = node.cri.state().containers[&new_id].env.clone();
    assert!(env.contains(&"ROLE=green".to_string()), "{env:?}");
    let entry = after.container("main").unwrap();
    assert_eq!(entry.restart_count, 1);
    assert_ne!(
        entry.hashes.extracted_env_from_metadata_hash,
        before
            .container("main")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash
    );
    assert_eq!(
        after.container("side"),
        before.container("side"),
        "side untouched"
    );
    // the annotation was rewritten after the recreate, so the daemon has seen it: still one stop
    assert_eq!(stops(&node).len(), 1, "never twice");
    // the stop and the recreate made several container events of one sandbox: its pod was
    // looked up once at most, then remembered
    assert!(
        node.cri.state().call_count("ListPodSandbox") <= 1,
        "ListPodSandbox called {} times for one sandbox",
        node.cri.state().call_count("ListPodSandbox")
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// `kruised explain -o json` of `default/<pod>` on the fake node.
async fn explain_view(node: &FakeNode, pod: &str) -> Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"))
        .args([
            "explain",
            &format!("default/{pod}"),
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(node.kubeconfig())
        .args(["--runtime-endpoint", &node.endpoint()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each container's decision in `kruised explain`.
async fn explained(node: &FakeNode, pod: &str) -> Vec<(String, String)> {
    let view = explain_view(node, pod).await;
    view["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["decision"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_same_change_while_in_place_update_ready_is_true_restarts_nothing() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    set_role(&node, "web-0", "green", None);
    d.wait_for_log("stale env, not stopping", LIMIT).await;
    assert!(stops(&node).is_empty());

    // and explain says why
    let view = explain_view(&node, "web-0").await;
    let main = &view["containers"][0];
    assert_eq!(main["name"], "main");
    assert_ne!(main["expectedEnvHash"], main["currentEnvHash"], "{view:#}");
    let decision = main["decision"].as_str().unwrap();
    assert!(
        decision.contains("blocked") && decision.contains("InPlaceUpdateReady"),
        "{decision}"
    );
    assert_eq!(view["containers"][1]["decision"], "up to date");
    // once the controller takes the pod out of service, the restart happens
    set_role(&node, "web-0", "green", Some("False"));
    node.cri
        .wait_for(LIMIT, |s| s.stops.len() == 1)
        .await
        .expect("restart after InPlaceUpdateReady=False");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn explain_says_restart_due_exactly_for_the_containers_the_daemon_then_stops() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    node.add_pod("web-1", containers(), json!({"role": "blue"}), true);
    let mut main_ids = Vec::new();
    for pod in ["web-0", "web-1"] {
        let m = wait::pod_meta(&node.api, LIMIT, pod, "first annotation", |m| {
            m.containers.len() == 2
        })
        .await;
        main_ids.push(m.container("main").unwrap().container_id.clone());
    }
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());

    // while no daemon runs, two in-place updates: env only, and image with env
    set_role(&node, "web-0", "green", Some("False"));
    node.api
        .modify("pods", "default", "web-1", |p| {
            p["spec"]["containers"][0]["image"] = json!("busybox:v2");
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    let due = |decisions: &[(String, String)]| -> Vec<String> {
        decisions
            .iter()
            .filter(|(_, d)| d.starts_with("restart due"))
            .map(|(n, _)| n.clone())
            .collect()
    };
    let web0 = explained(&node, "web-0").await;
    let web1 = explained(&node, "web-1").await;
    assert_eq!(due(&web0), ["main"], "{web0:?}");
    assert_eq!(due(&web1), Vec::<String>::new(), "{web1:?}");
    assert!(web1[0].1.contains("the kubelet recreates it"), "{web1:?}");

    // the daemon, started now, stops what explain said and nothing else
    let mut d = start(&node).await;
    node.cri
        .wait_for(LIMIT, |s| !s.stops.is_empty())
        .await
        .expect("the stale container is stopped");
    d.wait_for_log("stale env, not stopping", LIMIT).await;
    let web0_main = main_ids[0].strip_prefix("containerd://").unwrap();
    assert_eq!(stops(&node), [web0_main], "web-0's main, as explain said");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn an_image_and_env_change_together_is_left_to_the_kubelet_so_one_restart_happens() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    // image and annotation change in one in-place update
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["spec"]["containers"][0]["image"] = json!("busybox:v2");
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    d.wait_for_log("stale env, not stopping", LIMIT).await;
    // the kubelet sees the hash change and recreates the container with image and env
    let new_id = node.recreate("web-0", "main");
    wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "annotation of the new container",
        |m| m.container("main").unwrap().container_id.ends_with(&new_id),
    )
    .await;
    assert!(
        stops(&node).is_empty(),
        "the daemon stopped nothing: the kubelet's recreate was the one restart"
    );
    let env = node.cri.state().containers[&new_id].env.clone();
    assert!(env.contains(&"ROLE=green".to_string()), "{env:?}");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn env_is_read_from_the_runtime_spec_or_by_exec_whichever_works() {
    let mut node = FakeNode::start().await;
    // both containers read metadata here: one image without `env` (OCI spec only), one runtime
    // that does not report the OCI spec (exec only)
    let both_read_metadata = json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
        {"name": "side", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]}
    ]);
    let pod = node.add_pod("web-0", both_read_metadata, json!({"role": "blue"}), true);
    let sandbox = node.sandboxes["web-0"].clone();
    let spec = pod.spec.as_ref().unwrap().containers.clone();
    let no_env_binary = node.start_container(&pod, &sandbox, &spec[0], 1, true, false);
    let no_spec_info = node.start_container(&pod, &sandbox, &spec[1], 1, false, true);
    node.api
        .modify("pods", "default", "web-0", |p| {
            let ids = [("main", no_env_binary), ("side", no_spec_info)];
            for (name, id) in ids {
                status::update_container(p, name, |s| {
                    s["containerID"] = json!(format!("containerd://{id}"))
                });
            }
        })
        .unwrap();
    let mut d = start(&node).await;
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["labels"]["touched"] = json!("yes")
        })
        .unwrap();
    let meta = wait::pod_meta(&node.api, LIMIT, "web-0", "annotation", |m| {
        m.containers.len() == 2
            && m.containers
                .iter()
                .all(|c| c.hashes.extracted_env_from_metadata_hash != 0)
    })
    .await;
    let labels = pod.metadata.labels.clone().unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap();
    assert_eq!(
        meta.container("main")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash,
        expected_env_hash(&spec[0], &labels, &annotations)
    );
    assert_eq!(
        node.cri.state().call_count("ExecSync"),
        1,
        "exec only where the spec is missing"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_container_that_reads_no_metadata_gets_the_null_hash_without_any_runtime_call() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    // the image has no `env` and the runtime reports no OCI spec: reading its env is
    // impossible, and needless
    let plain = json!([{"name": "plain", "image": "busybox:v1",
                        "env": [{"name": "PLAIN", "value": "x"}]}]);
    node.add_pod("web-0", plain, json!({}), true);
    let meta = wait::pod_meta(&node.api, LIMIT, "web-0", "annotation", |m| {
        m.container("plain")
            .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash != 0)
    })
    .await;
    assert_eq!(
        meta.container("plain")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash,
        kruised::hash::env::NO_ENV_HASH
    );
    let calls = |rpc| node.cri.state().call_count(rpc);
    assert_eq!(calls("ExecSync"), 0);
    assert_eq!(calls("ContainerStatus"), 0);
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_container_annotated_before_it_ran_gets_its_env_hash_as_soon_as_it_runs() {
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    let pod = node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    let main_id = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    let main_id = main_id.trim_start_matches("containerd://").to_string();
    // the kubelet reports main created, not running yet
    node.cri.set_state(&main_id, ContainerState::Created);
    node.api
        .modify("pods", "default", "web-0", |p| {
            status::update_container(p, "main", |s| {
                s["state"] = json!({"waiting": {"reason": "ContainerCreating"}})
            });
            p["metadata"]["labels"]["touched"] = json!("yes");
        })
        .unwrap();
    wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "annotation with main's hash unknown",
        |m| {
            m.container("main")
                .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash == 0)
                && m.container("side")
                    .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash != 0)
        },
    )
    .await;
    // it runs: its hash comes with the status change, not with a relist minutes later
    node.cri.set_state(&main_id, ContainerState::Running);
    node.api
        .modify("pods", "default", "web-0", |p| {
            status::update_container(p, "main", |s| {
                s["state"] = json!({"running": {"startedAt": "2026-01-01T00:00:01Z"}})
            });
        })
        .unwrap();
    let labels = pod.metadata.labels.clone().unwrap();
    let annotations = pod.metadata.annotations.clone().unwrap();
    let want = expected_env_hash(
        &pod.spec.as_ref().unwrap().containers[0],
        &labels,
        &annotations,
    );
    wait::pod_meta(&node.api, LIMIT, "web-0", "main's hash once it runs", |m| {
        m.container("main")
            .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash == want)
    })
    .await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn only_the_current_batch_of_a_multi_batch_update_is_restarted() {
    let mut node = FakeNode::start().await;
    let both = json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
        {"name": "side", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]}
    ]);
    let mut d = start(&node).await;
    node.add_pod("web-0", both, json!({"role": "blue"}), true);
    let meta = wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    // side belongs to the next batch
    let state = json!({"revision": "r2", "nextContainerRefMetadata": {"side": {"annotations": {"role": "green"}}}});
    node.api
        .modify("pods", "default", "web-0", |p| {
            p["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"] =
                json!(state.to_string());
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    node.cri
        .wait_for(LIMIT, |s| !s.stops.is_empty())
        .await
        .expect("the current batch restarts");
    d.wait_for_log("stale env, not stopping", LIMIT).await;
    let main = meta.container("main").unwrap().container_id.clone();
    assert_eq!(
        stops(&node),
        vec![main.strip_prefix("containerd://").unwrap().to_string()]
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_container_recreated_while_the_event_stream_is_down_is_noticed_once_it_is_back() {
    let mut node = FakeNode::start().await;
    // no relist within the test: only the event stream, or its catch-up, can notice
    let mut d = start_with(&node, &["--relist-interval", "1h"]).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    d.wait_for_log("following the runtime's container events", LIMIT)
        .await;

    // the runtime goes away (the stream breaks) and refuses the next calls: the daemon backs
    // off; meanwhile the container dies and the kubelet recreates it, and nobody is told
    node.cri
        .fail_next("GetContainerEvents", tonic::Code::Unavailable, 3);
    node.cri.break_event_streams();
    d.wait_for_log("container event stream broke", LIMIT).await;
    let (new_id, _) = node.recreate_unreported("web-0", "main");

    // once a stream is back, every annotated pod is looked at again
    wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "the annotation follows the new container",
        |m| m.container("main").unwrap().container_id == format!("containerd://{new_id}"),
    )
    .await;
    // and the stream is followed again (it counts as up after a quiet second)
    d.wait_for_logged_times("following the runtime's container events", 2, LIMIT)
        .await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_runtime_whose_event_stream_ends_at_once_is_relisted_and_it_is_said_once() {
    let mut node = FakeNode::start().await;
    // CRI-O without enable_pod_events: the call ends at once, status OK, no event
    node.cri.state().events_off = true;
    let mut d = start_with(&node, &["--relist-interval", "1s"]).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    d.wait_for_log("the runtime sends no container events", LIMIT)
        .await;
    let (new_id, _) = node.recreate_unreported("web-0", "main");
    wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "the relist finds the new container",
        |m| m.container("main").unwrap().container_id == format!("containerd://{new_id}"),
    )
    .await;
    // the relist ran and the daemon did not ask again and again: one call, said once
    assert_eq!(count_logged(&d, "the runtime sends no container events"), 1);
    assert_eq!(
        count_logged(&d, "following the runtime's container events"),
        0
    );
    assert_eq!(node.cri.state().call_count("GetContainerEvents"), 1);
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn the_event_stream_of_a_quiet_runtime_stays_open_and_reports_a_death_at_once() {
    let mut node = FakeNode::start().await;
    let mut d = start_with(&node, &["--relist-interval", "1h"]).await;
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    wait::pod_meta(&node.api, LIMIT, "web-0", "first annotation", |m| {
        m.containers.len() == 2
    })
    .await;
    d.wait_for_log("following the runtime's container events", LIMIT)
        .await;
    let calls = node.cri.state().call_count("GetContainerEvents");
    // the scenario, not a synchronisation: the runtime sends nothing for more than twice the
    // deadline the call once had (5 s), after which the daemon hung up, backed off, and
    // missed what died meanwhile
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        node.cri.state().call_count("GetContainerEvents"),
        calls,
        "the same call, open all along"
    );
    let (new_id, _) = node.recreate_unreported("web-0", "main");
    wait::pod_meta(
        &node.api,
        LIMIT,
        "web-0",
        "the annotation follows the new container",
        |m| m.container("main").unwrap().container_id == format!("containerd://{new_id}"),
    )
    .await;
    assert_eq!(count_logged(&d, "container event stream broke"), 0);
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
