//! NodePodProbe on the real cluster: the test plays kruise-manager (it writes the node's
//! NodePodProbe as the PodProbeMarker controller would), the real kubelet runs the pod, kruised
//! probes its containers and reports the states.

use std::time::Duration;

use kruised::cri::RuntimeService;
use kruised::k8s::crd::{NodePodProbe, ProbeState};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

use super::support::cluster::{self, KubeLab, Rbac, Scene, apply_object, wait_for};
use super::{runtime_id, status_of};

const READY: Duration = Duration::from_secs(60);

fn state_is(
    uid: &str,
    probe: &'static str,
    want: ProbeState,
) -> impl Fn(Option<&NodePodProbe>) -> bool {
    let uid = uid.to_string();
    move |n: Option<&NodePodProbe>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.probe_state(&uid, probe))
            .is_some_and(|s| s.state == want)
    }
}

#[tokio::test]
async fn node_pod_probes_report_the_states_of_a_pod_the_real_kubelet_runs() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "probe").await;
    let identity = cluster::identity(&lab, &scene.admin, Rbac::Deploy).await;
    let mut d = cluster::start_daemon(&lab, &identity, &[]);
    d.wait_for_log("daemon ready", READY).await;

    let port = super::support::daemon::free_addr().port();
    let image = lab.image("busybox:v1");
    let mut pod = scene.kruise_pod("web", &[("main", &image, &[]), ("srv", &image, &[])]);
    pod["spec"]["containers"][1]["command"] = json!([
        "sh",
        "-c",
        format!(
            "mkdir -p /www && echo up > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www"
        )
    ]);
    let pod = scene.run_pod(pod).await;
    let uid = pod.uid().unwrap();
    let probe = |name: &str, handler: serde_json::Value| {
        let mut p = json!({"periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 1});
        for (k, v) in handler.as_object().unwrap() {
            p[k] = v.clone();
        }
        json!({"name": name, "containerName": "main", "probe": p})
    };
    apply_object(
        &scene.admin,
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
               "metadata": {"name": lab.node},
               "spec": {"podProbes": [{"name": "web", "namespace": scene.ns.name, "uid": uid,
                   "IP": pod.status.as_ref().unwrap().pod_ip.clone().unwrap_or_default(),
                   "probes": [
                       probe("ppm#ready-file", json!({"exec": {"command": ["test", "-f", "/tmp/ready"]}})),
                       probe("ppm#http", json!({"httpGet": {"port": port, "path": "/index.html", "scheme": "HTTP"}})),
                   ]}]}}),
    )
    .await;
    let npps: Api<NodePodProbe> = Api::all(scene.admin.clone());
    wait_for(
        &npps,
        &lab.node,
        "the file probe Failed",
        state_is(&uid, "ppm#ready-file", ProbeState::Failed),
    )
    .await;
    wait_for(
        &npps,
        &lab.node,
        "the HTTP probe Succeeded",
        state_is(&uid, "ppm#http", ProbeState::Succeeded),
    )
    .await;
    lab.runtime()
        .exec_sync(
            runtime_id(status_of(&pod, "main").container_id.as_deref().unwrap()),
            vec!["touch".into(), "/tmp/ready".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    wait_for(
        &npps,
        &lab.node,
        "the file probe Succeeded",
        state_is(&uid, "ppm#ready-file", ProbeState::Succeeded),
    )
    .await;

    d.terminate();
    assert!(d.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&d);
    let _ = npps.delete(&lab.node, &DeleteParams::default()).await;
    cluster::wait_deleted(&npps, &lab.node, "the NodePodProbe deleted").await;
    scene.cleanup().await;
}
