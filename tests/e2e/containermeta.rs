//! Container meta and env-from-metadata restarts end to end: the `kruised` binary against real
//! containerd + runc (the lab), the API-server double as control plane, and this test as the
//! kubelet (it creates and recreates containers through CRI and reports them in the pod status).

use crate::support;

use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec, RunningPod, status};
use crate::support::wait;
use crate::support::{Lab, Plane, unique, within};
use apiserver_double::Handle;
use k8s_openapi::api::core::v1::Pod;
use kruised::cri::{ContainerState, ImageService, RuntimeService};
use kruised::hash::kubelet::parse_hash;
use kruised::k8s::keys;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);

struct Cluster {
    api: Handle,
    kubelet: Kubelet,
    daemon: Daemon,
    _dir: tempfile::TempDir,
}

async fn cluster(lab: &Lab, node: &str) -> Cluster {
    cluster_with(lab, node, &[]).await
}

async fn cluster_with(lab: &Lab, node: &str, extra: &[&str]) -> Cluster {
    let plane = Plane::start().await;
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    kubelet
        .pull(
            &[
                lab.image("busybox:v1"),
                lab.image("busybox:v2"),
                lab.image("noenv:v1"),
            ],
            LIMIT,
        )
        .await;
    let daemon = plane.start_daemon(lab, node, extra, LIMIT).await;
    Cluster {
        api: plane.api,
        kubelet,
        daemon,
        _dir: plane.dir,
    }
}

fn spec_of(api: &Handle, name: &str) -> Pod {
    serde_json::from_value(api.get("pods", "default", name).unwrap()).unwrap()
}

/// Creates the pod in the API, runs it through CRI, reports its containers in the status.
async fn run_pod(c: &Cluster, name: &str, image: &str, ready: bool) -> RunningPod {
    let created = c
        .api
        .create(
            "pods",
            json!({
                "metadata": {"name": name, "namespace": "default", "labels": {"app": "demo"},
                    "annotations": {"role": "blue"},
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                         "name": "demo", "uid": "cs-1", "controller": true}]},
                "spec": {"nodeName": "node-e2e", "terminationGracePeriodSeconds": 5, "containers": [
                    {"name": "main", "image": image,
                     "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
                    {"name": "side", "image": image}
                ]}
            }),
        )
        .unwrap();
    let pod: Pod = serde_json::from_value(created).unwrap();
    let mut spec = PodSpec::new(
        name,
        vec![
            ContainerSpec::of_pod(&pod, "main"),
            ContainerSpec::of_pod(&pod, "side"),
        ],
    );
    spec.uid = pod.metadata.uid.clone().unwrap();
    spec.termination_grace_seconds = 5;
    let running = within(LIMIT, "pod start", c.kubelet.run_pod(spec)).await;
    report(&c.api, name, &running, ready);
    running
}

/// The kubelet's status report of the pod's current containers.
fn report(api: &Handle, name: &str, running: &RunningPod, ready: bool) {
    api.modify("pods", "default", name, |p| {
        p["status"] = json!({"phase": "Running",
            "conditions": [{"type": keys::INPLACE_UPDATE_READY, "status": if ready { "True" } else { "False" }}]});
        status::set_containers(p, &running.reports());
    })
    .unwrap();
}

async fn echo_role(c: &Cluster, id: &str) -> String {
    let out = c
        .kubelet
        .runtime()
        .exec_sync(
            id,
            vec!["sh".into(), "-c".into(), "echo $ROLE".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn stops_logged(d: &Daemon) -> usize {
    d.log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("stopping container"))
        })
        .count()
}

#[tokio::test]
async fn env_from_metadata_restarts_once_and_only_while_the_update_is_pending() {
    let Some(lab) = Lab::get() else { return };
    let mut c = cluster(&lab, "node-e2e").await;
    let name = unique("web");
    let mut running = run_pod(&c, &name, &lab.image("busybox:v1"), true).await;

    // a managed pod gets a truthful annotation once it changes
    c.api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["labels"]["touch"] = json!("1")
        })
        .unwrap();
    let meta = wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "both containers annotated with their env hash",
        |m| {
            m.containers.len() == 2
                && m.containers
                    .iter()
                    .all(|e| e.hashes.extracted_env_from_metadata_hash != 0)
        },
    )
    .await;
    for n in ["main", "side"] {
        let entry = meta.container(n).unwrap();
        assert_eq!(
            entry.container_id,
            support::kubelet_id(running.container(n)),
            "same ID as the pod status"
        );
        let status = c
            .kubelet
            .runtime()
            .container_status(running.container(n), false)
            .await
            .unwrap();
        let recorded = parse_hash(&status.annotations[keys::KUBELET_CONTAINER_HASH]).unwrap();
        assert_eq!(
            entry.hashes.plain_hash, recorded,
            "the kubelet's hash as the runtime recorded it"
        );
    }

    // the same change while InPlaceUpdateReady is True restarts nothing
    c.api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["annotations"]["role"] = json!("green")
        })
        .unwrap();
    c.daemon
        .wait_for_log("stale env, not stopping", LIMIT)
        .await;
    let main = running.container("main").to_string();
    assert_eq!(
        c.kubelet
            .runtime()
            .container_status(&main, false)
            .await
            .unwrap()
            .state,
        ContainerState::Running
    );

    // pending: exactly that container is stopped
    c.api
        .modify("pods", "default", &name, |p| {
            p["status"]["conditions"][0]["status"] = json!("False")
        })
        .unwrap();
    c.daemon.wait_for_log("stopping container", LIMIT).await;
    // StopContainer on a stopping container returns once it has stopped: no polling needed
    within(
        LIMIT,
        "container stop",
        c.kubelet
            .runtime()
            .stop_container(&main, Duration::from_secs(30)),
    )
    .await
    .unwrap();
    assert_eq!(
        c.kubelet
            .runtime()
            .container_status(running.container("side"), false)
            .await
            .unwrap()
            .state,
        ContainerState::Running
    );

    // the kubelet recreates it with the new value; the annotation follows
    let pod = spec_of(&c.api, &name);
    let new_main = within(
        LIMIT,
        "recreate",
        c.kubelet.recreate(
            &mut running,
            "main",
            Some(ContainerSpec::of_pod(&pod, "main")),
        ),
    )
    .await;
    report(&c.api, &name, &running, false);
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "the new main annotated",
        |m| {
            m.container("main")
                .unwrap()
                .container_id
                .ends_with(&new_main)
        },
    )
    .await;
    assert_eq!(
        echo_role(&c, &new_main).await,
        "green",
        "the new container sees the new value"
    );
    assert_eq!(stops_logged(&c.daemon), 1, "one restart");

    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn an_image_and_env_change_together_restarts_the_container_exactly_once() {
    let Some(lab) = Lab::get() else { return };
    let mut c = cluster(&lab, "node-e2e").await;
    let name = unique("web");
    let mut running = run_pod(&c, &name, &lab.image("busybox:v1"), true).await;
    c.api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["labels"]["touch"] = json!("1")
        })
        .unwrap();
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "both containers annotated",
        |m| m.containers.len() == 2,
    )
    .await;

    let v2 = lab.image("busybox:v2");
    c.api
        .modify("pods", "default", &name, |p| {
            p["spec"]["containers"][0]["image"] = json!(v2);
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"]["conditions"][0]["status"] = json!("False");
        })
        .unwrap();
    let blocked = c
        .daemon
        .wait_for_log("stale env, not stopping", LIMIT)
        .await;
    assert!(
        blocked["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("kubelet recreates"),
        "{blocked}"
    );
    // the kubelet's own restart for the new hash
    let main = running.container("main").to_string();
    within(
        LIMIT,
        "kubelet stop",
        c.kubelet
            .runtime()
            .stop_container(&main, Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let pod = spec_of(&c.api, &name);
    let new_main = within(
        LIMIT,
        "recreate",
        c.kubelet.recreate(
            &mut running,
            "main",
            Some(ContainerSpec::of_pod(&pod, "main")),
        ),
    )
    .await;
    report(&c.api, &name, &running, false);
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "the new main annotated",
        |m| {
            m.container("main")
                .unwrap()
                .container_id
                .ends_with(&new_main)
        },
    )
    .await;
    assert_eq!(
        stops_logged(&c.daemon),
        0,
        "the daemon stopped nothing: one restart in all"
    );
    assert_eq!(echo_role(&c, &new_main).await, "green");
    let version = c
        .kubelet
        .runtime()
        .exec_sync(
            &new_main,
            vec!["cat".into(), "/etc/image-version".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), "v2");

    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn an_image_without_env_binary_still_gets_its_env_hash() {
    let Some(lab) = Lab::get() else { return };
    let mut c = cluster(&lab, "node-e2e").await;
    let name = unique("noenv");
    let running = run_pod(&c, &name, &lab.image("noenv:v1"), true).await;
    // the image really has no env binary
    let r = c
        .kubelet
        .runtime()
        .exec_sync(
            running.container("main"),
            vec!["env".into()],
            Duration::from_secs(10),
        )
        .await;
    assert!(
        r.map(|o| o.exit_code != 0).unwrap_or(true),
        "env must be missing from test/noenv"
    );

    c.api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["labels"]["touch"] = json!("1")
        })
        .unwrap();
    let pod = spec_of(&c.api, &name);
    let main_spec = &pod.spec.as_ref().unwrap().containers[0];
    let expected = kruised::hash::env::expected_env_hash(
        main_spec,
        &pod.metadata.labels.clone().unwrap(),
        &pod.metadata.annotations.clone().unwrap(),
    );
    let meta = wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "main annotated with its env hash",
        |m| {
            m.container("main")
                .is_some_and(|e| e.hashes.extracted_env_from_metadata_hash != 0)
        },
    )
    .await;
    assert_eq!(
        meta.container("main")
            .unwrap()
            .hashes
            .extracted_env_from_metadata_hash,
        expected
    );

    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
}

/// The daemon's relist where the runtime sends container events: out of the test's reach, so
/// only the events can notice what the runtime does. Where it sends none: 2 s.
fn relist_args(lab: &Lab) -> [&'static str; 2] {
    if lab.runtime.has_events() {
        ["--relist-interval", "1h"]
    } else {
        ["--relist-interval", "2s"]
    }
}

/// How many lines of the daemon's log start with `message`.
fn count_logged(d: &Daemon, message: &str) -> usize {
    d.log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        })
        .count()
}

/// How long a node stays quiet in [`a_container_that_dies_while_the_node_was_quiet_is_noticed`]:
/// more than twice the deadline the event call once had (5 s), after which the daemon
/// reconnected and backed off again and again, and missed what died in between.
const QUIET: Duration = Duration::from_secs(12);

#[tokio::test]
async fn a_container_that_dies_while_the_node_was_quiet_is_noticed() {
    let Some(lab) = Lab::get() else { return };
    let mut c = cluster_with(&lab, "node-e2e", &relist_args(&lab)).await;
    let name = unique("quiet");
    let mut running = run_pod(&c, &name, &lab.image("busybox:v1"), true).await;
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "both containers annotated",
        |m| m.containers.len() == 2,
    )
    .await;
    if lab.runtime.has_events() {
        c.daemon
            .wait_for_log("following the runtime's container events", LIMIT)
            .await;
    } else {
        c.daemon
            .wait_for_log("the runtime sends no container events", LIMIT)
            .await;
    }
    // the scenario, not a synchronisation: nothing happens on the node for a while
    tokio::time::sleep(QUIET).await;
    if lab.runtime.has_events() {
        assert_eq!(
            count_logged(&c.daemon, "following the runtime's container events"),
            1,
            "one stream, for as long as the node was quiet:\n{}",
            c.daemon.log_text()
        );
        assert_eq!(count_logged(&c.daemon, "container event stream broke"), 0);
    } else {
        assert_eq!(
            count_logged(&c.daemon, "the runtime sends no container events"),
            1,
            "said once"
        );
    }

    // the container dies and the kubelet starts it again; the pod's status does not say so
    // yet: the runtime's events (or the relist where it has none) must
    let old = running.container("main").to_string();
    within(
        LIMIT,
        "container stop",
        c.kubelet.runtime().stop_container(&old, Duration::ZERO),
    )
    .await
    .unwrap();
    let new = within(
        LIMIT,
        "recreate",
        c.kubelet.recreate(&mut running, "main", None),
    )
    .await;
    let started = std::time::Instant::now();
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "the new main annotated",
        |m| m.container("main").unwrap().container_id == support::kubelet_id(&new),
    )
    .await;
    // a figure, not asserted (docs/PERFORMANCE.md)
    eprintln!(
        "{:?}: the annotation named the new container {:?} after it started",
        lab.runtime,
        started.elapsed()
    );

    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn cri_o_without_events_is_relisted_and_the_daemon_says_so_once() {
    let Some(lab) = Lab::get() else { return };
    if lab.runtime != support::LabRuntime::Crio {
        return;
    }
    // the lab's second CRI-O, with its default enable_pod_events = false
    let socket = lab.dir.join("crio-noevents/crio.sock");
    assert!(
        socket.exists(),
        "the CRI-O pass needs the lab's crio-noevents (CRI_LAB_RUNTIMES)"
    );
    let lab = Lab { socket, ..lab };
    let mut c = cluster_with(&lab, "node-e2e", &["--relist-interval", "2s"]).await;
    let name = unique("noevents");
    let mut running = run_pod(&c, &name, &lab.image("busybox:v1"), true).await;
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "both containers annotated",
        |m| m.containers.len() == 2,
    )
    .await;
    c.daemon
        .wait_for_log("the runtime sends no container events", LIMIT)
        .await;

    let old = running.container("main").to_string();
    within(
        LIMIT,
        "container stop",
        c.kubelet.runtime().stop_container(&old, Duration::ZERO),
    )
    .await
    .unwrap();
    let new = within(
        LIMIT,
        "recreate",
        c.kubelet.recreate(&mut running, "main", None),
    )
    .await;
    wait::meta(
        &c.api,
        LIMIT,
        "default",
        &name,
        "the new main annotated",
        |m| m.container("main").unwrap().container_id == support::kubelet_id(&new),
    )
    .await;
    assert_eq!(
        count_logged(&c.daemon, "the runtime sends no container events"),
        1,
        "said once:\n{}",
        c.daemon.log_text()
    );
    assert_eq!(
        count_logged(&c.daemon, "following the runtime's container events"),
        0
    );
    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
}

/// `kruised explain -o json` of pod `name` on the lab's runtime.
async fn explain(c: &Cluster, lab: &Lab, name: &str) -> Value {
    let kubeconfig = c._dir.path().join("kubeconfig");
    let out = tokio::process::Command::new(support::daemon::kruised_bin())
        .args([
            "explain",
            &format!("default/{name}"),
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .args(["--runtime-endpoint", &lab.endpoint().to_string()])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn explain_gives_the_same_answer_for_the_same_pod_on_every_runtime() {
    let Some(lab) = Lab::get() else { return };
    let mut c = cluster(&lab, "node-e2e").await;
    // explain alone: no daemon acts on the pod while it is asked about
    c.daemon.terminate();
    assert!(c.daemon.wait_exit(LIMIT).await.success());
    let name = unique("explain");
    let mut running = run_pod(&c, &name, &lab.image("busybox:v1"), false).await;
    // `main` carries a hash of neither kubelet formula (as one of another version would
    // record), so whether the kubelet recreates it is decided by its image: the runtime's
    // image identity, which each runtime reports its own way
    let mut main = ContainerSpec::of_pod(&spec_of(&c.api, &name), "main");
    main.hash = "1a2b3c4d".into();
    within(
        LIMIT,
        "stop",
        c.kubelet
            .runtime()
            .stop_container(running.container("main"), Duration::ZERO),
    )
    .await
    .unwrap();
    within(
        LIMIT,
        "recreate",
        c.kubelet.recreate(&mut running, "main", Some(main)),
    )
    .await;
    report(&c.api, &name, &running, false);
    // the update: a new value for the env, the pod out of service (InPlaceUpdateReady=False)
    c.api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["annotations"]["role"] = json!("green")
        })
        .unwrap();
    let v1 = c
        .kubelet
        .runtime()
        .image_status(&lab.image("busybox:v1"))
        .await
        .unwrap()
        .unwrap();
    let v1_id = format!("sha256:{}", v1.id.trim_start_matches("sha256:"));

    // what differs between runtimes is left out: the container IDs; and the in-place update
    // timelines, the daemon's (whichever answers on loopback), not the runtime's
    let answer = |mut v: Value| {
        v.as_object_mut().unwrap().remove("inPlaceUpdates");
        for c in v["containers"].as_array_mut().unwrap() {
            assert!(
                c["containerId"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{}://", lab.runtime.cri_name()))
            );
            c.as_object_mut().unwrap().remove("containerId");
            for r in c["restarts"].as_array_mut().unwrap() {
                r.as_object_mut().unwrap().remove("stopped");
            }
        }
        v
    };
    let same_image = answer(explain(&c, &lab, &name).await);
    let role = |v: &str| {
        kruised::hash::env::expected_env_hash(
            &spec_of(&c.api, &name).spec.unwrap().containers[0],
            &Default::default(),
            &[("role".to_string(), v.to_string())].into_iter().collect(),
        )
    };
    let (blue, green) = (role("blue"), role("green"));
    assert_eq!(
        same_image,
        json!({
            "pod": format!("default/{name}"),
            "managed": true,
            "inPlaceUpdatePending": true,
            "inPlaceUpdateState": null,
            "containers": [
                {"name": "main", "specImage": lab.image("busybox:v1"), "runningImage": v1_id,
                 "recordedHash": "1a2b3c4d",
                 "specHash": same_image["containers"][0]["specHash"],
                 "specHashLegacy": same_image["containers"][0]["specHashLegacy"],
                 "expectedEnvHash": green, "currentEnvHash": blue, "annotatedEnvHash": null,
                 "decision": "restart due (env-from-metadata): env from metadata is stale",
                 // the stop above, made here as by anyone but kruised: a restart it did not make
                 "restartCount": 1,
                 "restarts": [{"restart": 1, "byKruised": false,
                     "reason": "not stopped by kruised (a crash, an OOM kill, or the kubelet)",
                     "detail": null, "time": null, "exit": "exit code 137 (Error)"}]},
                {"name": "side", "specImage": lab.image("busybox:v1"), "runningImage": v1_id,
                 "recordedHash": same_image["containers"][1]["specHash"],
                 "specHash": same_image["containers"][1]["specHash"],
                 "specHashLegacy": same_image["containers"][1]["specHashLegacy"],
                 "expectedEnvHash": same_image["containers"][1]["expectedEnvHash"],
                 "currentEnvHash": same_image["containers"][1]["expectedEnvHash"],
                 "annotatedEnvHash": null,
                 "decision": "up to date", "restartCount": 0, "restarts": []}
            ]
        }),
        "{lab:?}"
    );

    // the spec's image changes too: another image, so the kubelet recreates the container
    c.api
        .modify("pods", "default", &name, |p| {
            p["spec"]["containers"][0]["image"] = json!(lab.image("busybox:v2"))
        })
        .unwrap();
    let other_image = answer(explain(&c, &lab, &name).await);
    assert_eq!(
        other_image["containers"][0]["decision"],
        "stale, but its spec changed too: the kubelet recreates it with the new env"
    );
    within(LIMIT, "pod removal", c.kubelet.remove_pod(&running)).await;
}
