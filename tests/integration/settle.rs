//! The kubelet's sync timing against kruised's settle model, on the fake node with
//! [`KubeletTiming`] as the kubelet: what the cluster layer proved on a real v1.36 kubelet
//! (`tests/cluster/containermeta.rs::an_env_change_during_an_update_restarts_the_container_once_with_the_new_value`,
//! `tests/cluster/dropin.rs::fifty_env_changes_under_load_restart_each_container_exactly_once_with_the_new_value`),
//! and what made a second restart possible there (`src/controller/containermeta/settle.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::manager::KubeletTiming;
use crate::support::node::{FakeNode, NODE};
use crate::support::restarts::HookServer;
use crate::support::wait;
use apiserver_double::StoreView;
use kruised::k8s::keys;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(30);
/// The kubelet's relist period (PLEG).
const RELIST: Duration = Duration::from_secs(1);

/// A kruise pod whose container `main` reads the annotation `app-config` (`v1`), gated by
/// `InPlaceUpdateReady` (True), with the preStop hooks `hooks` gives it (none without).
fn add(node: &mut FakeNode, name: &str, hooks: Option<&HookServer>) {
    let mut main = json!({"name": "main", "image": "busybox:v1",
        "env": [{"name": "APP_CONFIG", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['app-config']"}}}]});
    let mut side = json!({"name": "side", "image": "busybox:v1",
        "env": [{"name": "APP_CONFIG", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['app-config']"}}}]});
    if let Some(h) = hooks {
        main["lifecycle"] = json!({"preStop": {"exec": {"command": ["true"]}}});
        side["lifecycle"] = json!({"preStop": {"httpGet": {"port": h.port,
            "path": format!("/hook/{name}/side")}}});
    }
    node.add_pod(name, json!([main, side]), json!({"app-config": "v1"}), true);
    node.api
        .modify("pods", "default", name, |p| {
            p["spec"]["readinessGates"] = json!([{"conditionType": keys::INPLACE_UPDATE_READY}]);
        })
        .unwrap();
}

async fn daemon(node: &FakeNode, extra: &[&str]) -> Daemon {
    let mut args = node.daemon_args();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

/// The manager's in-place update of `app-config` (kruise 07169cf
/// pkg/util/inplaceupdate/inplace_update.go:326-424): the gate False through the status first,
/// then, once the kubelet took the pod for a sync (its watch delivers the first write before
/// the second), the annotation.
async fn update(node: &FakeNode, kubelet: &KubeletTiming, pod: &str, value: &str) {
    node.api
        .modify("pods", "default", pod, |p| {
            for c in p["status"]["conditions"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if c["type"] == keys::INPLACE_UPDATE_READY {
                    c["status"] = json!("False");
                    c["reason"] = json!("StartInPlaceUpdate");
                }
            }
        })
        .unwrap();
    assert!(
        kubelet.wait_sync_waiting(pod, LIMIT).await,
        "the kubelet took {pod} for a sync after the gate"
    );
    node.api
        .modify("pods", "default", pod, |p| {
            p["metadata"]["annotations"]["app-config"] = json!(value);
        })
        .unwrap();
}

/// The value `main` of `pod` runs with now (the env the fake runtime holds for its container),
/// and the container's attempt.
fn running(node: &FakeNode, pod: &str, container: &str) -> Option<(String, u32)> {
    running_in(node, &node.api.get("pods", "default", pod)?, container)
}

/// [`running`] for the pod object `obj` (read inside a wait on the API double's store).
fn running_in(node: &FakeNode, obj: &serde_json::Value, container: &str) -> Option<(String, u32)> {
    let id = obj["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|s| s["name"] == container)?["containerID"]
        .as_str()?
        .rsplit('/')
        .next()?
        .to_string();
    let st = node.cri.state();
    let c = st.containers.get(&id)?;
    let value = c
        .env
        .iter()
        .find_map(|e| e.strip_prefix("APP_CONFIG="))
        .map(String::from)?;
    Some((value, c.status.metadata.attempt))
}

/// What a wait on `container` of `pod` looks at in the store: whether kruised's annotation
/// names the container the status reports, and what that container runs with (the status names
/// a container only after the fake runtime made it, so a change of what runs is a change of the
/// store).
fn follows(
    node: &FakeNode,
    v: &StoreView<'_>,
    pod: &str,
    container: &str,
) -> (bool, Option<(String, u32)>) {
    let Some(obj) = v.get("pods", "default", pod) else {
        return (false, None);
    };
    let id = obj["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == container))
        .and_then(|s| s["containerID"].as_str());
    let annotated = wait::meta_of(&obj)
        .and_then(|m| Some(m.container(container)?.container_id.clone()))
        .is_some_and(|a| Some(a.as_str()) == id);
    (annotated, running_in(node, &obj, container))
}

/// Whether what [`follows`] saw runs `value` with the annotation following it.
fn runs(value: &str) -> impl Fn(&(bool, Option<(String, u32)>)) -> bool {
    move |(annotated, running)| *annotated && running.as_ref().is_some_and(|(v, _)| v == value)
}

fn stops(d: &Daemon, reason: &str) -> usize {
    d.log()
        .iter()
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("stopping container"))
                && (reason.is_empty() || v["reason"] == reason)
        })
        .count()
}

#[tokio::test]
async fn a_sync_holding_the_pod_from_before_the_change_recreates_the_old_value_and_kruised_corrects_it_once()
 {
    // the race the settle model waits out, made to happen: no settle (--env-restart-delay 0s),
    // and the kubelet's relist held until kruised has stopped the container, so the sync that
    // took the pod at the gate (app-config still v1) recreates it from that pod
    let mut node = FakeNode::start().await;
    add(&mut node, "web-0", None);
    let node = Arc::new(node);
    let kubelet = KubeletTiming::start(node.clone(), RELIST);
    let mut d = daemon(&node, &["--env-restart-delay", "0s"]).await;

    kubelet.hold();
    update(&node, &kubelet, "web-0", "v2").await;
    d.wait_for_logged_times("stopping container", 2, LIMIT)
        .await; // main and side
    kubelet.release();

    // the held sync recreated both from the old pod; kruised stopped each once more, and the
    // kubelet's next sync, with the pod as it now is, gave the new value: never a third stop
    for c in ["main", "side"] {
        let what = format!("web-0/{c} runs v2 and kruised's annotation follows it");
        let look = |v: &StoreView<'_>| follows(&node, v, "web-0", c);
        wait::store(&node.api, LIMIT, &what, look, runs("v2")).await;
    }
    assert_eq!(
        stops(&d, "stale-recreation"),
        2,
        "the double raced: each container came back with v1 once\n{}",
        d.log_text()
    );
    assert_eq!(stops(&d, ""), 4, "{}", d.log_text());
    assert_eq!(running(&node, "web-0", "main").map(|(_, a)| a), Some(2));
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn with_the_settle_each_change_is_one_restart_however_the_kubelets_syncs_line_up() {
    // kruised's default (auto): it stops only once a relist after the change can have been
    // seen, so the sync holding the old pod finds the container still running; each container
    // restarts exactly once, with the new value, and its preStop hook runs once (seen on the
    // real kubelet under load: tests/cluster/dropin.rs, fifty changes)
    let hooks = HookServer::start().await;
    let mut node = FakeNode::start().await;
    let pods: Vec<String> = (0..5).map(|i| format!("web-{i}")).collect();
    for p in &pods {
        add(&mut node, p, Some(&hooks));
    }
    let node = Arc::new(node);
    let kubelet = KubeletTiming::start(node.clone(), RELIST);
    let mut d = daemon(&node, &[]).await;
    let execs_before = node.cri.state().call_count("ExecSync");
    for (i, p) in pods.iter().enumerate() {
        // at different points of the relist period
        tokio::time::sleep(RELIST / 5 * u32::try_from(i).unwrap()).await;
        update(&node, &kubelet, p, "v2").await;
    }
    for p in &pods {
        for c in ["main", "side"] {
            let what = format!("{p}/{c} runs v2 and kruised's annotation follows it");
            let look = |v: &StoreView<'_>| follows(&node, v, p, c);
            wait::store(&node.api, LIMIT, &what, look, runs("v2")).await;
        }
    }
    assert_eq!(stops(&d, "stale-recreation"), 0, "{}", d.log_text());
    assert_eq!(stops(&d, ""), 2 * pods.len(), "{}", d.log_text());
    for p in &pods {
        for c in ["main", "side"] {
            assert_eq!(running(&node, p, c).map(|(_, a)| a), Some(1), "{p}/{c}");
        }
        assert_eq!(hooks.count(p, "side"), 1, "{p}: the HTTP hook ran once");
    }
    assert_eq!(
        node.cri.state().call_count("ExecSync") - execs_before,
        pods.len() as u64,
        "each exec hook ran once"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
