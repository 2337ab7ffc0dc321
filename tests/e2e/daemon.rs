//! `kruised run` as a process, against the API-server double and the real containerd lab.

use crate::support;

use std::time::Duration;

use crate::support::daemon::{Daemon, http_get};
use crate::support::{Lab, Plane};
use serde_json::json;

const START: Duration = Duration::from_secs(30);
/// The daemon's drain deadline in these tests, and the margin allowed over it.
const DRAIN: Duration = Duration::from_secs(3);

#[tokio::test]
async fn daemon_becomes_ready_serves_metrics_and_drains_on_sigterm_within_a_second() {
    let Some(lab) = Lab::get() else { return };
    let plane = Plane::start().await;
    plane
        .api
        .create(
            "pods",
            json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "busybox"}]}}),
        )
        .unwrap();
    // a drain deadline of one second: with no work in flight, SIGTERM must end the daemon
    // before it (the container event stream, open on a quiet node, once held it to the end)
    let mut d = plane
        .start_daemon(&lab, "node-a", &["--drain-timeout", "1s"], START)
        .await;
    if lab.runtime.has_events() {
        d.wait_for_log("following the runtime's container events", START)
            .await;
    }

    let (code, body) = http_get(d.admin, "/readyz").await;
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, _) = http_get(d.admin, "/healthz").await;
    assert_eq!(code, 200);
    let (code, metrics) = http_get(d.admin, "/metrics").await;
    assert_eq!(code, 200);
    assert!(metrics.contains("kruised_build_info"), "{metrics}");
    assert!(
        metrics.contains("process_resident_memory_bytes"),
        "{metrics}"
    );

    // it watched only its node's pods, with a field selector
    let watches: Vec<_> = plane
        .api
        .requests()
        .into_iter()
        .filter(|r| r.resource == "pods" && (r.verb == "list" || r.verb == "watch"))
        .collect();
    assert!(!watches.is_empty());
    for r in &watches {
        assert!(
            r.query.contains("fieldSelector=spec.nodeName%3Dnode-a"),
            "{}",
            r.query
        );
    }

    d.terminate();
    let status = d.wait_exit(DRAIN + Duration::from_secs(5)).await;
    assert!(
        status.success(),
        "exit status {status}; log: {:#?}",
        d.log()
    );
    assert!(d.logged("drained"), "log:\n{}", d.log_text());
    assert!(!d.logged("drain deadline passed"), "log:\n{}", d.log_text());
}

#[tokio::test]
async fn daemon_without_api_server_or_runtime_stays_up_and_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    // an API server address that refuses connections
    let dead = support::daemon::free_addr();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        apiserver_double::kubeconfig_for(&format!("http://{dead}")),
    )
    .unwrap();
    let missing = format!("unix://{}", dir.path().join("no-runtime.sock").display());
    let mut d = Daemon::start(
        "node-a",
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--runtime-endpoint",
            &missing,
            "--drain-timeout",
            "3s",
        ],
    );
    d.wait_for_log("watch failed", START).await;
    d.wait_for_log("container runtime not found", START).await;

    let (code, body) = http_get(d.admin, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("[-]pods"), "{body}");
    assert!(
        body.contains("[-]runtime") && body.contains("no-runtime.sock"),
        "{body}"
    );
    let (code, _) = http_get(d.admin, "/healthz").await;
    assert_eq!(code, 200, "alive, only not ready");
    assert!(d.running(), "no crash loop");

    d.terminate();
    let status = d.wait_exit(DRAIN + Duration::from_secs(5)).await;
    assert!(
        status.success(),
        "exit status {status}; log: {:#?}",
        d.log()
    );
}

#[tokio::test]
async fn daemon_refuses_to_start_without_a_node_name() {
    let out = std::process::Command::new(support::daemon::kruised_bin())
        .args(["run"])
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("NODE_NAME"), "{stderr}");
}
