//! kruised as a drop-in for kruise-daemon on the real cluster: run under the name
//! `kruise-daemon` with exactly the arguments and RBAC of kruise's Helm chart, the runtime found
//! through a `/hostvarrun`-style directory; and env restarts under load, exactly once per change.
//! The test plays kruise-manager: the NodeImage of the chart's test is one the manager would
//! write, and the load test makes fifty changes in waves, at a pace of its own.

use std::time::Duration;

use serde_json::json;

use super::imagepull::{pull_scenario, remove_node_image};
use super::support::cluster::{self, KubeLab, Rbac, Scene};
use super::support::daemon::Daemon;
use super::support::restarts::{self, CpuLoad, HookServer};

const READY: Duration = Duration::from_secs(60);

/// The arguments kruise's chart (`templates/manager.yaml`, 1.9) gives the daemon container,
/// with the gates of an install that enabled image pull jobs.
const CHART_ARGS: [&str; 7] = [
    "--logtostderr=true",
    "--v=4",
    "--addr=:10221",
    "--feature-gates=ImagePullJobGate=true,ForceDeleteTimeoutExpectationGate=true",
    "--socket-file=",
    "--enable-pprof=true",
    "--pprof-addr=localhost:10222",
];

#[tokio::test]
async fn kruises_chart_runs_kruised_as_kruise_daemon_with_its_arguments_and_rbac() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "chart").await;
    let identity = cluster::identity(&lab, &scene.admin, Rbac::KruiseChart).await;

    // the image's /kruise-daemon is kruised under another name
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("kruise-daemon");
    std::os::unix::fs::symlink(super::support::daemon::kruised_bin(), &exe).unwrap();
    // the chart mounts the host's /var/run at /hostvarrun; here a directory like it
    let hostvarrun = dir.path().join("hostvarrun");
    std::fs::create_dir_all(hostvarrun.join("containerd")).unwrap();
    std::os::unix::fs::symlink(&lab.socket, hostvarrun.join("containerd/containerd.sock")).unwrap();
    let mut d = Daemon::start_exe(
        &exe,
        &CHART_ARGS,
        &[
            ("NODE_NAME", lab.node.as_str()),
            ("KUBECONFIG", identity.kubeconfig.to_str().unwrap()),
            ("KRUISED_HOST_RUN_DIR", hostvarrun.to_str().unwrap()),
            ("KRUISED_LOG_FORMAT", "json"),
        ],
    );
    d.wait_for_log("daemon ready", READY).await;
    d.wait_for_log("no effect here", READY).await;
    assert!(
        d.logged("found container runtime"),
        "the runtime was found under the hostvarrun directory"
    );

    // an env restart, as kruise-manager drives it
    let image = lab.image("busybox:v1");
    scene
        .run_pod(scene.kruise_pod("web", &[("main", &image, &[("APP_CONFIG", "app-config")])]))
        .await;
    let pods = scene.pods();
    let before = cluster::wait_for(
        &pods,
        "web",
        "annotated",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.and_then(super::meta).is_some_and(|m| {
                m.container("main")
                    .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash != 0)
            })
        },
    )
    .await;
    let old = super::status_of(&before, "main")
        .container_id
        .clone()
        .unwrap();
    scene.set_update_ready("web", false).await;
    scene
        .patch_pod(
            "web",
            json!({"metadata": {"annotations": {"app-config": "v2"}}}),
        )
        .await;
    let after = cluster::wait_for(
        &pods,
        "web",
        "main restarted",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| {
                let s = super::status_of(p, "main");
                s.container_id.as_deref() != Some(old.as_str())
                    && s.state.as_ref().is_some_and(|st| st.running.is_some())
            })
        },
    )
    .await;
    assert_eq!(super::status_of(&after, "main").restart_count, 1);

    // a NodeImage written at v1beta1 with `mode`: pulled, `mode` kept
    pull_scenario(&lab, &scene.admin).await;

    d.terminate();
    assert!(d.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&d);
    remove_node_image(&lab, &scene.admin).await;
    scene.cleanup().await;
}

/// Changes in all, over [`WAVES`] waves of pods changed at once.
const CHANGES: usize = 50;
const WAVES: usize = 5;

#[tokio::test]
async fn fifty_env_changes_under_load_restart_each_container_exactly_once_with_the_new_value() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "load").await;
    let identity = cluster::identity(&lab, &scene.admin, Rbac::Deploy).await;
    let mut d = cluster::start_daemon(&lab, &identity, &[]);
    d.wait_for_log("daemon ready", READY).await;
    let hooks = HookServer::start().await;
    // one change per pod: the kubelet backs off a container restarted again within minutes,
    // which would measure its back-off, not the restart
    let pods = restarts::create_pods(&scene, &hooks, "w", CHANGES).await;
    let _load = CpuLoad::top_up();
    let mut results = Vec::new();
    for wave in pods.chunks(CHANGES / WAVES) {
        results.extend(restarts::change_wave(&scene, &hooks, wave, "v2").await);
    }
    drop(_load);
    assert_eq!(results.len(), CHANGES);
    // what kruised warned of (a hook that failed or ran out of time), for a failure's message
    let warnings: String = d
        .log()
        .iter()
        .filter(|v| v["level"] == "WARN")
        .map(|v| format!("\n  {v}"))
        .collect();
    for r in &results {
        assert_eq!(r.restarts, [1, 1], "{}: one restart per container", r.pod);
        assert_eq!(
            r.hooks,
            [1, 1],
            "{}: one preStop run per container; kruised's warnings:{warnings}",
            r.pod
        );
        assert_eq!(
            r.seen,
            ["v2", "v2"],
            "{}: the new containers see the new value",
            r.pod
        );
    }
    let stops = d
        .log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("stopping container"))
        })
        .count();
    assert_eq!(stops, 2 * CHANGES, "kruised stopped each container once");
    let mut took: Vec<Duration> = results.iter().map(|r| r.took).collect();
    eprintln!(
        "{CHANGES} changes under load: change to both containers running with the new value p50 {:?}, p90 {:?}, max {:?}",
        restarts::percentile(&mut took, 0.5),
        restarts::percentile(&mut took, 0.9),
        restarts::percentile(&mut took, 1.0)
    );
    d.terminate();
    assert!(d.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&d);
    scene.cleanup().await;
}
