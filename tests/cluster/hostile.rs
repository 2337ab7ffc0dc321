//! Hostile tenants on the real kube-apiserver and kubelet (issue 32): what CI proves on the API
//! double and Debian's containerd (`tests/integration/hostile.rs`, `tests/e2e/hostile.rs`), here
//! with the real server's validation and the real kubelet's containers. The test writes the
//! objects a tenant could write were kruise-manager's webhook bypassed or absent, so these run
//! only where the real manager does not (its webhook fills the fields these tests forge).

use std::time::Duration;

use kruised::k8s::crd::{ContainerRecreateRequest, ContainerRecreateRequestPhase as Phase};
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use super::containermeta::stops_logged;
use super::support::cluster::{self, KubeLab, Rbac, TestNamespace, wait_for};
use super::support::crr::Request;
use super::support::daemon::Daemon;
use super::{Scene, status_of};

const READY: Duration = Duration::from_secs(60);

/// Whether the real kruise-manager runs beside the cluster: its webhook rewrites what these
/// tests forge, so they have nothing to prove then.
fn webhook_absent() -> bool {
    let absent = std::env::var("KRUISED_KRUISE_MANAGER").map_or(true, |v| v.is_empty());
    if !absent {
        eprintln!("skipped: kruise-manager's webhook runs, and fills the fields this test forges");
    }
    absent
}

async fn start(lab: &KubeLab, scene: &Scene) -> (Daemon, cluster::Identity) {
    let identity = cluster::identity(lab, &scene.admin, Rbac::Deploy).await;
    let mut daemon = cluster::start_daemon(lab, &identity, &[]);
    daemon.wait_for_log("daemon ready", READY).await;
    (daemon, identity)
}

/// A recreate request in `namespace` for container `main` of `pod` as the real kubelet runs it,
/// labelled with `pod_uid` (a forged one, when it is another namespace's pod's).
fn request(
    namespace: &str,
    name: &str,
    pod: &k8s_openapi::api::core::v1::Pod,
    node: &str,
    grace: i64,
) -> ContainerRecreateRequest {
    let id = status_of(pod, "main").container_id.clone();
    let request = Request::new(name, namespace, node, &pod.name_any(), &pod.uid().unwrap())
        .container("main", id.as_deref(), None)
        .grace(grace);
    serde_json::from_value(request.json()).unwrap()
}

#[tokio::test]
async fn a_request_naming_another_namespaces_pod_by_its_uid_restarts_nothing_on_the_real_kubelet() {
    let Some(lab) = KubeLab::get() else { return };
    if !webhook_absent() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "victim").await;
    let (mut daemon, _identity) = start(&lab, &scene).await;
    let image = lab.image("busybox:v1");
    let victim = scene
        .run_pod(scene.kruise_pod("web", &[("main", &image, &[])]))
        .await;
    // the tenant's namespace, and a request there that borrows the victim's uid and name
    let tenant = TestNamespace::create(&scene.admin, "tenant").await;
    let crrs: Api<ContainerRecreateRequest> = Api::namespaced(scene.admin.clone(), &tenant.name);
    crrs.create(
        &PostParams::default(),
        &request(&tenant.name, "borrowed", &victim, &lab.node, 30),
    )
    .await
    .unwrap();
    let done = wait_for(
        &crrs,
        "borrowed",
        "the request refused",
        |r: Option<&ContainerRecreateRequest>| r.is_some_and(|r| r.phase() == Phase::Completed),
    )
    .await;
    let message = done.status.map(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!(
            "names pod {}/web, not this request's {}/web",
            scene.ns.name, tenant.name
        )),
        "{message:?}"
    );
    let after = scene.pods().get("web").await.unwrap();
    assert_eq!(
        status_of(&after, "main").restart_count,
        0,
        "the victim untouched"
    );
    assert_eq!(stops_logged(&daemon), 0);
    assert!(!daemon.log_text().contains("panicked"));
    daemon.terminate();
    assert!(daemon.wait_exit(READY).await.success());
    tenant.delete().await;
    scene.cleanup().await;
}

#[tokio::test]
async fn an_int64_maximum_grace_period_recreates_the_real_container_once_without_a_panic() {
    let Some(lab) = KubeLab::get() else { return };
    if !webhook_absent() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "grace").await;
    let (mut daemon, _identity) = start(&lab, &scene).await;
    let image = lab.image("busybox:v1");
    let pod = scene
        .run_pod(scene.kruise_pod("web", &[("main", &image, &[])]))
        .await;
    let crrs: Api<ContainerRecreateRequest> = Api::namespaced(scene.admin.clone(), &scene.ns.name);
    crrs.create(
        &PostParams::default(),
        &request(&scene.ns.name, "forever", &pod, &lab.node, i64::MAX),
    )
    .await
    .unwrap();
    let done = wait_for(
        &crrs,
        "forever",
        "the request completed",
        |r: Option<&ContainerRecreateRequest>| r.is_some_and(|r| r.phase() == Phase::Completed),
    )
    .await;
    let after = wait_for(
        &scene.pods(),
        "web",
        "main recreated by the kubelet",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| {
                status_of(p, "main").restart_count == 1 && cluster::all_running(Some(p))
            })
        },
    )
    .await;
    assert_eq!(status_of(&after, "main").restart_count, 1, "{done:#?}");
    assert!(
        !daemon.log_text().contains("panicked"),
        "{}",
        daemon.log_text()
    );
    daemon.terminate();
    assert!(daemon.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&daemon);
    scene.cleanup().await;
}
