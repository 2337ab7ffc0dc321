//! ContainerRecreateRequests end to end: the `kruised` binary against real containerd + runc
//! (the lab), the API-server double as control plane, and this test playing the kubelet (it
//! recreates the containers kruised stops) and kruise-manager (it creates the requests and
//! writes the container-status snapshot).

use crate::support;

use std::time::Duration;

use crate::support::crr::Request;
use crate::support::daemon::Daemon;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec, RunningPod};
use crate::support::restarts::HookServer;
use crate::support::wait;
use crate::support::{Lab, Plane, unique, within};
use apiserver_double::Handle;
use kruised::cri::RuntimeService;
use kruised::k8s::crd::{ContainerRecreateRequest, ContainerRecreateRequestPhase as Phase};
use kruised::k8s::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const NODE: &str = "node-crr";

struct Env {
    plane: Plane,
    kubelet: Kubelet,
    daemon: Daemon,
}

async fn env(lab: &Lab) -> Env {
    let plane = Plane::start().await;
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    kubelet.pull(&[lab.image("busybox:v1")], LIMIT).await;
    let daemon = plane.start_daemon(lab, NODE, &[], LIMIT).await;
    Env {
        plane,
        kubelet,
        daemon,
    }
}

async fn run_pod(e: &Env, lab: &Lab, containers: &[&str]) -> RunningPod {
    let name = unique("crr");
    let mut spec = PodSpec::new(
        &name,
        containers
            .iter()
            .map(|c| ContainerSpec::sleeper(c, &lab.image("busybox:v1")))
            .collect(),
    );
    spec.termination_grace_seconds = 5;
    within(LIMIT, "pod start", e.kubelet.run_pod(spec)).await
}

/// A request as kruise's webhook fills it: labels, statusContext from the pod's containers.
fn request(pod: &RunningPod, containers: &[(&str, Option<Value>)], strategy: Value) -> Value {
    let mut request = Request::new(&unique("r"), "default", NODE, &pod.spec.name, &pod.spec.uid)
        .strategy(strategy);
    for (c, pre_stop) in containers {
        let id = pod.containers.get(*c).map(|id| support::kubelet_id(id));
        request = request.container(c, id.as_deref(), pre_stop.clone());
    }
    request.json()
}

fn crr(api: &Handle, name: &str) -> ContainerRecreateRequest {
    serde_json::from_value(
        api.get("containerrecreaterequests", "default", name)
            .unwrap(),
    )
    .unwrap()
}

fn state_of(r: &ContainerRecreateRequest, c: &str) -> Option<(Phase, bool)> {
    r.status
        .as_ref()?
        .container_recreate_states
        .iter()
        .find(|s| s.name == c)
        .map(|s| (s.phase.clone(), s.is_killed))
}

/// Plays the kubelet and the manager for container `c`: once kruised has recorded its kill,
/// waits for the container to stop, recreates it, and reports it ready in the snapshot.
async fn recreate_when_killed(e: &Env, pod: &mut RunningPod, name: &str, c: &str) {
    wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        name,
        &format!("{c} killed"),
        |r| state_of(r, c).is_some_and(|(_, killed)| killed),
    )
    .await;
    // the daemon records the kill before it makes it (a crash in between must not kill twice),
    // so the kill, preStop hook first, may still be under way: wait for the container to exit
    e.kubelet.wait_exited(pod.container(c), LIMIT).await;
    let new = within(LIMIT, "recreate", e.kubelet.recreate(pod, c, None)).await;
    let mut snapshot: Vec<Value> = serde_json::from_str(
        crr(&e.plane.api, name)
            .metadata
            .annotations
            .unwrap_or_default()
            .get(keys::CRR_SYNC_CONTAINER_STATUSES)
            .map_or("[]", String::as_str),
    )
    .unwrap();
    snapshot.push(
        json!({"name": c, "ready": true, "restartCount": pod.attempts[c],
                         "containerID": support::kubelet_id(&new)}),
    );
    let text = serde_json::to_string(&snapshot).unwrap();
    e.plane
        .api
        .modify("containerrecreaterequests", "default", name, |o| {
            o["metadata"]["annotations"][keys::CRR_SYNC_CONTAINER_STATUSES] = json!(text)
        })
        .unwrap();
}

/// The runtime's state of the current container of `c`.
async fn running(e: &Env, pod: &RunningPod, c: &str) -> bool {
    e.kubelet
        .runtime()
        .container_status(pod.container(c), false)
        .await
        .unwrap()
        .state
        == kruised::cri::ContainerState::Running
}

fn completed(r: &ContainerRecreateRequest) -> bool {
    r.phase() == Phase::Completed && r.is_completed()
}

#[tokio::test]
async fn an_ordered_request_recreates_both_containers_in_order_once_each_after_the_prestop_hook() {
    let Some(lab) = Lab::get() else { return };
    let mut e = env(&lab).await;
    let hooks = HookServer::start().await;
    let mut pod = run_pod(&e, &lab, &["a", "b"]).await;
    let hook = json!({"exec": {"command": ["sh", "-c",
        format!("wget -q -O /dev/null http://127.0.0.1:{}/hook/{}/a", hooks.port, pod.spec.name)]}});
    let req = request(
        &pod,
        &[("a", Some(hook)), ("b", None)],
        // a grace that leaves the hook (an exec of wget) time on a loaded machine: the
        // containers end at once on SIGTERM, so it costs nothing when all is well
        json!({"orderedRecreate": true, "failurePolicy": "Fail", "terminationGracePeriodSeconds": 30}),
    );
    let name = req["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", req)
        .unwrap();
    wait::crr_phase(&e.plane.api, LIMIT, "default", &name, Phase::Recreating).await;

    recreate_when_killed(&e, &mut pod, &name, "a").await;
    assert_eq!(
        hooks.count(&pod.spec.name, "a"),
        1,
        "the preStop hook ran before the stop; the daemon's log:\n{}",
        e.daemon.log_text()
    );
    // ordered: b waits until a is Succeeded
    let r = wait::crr(&e.plane.api, LIMIT, "default", &name, "a succeeded", |r| {
        state_of(r, "a").is_some_and(|(p, _)| p == Phase::Succeeded)
    })
    .await;
    assert_ne!(
        state_of(&r, "b").map(|(_, k)| k),
        Some(true),
        "b not killed before a is done"
    );
    recreate_when_killed(&e, &mut pod, &name, "b").await;
    let r = wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &name,
        "Completed",
        completed,
    )
    .await;
    assert_eq!(state_of(&r, "a"), Some((Phase::Succeeded, true)));
    assert_eq!(state_of(&r, "b"), Some((Phase::Succeeded, true)));
    assert!(r.status.as_ref().unwrap().message.is_empty());
    for c in ["a", "b"] {
        assert_eq!(pod.attempts[c], 1, "{c} recreated exactly once");
        assert!(
            running(&e, &pod, c).await,
            "{c}'s new container was left running"
        );
    }
    let (_, metrics) = support::daemon::http_get(e.daemon.admin, "/metrics").await;
    assert!(
        metrics.contains(r#"kruised_recreate_requests_total{result="succeeded"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("kruised_recreate_duration_seconds_count 1"),
        "{metrics}"
    );
    e.kubelet.remove_pod(&pod).await;
    e.daemon.terminate();
    assert!(e.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_missing_container_fails_and_fail_completes_while_ignore_still_recreates_the_other() {
    let Some(lab) = Lab::get() else { return };
    let mut e = env(&lab).await;
    let mut pod = run_pod(&e, &lab, &["a"]).await;

    let req = request(
        &pod,
        &[("missing", None), ("a", None)],
        json!({"failurePolicy": "Fail"}),
    );
    let name = req["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", req)
        .unwrap();
    let r = wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &name,
        "Completed",
        completed,
    )
    .await;
    let missing = &r.status.as_ref().unwrap().container_recreate_states[0];
    assert_eq!(
        (missing.phase.clone(), missing.message.as_str()),
        (Phase::Failed, "not found container on Node")
    );
    assert_ne!(
        state_of(&r, "a").map(|(_, k)| k),
        Some(true),
        "Fail: a left alone"
    );
    assert_eq!(pod.attempts["a"], 0);

    let req = request(
        &pod,
        &[("missing", None), ("a", None)],
        json!({"failurePolicy": "Ignore"}),
    );
    let name = req["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", req)
        .unwrap();
    recreate_when_killed(&e, &mut pod, &name, "a").await;
    let r = wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &name,
        "Completed",
        completed,
    )
    .await;
    assert_eq!(state_of(&r, "missing").map(|(p, _)| p), Some(Phase::Failed));
    assert_eq!(state_of(&r, "a"), Some((Phase::Succeeded, true)));
    e.kubelet.remove_pod(&pod).await;
    e.daemon.terminate();
    assert!(e.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn two_requests_for_one_pod_run_one_after_the_other() {
    let Some(lab) = Lab::get() else { return };
    let mut e = env(&lab).await;
    let mut pod = run_pod(&e, &lab, &["a"]).await;
    let first = request(&pod, &[("a", None)], json!({}));
    let first_name = first["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", first)
        .unwrap();
    wait::crr_phase(
        &e.plane.api,
        LIMIT,
        "default",
        &first_name,
        Phase::Recreating,
    )
    .await;
    let second = request(&pod, &[("a", None)], json!({}));
    let second_name = second["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", second)
        .unwrap();
    wait::crr_phase(&e.plane.api, LIMIT, "default", &second_name, Phase::Pending).await;

    recreate_when_killed(&e, &mut pod, &first_name, "a").await;
    wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &first_name,
        "first Completed",
        completed,
    )
    .await;
    // the manager drops the active label of a completed request
    e.plane
        .api
        .modify("containerrecreaterequests", "default", &first_name, |o| {
            o["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove(keys::CRR_ACTIVE_LABEL);
        })
        .unwrap();
    // the second one's statusContext names the first container: recreated since, so it is done
    // once the snapshot shows the current container ready (as kruise decides)
    let r = wait::crr_phase(
        &e.plane.api,
        LIMIT,
        "default",
        &second_name,
        Phase::Recreating,
    )
    .await;
    assert_eq!(r.phase(), Phase::Recreating);
    e.plane
        .api
        .modify("containerrecreaterequests", "default", &second_name, |o| {
            o["metadata"]["annotations"][keys::CRR_SYNC_CONTAINER_STATUSES] = json!(
                serde_json::to_string(&json!([{"name": "a", "ready": true, "restartCount": 1,
                    "containerID": support::kubelet_id(pod.container("a"))}]))
                .unwrap()
            )
        })
        .unwrap();
    wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &second_name,
        "second Completed",
        completed,
    )
    .await;
    assert_eq!(pod.attempts["a"], 1);
    e.kubelet.remove_pod(&pod).await;
    e.daemon.terminate();
    assert!(e.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn a_daemon_killed_in_the_middle_of_a_request_never_kills_a_container_twice() {
    let Some(lab) = Lab::get() else { return };
    let mut e = env(&lab).await;
    let mut pod = run_pod(&e, &lab, &["a", "b"]).await;
    let req = request(
        &pod,
        &[("a", None), ("b", None)],
        json!({"orderedRecreate": true}),
    );
    let name = req["metadata"]["name"].as_str().unwrap().to_string();
    e.plane
        .api
        .create("containerrecreaterequests", req)
        .unwrap();
    e.daemon
        .wait_for_log("stopping container for the recreate request", LIMIT)
        .await;
    // SIGKILL right after the stop of a began: no drain, no last write. Whether the stop
    // reached the runtime is up to chance: if not, the next daemon finds a still running with
    // its old ID and stops it; if it did, a is gone and the next daemon must not stop it again
    e.daemon.kill();
    e.daemon.wait_exit(LIMIT).await;
    let mut again = e.plane.start_daemon(&lab, NODE, &[], LIMIT).await;
    recreate_when_killed(&e, &mut pod, &name, "a").await;
    recreate_when_killed(&e, &mut pod, &name, "b").await;
    let r = wait::crr(
        &e.plane.api,
        LIMIT,
        "default",
        &name,
        "Completed",
        completed,
    )
    .await;
    assert_eq!(state_of(&r, "a"), Some((Phase::Succeeded, true)));
    assert_eq!(state_of(&r, "b"), Some((Phase::Succeeded, true)));
    for c in ["a", "b"] {
        assert_eq!(
            pod.attempts[c], 1,
            "{c} recreated exactly once across the restart"
        );
        assert!(
            running(&e, &pod, c).await,
            "{c}'s new container was not stopped again"
        );
    }
    e.kubelet.remove_pod(&pod).await;
    again.terminate();
    assert!(again.wait_exit(LIMIT).await.success());
}
