//! End-to-end tests of the CRI layer against real containerd + runc and a real registry
//! (`tests/cri-lab.sh`, started by `tests/run.sh`).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::support::events::Events;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::{Lab, unique, within};
use kruised::cri::{
    ContainerEventKind, ContainerFilter, ContainerState, CriError, EndpointSource, ImageService,
    PullRequest, RuntimeService, Runtimes, SandboxFilter, Timeouts, dialect,
};
use kruised::k8s::keys;

const LIMIT: Duration = Duration::from_secs(60);

async fn kubelet(lab: &Lab) -> Kubelet {
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    // the kubelet pulls images before it creates containers
    let image = lab.image("busybox:v1");
    within(LIMIT, "pull of busybox:v1", async {
        k.runtime()
            .pull_image(
                PullRequest {
                    image: image.clone(),
                    ..Default::default()
                },
                LIMIT,
            )
            .await
            .expect("pull busybox:v1")
    })
    .await;
    k
}

#[tokio::test]
async fn detection_finds_the_runtime_behind_its_well_known_socket_name() {
    let Some(lab) = Lab::get() else { return };
    let base = tempfile::tempdir().unwrap();
    // the runtime's socket where its package puts it, and the same socket under a second
    // well-known name (tried once)
    let (dir, second) = match lab.runtime.cri_name() {
        "cri-o" => ("crio/crio.sock", "crio.sock"),
        _ => ("containerd/containerd.sock", "containerd.sock"),
    };
    std::fs::create_dir(base.path().join(dir).parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&lab.socket, base.path().join(dir)).unwrap();
    std::os::unix::fs::symlink(&lab.socket, base.path().join(second)).unwrap();
    let source = EndpointSource::Detect {
        host_run_dirs: vec![base.path().to_path_buf()],
    };
    let runtimes = within(
        LIMIT,
        "discovery",
        Runtimes::discover(&source, None, Timeouts::default()),
    )
    .await
    .expect("the runtime is found");
    let name = lab.runtime.cri_name();
    assert_eq!(runtimes.primary_version().runtime_name, name);
    assert_eq!(runtimes.primary_version().runtime_api_version, "v1");
    assert_eq!(runtimes.all().count(), 1);
    let abc = crate::support::kubelet_id("abc");
    let (rt, id) = runtimes
        .for_container_id(&abc)
        .expect("the runtime owns its prefix");
    assert_eq!(id, "abc");
    assert_eq!(rt.endpoint().path(), base.path().join(dir));
    let other = if name == "cri-o" {
        "containerd"
    } else {
        "cri-o"
    };
    assert!(
        runtimes
            .for_container_id(&format!("{other}://abc"))
            .is_none()
    );

    // and the binary says the same
    // the machine's own /etc/crictl.yaml must not interfere: point at an empty one
    std::fs::write(base.path().join("crictl.yaml"), "").unwrap();
    let out = std::process::Command::new(crate::support::daemon::kruised_bin())
        .args(["version", "--host-run-dir"])
        .arg(base.path())
        .env_remove("CONTAINER_RUNTIME_ENDPOINT")
        .env("CRI_CONFIG_FILE", base.path().join("crictl.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("RuntimeName:  {name}\n")),
        "{stdout}"
    );
    assert!(stdout.contains("RuntimeApiVersion:  v1"), "{stdout}");
    // containerd's content service shows pulls' progress; CRI-O has none
    let progress = if name == "cri-o" { "no" } else { "yes" };
    assert!(
        stdout.contains(&format!("PullProgress:  {progress} (")),
        "{stdout}"
    );
}

#[tokio::test]
async fn sandboxes_and_containers_are_listed_with_the_kubelets_labels() {
    let Some(lab) = Lab::get() else { return };
    let k = kubelet(&lab).await;
    let mut c = ContainerSpec::sleeper("main", &lab.image("busybox:v1"));
    c.env = vec![("GREETING".into(), "a=b c".into())];
    c.hash = "8e45cbd0".into();
    let mut spec = PodSpec::new(&unique("labels"), vec![c]);
    spec.labels.insert("app".into(), "demo".into());
    let pod = within(LIMIT, "pod start", k.run_pod(spec.clone())).await;
    let rt = k.runtime();

    let by_uid: kruised::cri::StringMap = [(keys::KUBELET_POD_UID.to_string(), spec.uid.clone())]
        .into_iter()
        .collect();
    let sandboxes = rt
        .list_pod_sandboxes(SandboxFilter {
            labels: by_uid.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].id, pod.sandbox_id);
    assert_eq!(sandboxes[0].metadata.name, spec.name);
    assert_eq!(
        sandboxes[0].labels.get("app").map(String::as_str),
        Some("demo")
    );
    let status = rt.pod_sandbox_status(&pod.sandbox_id, false).await.unwrap();
    assert!(
        status.host_network,
        "the lab runs host-network sandboxes only"
    );

    let containers = rt
        .list_containers(ContainerFilter {
            labels: by_uid,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(containers.len(), 1);
    let listed = &containers[0];
    assert_eq!(listed.id, pod.container("main"));
    assert_eq!(listed.metadata.name, "main");
    assert_eq!(listed.state, ContainerState::Running);
    assert_eq!(listed.labels[keys::KUBELET_CONTAINER_NAME], "main");
    // every runtime names the image it runs its own way (cri::dialect); each says it is the
    // image the kubelet asked for
    let image = rt
        .image_status(&lab.image("busybox:v1"))
        .await
        .unwrap()
        .expect("busybox:v1 is on the node");
    assert!(
        dialect::runs_image(&image, listed),
        "{listed:?} runs {image:?}"
    );
    assert_eq!(
        dialect::container_image_id(listed).as_deref(),
        Some(format!("sha256:{}", image.id.trim_start_matches("sha256:")).as_str())
    );

    let status = rt.container_status(&listed.id, true).await.unwrap();
    assert_eq!(status.state, ContainerState::Running);
    assert!(status.started_at > 0);
    assert_eq!(status.annotations[keys::KUBELET_CONTAINER_HASH], "8e45cbd0");
    assert_eq!(
        status.annotations[keys::KUBELET_CONTAINER_RESTART_COUNT],
        "0"
    );
    assert!(
        image.repo_digests.contains(&status.image_ref),
        "ContainerStatus reports the repo digest on every runtime: {}",
        status.image_ref
    );
    // verbose status carries the OCI spec, environment included (what env-from-metadata reads)
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let env = info["runtimeSpec"]["process"]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e == "GREETING=a=b c"), "{env:?}");

    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
    let err = rt
        .container_status(pod.container("main"), false)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[tokio::test]
async fn exec_sync_returns_output_and_exit_code() {
    let Some(lab) = Lab::get() else { return };
    let k = kubelet(&lab).await;
    let spec = PodSpec::new(
        &unique("exec"),
        vec![ContainerSpec::sleeper("main", &lab.image("busybox:v1"))],
    );
    let pod = within(LIMIT, "pod start", k.run_pod(spec)).await;
    let rt = k.runtime();
    let id = pod.container("main");

    let r = rt
        .exec_sync(
            id,
            vec!["cat".into(), "/etc/image-version".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, b"v1\n".as_slice()));
    let r = rt
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), "echo oops >&2; exit 3".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stderr.as_slice()),
        (3, b"oops\n".as_slice())
    );
    let err = rt
        .exec_sync(id, vec!["no-such-binary".into()], Duration::from_secs(10))
        .await;
    match err {
        Err(e) => assert!(e.to_string().contains("no-such-binary"), "{e}"),
        Ok(r) => assert_ne!(r.exit_code, 0, "a missing binary cannot succeed"),
    }
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}

#[tokio::test]
async fn stop_container_waits_the_grace_period_before_killing() {
    let Some(lab) = Lab::get() else { return };
    let k = kubelet(&lab).await;
    let image = lab.image("busybox:v1");
    let spec = PodSpec::new(
        &unique("stop"),
        vec![
            ContainerSpec::stubborn("stubborn", &image),
            ContainerSpec::sleeper("polite", &image),
        ],
    );
    let pod = within(LIMIT, "pod start", k.run_pod(spec)).await;
    let rt = k.runtime();

    let started = Instant::now();
    within(
        LIMIT,
        "stop of a container that ignores TERM",
        rt.stop_container(pod.container("stubborn"), Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    let status = rt
        .container_status(pod.container("stubborn"), false)
        .await
        .unwrap();
    assert_eq!(status.state, ContainerState::Exited);
    assert_eq!(
        status.exit_code, 137,
        "killed by SIGKILL after the grace period"
    );
    assert!(
        took >= Duration::from_secs(2),
        "the grace period was cut short: {took:?}"
    );

    within(
        LIMIT,
        "stop of a container that exits on TERM",
        rt.stop_container(pod.container("polite"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let status = rt
        .container_status(pod.container("polite"), false)
        .await
        .unwrap();
    assert_eq!(
        (status.state, status.exit_code),
        (ContainerState::Exited, 0)
    );
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}

#[tokio::test]
async fn container_events_report_a_stop_or_say_they_are_unsupported() {
    let Some(lab) = Lab::get() else { return };
    let k = kubelet(&lab).await;
    let spec = PodSpec::new(
        &unique("events"),
        vec![ContainerSpec::sleeper("main", &lab.image("busybox:v1"))],
    );
    let pod = within(LIMIT, "pod start", k.run_pod(spec)).await;
    match Events::subscribe(&k, &pod, LIMIT).await {
        Ok(mut events) => {
            assert!(lab.runtime.has_events(), "{:?} sends events", lab.runtime);
            let id = pod.container("main").to_string();
            k.runtime()
                .stop_container(&id, Duration::from_secs(5))
                .await
                .unwrap();
            events
                .wait_for(LIMIT, "the stop of the container", |e| {
                    e.container_id == id && e.kind == ContainerEventKind::Stopped
                })
                .await;
        }
        // containerd 1.6 has no GetContainerEvents (it came with 1.7): the daemon relists instead
        Err(Some(CriError::Unsupported { call, .. })) => {
            assert!(!lab.runtime.has_events());
            assert_eq!(call, "GetContainerEvents");
        }
        Err(e) => panic!("unexpected end of the event stream: {e:?}"),
    }
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}

/// Plain HTTP GET against the lab registry (loopback only).
fn registry_get(registry: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(registry).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {registry}\r\nAccept: application/vnd.oci.image.manifest.v1+json, \
         application/vnd.docker.distribution.manifest.v2+json\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn layer_digests(lab: &Lab, tag: &str) -> Vec<String> {
    let manifest: serde_json::Value = serde_json::from_str(&registry_get(
        &lab.registry,
        &format!("/v2/test/pull/manifests/{tag}"),
    ))
    .unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

fn blob_fetches_since(lab: &Lab, offset: usize) -> Vec<String> {
    let log = std::fs::read_to_string(lab.dir.join("logs/registry.log")).unwrap();
    log[offset..]
        .lines()
        .filter_map(|l| {
            let rest = l.split("\"GET /v2/test/pull/blobs/").nth(1)?;
            Some(rest.split(' ').next()?.to_string())
        })
        .collect()
}

fn registry_log_len(lab: &Lab) -> usize {
    std::fs::metadata(lab.dir.join("logs/registry.log")).map_or(0, |m| m.len() as usize)
}

#[tokio::test]
async fn pulling_v2_after_v1_fetches_only_the_new_layer() {
    let Some(lab) = Lab::get() else { return };
    let rt = lab.runtime();
    let (v1, v2) = (lab.image("pull:v1"), lab.image("pull:v2"));
    // start from an empty cache for this repository (only this test uses it)
    for image in [&v1, &v2] {
        rt.remove_image(image).await.unwrap();
        assert_eq!(
            rt.image_status(image).await.unwrap(),
            None,
            "{image} still present"
        );
    }
    let (layers_v1, layers_v2) = (layer_digests(&lab, "v1"), layer_digests(&lab, "v2"));
    let shared: Vec<_> = layers_v1
        .iter()
        .filter(|d| layers_v2.contains(d))
        .cloned()
        .collect();
    let new: Vec<_> = layers_v2
        .iter()
        .filter(|d| !layers_v1.contains(d))
        .cloned()
        .collect();
    assert!(
        shared.len() == 2 && new.len() == 1,
        "the lab images share two layers and differ in one: {layers_v1:?} {layers_v2:?}"
    );

    let offset = registry_log_len(&lab);
    let image_id = within(
        LIMIT,
        "pull of v1",
        rt.pull_image(
            PullRequest {
                image: v1.clone(),
                ..Default::default()
            },
            LIMIT,
        ),
    )
    .await
    .unwrap();
    assert!(
        dialect::is_image_id(&image_id),
        "PullImage answers the image ID: {image_id}"
    );
    // the first layer (busybox) may be on the node from other images; the rest are this
    // repository's own
    let fetched_v1 = blob_fetches_since(&lab, offset);
    for d in &layers_v1[1..] {
        assert!(
            fetched_v1.contains(d),
            "v1 pull fetched {d}: {fetched_v1:?}"
        );
    }
    let status = rt.image_status(&v1).await.unwrap().expect("v1 is present");
    assert_eq!(status.id, image_id);
    assert!(status.repo_tags.contains(&v1), "{:?}", status.repo_tags);

    let offset = registry_log_len(&lab);
    within(
        LIMIT,
        "pull of v2",
        rt.pull_image(
            PullRequest {
                image: v2.clone(),
                ..Default::default()
            },
            LIMIT,
        ),
    )
    .await
    .unwrap();
    let fetched_v2 = blob_fetches_since(&lab, offset);
    let layers_fetched: Vec<_> = fetched_v2
        .iter()
        .filter(|d| layers_v2.contains(d))
        .collect();
    assert_eq!(
        layers_fetched,
        vec![&new[0]],
        "only the new layer is fetched for v2"
    );

    let images = rt.list_images().await.unwrap();
    assert!(images.iter().any(|i| i.repo_tags.contains(&v2)));
    let fs = rt.image_fs_info().await.unwrap();
    // containerd samples usage in the background, so a fresh root may still say 0 bytes
    assert!(!fs.is_empty() && !fs[0].mountpoint.is_empty(), "{fs:?}");
}

#[tokio::test]
async fn pulling_a_missing_tag_fails_with_the_registrys_answer() {
    let Some(lab) = Lab::get() else { return };
    let rt = lab.runtime();
    let err = within(
        LIMIT,
        "pull of a missing tag",
        rt.pull_image(
            PullRequest {
                image: lab.image("busybox:no-such-tag"),
                ..Default::default()
            },
            LIMIT,
        ),
    )
    .await
    .unwrap_err();
    assert!(lab.runtime.says_no_such_tag(&err.to_string()), "{err}");
}
