//! ContainerRecreateRequests on the real cluster: the real kubelet recreates what kruised
//! stops; the test plays kruise-manager (creates the request as its webhook would, keeps the
//! container-status snapshot in `status.containerStatusSnapshot` (v1beta1, the stored version),
//! drops the `active` label once completed).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kruised::k8s::crd::{ContainerRecreateRequest, ContainerRecreateRequestPhase as Phase};
use kruised::k8s::keys;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::status_of;
use super::support::cluster::{self, KubeLab, MANAGER, Rbac, Scene, apply_object, wait_for};
use super::support::restarts::HookServer;

const READY: Duration = Duration::from_secs(60);

fn crr_api(scene: &Scene) -> Api<DynamicObject> {
    let ar = kube::discovery::ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        "v1beta1",
        "ContainerRecreateRequest",
    ));
    Api::namespaced_with(scene.admin.clone(), &scene.ns.name, &ar)
}

/// The manager's snapshot: the containers running that the request did not find (by ID: a
/// start time has whole seconds, and a pod started in the second the request was made would
/// count as recreated, its snapshot written before kruised gave the request a phase: 422).
fn snapshot(pod: &Pod, at_request: &[String]) -> Vec<Value> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter(|c| {
            c.state.as_ref().is_some_and(|s| s.running.is_some())
                && c.container_id
                    .as_ref()
                    .is_some_and(|id| !at_request.contains(id))
        })
        .map(|c| {
            json!({"name": c.name, "ready": c.ready, "restartCount": c.restart_count,
                   "containerID": c.container_id})
        })
        .collect()
}

/// Plays kruise-manager's CRR controller until the request completes.
async fn manager(scene: &Scene, pod: &str, name: &str) {
    let crrs = crr_api(scene);
    let pods = scene.pods();
    let typed: Api<ContainerRecreateRequest> = Api::namespaced(scene.admin.clone(), &scene.ns.name);
    let at_request: Vec<String> = typed
        .get(name)
        .await
        .unwrap()
        .spec
        .containers
        .iter()
        .filter_map(|c| c.status_context.as_ref().map(|s| s.container_id.clone()))
        .collect();
    let stream = watcher(
        pods,
        watcher::Config::default().fields(&format!("metadata.name={pod}")),
    );
    let mut stream = std::pin::pin!(stream);
    let done = kube::runtime::wait::await_condition(
        typed,
        name,
        |r: Option<&ContainerRecreateRequest>| r.is_some_and(|r| r.is_completed()),
    );
    let mut done = std::pin::pin!(done);
    let mut last = Vec::new();
    loop {
        let event = tokio::select! {
            _ = &mut done => return,
            e = stream.next() => e,
        };
        let Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) = event else {
            continue;
        };
        let snap = snapshot(&p, &at_request);
        if snap != last {
            crrs.patch_status(
                name,
                &PatchParams::apply(MANAGER),
                &Patch::Merge(json!({"status": {"containerStatusSnapshot": snap}})),
            )
            .await
            .unwrap();
            last = snap;
        }
    }
}

#[tokio::test]
async fn a_recreate_request_is_carried_out_with_the_real_kubelet_recreating_the_containers() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "crr").await;
    let identity = cluster::identity(&lab, &scene.admin, Rbac::Deploy).await;
    let mut d = cluster::start_daemon(&lab, &identity, &[]);
    d.wait_for_log("daemon ready", READY).await;
    let hooks = HookServer::start().await;
    let image = lab.image("busybox:v1");
    let pod = scene
        .run_pod(scene.kruise_pod("web", &[("a", &image, &[]), ("b", &image, &[])]))
        .await;
    let context = |c: &str| {
        let s = status_of(&pod, c);
        json!({"containerID": s.container_id, "restartCount": s.restart_count})
    };
    let hook = json!({"exec": {"command": ["sh", "-c",
        format!("wget -q -O /dev/null http://127.0.0.1:{}/hook/web/a", hooks.port)]}});
    apply_object(
        &scene.admin,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "recreate-both", "namespace": scene.ns.name, "labels": {
                keys::CRR_NODE_NAME_LABEL: lab.node, keys::CRR_ACTIVE_LABEL: "true",
                keys::CRR_POD_UID_LABEL: pod.uid().unwrap()}},
            "spec": {"podName": "web", "containers": [
                {"name": "a", "preStop": hook, "statusContext": context("a")},
                {"name": "b", "statusContext": context("b")}],
                "strategy": {"orderedRecreate": true, "failurePolicy": "Fail",
                             "terminationGracePeriodSeconds": 5}}
        }),
    )
    .await;
    let typed: Api<ContainerRecreateRequest> = Api::namespaced(scene.admin.clone(), &scene.ns.name);
    tokio::time::timeout(cluster::LIMIT, manager(&scene, "web", "recreate-both"))
        .await
        .expect("the request did not complete in time");
    let r = wait_for(
        &typed,
        "recreate-both",
        "Completed",
        |r: Option<&ContainerRecreateRequest>| r.is_some_and(|r| r.is_completed()),
    )
    .await;
    let states = &r.status.as_ref().unwrap().container_recreate_states;
    assert_eq!(r.phase(), Phase::Completed);
    assert!(
        states
            .iter()
            .all(|s| s.phase == Phase::Succeeded && s.is_killed),
        "{states:#?}"
    );
    // the manager drops the active label
    crr_api(&scene)
        .patch(
            "recreate-both",
            &PatchParams::apply(MANAGER),
            &Patch::Merge(json!({"metadata": {"labels": {keys::CRR_ACTIVE_LABEL: null}}})),
        )
        .await
        .unwrap();
    let p = scene.pods().get("web").await.unwrap();
    for c in ["a", "b"] {
        assert_eq!(
            status_of(&p, c).restart_count,
            1,
            "{c} recreated once by the kubelet"
        );
    }
    assert_eq!(hooks.count("web", "a"), 1, "a's preStop hook ran once");
    d.terminate();
    assert!(d.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&d);
    scene.cleanup().await;
}
