//! A warm set for new nodes (`--startup-taint`): the `kruised` binary against the API-server
//! double and the fake runtime removes the startup taint from its own Node once the NodeImage
//! tags listed at its start are pulled, or at the deadline when one never finishes; someone
//! else's taint, also one added between kruised's read and its write, stays; without the flag
//! nothing is written to the Node. Under the RBAC of `deploy/` plus the opt-in overlay
//! `deploy/overlays/startup-taint`, nothing refused; under `deploy/`'s alone, the taint stays and
//! kruised says which right it lacks.

use std::time::Duration;

use crate::support::daemon::Daemon;
use crate::support::node::{FakeNode, NODE};
use crate::support::rbac::{
    DEPLOY_RBAC_YAML, assert_never_forbidden, assert_nothing_refused, identity_with,
};
use crate::support::wait;
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(30);
const KEY: &str = "kruised.io/warm-set";
/// The overlay's grant of `patch` on nodes.
const OVERLAY_RBAC_YAML: &str =
    include_str!("../../deploy/overlays/startup-taint/node-taint-remover.yaml");

fn taint(key: &str, value: &str, effect: &str) -> Value {
    json!({"key": key, "value": value, "effect": effect})
}

/// The Node with the startup taint and someone else's.
fn create_node(node: &FakeNode) {
    node.api
        .create(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                   "spec": {"taints": [taint(KEY, "", "NoSchedule"),
                                       taint("dedicated", "gpu", "NoSchedule")]}}),
        )
        .unwrap();
}

fn create_node_image(node: &FakeNode, tags: &[&str]) {
    let tags: Vec<Value> = tags
        .iter()
        .map(|t| json!({"tag": t, "version": 1}))
        .collect();
    let images = if tags.is_empty() {
        json!({})
    } else {
        json!({"r.io/app": {"tags": tags}})
    };
    node.api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                   "metadata": {"name": NODE}, "spec": {"images": images}}),
        )
        .unwrap();
}

fn taints(node: &FakeNode) -> Vec<Value> {
    let n = node.api.get("nodes", "", NODE).expect("the Node");
    n["spec"]["taints"].as_array().cloned().unwrap_or_default()
}

fn keys(taints: &[Value]) -> Vec<&str> {
    taints.iter().filter_map(|t| t["key"].as_str()).collect()
}

/// Waits until the Node has no taint with [`KEY`]; returns its taints then.
async fn startup_taint_gone(node: &FakeNode, what: &str) -> Vec<Value> {
    wait::store(
        &node.api,
        LIMIT,
        what,
        |v| {
            v.get("nodes", "", NODE)
                .and_then(|n| n["spec"]["taints"].as_array().cloned())
                .unwrap_or_default()
        },
        |t| !keys(t).contains(&KEY),
    )
    .await
}

fn node_patches(node: &FakeNode) -> usize {
    node.api
        .requests()
        .iter()
        .filter(|r| r.verb == "patch" && r.resource == "nodes")
        .count()
}

/// `kruised run` for the node with `args` more, as `kubeconfig`'s user; ready.
async fn start(node: &FakeNode, kubeconfig: &std::path::Path, args: &[&str]) -> Daemon {
    let mut all = crate::support::daemon_args(kubeconfig, &node.endpoint());
    all.extend(args.iter().map(|a| a.to_string()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &all);
    d.wait_for_log("daemon ready", LIMIT).await;
    d
}

#[tokio::test]
async fn a_new_node_is_untainted_once_its_node_images_tags_are_pulled_and_a_restart_writes_nothing()
{
    let node = FakeNode::start().await;
    create_node(&node);
    create_node_image(&node, &["v1", "v2"]);
    let id = identity_with(
        &node.api,
        "kruised",
        &format!("{DEPLOY_RBAC_YAML}\n---\n{OVERLAY_RBAC_YAML}"),
        node.dir.path(),
    );
    // the NodeImage may not say "Succeeded" until the test lets it
    let held = node
        .api
        .hold_requests("patch", "nodeimages/status", "Succeeded");
    let mut d = start(&node, &id.kubeconfig, &["--startup-taint", KEY]).await;
    node.api
        .wait_for_requests(LIMIT, |log| {
            log.records()
                .any(|r| r.resource == "nodeimages/status" && r.body.contains("Succeeded"))
        })
        .await
        .expect("kruised reports the pulls done");
    assert_eq!(
        keys(&taints(&node)),
        [KEY, "dedicated"],
        "tainted while the NodeImage does not say its tags are pulled"
    );
    assert_eq!(node_patches(&node), 0);
    held.release();

    let left = startup_taint_gone(&node, "the startup taint removed").await;
    assert_eq!(left, [taint("dedicated", "gpu", "NoSchedule")], "only it");
    let line = d.wait_for_log("Removed taint", LIMIT).await;
    let said = line["message"].as_str().unwrap();
    assert!(
        said.contains("the 2 NodeImage tags listed at start are finished: 2 pulled, 0 failed"),
        "{said}"
    );
    let events = wait::events(&node.api, LIMIT, "StartupTaintRemoved", 1).await;
    assert_eq!(events[0]["involvedObject"]["kind"], "Node");
    assert_eq!(events[0]["involvedObject"]["name"], NODE);
    assert_eq!(events[0]["type"], "Normal");
    assert_eq!(events[0]["message"], said);
    assert_eq!(node_patches(&node), 1, "one write");
    let patch = node
        .api
        .requests()
        .into_iter()
        .find(|r| r.verb == "patch" && r.resource == "nodes")
        .unwrap();
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/json-patch+json")
    );
    assert!(
        !patch.body.contains("dedicated"),
        "the write carries no other taint: {}",
        patch.body
    );

    // a restart after the removal: the taint is gone, nothing to do
    d.terminate();
    d.wait_exit(LIMIT).await;
    let mut again = start(&node, &id.kubeconfig, &["--startup-taint", KEY]).await;
    again
        .wait_for_log("the Node has no startup taint: nothing to do", LIMIT)
        .await;
    assert_eq!(node_patches(&node), 1, "nothing written after a restart");
    assert_never_forbidden(&d);
    assert_never_forbidden(&again);
    assert_nothing_refused(&node.api);
}

#[tokio::test]
async fn a_new_node_is_untainted_at_the_deadline_when_a_tag_never_finishes_pulling() {
    let node = FakeNode::start().await;
    create_node(&node);
    // v1 is on the node already (IfNotPresent: no pull); every pull, so slow's, takes an hour
    node.cri.state().add_image("r.io/app:v1");
    node.cri.delay("PullImage.body", Duration::from_secs(3600));
    node.api
        .create(
            "nodeimages",
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                   "metadata": {"name": NODE}, "spec": {"images": {"r.io/app": {"tags": [
                       {"tag": "v1", "version": 1, "imagePullPolicy": "IfNotPresent"},
                       {"tag": "slow", "version": 1}]}}}}),
        )
        .unwrap();
    let mut d = start(
        &node,
        &node.kubeconfig(),
        &["--startup-taint", KEY, "--startup-taint-deadline", "5s"],
    )
    .await;
    d.wait_for_log("warm set taken from the NodeImage", LIMIT)
        .await;
    let left = startup_taint_gone(&node, "the startup taint removed at the deadline").await;
    assert_eq!(left, [taint("dedicated", "gpu", "NoSchedule")]);
    let line = d.wait_for_log("Removed taint", LIMIT).await;
    let said = line["message"].as_str().unwrap();
    assert!(
        said.contains("deadline (5s after the Node's creation) passed with 1 of the 2")
            && said.contains("r.io/app:slow Pulling); 1 pulled, 0 failed"),
        "{said}"
    );
    assert_eq!(line["level"], "WARN", "{line}");
    let events = wait::events(&node.api, LIMIT, "StartupTaintRemoved", 1).await;
    assert_eq!(events[0]["type"], "Warning");
    assert_eq!(events[0]["message"], said);
    let status = wait::node_image_status(node.api.get("nodeimages", "", NODE)).unwrap();
    assert_eq!(
        (status.succeeded, status.pulling),
        (1, 1),
        "slow is still being pulled"
    );
}

#[tokio::test]
async fn someone_elses_taint_added_between_kruiseds_read_and_its_write_stays() {
    let node = FakeNode::start().await;
    create_node(&node);
    // nothing to pull: the taint goes at once
    create_node_image(&node, &[]);
    let held = node.api.hold_requests("patch", "nodes", "");
    let mut d = start(&node, &node.kubeconfig(), &["--startup-taint", KEY]).await;
    node.api
        .wait_for_requests(LIMIT, |log| log.count("patch", "nodes") == 1)
        .await
        .expect("kruised's write arrives");
    // another writer puts a taint first in the list, after kruised read the Node
    node.api
        .modify("nodes", "", NODE, |n| {
            let list = n["spec"]["taints"].as_array_mut().unwrap();
            list.insert(0, taint("late", "1", "NoExecute"));
        })
        .unwrap();
    held.release();

    let left = startup_taint_gone(&node, "the startup taint removed").await;
    assert_eq!(
        left,
        [
            taint("late", "1", "NoExecute"),
            taint("dedicated", "gpu", "NoSchedule")
        ],
        "the other writer's taint and the old one stay, in their order"
    );
    d.wait_for_log("Removed taint", LIMIT).await;
    assert_eq!(
        node_patches(&node),
        2,
        "the first write refused (the Node changed), the second made on a fresh read"
    );
    let line = d.wait_for_log("Removed taint", LIMIT).await;
    assert_eq!(line["conflicts"], 1, "{line}");
}

#[tokio::test]
async fn without_the_flag_kruised_writes_nothing_to_its_node() {
    let node = FakeNode::start().await;
    create_node(&node);
    create_node_image(&node, &["v1"]);
    let d = start(&node, &node.kubeconfig(), &[]).await;
    wait::node_image(&node.api, LIMIT, NODE, "v1 pulled", |s| s.succeeded == 1).await;
    assert_eq!(node_patches(&node), 0, "no write to the Node");
    assert_eq!(
        keys(&taints(&node)),
        [KEY, "dedicated"],
        "taints as they were"
    );
    assert!(!d.logged("startup taint"), "{}", d.log_text());
}

#[tokio::test]
async fn with_only_the_base_rbac_the_taint_stays_and_kruised_names_the_right_it_lacks() {
    let node = FakeNode::start().await;
    create_node(&node);
    create_node_image(&node, &[]);
    let id = identity_with(&node.api, "kruised", DEPLOY_RBAC_YAML, node.dir.path());
    let mut d = start(&node, &id.kubeconfig, &["--startup-taint", KEY]).await;
    let line = d
        .wait_for_log("kruised may not patch its Node", LIMIT)
        .await;
    assert_eq!(line["level"], "ERROR", "{line}");
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .contains("deploy/overlays/startup-taint"),
        "{line}"
    );
    assert_eq!(
        keys(&taints(&node)),
        [KEY, "dedicated"],
        "taints as they were"
    );
    assert_eq!(node_patches(&node), 1, "one refused write, not retried");
}

/// `deploy/overlays/startup-taint/args.yaml`, the JSON patch an operator applies to the shipped
/// DaemonSet, adds flags kruised accepts, naming the taint the docs name.
#[test]
fn the_overlays_args_patch_gives_the_shipped_daemonset_a_startup_taint_kruised_accepts() {
    use clap::Parser as _;
    let read = |path: &str| {
        let full = concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + path;
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {full}: {e}"))
    };
    let daemonset = serde_saphyr::from_multiple::<Value>(&read("deploy/daemonset.yaml"))
        .expect("deploy/daemonset.yaml is YAML")
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let ops: Vec<Value> = serde_saphyr::from_str(&read("deploy/overlays/startup-taint/args.yaml"))
        .expect("args.yaml is a list of operations");
    let mut args: Vec<String> = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the container's args")
        .iter()
        .map(|a| {
            a.as_str()
                .expect("a string")
                .replace("$(POD_IP)", "10.0.0.7")
        })
        .collect();
    for op in &ops {
        assert_eq!(op["op"], "add", "{op}");
        assert_eq!(
            op["path"], "/spec/template/spec/containers/0/args/-",
            "{op}"
        );
        args.push(op["value"].as_str().expect("a flag").to_string());
    }
    let argv = std::iter::once("kruised".to_string()).chain(args);
    let cli = kruised::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("the flags parse: {e}"));
    let kruised::Command::Run(mut run) = cli.command else {
        panic!("the container runs the daemon")
    };
    run.node_name = Some(NODE.into());
    let config = run
        .resolve()
        .unwrap_or_else(|e| panic!("the flags resolve: {e}"));
    assert_eq!(
        config.startup_taint,
        Some(kruised::config::StartupTaint {
            key: KEY.into(),
            deadline: Duration::from_secs(600)
        })
    );
}
