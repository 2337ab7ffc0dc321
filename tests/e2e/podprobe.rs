//! NodePodProbe end to end: the `kruised` binary against real containerd + runc (the lab),
//! the API-server double as control plane, this test as the kubelet (host-network pods through
//! CRI) and as kruise-manager (it writes the NodePodProbe spec).

use crate::support;

use std::time::Duration;

use crate::support::daemon::free_addr;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::wait;
use crate::support::{Lab, Plane, unique, within};
use kruised::cri::RuntimeService;
use kruised::k8s::crd::{NodePodProbe, ProbeState};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(60);
const NODE: &str = "node-probe";

fn probe(name: &str, handler: Value) -> Value {
    let mut p = json!({"periodSeconds": 1, "timeoutSeconds": 2});
    for (k, v) in handler.as_object().unwrap() {
        p[k] = v.clone();
    }
    json!({"name": name, "containerName": "main", "probe": p})
}

#[tokio::test]
async fn exec_http_and_tcp_probes_report_their_states_and_transitions_and_removed_probes_vanish() {
    let Some(lab) = Lab::get() else { return };
    let plane = Plane::start().await;
    let api = &plane.api;
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    let image = lab.image("busybox:v1");
    kubelet.pull(std::slice::from_ref(&image), LIMIT).await;

    // a host-network server on a free port, in a container of its own
    let port = free_addr().port();
    let mut srv = ContainerSpec::sleeper("srv", &image);
    srv.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "mkdir -p /www && echo up > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www"
        ),
    ];
    let name = unique("probed");
    let pod = within(
        LIMIT,
        "pod start",
        kubelet.run_pod(PodSpec::new(
            &name,
            vec![ContainerSpec::sleeper("main", &image), srv],
        )),
    )
    .await;
    let uid = pod.spec.uid.clone();
    let probes = json!([
        probe(
            "m#exec-ok",
            json!({"exec": {"command": ["sh", "-c", "echo fine"]}})
        ),
        probe(
            "m#exec-fail",
            json!({"exec": {"command": ["sh", "-c", "echo nope >&2; exit 1"]}})
        ),
        probe(
            "m#exec-flip",
            json!({"exec": {"command": ["test", "-f", "/tmp/ready"]}})
        ),
        probe(
            "m#http",
            json!({"httpGet": {"port": port, "path": "/index.html", "scheme": "HTTP"}})
        ),
        probe("m#tcp", json!({"tcpSocket": {"port": port}})),
    ]);
    api.create(
        "nodepodprobes",
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
               "metadata": {"name": NODE},
               "spec": {"podProbes": [{"name": name, "namespace": "default", "uid": uid,
                                       "IP": "127.0.0.1", "probes": probes}]}}),
    )
    .unwrap();
    let mut d = plane.start_daemon(&lab, NODE, &[], LIMIT).await;

    assert_eq!(
        wait::probe_state(api, LIMIT, NODE, &uid, "m#exec-ok", ProbeState::Succeeded).await,
        "fine"
    );
    assert_eq!(
        wait::probe_state(api, LIMIT, NODE, &uid, "m#exec-fail", ProbeState::Failed).await,
        "nope"
    );
    wait::probe_state(api, LIMIT, NODE, &uid, "m#exec-flip", ProbeState::Failed).await;
    // no body in the message: the kubelet reports none (2c6dc4e reported the server's)
    assert_eq!(
        wait::probe_state(api, LIMIT, NODE, &uid, "m#http", ProbeState::Succeeded).await,
        ""
    );
    wait::probe_state(api, LIMIT, NODE, &uid, "m#tcp", ProbeState::Succeeded).await;

    // the flip: the file appears in the container
    kubelet
        .runtime()
        .exec_sync(
            pod.container("main"),
            vec!["touch".into(), "/tmp/ready".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    wait::probe_state(api, LIMIT, NODE, &uid, "m#exec-flip", ProbeState::Succeeded).await;
    let npp: NodePodProbe =
        serde_json::from_value(api.get("nodepodprobes", "", NODE).unwrap()).unwrap();
    let flip = npp
        .status
        .unwrap()
        .probe_state(&uid, "m#exec-flip")
        .unwrap()
        .clone();
    assert!(flip.last_transition_time.is_some() && flip.last_probe_time.is_some());

    // the server stops: HTTP and TCP fail with the dial error
    kubelet
        .runtime()
        .stop_container(pod.container("srv"), Duration::from_secs(2))
        .await
        .unwrap();
    let http = wait::probe_state(api, LIMIT, NODE, &uid, "m#http", ProbeState::Failed).await;
    // a probe that meets the server while it stops gets the connection reset instead
    assert!(
        http.contains("connect") || http.contains("refused") || http.contains("reset"),
        "{http}"
    );
    let tcp = wait::probe_state(api, LIMIT, NODE, &uid, "m#tcp", ProbeState::Failed).await;
    assert!(
        tcp.starts_with(&format!("dial tcp 127.0.0.1:{port}")),
        "{tcp}"
    );

    // a probe removed from the spec is removed from the status
    api.modify("nodepodprobes", "", NODE, |o| {
        o["spec"]["podProbes"][0]["probes"]
            .as_array_mut()
            .unwrap()
            .remove(0);
    })
    .unwrap();
    api.wait_for_value(LIMIT, |v| {
        let npp: NodePodProbe = serde_json::from_value(v.get("nodepodprobes", "", NODE)?).ok()?;
        let status = npp.status?;
        (status.probe_state(&uid, "m#exec-ok").is_none()
            && status.probe_state(&uid, "m#tcp").is_some())
        .then_some(())
    })
    .await
    .expect("the removed probe's state dropped");

    let (_, metrics) = support::daemon::http_get(d.admin, "/metrics").await;
    for want in [
        r#"kruised_podprobe_runs_total{handler="exec",result="succeeded"}"#,
        r#"kruised_podprobe_runs_total{handler="http",result="failed"}"#,
        "kruised_podprobe_duration_seconds_count{handler=\"tcp\"}",
    ] {
        assert!(metrics.contains(want), "{want} missing from\n{metrics}");
    }
    let events: Vec<Value> = api.list("events", None);
    assert!(events.iter().any(|e| e["reason"] == "KruiseProbeSucceeded"));
    assert!(events.iter().any(|e| e["reason"] == "KruiseProbeFailed"));
    within(LIMIT, "pod removal", kubelet.remove_pod(&pod)).await;
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
