//! The lab's runtime killed (SIGKILL) and started again 10 times while kruised has work in
//! every capability: an image pull (a NodeImage version bump), an env-from-metadata restart, a
//! ContainerRecreateRequest and an exec probe. The `kruised` binary against the lab's real
//! runtime (containerd 1.6, containerd 2.3 or CRI-O) + runc, the API-server double as control
//! plane, and this test as the kubelet and kruise-manager. And a container that dies while the
//! runtime is down.
//!
//! What must hold: kruised never exits, and every piece of work issued around each crash ends in
//! its right state (the pull Succeeded at the new version, the container running the new env
//! value and annotated, the request Completed with its container recreated once, the probe
//! reporting the state the container is in now). The time from the runtime answering again to
//! each piece of work being done is printed as a measured figure (the goal is within 1 s); it is
//! not asserted.
//!
//! Randomised: the crash comes a random 0-400 ms after the work is issued.
//! `KRUISED_FAULTS_SEED=<u64>` replays the choices (printed at the start and on failure),
//! `KRUISED_FAULTS_CYCLES` sets the number of crashes (default 10).

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::daemon::Daemon;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec, RunningPod, status};
use crate::support::wait::meta_of;
use crate::support::{Lab, Plane, unique, within};
use apiserver_double::Handle;
use k8s_openapi::api::core::v1::Pod;
use kruised::cri::{ContainerState, ContainerStatus, ImageService, RuntimeService};
use kruised::k8s::crd::{ContainerRecreateRequest, NodePodProbe, ProbeState};
use kruised::k8s::keys;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const NODE: &str = "node-faults";

use super::RUNTIME;

struct Seed(u64);

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "e2e_faults runtime_crashes FAILED with KRUISED_FAULTS_SEED={} (set it to replay)",
                self.0
            );
        }
    }
}

/// A CRI call of the test's kubelet, retried while the runtime is away (the real kubelet's
/// sync loop retries the same way).
macro_rules! cri {
    ($what:expr, $call:expr) => {{
        let deadline = Instant::now() + LIMIT;
        loop {
            match $call.await {
                Ok(v) => break v,
                // a retry pause, as the kubelet's own; it waits for nothing in particular
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("{}: {e}", $what),
            }
        }
    }};
}

fn pod_of(api: &Handle, name: &str) -> Pod {
    serde_json::from_value(api.get("pods", "default", name).unwrap()).unwrap()
}

fn report(api: &Handle, name: &str, running: &RunningPod) {
    api.modify("pods", "default", name, |p| {
        p["status"] = json!({"phase": "Running",
            "conditions": [{"type": keys::INPLACE_UPDATE_READY, "status": "False"}]});
        status::set_containers(p, &running.reports());
    })
    .unwrap();
}

/// The daemon's last `n` log lines, for a failure's message.
fn last_lines(d: &Daemon, n: usize) -> String {
    let log = d.log();
    log[log.len().saturating_sub(n)..]
        .iter()
        .map(|v| format!("  {v}\n"))
        .collect()
}

async fn running(kubelet: &Kubelet, id: &str) -> bool {
    cri!(
        "container status",
        kubelet.runtime().container_status(id, false)
    )
    .state
        == ContainerState::Running
}

/// Whether the runtime reports `id` running though its process is gone. containerd (1.6, and 2.x
/// before #11579) can lose a container's exit when it is killed while handling it: after the
/// restart the container stays running for good and every `StopContainer` on it times out
/// (containerd #12600). The kubelet would wait on it as long; an operator restarts the runtime,
/// which then reads the exit from the shim.
async fn running_without_its_process(kubelet: &Kubelet, id: &str) -> bool {
    let status = cri!(
        "container status",
        kubelet.runtime().container_status(id, true)
    );
    let Some(pid) = pid_of(&status) else {
        return false;
    };
    // gone, or a zombie nobody reaped
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    });
    status.state == ContainerState::Running && !alive
}

/// How long after the runtime answered again a container it still reports running without its
/// process is taken for the runtime's lost exit: a request is done within about a second, and a
/// `StopContainer` gives up after the grace period and 7 s.
const LOST_EXIT_AFTER: Duration = Duration::from_secs(15);

fn crr(api: &Handle, name: &str) -> ContainerRecreateRequest {
    serde_json::from_value(
        api.get("containerrecreaterequests", "default", name)
            .unwrap(),
    )
    .unwrap()
}

fn probe_state(api: &Handle, uid: &str) -> Option<(ProbeState, Option<String>)> {
    let npp: NodePodProbe = serde_json::from_value(api.get("nodepodprobes", "", NODE)?).ok()?;
    let s = npp.status?.probe_state(uid, "main#ready")?.clone();
    Some((s.state, s.last_probe_time.map(|t| t.0.to_string())))
}

#[derive(Default)]
struct Figures(BTreeMap<&'static str, Vec<Duration>>);

impl Figures {
    fn add(&mut self, what: &'static str, d: Duration) {
        self.0.entry(what).or_default().push(d);
    }

    fn print(&self) {
        for (what, v) in &self.0 {
            let mut v = v.clone();
            v.sort();
            eprintln!(
                "runtime_crashes: {what}: done after the runtime answered again: \
                 median {:?}, max {:?}, all {:?}",
                v[v.len() / 2],
                v[v.len() - 1],
                v
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_killed_ten_times_during_pulls_restarts_recreates_and_probes() {
    let Some(lab) = Lab::get() else { return };
    let _alone = RUNTIME.lock().await;
    let seed = Seed(
        std::env::var("KRUISED_FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random),
    );
    eprintln!("runtime_crashes: KRUISED_FAULTS_SEED={}", seed.0);
    let cycles: u32 = std::env::var("KRUISED_FAULTS_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let mut rng = StdRng::seed_from_u64(seed.0);

    let plane = Plane::start().await;
    let api = &plane.api;
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    let image = lab.image("busybox:v1");
    kubelet.pull(std::slice::from_ref(&image), LIMIT).await;

    // pod `env`: a kruise-managed pod whose container reads an annotation, in an in-place update
    let env_name = unique("env");
    let created = api
        .create(
            "pods",
            json!({
                "metadata": {"name": env_name, "namespace": "default",
                    "annotations": {"role": "r0"},
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                         "name": "demo", "uid": "cs-1", "controller": true}]},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 2, "containers": [
                    {"name": "main", "image": image,
                     "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]}
                ]}
            }),
        )
        .unwrap();
    let pod: Pod = serde_json::from_value(created).unwrap();
    let mut spec = PodSpec::new(&env_name, vec![ContainerSpec::of_pod(&pod, "main")]);
    spec.uid = pod.metadata.uid.clone().unwrap();
    spec.termination_grace_seconds = 2;
    let mut env_pod = within(LIMIT, "pod start", kubelet.run_pod(spec)).await;
    report(api, &env_name, &env_pod);

    // pod `crr`: its container is recreated on request, once per cycle
    let mut crr_spec = PodSpec::new(&unique("crr"), vec![ContainerSpec::sleeper("a", &image)]);
    crr_spec.termination_grace_seconds = 2;
    let mut crr_pod = within(LIMIT, "pod start", kubelet.run_pod(crr_spec)).await;

    // pod `probe`: an exec probe that follows a file the test creates and removes
    let probe_pod = within(
        LIMIT,
        "pod start",
        kubelet.run_pod(PodSpec::new(
            &unique("probe"),
            vec![ContainerSpec::sleeper("main", &image)],
        )),
    )
    .await;
    let probe_uid = probe_pod.spec.uid.clone();
    api.create(
        "nodepodprobes",
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
               "metadata": {"name": NODE},
               "spec": {"podProbes": [{"name": probe_pod.spec.name, "namespace": "default",
                   "uid": probe_uid, "IP": "127.0.0.1",
                   "probes": [{"name": "main#ready", "containerName": "main",
                               "probe": {"periodSeconds": 1, "timeoutSeconds": 5,
                                         "exec": {"command": ["test", "-f", "/tmp/ready"]}}}]}]}}),
    )
    .unwrap();

    // the NodeImage: one tag, pulled again at every new version
    let repo = format!("{}/test/busybox", lab.registry);
    api.create(
        "nodeimages",
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
               "metadata": {"name": NODE},
               "spec": {"images": {&repo: {"tags": [{"tag": "v1", "version": 1}]}}}}),
    )
    .unwrap();

    let mut d = plane.start_daemon(&lab, NODE, &[], LIMIT).await;
    let pulled = |api: &Handle, version: i64| {
        api.get("nodeimages", "", NODE).is_some_and(|o| {
            let t = &o["status"]["imageStatuses"][&repo]["tags"][0];
            t["phase"] == "Succeeded" && t["version"] == version
        })
    };
    api.wait_for(LIMIT, |v| {
        v.get("nodeimages", "", NODE)
            .is_some_and(|o| o["status"]["imageStatuses"][&repo]["tags"][0]["phase"] == "Succeeded")
    })
    .await
    .expect("the first pull succeeds");

    let mut figures = Figures::default();
    let mut env_stops_expected = 0;
    for cycle in 1..=cycles {
        // the work, issued while the runtime runs
        let role = format!("r{cycle}");
        api.modify("pods", "default", &env_name, |p| {
            p["metadata"]["annotations"]["role"] = json!(role)
        })
        .unwrap();
        env_stops_expected += 1;
        let version = i64::from(cycle) + 1;
        api.modify("nodeimages", "", NODE, |o| {
            o["spec"]["images"][&repo]["tags"][0]["version"] = json!(version)
        })
        .unwrap();
        let request = format!("r-{cycle}");
        let old_a = crr_pod.container("a").to_string();
        api.create(
            "containerrecreaterequests",
            json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
                "metadata": {"name": request, "namespace": "default", "labels": {
                    keys::CRR_NODE_NAME_LABEL: NODE, keys::CRR_ACTIVE_LABEL: "true",
                    keys::CRR_POD_UID_LABEL: crr_pod.spec.uid}},
                "spec": {"podName": crr_pod.spec.name, "containers": [{"name": "a",
                    "statusContext": {"containerID": support::kubelet_id(&old_a),
                                      "restartCount": crr_pod.attempts["a"]}}],
                    "strategy": {"terminationGracePeriodSeconds": 2}}
            }),
        )
        .unwrap();
        let ready_file = cycle % 2 == 1;

        // the crash, a random moment later (the pause picks the moment; it synchronises nothing)
        let pause = Duration::from_millis(rng.random_range(0..400));
        tokio::time::sleep(pause).await;
        restart_runtime(&lab).await;
        let back = Instant::now();
        assert!(
            d.running(),
            "cycle {cycle}: kruised exited:\n{}",
            d.log_text()
        );

        // the result to tell the new one from, read before the probe's file changes (read
        // after it, it can already be the new one, and then no later change comes): a result
        // that differs from it in state or time (the time has whole seconds: a Failed and then
        // a Succeeded within one second share it)
        let probe_before = probe_state(api, &probe_uid);
        // the probe's file follows the cycle: there on odd cycles, gone on even ones
        let cmd = if ready_file { "touch" } else { "rm" };
        cri!(
            "exec in the probed container",
            kubelet.runtime().exec_sync(
                probe_pod.container("main"),
                vec![cmd.into(), "-f".into(), "/tmp/ready".into()],
                Duration::from_secs(10),
            )
        );
        let want_probe = if ready_file {
            ProbeState::Succeeded
        } else {
            ProbeState::Failed
        };

        // play the kubelet and the manager until everything is done
        let deadline = back + LIMIT;
        let (mut t_env, mut t_pull, mut t_crr, mut t_probe) = (None, None, None, None);
        let mut restarted_for_lost_exit = false;
        loop {
            let rv = api.resource_version();
            let main = env_pod.container("main").to_string();
            if !running(&kubelet, &main).await {
                let spec = ContainerSpec::of_pod(&pod_of(api, &env_name), "main");
                let attempt = env_pod.attempts["main"] + 1;
                env_pod.spec.containers[0] = spec.clone();
                let id = kubelet
                    .start(&env_pod.spec, &env_pod.sandbox_id, &spec, attempt)
                    .await;
                env_pod.containers.insert("main".into(), id);
                env_pod.attempts.insert("main".into(), attempt);
                report(api, &env_name, &env_pod);
            }
            let a = crr_pod.container("a").to_string();
            if t_crr.is_none() && !running(&kubelet, &a).await {
                let spec = crr_pod.spec.containers[0].clone();
                let attempt = crr_pod.attempts["a"] + 1;
                let id = kubelet
                    .start(&crr_pod.spec, &crr_pod.sandbox_id, &spec, attempt)
                    .await;
                crr_pod.containers.insert("a".into(), id.clone());
                crr_pod.attempts.insert("a".into(), attempt);
                let snapshot = serde_json::to_string(&json!([{"name": "a", "ready": true,
                    "restartCount": attempt, "containerID": support::kubelet_id(&id)}]))
                .unwrap();
                api.modify("containerrecreaterequests", "default", &request, |o| {
                    o["metadata"]["annotations"][keys::CRR_SYNC_CONTAINER_STATUSES] =
                        json!(snapshot)
                })
                .unwrap();
            }
            let now = back.elapsed();
            if t_crr.is_none()
                && !restarted_for_lost_exit
                && now > LOST_EXIT_AFTER
                && running_without_its_process(&kubelet, &a).await
            {
                eprintln!(
                    "runtime_crashes: cycle {cycle}: the runtime reports container a running {now:?} \
                     after it answered again, and its process is gone: it lost the exit over its \
                     restart (containerd #11579, #12600). Restarting it, as an operator would"
                );
                restart_runtime(&lab).await;
                restarted_for_lost_exit = true;
            }
            if t_env.is_none() {
                let p = api.get("pods", "default", &env_name).unwrap();
                let id = env_pod.container("main").to_string();
                let annotated = meta_of(&p).is_some_and(|m| {
                    m.container("main")
                        .is_some_and(|c| c.container_id == support::kubelet_id(&id))
                });
                if annotated
                    && env_pod.spec.containers[0]
                        .env
                        .contains(&("ROLE".to_string(), role.clone()))
                {
                    t_env = Some(now);
                }
            }
            if t_pull.is_none() && pulled(api, version) {
                t_pull = Some(now);
            }
            if t_crr.is_none() && crr(api, &request).is_completed() {
                t_crr = Some(now);
            }
            if t_probe.is_none()
                && probe_state(api, &probe_uid)
                    .is_some_and(|now| now.0 == want_probe && Some(&now) != probe_before.as_ref())
            {
                t_probe = Some(now);
            }
            if t_env.is_some() && t_pull.is_some() && t_crr.is_some() && t_probe.is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cycle {cycle} (crash {pause:?} after the work): not all done within {LIMIT:?}: \
                 env {t_env:?} pull {t_pull:?} request {t_crr:?} probe {t_probe:?}; request {:#?}; \
                 NodeImage {:#}; probe {:?}; kruised's last lines:\n{}",
                crr(api, &request).status,
                api.get("nodeimages", "", NODE).unwrap()["status"],
                probe_state(api, &probe_uid),
                last_lines(&d, 80)
            );
            // the next write of the daemon, or a short while for the runtime's side to move
            let _ = api
                .wait_for(Duration::from_millis(100), |v| v.resource_version() > rv)
                .await;
        }
        let r = crr(api, &request);
        let state = &r.status.as_ref().unwrap().container_recreate_states[0];
        assert!(
            state.is_killed
                && state.phase == kruised::k8s::crd::ContainerRecreateRequestPhase::Succeeded,
            "cycle {cycle}: {state:?}"
        );
        api.modify("containerrecreaterequests", "default", &request, |o| {
            o["metadata"]["labels"]
                .as_object_mut()
                .unwrap()
                .remove(keys::CRR_ACTIVE_LABEL);
        })
        .unwrap();
        eprintln!(
            "runtime_crashes: cycle {cycle}: crash {pause:?} after the work; done after \
             the runtime answered: env {:?}, pull {:?}, request {:?}, probe {:?}",
            t_env.unwrap(),
            t_pull.unwrap(),
            t_crr.unwrap(),
            t_probe.unwrap()
        );
        figures.add("env-from-metadata restart", t_env.unwrap());
        figures.add("pull", t_pull.unwrap());
        figures.add("recreate request", t_crr.unwrap());
        figures.add("probe", t_probe.unwrap());
    }
    figures.print();
    assert!(d.running(), "kruised exited:\n{}", d.log_text());
    // each request recreated its container exactly once
    assert_eq!(crr_pod.attempts["a"], cycles);
    let stops = d
        .log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("stopping container"))
        })
        .count();
    eprintln!(
        "runtime_crashes: {stops} stops logged for {env_stops_expected} env changes and \
         {cycles} requests; main attempts {}",
        env_pod.attempts["main"]
    );
    for p in [&env_pod, &crr_pod, &probe_pod] {
        kubelet.remove_pod(p).await;
    }
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// Whether the pod's annotation comes to name container `id` as its `main`, within `LIMIT`.
async fn annotated(api: &Handle, pod: &str, id: &str) -> bool {
    let want = support::kubelet_id(id);
    api.wait_for_value(LIMIT, |v| {
        v.get("pods", "default", pod)
            .and_then(|o| meta_of(&o))
            .filter(|m| m.container("main").is_some_and(|c| c.container_id == want))
    })
    .await
    .is_ok()
}

/// The process ID of a running container, from the runtime's verbose status.
async fn container_pid(kubelet: &Kubelet, id: &str) -> i32 {
    let status = kubelet.runtime().container_status(id, true).await.unwrap();
    pid_of(&status).expect("the runtime reports the pid")
}

/// The pid of a container's process, from the runtime's verbose status (containerd's and
/// CRI-O's `info` JSON).
fn pid_of(status: &ContainerStatus) -> Option<i32> {
    let info: Value = serde_json::from_str(status.info.get("info")?).ok()?;
    i32::try_from(info["pid"].as_i64()?)
        .ok()
        .filter(|pid| *pid > 0)
}

/// A script of the lab's (`kill-runtime`, `start-runtime`), off the test's threads.
async fn lab_script(lab: &Lab, cmd: &'static str) {
    let lab = lab.clone();
    tokio::task::spawn_blocking(move || lab.script(cmd))
        .await
        .unwrap();
}

/// The lab's runtime killed (SIGKILL) and started again.
async fn restart_runtime(lab: &Lab) {
    lab_script(lab, "kill-runtime").await;
    lab_script(lab, "start-runtime").await;
}

#[tokio::test]
async fn a_container_that_dies_while_the_runtime_is_down_is_noticed_once_it_is_back() {
    let Some(lab) = Lab::get() else { return };
    let _alone = RUNTIME.lock().await;
    let plane = Plane::start().await;
    let api = &plane.api;
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    let image = lab.image("busybox:v1");
    kubelet.pull(std::slice::from_ref(&image), LIMIT).await;
    // where the runtime sends events, no relist within the test: only the stream (its
    // catch-up once it is back) can notice; where it sends none, the relist
    let relist = if lab.runtime.has_events() { "1h" } else { "2s" };
    // (started first: pods found at start are written only once they change)
    let mut d = plane
        .start_daemon(&lab, NODE, &["--relist-interval", relist], LIMIT)
        .await;
    let name = unique("down");
    let created = api
        .create(
            "pods",
            json!({
                "metadata": {"name": name, "namespace": "default",
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                         "name": "demo", "uid": "cs-1", "controller": true}]},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": image}]}
            }),
        )
        .unwrap();
    let pod: Pod = serde_json::from_value(created).unwrap();
    let mut spec = PodSpec::new(&name, vec![ContainerSpec::of_pod(&pod, "main")]);
    spec.uid = pod.metadata.uid.clone().unwrap();
    let mut running = within(LIMIT, "pod start", kubelet.run_pod(spec)).await;
    report(api, &name, &running);
    let old = running.container("main").to_string();
    assert!(annotated(api, &name, &old).await, "first annotation");
    if lab.runtime.has_events() {
        d.wait_for_log("following the runtime's container events", LIMIT)
            .await;
    }

    // the runtime goes away; the daemon's stream breaks and it backs off; the container dies
    let pid = container_pid(&kubelet, &old).await;
    lab_script(&lab, "kill-runtime").await;
    if lab.runtime.has_events() {
        d.wait_for_log("container event stream broke", LIMIT).await;
    }
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {pid}");
    lab_script(&lab, "start-runtime").await;
    // the CRI answers before containerd 1.6 has its images back (ImageStatus fails meanwhile),
    // and the kubelet needs the image to create the container
    let runtime = lab.runtime();
    within(LIMIT, "the image known to the runtime again", async {
        while !matches!(runtime.image_status(&image).await, Ok(Some(_))) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    // back: the kubelet starts it again, and reports nothing yet
    let new = within(
        LIMIT,
        "recreate",
        kubelet.recreate(&mut running, "main", None),
    )
    .await;
    assert!(
        annotated(api, &name, &new).await,
        "the annotation names the new container {new}: log {:#?}",
        d.log()
    );
    within(LIMIT, "pod removal", kubelet.remove_pod(&running)).await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
