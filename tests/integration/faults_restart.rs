//! kruised killed with SIGKILL at random points of a ContainerRecreateRequest and of an image
//! pull, and started again: no container is killed twice, and the request's and the NodeImage's
//! status converge to what they would have been without the crash. The `kruised` binary against
//! the API-server double and the fake runtime; the test plays the kubelet (it recreates what the
//! daemon stops) and kruise-manager (it creates the requests and reports the recreated
//! containers ready).
//!
//! Randomised: the kill point of each round is one of the request's or pull's milestones (a log
//! line or a runtime call), optionally followed by a random extra delay that moves the kill
//! between milestones (the delay picks where to kill; it synchronises nothing). The fake
//! runtime's preStop hooks and pulls take a random time too. `KRUISED_FAULTS_SEED=<u64>` replays
//! a run's choices (printed at the start and on failure); `KRUISED_FAULTS_ROUNDS` sets the rounds
//! per test (default 8).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use crate::support::node::{FakeNode, NODE};
use kruised::cri::ContainerState;
use kruised::k8s::crd::{
    ContainerRecreateRequest, ContainerRecreateRequestPhase as Phase, ImagePullPhase,
    NodeImageStatus,
};
use kruised::k8s::keys;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);

struct Seed(u64, &'static str);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{} FAILED with KRUISED_FAULTS_SEED={} (set it to replay the same choices)",
                self.1, self.0
            );
        }
    }
}

fn seed(test: &'static str) -> Seed {
    let seed = std::env::var("KRUISED_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: KRUISED_FAULTS_SEED={seed}");
    Seed(seed, test)
}

fn rounds() -> usize {
    std::env::var("KRUISED_FAULTS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
}

async fn start(node: &FakeNode) -> Daemon {
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// SIGKILL, and wait until the process is gone.
async fn kill(d: &mut Daemon) {
    d.kill();
    d.wait_exit(LIMIT).await;
}

/// Moves the kill point by a random 0-80 ms, half of the time.
async fn jitter(rng: &mut StdRng) -> Option<Duration> {
    if rng.random_bool(0.5) {
        let d = Duration::from_millis(rng.random_range(0..80));
        tokio::time::sleep(d).await;
        Some(d)
    } else {
        None
    }
}

fn is_request_line(v: &Value, request: &str, message: &str) -> bool {
    v["request"] == request && v["message"].as_str().is_some_and(|m| m.contains(message))
}

fn crr(node: &FakeNode, name: &str) -> ContainerRecreateRequest {
    serde_json::from_value(
        node.api
            .get("containerrecreaterequests", "default", name)
            .unwrap(),
    )
    .unwrap()
}

fn current_id(node: &FakeNode, pod: &str, c: &str) -> String {
    let p = node.api.get("pods", "default", pod).unwrap();
    p["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == c)
        .unwrap()["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

/// The kubelet and the manager for one pod: recreates each of `containers` that is no longer
/// running, and reports the recreated ones ready in the request's snapshot annotation (as
/// kruise-manager does). Returns whether anything was recreated.
fn kubelet_and_manager(node: &FakeNode, pod: &str, request: &str, containers: &[&str]) -> bool {
    let mut any = false;
    for c in containers {
        let id = current_id(node, pod, c);
        let running = node
            .cri
            .state()
            .containers
            .get(&id)
            .is_some_and(|x| x.status.state == ContainerState::Running);
        if !running {
            node.recreate(pod, c);
            any = true;
        }
    }
    if any {
        let p = node.api.get("pods", "default", pod).unwrap();
        let snapshot: Vec<Value> = p["status"]["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                json!({"name": s["name"], "ready": true, "restartCount": s["restartCount"],
                       "containerID": s["containerID"]})
            })
            .collect();
        let text = serde_json::to_string(&snapshot).unwrap();
        node.api
            .modify("containerrecreaterequests", "default", request, |o| {
                o["metadata"]["annotations"][keys::CRR_SYNC_CONTAINER_STATUSES] = json!(text)
            })
            .unwrap();
    }
    any
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreate_request_killed_anywhere_kills_each_container_once_and_completes() {
    let seed = seed("recreate-kill");
    let mut rng = StdRng::seed_from_u64(seed.0);
    let mut node = FakeNode::start().await;
    let mut d = start(&node).await;
    let mut points = BTreeMap::<String, usize>::new();
    let mut unmarked = 0;
    let started = Instant::now();
    for round in 0..rounds() {
        let pod = format!("web-{round}");
        let two = rng.random_bool(0.5);
        let names: Vec<&str> = if two { vec!["a", "b"] } else { vec!["a"] };
        let containers: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "image": "busybox:v1"}))
            .collect();
        node.add_pod(&pod, json!(containers), json!({}), true);
        let p = node.api.get("pods", "default", &pod).unwrap();
        let original: BTreeMap<&str, String> = names
            .iter()
            .map(|c| (*c, current_id(&node, &pod, c)))
            .collect();
        // a preStop hook that takes a random time, on a random half of the requests
        let hook_time = Duration::from_millis(rng.random_range(0..150));
        let with_hook = rng.random_bool(0.5);
        node.cri.delay("ExecSync", hook_time);
        let spec_containers: Vec<Value> = names
            .iter()
            .map(|c| {
                let mut v = json!({"name": c, "statusContext": {
                    "containerID": format!("containerd://{}", original[c]), "restartCount": 0}});
                if with_hook {
                    v["preStop"] = json!({"exec": {"command": ["sleep", "1"]}});
                }
                v
            })
            .collect();
        let request = format!("r-{round}");
        node.api
            .create(
                "containerrecreaterequests",
                json!({
                    "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                    "metadata": {"name": request, "namespace": "default", "labels": {
                        keys::CRR_NODE_NAME_LABEL: NODE, keys::CRR_ACTIVE_LABEL: "true",
                        keys::CRR_POD_UID_LABEL: p["metadata"]["uid"]}},
                    "spec": {"podName": pod, "containers": spec_containers,
                             "strategy": {"orderedRecreate": rng.random_bool(0.5),
                                          "terminationGracePeriodSeconds": 30}}
                }),
            )
            .unwrap();

        // the kill point
        let point = rng.random_range(0..4);
        let what = match point {
            0 => "at once".to_string(),
            1 => {
                d.wait_for_line("recreating", LIMIT, |v| {
                    is_request_line(v, &request, "recreating")
                })
                .await;
                "phase Recreating".to_string()
            }
            2 => {
                d.wait_for_line("the stop", LIMIT, |v| {
                    is_request_line(v, &request, "stopping container for the recreate request")
                })
                .await;
                "kill begun".to_string()
            }
            _ => {
                let first = original[names[0]].clone();
                node.cri
                    .wait_for(LIMIT, |s| s.stops.iter().any(|(id, _)| *id == first))
                    .await
                    .expect("the first container is stopped");
                "first StopContainer".to_string()
            }
        };
        let extra = jitter(&mut rng).await;
        *points.entry(what.clone()).or_default() += 1;
        kill(&mut d).await;
        // the kubelet may recreate what was stopped before or after the daemon is back
        let kubelet_first = rng.random_bool(0.5);
        if kubelet_first {
            kubelet_and_manager(&node, &pod, &request, &names);
        }
        // the containers the killed daemon had stopped: its isKilled write may have died with it
        let stopped_before_restart = node.stopped_ids();
        d = start(&node).await;
        // play the kubelet and the manager until the request completes
        let deadline = Instant::now() + LIMIT;
        loop {
            // what the daemon did so far: a later stop or write wakes the wait below
            let stops = node.cri.state().stops.len();
            let rv = node.api.resource_version();
            let done = crr(&node, &request).is_completed();
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round} (kill {what}, +{extra:?}, kubelet first {kubelet_first}): request \
                 not completed; now {:#?}",
                crr(&node, &request)
            );
            if !kubelet_and_manager(&node, &pod, &request, &names) {
                // wait for the next move of the daemon: a stop or a status write
                tokio::select! {
                    _ = node.cri.wait_for(LIMIT, |s| s.stops.len() > stops) => {}
                    _ = node.api.wait_for(LIMIT, |v| v.resource_version() > rv) => {}
                }
            }
        }
        let r = crr(&node, &request);
        let states = &r.status.as_ref().unwrap().container_recreate_states;
        let stops = node.stopped_ids();
        for c in &names {
            let s = states.iter().find(|s| s.name == *c).unwrap();
            assert_eq!(
                s.phase,
                Phase::Succeeded,
                "round {round} (kill {what}): {c} {s:?}"
            );
            // isKilled lives only in the status: a daemon killed between StopContainer and that
            // write, which comes back to find the container already recreated and reported ready,
            // sees Succeeded at once and never marks it (kruise-daemon decides the same way). The
            // kubelet may recreate it before the daemon is back (kubelet first) or while it starts
            // (the loop above plays the kubelet at once). A container the restarted daemon stopped
            // itself is always marked.
            assert!(
                s.is_killed || stopped_before_restart.contains(&original[c]),
                "round {round} (kill {what}, kubelet first {kubelet_first}): {c} {s:?}"
            );
            if !s.is_killed {
                unmarked += 1;
            }
            let times = stops.iter().filter(|id| **id == original[c]).count();
            assert_eq!(
                times, 1,
                "round {round} (kill {what}, +{extra:?}, kubelet first {kubelet_first}): {c} \
                 stopped {times} times"
            );
            let now = current_id(&node, &pod, c);
            assert!(
                !stops.contains(&now),
                "round {round}: the recreated {c} was stopped too"
            );
        }
        assert_eq!(r.phase(), Phase::Completed);
        // the manager ends it: the daemon's watch no longer selects it
        node.api
            .modify("containerrecreaterequests", "default", &request, |o| {
                o["metadata"]["labels"]
                    .as_object_mut()
                    .unwrap()
                    .remove(keys::CRR_ACTIVE_LABEL);
            })
            .unwrap();
    }
    eprintln!(
        "recreate-kill: seed {}, {} rounds in {:.1?}, kill points {points:?}, {unmarked} \
         containers recreated before the restarted daemon saw them (Succeeded, isKilled unset)",
        seed.0,
        rounds(),
        started.elapsed()
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

fn status(node: &FakeNode) -> Option<NodeImageStatus> {
    let o = node.api.get("nodeimages", "", NODE)?;
    serde_json::from_value(o.get("status")?.clone()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_killed_anywhere_converges_to_succeeded_and_finished_pulls_are_not_repeated() {
    let seed = seed("pull-kill");
    let mut rng = StdRng::seed_from_u64(seed.0);
    let node = FakeNode::start().await;
    node.api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
                   "metadata": {"name": NODE}, "spec": {"images": {}}}),
        )
        .unwrap();
    let mut d = start(&node).await;
    let mut points = BTreeMap::<String, usize>::new();
    let started = Instant::now();
    let pulls_of = |node: &FakeNode, image: &str| {
        node.cri
            .state()
            .pulls
            .iter()
            .filter(|p| p.image.starts_with(image))
            .count()
    };
    for round in 0..rounds() {
        let image = format!("registry.example.com/app{round:02}");
        node.cri.delay(
            "PullImage.body",
            Duration::from_millis(rng.random_range(0..200)),
        );
        let before: Vec<usize> = (0..round)
            .map(|r| pulls_of(&node, &format!("registry.example.com/app{r:02}:")))
            .collect();
        let img = image.clone();
        node.api
            .modify("nodeimages", "", NODE, |o| {
                o["spec"]["images"][&img] =
                    json!({"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 3}}]})
            })
            .unwrap();
        let tagged = format!("{image}:v1");
        let point = rng.random_range(0..4);
        let what = match point {
            0 => "at once",
            1 => {
                let t = tagged.clone();
                node.cri
                    .wait_for(LIMIT, |s| s.pulls.iter().any(|p| p.image == t))
                    .await
                    .expect("the pull starts");
                "PullImage in flight"
            }
            2 => {
                d.wait_for_line("pulled", LIMIT, |v| {
                    v["message"] == "pulled" && v.to_string().contains(&image)
                })
                .await;
                "pulled, status not yet written"
            }
            _ => {
                let img = image.clone();
                node.api
                    .wait_for(LIMIT, |v| {
                        v.get("nodeimages", "", NODE).is_some_and(|o| {
                            o["status"]["imageStatuses"][&img]["tags"][0]["phase"] == "Succeeded"
                        })
                    })
                    .await
                    .expect("Succeeded written");
                "status written"
            }
        };
        let extra = jitter(&mut rng).await;
        *points.entry(what.to_string()).or_default() += 1;
        kill(&mut d).await;
        d = start(&node).await;
        let img = image.clone();
        let want = round + 1;
        let ok = node
            .api
            .wait_for(LIMIT, |v| {
                let Some(o) = v.get("nodeimages", "", NODE) else {
                    return false;
                };
                let Ok(s) = serde_json::from_value::<NodeImageStatus>(o["status"].clone()) else {
                    return false;
                };
                s.succeeded == i32::try_from(want).unwrap()
                    && s.desired == s.succeeded
                    && s.image_statuses.get(&img).is_some_and(|i| {
                        i.tags.first().is_some_and(|t| {
                            t.phase == ImagePullPhase::Succeeded && !t.image_id.is_empty()
                        })
                    })
            })
            .await;
        assert!(
            ok.is_ok(),
            "round {round} (kill {what}, +{extra:?}): status did not converge: {:#?}",
            status(&node)
        );
        let s = status(&node).unwrap();
        assert_eq!(
            (s.desired, s.succeeded, s.failed, s.pulling, s.waiting),
            (
                i32::try_from(want).unwrap(),
                i32::try_from(want).unwrap(),
                0,
                0,
                0
            ),
            "round {round}: counters"
        );
        for (r, n) in before.iter().enumerate() {
            assert_eq!(
                pulls_of(&node, &format!("registry.example.com/app{r:02}:")),
                *n,
                "round {round}: app{r}, finished before the crash, was pulled again"
            );
        }
        assert!(pulls_of(&node, &format!("{image}:")) >= 1);
    }
    eprintln!(
        "pull-kill: seed {}, {} rounds in {:.1?}, kill points {points:?}, PullImage calls {}",
        seed.0,
        rounds(),
        started.elapsed(),
        node.cri.state().pulls.len()
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
