//! Faults of the API server: the `kruised` binary against the API-server double and the fake
//! runtime while the double drops every watch and answers 410, 409, 429 and 500 at random, over
//! 1,000 randomised annotation changes on a node of 100 pods (the test plays the kubelet: it
//! recreates every container the daemon stops, with env resolved from the pod's metadata then).
//!
//! What must hold whatever the faults: no env-from-metadata change is missed (every change ends
//! with the container running the new value and the pod's `runtime-containers-meta` naming that
//! container), no container is stopped twice, and no annotation another writer put on a pod is
//! lost to the daemon's writes.
//!
//! Randomised: `KRUISED_FAULTS_SEED=<u64>` replays a run's choices (the seed is printed at the
//! start and on failure); `KRUISED_FAULTS_CHANGES` sets the number of changes (default 1000),
//! `KRUISED_FAULTS_RATE` the chance of a fault before each change (default 0.3; 0 gives the
//! figures without faults).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use crate::support::node::{FakeNode, NODE};
use crate::support::wait::{self, meta_of};
use apiserver_double::Fault;
use kruised::cri::ContainerState;
use kruised::hash::env::expected_env_hash;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// Bound of one change's convergence. Faults include 429s with `Retry-After: 1` and watch
/// restarts with backoff, and the hundred drivers inject them for every pod at once, so one
/// pod's annotation write can meet a fault on several tries in a row; the daemon's pause before
/// a pod's retry doubles from 3 s up to `RETRY_DELAY_LIMIT` (a minute), so five failures in a
/// row wait 3 + 6 + 12 + 24 + 48 s. Three of those minutes: a missed change never converges and
/// still fails here, and a schedule the daemon legitimately follows does not (CI saw a change
/// take over the former 60 s on a loaded machine; the earlier local case: writes retried every
/// 9-17 s into injected 409s).
const CHANGE_LIMIT: Duration =
    Duration::from_secs(3 * kruised::controller::queue::RETRY_DELAY_LIMIT.as_secs());
const PODS: usize = 100;
const WRITER: &str = "writer.example.com";

/// The seed of this run, printed when the test fails.
struct Seed(u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "faults_api FAILED with KRUISED_FAULTS_SEED={} (set it to replay the same choices)",
                self.0
            );
        }
    }
}

fn seed() -> Seed {
    let seed = std::env::var("KRUISED_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("faults_api: KRUISED_FAULTS_SEED={seed}");
    Seed(seed)
}

fn containers() -> Value {
    json!([
        {"name": "main", "image": "busybox:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
        {"name": "side", "image": "busybox:v1"}
    ])
}

/// The current container IDs of every pod, as the kubelet (this test) knows them.
type Current = Arc<Mutex<BTreeMap<(String, String), String>>>;

fn id_of(status: &Value, container: &str) -> String {
    status["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == container)
        .unwrap()["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

/// Plays the kubelet: whenever a current container has exited, recreates it from the pod's
/// current spec and metadata.
async fn kubelet(node: Arc<FakeNode>, current: Current, stop: tokio_util::sync::CancellationToken) {
    loop {
        let mut exited = Vec::new();
        let waited = node.cri.wait_for(Duration::from_secs(3600), |s| {
            exited = current
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, id)| {
                    s.containers
                        .get(*id)
                        .is_some_and(|c| c.status.state != ContainerState::Running)
                })
                .map(|(k, _)| k.clone())
                .collect();
            !exited.is_empty() || stop.is_cancelled()
        });
        tokio::select! {
            _ = waited => {}
            () = stop.cancelled() => return,
        }
        if stop.is_cancelled() {
            return;
        }
        for (pod, c) in exited {
            let id = node.recreate(&pod, &c);
            current.lock().unwrap().insert((pod, c), id);
        }
    }
}

/// One fault, chosen at random: a dropped watch, or the next 1-3 requests of a random verb and
/// resource answered with 410, 409, 429 or 500. A new fault replaces the one still pending, so
/// failures come in bursts of at most 3 (unconsumed rules piling up would fail every retry of a
/// watch for minutes: the daemon's backoff, like client-go's, grows to 30 s then, by design).
fn inject(node: &FakeNode, rng: &mut StdRng, counts: &Mutex<BTreeMap<String, usize>>) {
    node.api.clear_faults();
    let kind = if rng.random_bool(0.25) {
        node.api.drop_watches();
        "drop-watches".to_string()
    } else {
        let code = [410u16, 409, 429, 500][rng.random_range(0..4)];
        // requests the daemon makes
        let (verb, resource) = match code {
            // Gone: what a watch or list from a compacted resourceVersion gets
            410 => (
                ["watch", "list"][rng.random_range(0..2)],
                ["pods", "nodeimages", "containerrecreaterequests"][rng.random_range(0..3)],
            ),
            // Conflict: what its annotation write gets
            409 => ("patch", "pods/status"),
            _ => [
                ("patch", "pods/status"),
                ("watch", "pods"),
                ("list", "pods"),
                ("create", "events"),
                ("patch", "events"),
                ("watch", "nodeimages"),
                ("watch", "containerrecreaterequests"),
            ][rng.random_range(0..7)],
        };
        node.api.add_fault(Fault {
            count: rng.random_range(1..=3),
            code,
            verb: Some(verb.to_string()),
            resource: Some(resource.to_string()),
            ..Fault::default()
        });
        format!("{code} {verb} {resource}")
    };
    *counts.lock().unwrap().entry(kind).or_default() += 1;
}

/// Whether pod `pod`'s main container runs with `ROLE=role` and the pod's annotation names it.
fn converged(node: &FakeNode, current: &Current, pod: &str, role: &str, obj: &Value) -> bool {
    let Some(id) = current
        .lock()
        .unwrap()
        .get(&(pod.to_string(), "main".to_string()))
        .cloned()
    else {
        return false;
    };
    let runs_role = node.cri.state().containers.get(&id).is_some_and(|c| {
        c.status.state == ContainerState::Running && c.env.contains(&format!("ROLE={role}"))
    });
    runs_role
        && meta_of(obj).is_some_and(|m| {
            m.container("main")
                .is_some_and(|c| c.container_id == format!("containerd://{id}"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_env_change_missed_no_double_stop_no_foreign_annotation_lost_under_api_faults() {
    let seed = seed();
    let changes: usize = std::env::var("KRUISED_FAULTS_CHANGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let rate: f64 = std::env::var("KRUISED_FAULTS_RATE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.3);
    let mut node = FakeNode::start().await;
    let current: Current = Arc::default();
    for p in 0..PODS {
        let name = format!("web-{p}");
        // InPlaceUpdateReady False throughout: every env change is due at once
        let pod = node.add_pod(&name, containers(), json!({"role": "r0"}), false);
        let v = serde_json::to_value(&pod).unwrap();
        for c in ["main", "side"] {
            current
                .lock()
                .unwrap()
                .insert((name.clone(), c.to_string()), id_of(&v, c));
        }
    }
    let mut args = node.daemon_args();
    // 1,000 changes make ~1,100 writes (annotations, events) in about a minute: past the default
    // client-side limit of 20 requests/s, which would make this a test of the rate limiter
    args.extend(["--rest-config-qps", "500", "--rest-config-burst", "500"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", CHANGE_LIMIT).await;

    let node = Arc::new(node);
    let stop = tokio_util::sync::CancellationToken::new();
    let kubelet_task = tokio::spawn(kubelet(node.clone(), current.clone(), stop.clone()));
    let faults = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let started = Instant::now();

    // one driver per pod, each with its own share of the changes and its own random stream
    let mut drivers = Vec::new();
    for p in 0..PODS {
        let (node, current, faults) = (node.clone(), current.clone(), faults.clone());
        let share = changes / PODS + usize::from(p < changes % PODS);
        let mut rng =
            StdRng::seed_from_u64(seed.0 ^ (p as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        drivers.push(tokio::spawn(async move {
            let pod = format!("web-{p}");
            let mut role = "r0".to_string();
            let mut written = BTreeMap::<String, String>::new();
            let mut env_changes = 0usize;
            let mut waits = Vec::new();
            for i in 0..share {
                if rng.random_bool(rate) {
                    inject(&node, &mut rng, &faults);
                }
                match rng.random_range(0..10) {
                    // an env-from-metadata change, as an in-place update makes it
                    0..5 => {
                        role = format!("r{p}-{i}");
                        let r = role.clone();
                        node.api
                            .modify("pods", "default", &pod, |o| {
                                o["metadata"]["annotations"]["role"] = json!(r)
                            })
                            .unwrap();
                        env_changes += 1;
                        let t = Instant::now();
                        let (n, c, r) = (node.clone(), current.clone(), role.clone());
                        let ok = node
                            .api
                            .wait_for(CHANGE_LIMIT, |v| {
                                v.get("pods", "default", &pod)
                                    .is_some_and(|o| converged(&n, &c, &pod, &r, &o))
                            })
                            .await;
                        if ok.is_err() {
                            // the kubelet's recreate does not write the store when the daemon
                            // has nothing to do: check once more before failing
                            let o = node.api.get("pods", "default", &pod).unwrap();
                            assert!(
                                converged(&node, &current, &pod, &role, &o),
                                "{pod}: env change to {role} missed; pod now {o:#}"
                            );
                        }
                        waits.push(t.elapsed());
                    }
                    // another writer's annotation: a new key, or a new value of an old one
                    5..9 => {
                        let key = if written.is_empty() || rng.random_bool(0.5) {
                            format!("{WRITER}/k{i}")
                        } else {
                            let n = rng.random_range(0..written.len());
                            written.keys().nth(n).unwrap().clone()
                        };
                        let value = format!("v{i}");
                        let (k, v) = (key.clone(), value.clone());
                        node.api
                            .modify("pods", "default", &pod, |o| {
                                o["metadata"]["annotations"][&k] = json!(v)
                            })
                            .unwrap();
                        written.insert(key, value);
                    }
                    // a label nobody's env reads
                    _ => {
                        node.api
                            .modify("pods", "default", &pod, |o| {
                                o["metadata"]["labels"]["touched"] = json!(format!("{i}"))
                            })
                            .unwrap();
                    }
                }
            }
            (pod, role, written, env_changes, waits)
        }));
    }
    let mut results = Vec::new();
    for t in drivers {
        match t.await {
            Ok(r) => results.push(r),
            Err(e) => {
                // for the diagnosis: what the daemon logged of the pod the driver failed on (its
                // message starts with the pod's name), its warnings, and the faults so far
                let panic = e.into_panic();
                let message = panic
                    .downcast_ref::<String>()
                    .map_or("", String::as_str)
                    .to_string();
                let pod = message.split(':').next().unwrap_or_default();
                for line in d.log() {
                    let text = line.to_string();
                    if text.contains(&format!("{pod}\""))
                        || line["level"] == "WARN"
                        || line["level"] == "ERROR"
                    {
                        eprintln!("daemon: {text}");
                    }
                }
                eprintln!("faults injected: {:?}", faults.lock().unwrap());
                std::panic::resume_unwind(panic);
            }
        }
    }
    let elapsed = started.elapsed();
    // the faults still pending must not hide a lost write: clear them and let the daemon settle
    node.api.clear_faults();
    let mut all_waits = Vec::new();
    let mut env_total = 0;
    for (pod, role, written, env_changes, waits) in &results {
        let o = node.api.get("pods", "default", pod).unwrap();
        assert!(
            converged(&node, &current, pod, role, &o),
            "{pod}: final role {role} not running; pod {o:#}"
        );
        for (k, v) in written {
            assert_eq!(
                o["metadata"]["annotations"][k].as_str(),
                Some(v.as_str()),
                "{pod}: annotation {k} of another writer lost; annotations now {:#}",
                o["metadata"]["annotations"]
            );
        }
        // the env hash the daemon reports is the one of the env the container really runs
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(o.clone()).unwrap();
        let spec = &p.spec.as_ref().unwrap().containers[0];
        let want = expected_env_hash(
            spec,
            &p.metadata.labels.clone().unwrap_or_default(),
            &p.metadata.annotations.clone().unwrap_or_default(),
        );
        let meta = meta_of(&o).unwrap();
        assert_eq!(
            meta.container("main")
                .unwrap()
                .hashes
                .extracted_env_from_metadata_hash,
            want,
            "{pod}: annotation's env hash"
        );
        all_waits.extend(waits.iter().copied());
        env_total += env_changes;
    }
    let stops = node.stopped_ids();
    let distinct: BTreeSet<&String> = stops.iter().collect();
    assert_eq!(
        distinct.len(),
        stops.len(),
        "a container was stopped twice: {stops:?}"
    );
    assert!(
        stops.len() <= env_total,
        "{} stops for {env_total} env changes",
        stops.len()
    );
    assert!(d.running(), "kruised is still running");
    stop.cancel();
    kubelet_task.await.unwrap();

    all_waits.sort();
    let pct = |q: f64| all_waits[((all_waits.len() as f64 - 1.0) * q) as usize];
    let faults = faults.lock().unwrap().clone();
    eprintln!(
        "faults_api: seed {}, {changes} changes ({env_total} env, {} stops) in {elapsed:.1?}; \
         env change to container running it and annotated: p50 {:?}, p90 {:?}, max {:?}; \
         {} faults injected: {faults:?}; API requests {:?}",
        seed.0,
        stops.len(),
        pct(0.5),
        pct(0.9),
        pct(1.0),
        faults.values().sum::<usize>(),
        node.api.request_counts()
    );
    d.terminate();
    assert!(d.wait_exit(Duration::from_secs(20)).await.success());
}

// the 5-minute outage test failed in CI on 9805b61: three pods whose annotation write failed
// (it fell in the outage) were retried every 3 s, 273 writes while the API server was away
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_annotation_write_failing_three_times_in_a_row_waits_12_seconds_before_the_fourth() {
    let mut node = FakeNode::start().await;
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", CHANGE_LIMIT).await;
    node.api.add_fault(Fault {
        count: 3,
        code: 500,
        verb: Some("patch".into()),
        resource: Some("pods/status".into()),
        ..Fault::default()
    });
    node.add_pod("web-0", containers(), json!({"role": "blue"}), true);
    let mut tries = Vec::new();
    for n in 1..=4 {
        node.api
            .wait_for_requests(CHANGE_LIMIT, |log| log.count("patch", "pods/status") >= n)
            .await
            .unwrap_or_else(|_| panic!("annotation write {n} never came; log:\n{}", d.log_text()));
        tries.push(Instant::now());
    }
    let annotated = wait::try_meta(
        &node.api,
        CHANGE_LIMIT,
        "default",
        "web-0",
        "the annotation",
        |m| m.containers.len() == 2,
    )
    .await
    .ok();
    assert!(
        annotated.is_some(),
        "the fourth write did not land; log:\n{}",
        d.log_text()
    );
    let gaps: Vec<f64> = tries
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect();
    eprintln!("annotation writes failing three times: retried after {gaps:.1?} s");
    // the third failure in a row waits 12 s (3 s doubled twice): a write that lands must have
    // waited that long after it (the test sees each write a little late: 0.5 s slack). The
    // pauses before may be shorter: the pod's own events (its status written by the kubelet)
    // start a pass at once, as client-go's queue does, and those count as failures too.
    let last = gaps.last().copied().unwrap_or_default();
    assert!(
        last >= 11.5,
        "retried after {gaps:.1?} s: the third failure in a row did not wait 12 s; log:\n{}",
        d.log_text()
    );
    d.terminate();
    assert!(d.wait_exit(CHANGE_LIMIT).await.success());
}
