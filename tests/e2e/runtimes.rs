//! A node where two real runtimes answer (kruise #1825: kruise-daemon's image puller talked to
//! the first runtime found, not the kubelet's). The lab's runtime plays the kubelet's, found
//! second in detection's order (k3s's containerd, `k3s/containerd/containerd.sock`, or CRI-O's
//! socket); another lab's runtime (`KRUISED_LAB_OTHER`) answers first, at the host's
//! `containerd/containerd.sock` or CRI-O's, as on a k3s node whose host also runs containerd.
//! Where both are containerd only the version the Node reports tells them apart. The other
//! runtime is only read here: its own lab's tests run beside these.

use std::path::Path;
use std::time::Duration;

use crate::pull_support::{self, NODE};
use crate::support::daemon::{Daemon, http_get, kruised_bin};
use crate::support::kubelet::status::{self, Report};
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::wait::meta_of;
use crate::support::{Lab, LabRuntime, Plane, wait, within};
use k8s_openapi::api::core::v1::Pod;
use kruised::cri::{ImageService, RuntimeService, RuntimeVersion};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);
/// The repository only this test pulls and removes (`tests/cri-lab.sh` pushes it: an image
/// with a layer of its own, so removing it removes no other test's image).
const REPO: &str = "runtimes/busybox";

/// Where detection finds `runtime`'s socket under the host's run directory: containerd at the
/// host's path when `host`, else at k3s's; CRI-O at its own.
fn socket_path(runtime: LabRuntime, host: bool) -> &'static str {
    match (runtime, host) {
        (LabRuntime::Crio, _) => "crio/crio.sock",
        (_, true) => "containerd/containerd.sock",
        (_, false) => "k3s/containerd/containerd.sock",
    }
}

/// Links `socket` in at `rel` under `dir`.
fn link(dir: &Path, rel: &str, socket: &Path) {
    let at = dir.join(rel);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(socket, &at).unwrap();
}

/// What the kubelet writes in `status.nodeInfo.containerRuntimeVersion` for a runtime that
/// answers `v`: `<runtimeName>://<runtimeVersion>`.
fn as_the_kubelet_reports(v: &RuntimeVersion) -> String {
    format!("{}://{}", v.runtime_name, v.runtime_version)
}

#[tokio::test]
async fn on_a_node_where_two_runtimes_answer_the_kubelets_gets_the_images_and_its_pods_are_reported()
 {
    let Some(lab) = Lab::get() else { return };
    let Some(other) = Lab::other() else { return };
    let (kubelets, others) = (lab.runtime(), other.runtime());
    let reported = as_the_kubelet_reports(&kubelets.version().await.unwrap());
    let beside = as_the_kubelet_reports(&others.version().await.unwrap());
    assert_ne!(
        reported, beside,
        "two runtimes answering alike cannot be told apart: the test needs two versions"
    );

    // the host's run directory: the other runtime where detection looks first
    let host = tempfile::tempdir().unwrap();
    let other_at = socket_path(other.runtime, true);
    let kubelets_at = socket_path(lab.runtime, lab.runtime == other.runtime);
    link(host.path(), other_at, &other.socket);
    link(host.path(), kubelets_at, &lab.socket);
    // `kruised version` reads crictl's config: none here
    std::fs::write(host.path().join("crictl.yaml"), "").unwrap();

    let image = format!("{}/{REPO}:v1", lab.registry);
    pull_support::remove_images(&kubelets, std::slice::from_ref(&image)).await;
    assert!(
        others.image_status(&image).await.unwrap().is_none(),
        "{image} is in the other runtime before the test: only this test pulls it, and only \
         into the kubelet's runtime"
    );

    let plane = Plane::start().await;
    plane
        .api
        .create(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                   "status": {"nodeInfo": {"containerRuntimeVersion": reported,
                       "kubeletVersion": "v1.36.2", "operatingSystem": "linux",
                       "architecture": "amd64", "machineID": "", "systemUUID": "", "bootID": "",
                       "kernelVersion": "", "osImage": "", "kubeProxyVersion": ""}}}),
        )
        .unwrap();
    let kubeconfig = plane.kubeconfig().display().to_string();
    let run_dir = host.path().display().to_string();
    let mut d = Daemon::start(
        NODE,
        &[
            "--kubeconfig",
            &kubeconfig,
            "--host-run-dir",
            &run_dir,
            "--drain-timeout",
            "3s",
        ],
    );
    d.wait_for_log("daemon ready", LIMIT).await;
    let chosen = d.wait_for_log("primary container runtime", LIMIT).await;
    assert_eq!(
        chosen["endpoint"].as_str(),
        Some(format!("unix://{}", host.path().join(kubelets_at).display()).as_str()),
        "the kubelet's runtime is the primary one: {chosen}"
    );
    let (code, body) = http_get(d.admin, "/readyz?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("the Node reports {reported}")),
        "/readyz says which runtime and why: {body}"
    );

    // `kruised version` says the same, asked by an operator on the node
    let out = tokio::time::timeout(
        LIMIT,
        tokio::process::Command::new(kruised_bin())
            .env_remove("CONTAINER_RUNTIME_ENDPOINT")
            .env_remove("IMAGE_SERVICE_ENDPOINT")
            .env_remove("CRI_CONFIG_FILE")
            .env("KUBECONFIG", plane.kubeconfig())
            .args(["version", "--host-run-dir", &run_dir, "--node-name", NODE])
            .arg("--config")
            .arg(host.path().join("crictl.yaml"))
            .output(),
    )
    .await
    .expect("kruised version ended")
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!(
            "PrimaryEndpoint:  unix://{}\n",
            host.path().join(kubelets_at).display()
        )) && text.contains(&format!("the Node reports {reported}")),
        "kruised version names the kubelet's runtime and why: {text}"
    );
    assert_eq!(
        text.matches("RuntimeEndpoint:").count(),
        2,
        "both runtimes listed: {text}"
    );

    // images go to the kubelet's runtime, and only there
    pull_support::create_node_image(
        &plane.api,
        json!({ format!("{}/{REPO}", lab.registry): {"tags": [{"tag": "v1", "version": 1}]}}),
        None,
    );
    wait::node_image(&plane.api, LIMIT, NODE, "v1 Succeeded", |s| {
        s.succeeded == 1
    })
    .await;
    assert!(
        kubelets.image_status(&image).await.unwrap().is_some(),
        "{image} pulled into the kubelet's runtime"
    );
    assert!(
        others.image_status(&image).await.unwrap().is_none(),
        "{image} pulled into the other runtime"
    );

    // a pod of the kubelet's: its containers are found in the kubelet's runtime and reported
    let kubelet = Kubelet::new(kubelets.clone(), lab.dir.join("pods"));
    let created = plane
        .api
        .create(
            "pods",
            json!({
                "metadata": {"name": "two-runtimes", "namespace": "default",
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                         "name": "demo", "uid": "cs-1", "controller": true}]},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "main", "image": image}]}
            }),
        )
        .unwrap();
    let pod: Pod = serde_json::from_value(created).unwrap();
    let mut spec = PodSpec::new("two-runtimes", vec![ContainerSpec::of_pod(&pod, "main")]);
    spec.uid = pod.metadata.uid.clone().unwrap();
    spec.termination_grace_seconds = 2;
    let running = within(LIMIT, "pod start", kubelet.run_pod(spec)).await;
    let id = format!("{}://{}", lab.runtime.cri_name(), running.container("main"));
    plane
        .api
        .modify("pods", "default", "two-runtimes", |p| {
            p["status"] = json!({"phase": "Running"});
            let main = Report {
                image: image.clone(),
                ..Report::ready("main", &id, 0)
            };
            status::set_containers(p, &[main]);
        })
        .unwrap();
    let meta = plane
        .api
        .wait_for_value(LIMIT, |v| {
            v.get("pods", "default", "two-runtimes")
                .and_then(|o| meta_of(&o))
                .filter(|m| m.containers.iter().any(|c| c.container_id == id))
        })
        .await;
    assert!(
        meta.is_ok(),
        "the pod's container ({id}) was never reported; log:\n{}",
        d.log_text()
    );

    eprintln!("two runtimes: the primary one {chosen}");
    kubelet.remove_pod(&running).await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
