//! Container meta and env-from-metadata restarts on the real kubelet: the annotation says what
//! the kubelet really runs, and a stale env is fixed by exactly one restart that the kubelet
//! completes with the new value. The test plays kruise-manager here for what the real one never
//! does (an annotation changed while the pod is in service) and to count each step exactly;
//! `kruise.rs` has the same update made by the real manager.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::RuntimeService;
use kruised::hash::env::expected_env_hash;
use kruised::hash::kubelet::{hash_container, parse_hash};
use kruised::k8s::keys;
use serde_json::json;

use super::support::cluster::{self, KubeLab, Rbac, wait_for};
use super::support::daemon::Daemon;
use super::{Scene, meta, runtime_id, status_of};

const READY: Duration = Duration::from_secs(60);

/// How many containers the daemon stopped (its log says so once per stop).
pub fn stops_logged(d: &Daemon) -> usize {
    stops(d).len()
}

/// The daemon's log lines of its stops, for a failing test's message.
pub fn stops(d: &Daemon) -> Vec<serde_json::Value> {
    d.log()
        .into_iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("stopping container"))
        })
        .collect()
}

/// What `echo $VAR` prints in the running container `id`.
pub async fn echo(lab: &KubeLab, id: &str, var: &str) -> String {
    let out = lab
        .runtime()
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), format!("echo ${var}")],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The env-from-metadata hash the pod's metadata gives container `name` now.
fn expected_hash(p: &Pod, name: &str) -> u64 {
    let c = p
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == name)
        .unwrap();
    expected_env_hash(c, p.labels(), p.annotations())
}

use kube::ResourceExt;

/// The annotation is up to date with the kubelet: every container's ID matches the status and
/// its env hash matches the pod's metadata.
pub fn meta_current(p: Option<&Pod>) -> bool {
    let Some(p) = p else { return false };
    let Some(m) = meta(p) else { return false };
    p.spec.as_ref().unwrap().containers.iter().all(|c| {
        m.container(&c.name).is_some_and(|e| {
            let status = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|s| s.name == c.name));
            status.is_some_and(|s| {
                s.container_id.as_deref() == Some(e.container_id.as_str())
                    && s.state.as_ref().is_some_and(|st| st.running.is_some())
            }) && e.hashes.extracted_env_from_metadata_hash == expected_hash(p, &c.name)
        })
    })
}

/// Waits until container `name` is no longer `old` and the annotation is up to date.
pub async fn restarted(scene: &Scene, name: &str, old: &str) -> Pod {
    wait_for(
        &scene.pods(),
        "web",
        &format!("{name} recreated and the annotation up to date"),
        |p: Option<&Pod>| {
            p.is_some_and(|p| status_of(p, name).container_id.as_deref() != Some(old))
                && meta_current(p)
        },
    )
    .await
}

/// The kubelet restarted container `name` `times` times in all, and it now sees `APP_CONFIG`
/// = `value`.
pub async fn assert_restarts(lab: &KubeLab, pod: &Pod, name: &str, times: i32, value: &str) {
    let status = status_of(pod, name);
    assert_eq!(status.restart_count, times, "{name}: restarts");
    assert_eq!(
        echo(
            lab,
            runtime_id(status.container_id.as_deref().unwrap()),
            "APP_CONFIG"
        )
        .await,
        value,
        "{name}: the new container sees the new value"
    );
}

async fn start(lab: &KubeLab, scene: &Scene) -> Daemon {
    let identity = cluster::identity(lab, &scene.admin, Rbac::Deploy).await;
    let mut daemon = cluster::start_daemon(lab, &identity, &[]);
    daemon.wait_for_log("daemon ready", READY).await;
    // the token file must outlive the daemon's start only: the client reads it once
    drop(identity);
    daemon
}

#[tokio::test]
async fn the_annotation_is_what_the_real_kubelet_runs() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "meta").await;
    let mut daemon = start(&lab, &scene).await;
    let image = lab.image("busybox:v1");
    scene
        .run_pod(scene.kruise_pod(
            "web",
            &[
                ("main", &image, &[("APP_CONFIG", "app-config")]),
                ("side", &image, &[]),
            ],
        ))
        .await;
    let pod = wait_for(
        &scene.pods(),
        "web",
        "an up-to-date annotation",
        meta_current,
    )
    .await;
    let m = meta(&pod).unwrap();
    let runtime = lab.runtime();
    for name in ["main", "side"] {
        let entry = m.container(name).unwrap();
        let status = status_of(&pod, name);
        assert_eq!(
            Some(entry.container_id.as_str()),
            status.container_id.as_deref(),
            "{name}: the kubelet's container ID"
        );
        assert_eq!(
            i64::from(entry.restart_count),
            i64::from(status.restart_count),
            "{name}: restart count"
        );
        let recorded = runtime
            .container_status(runtime_id(&entry.container_id), false)
            .await
            .unwrap();
        let kubelet_hash = parse_hash(&recorded.annotations[keys::KUBELET_CONTAINER_HASH]).unwrap();
        assert_eq!(
            entry.hashes.plain_hash, kubelet_hash,
            "{name}: the hash the kubelet recorded"
        );
        let spec = pod
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|c| c.name == name)
            .unwrap();
        assert_eq!(
            kubelet_hash,
            hash_container(spec),
            "{name}: a v1.36 kubelet hashes name and image"
        );
    }
    assert_ne!(
        m.container("main")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash,
        m.container("side")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash,
        "only main reads metadata"
    );
    daemon.terminate();
    assert!(daemon.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&daemon);
    scene.cleanup().await;
}

#[tokio::test]
async fn an_env_change_during_an_update_restarts_the_container_once_with_the_new_value() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "envrestart").await;
    let mut daemon = start(&lab, &scene).await;
    let image = lab.image("busybox:v1");
    scene
        .run_pod(scene.kruise_pod(
            "web",
            &[
                ("main", &image, &[("APP_CONFIG", "app-config")]),
                ("side", &image, &[]),
            ],
        ))
        .await;
    let before = wait_for(
        &scene.pods(),
        "web",
        "an up-to-date annotation",
        meta_current,
    )
    .await;
    let old_main = status_of(&before, "main").container_id.clone().unwrap();
    let old_side = status_of(&before, "side").container_id.clone().unwrap();

    // while the pod is in service, a changed annotation restarts nothing
    scene
        .patch_pod(
            "web",
            json!({"metadata": {"annotations": {"app-config": "v2"}}}),
        )
        .await;
    daemon.wait_for_log("stale env, not stopping", READY).await;
    assert_eq!(stops_logged(&daemon), 0);

    // the manager takes the pod out of service: the stale container is restarted once
    scene.set_update_ready("web", false).await;
    let after = restarted(&scene, "main", &old_main).await;
    assert_restarts(&lab, &after, "main", 1, "v2").await;
    assert_eq!(
        stops_logged(&daemon),
        1,
        "kruised stopped one container once"
    );

    // an in-place update as kruise-manager makes it (the pod already out of service, then the
    // new value): exactly one more restart, and the kubelet recreates it with the new value
    let old_main = status_of(&after, "main").container_id.clone().unwrap();
    scene
        .patch_pod(
            "web",
            json!({"metadata": {"annotations": {"app-config": "v3"}}}),
        )
        .await;
    let after = restarted(&scene, "main", &old_main).await;
    assert_restarts(&lab, &after, "main", 2, "v3").await;
    assert_eq!(
        stops_logged(&daemon),
        2,
        "kruised stopped it once per change"
    );
    let side = status_of(&after, "side");
    assert_eq!(
        side.container_id.as_deref(),
        Some(old_side.as_str()),
        "side untouched"
    );
    assert_eq!(side.restart_count, 0);

    daemon.terminate();
    assert!(daemon.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&daemon);
    scene.cleanup().await;
}
