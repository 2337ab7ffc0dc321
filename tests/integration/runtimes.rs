//! Nodes where more than one container runtime answers (containerd and CRI-O side by side):
//! kruise-daemon's image puller talked to the first runtime found, not the kubelet's (kruise
//! #1825). kruised makes the runtime the Node reports in `status.nodeInfo.
//! containerRuntimeVersion` the primary one (images go there), and says which and why in its
//! log, `/readyz?verbose` and `kruised version`. Two fake runtimes answer as containerd 2.x and
//! CRI-O 1.36.3 under the host's run directory, at the sockets detection looks for.

use std::time::Duration;

use apiserver_double::{ApiServer, Handle};
use kruised::cri::fake::{Dialect, FakeRuntime};
use serde_json::json;

use crate::pull_support::{self, NODE};
use crate::support::cluster::Rbac;
use crate::support::daemon::{Daemon, http_get};
use crate::support::rbac::identity_on_double;
use crate::support::wait;

const LIMIT: Duration = Duration::from_secs(30);
/// What the Node of a CRI-O kubelet reports: `<CRI Version's runtimeName>://<runtimeVersion>`
/// (kubernetes pkg/kubelet/nodestatus/setters.go `VersionInfo`), CRI-O 1.36.3 answering
/// `cri-o` / `1.36.3` (the runtime notes, docs/runtimes.md).
const CRIO_KUBELET: &str = "cri-o://1.36.3";
const IMAGE: &str = "r.io/app";

/// The API-server double with the node's Node, and containerd and CRI-O answering under one
/// host run directory (containerd's socket first in detection's order).
struct TwoRuntimes {
    api: Handle,
    dir: tempfile::TempDir,
    containerd: FakeRuntime,
    crio: FakeRuntime,
}

impl TwoRuntimes {
    async fn start(kubelets: &str) -> TwoRuntimes {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["containerd", "crio"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let containerd = FakeRuntime::start_as(
            &dir.path().join("containerd/containerd.sock"),
            Dialect::Containerd2,
        )
        .await
        .unwrap();
        let crio = FakeRuntime::start_as(&dir.path().join("crio/crio.sock"), Dialect::CriO)
            .await
            .unwrap();
        std::fs::write(dir.path().join("crictl.yaml"), "").unwrap();
        let api = ApiServer::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        api.write_kubeconfig(dir.path().join("kubeconfig")).unwrap();
        api.create(
            "nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                   "status": {"nodeInfo": {"containerRuntimeVersion": kubelets,
                       "kubeletVersion": "v1.36.2", "operatingSystem": "linux",
                       "architecture": "amd64", "machineID": "", "systemUUID": "", "bootID": "",
                       "kernelVersion": "", "osImage": "", "kubeProxyVersion": ""}}}),
        )
        .unwrap();
        TwoRuntimes {
            api,
            dir,
            containerd,
            crio,
        }
    }

    /// `kruised run` with `kubeconfig`, finding the runtimes by detection; ready.
    async fn daemon(&self, kubeconfig: &std::path::Path) -> Daemon {
        let kubeconfig = kubeconfig.display().to_string();
        let run_dir = self.dir.path().display().to_string();
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
        d
    }

    /// Pulls `IMAGE:v1` through the node's NodeImage; returns the pulls each runtime saw.
    async fn pull(&self) -> (usize, usize) {
        pull_support::create_node_image(
            &self.api,
            json!({IMAGE: {"tags": [{"tag": "v1", "version": 1}]}}),
            None,
        );
        let v1 = "v1 Succeeded";
        wait::node_image(&self.api, pull_support::LIMIT, NODE, v1, |s| {
            s.succeeded == 1
        })
        .await;
        let pulls = |rt: &FakeRuntime| {
            rt.state()
                .pulls
                .iter()
                .filter(|p| p.image.starts_with(IMAGE))
                .count()
        };
        (pulls(&self.containerd), pulls(&self.crio))
    }
}

async fn readyz(d: &Daemon) -> String {
    let (code, body) = http_get(d.admin, "/readyz?verbose").await;
    assert_eq!(code, 200, "{body}");
    body
}

#[tokio::test]
async fn on_a_node_with_containerd_and_cri_o_images_go_to_the_runtime_the_node_reports() {
    let node = TwoRuntimes::start(CRIO_KUBELET).await;
    let mut d = node.daemon(&node.dir.path().join("kubeconfig")).await;
    let chosen = d.wait_for_log("primary container runtime", LIMIT).await;
    assert_eq!(chosen["runtime"], "cri-o", "{chosen}");
    assert_eq!(
        node.pull().await,
        (0, 1),
        "(containerd, CRI-O): the kubelet's runtime pulled"
    );
    let body = readyz(&d).await;
    assert!(
        body.contains("[+]runtime ok: cri-o at unix://")
            && body.contains(&format!("the Node reports {CRIO_KUBELET}")),
        "readyz says which and why: {body}"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[tokio::test]
async fn where_the_node_reports_containerd_images_go_to_containerd() {
    let node = TwoRuntimes::start("containerd://2.1.9").await;
    let mut d = node.daemon(&node.dir.path().join("kubeconfig")).await;
    assert_eq!(node.pull().await, (1, 0), "(containerd, CRI-O)");
    assert!(
        readyz(&d)
            .await
            .contains("the Node reports containerd://2.1.9")
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

// kruise's chart 1.9 grants no `get` on nodes (tests/fixtures/kruise-chart/rbac.yaml): the Node
// is refused, and the first runtime found stays primary, as kruise-daemon had it, said in the
// log and /readyz (deploy/overlays/swap-kruise-daemon/node-reader.yaml grants the read).
#[tokio::test]
async fn with_kruises_chart_rbac_the_first_runtime_found_stays_primary_and_readyz_says_why() {
    let node = TwoRuntimes::start(CRIO_KUBELET).await;
    let identity = identity_on_double(&node.api, Rbac::KruiseChart, node.dir.path());
    let mut d = node.daemon(&identity.kubeconfig).await;
    let chosen = d
        .wait_for_log("primary container runtime: the first found", LIMIT)
        .await;
    assert_eq!(chosen["runtime"], "containerd", "{chosen}");
    assert_eq!(node.pull().await, (1, 0), "(containerd, CRI-O)");
    let body = readyz(&d).await;
    assert!(
        body.contains("[+]runtime ok: containerd at unix://")
            && body.contains("the first that answers, of several: kruised may not read its Node")
            && body.contains("node-reader.yaml"),
        "readyz says which, why, and what grants the read: {body}"
    );
    let refused: Vec<_> = node.api.refusals();
    assert!(
        refused
            .iter()
            .all(|r| r.resource == "nodes" && r.verb == "get"),
        "only the Node's read was refused: {refused:#?}"
    );
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

/// `kruised version` over the two runtimes, asking the Node when `node_name` is given.
async fn version(node: &TwoRuntimes, node_name: Option<&str>) -> String {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"));
    cmd.env_remove("CONTAINER_RUNTIME_ENDPOINT")
        .env_remove("IMAGE_SERVICE_ENDPOINT")
        .env_remove("CRI_CONFIG_FILE")
        .env_remove("NODE_NAME")
        .env("KUBECONFIG", node.dir.path().join("kubeconfig"))
        .args(["version", "--host-run-dir"])
        .arg(node.dir.path())
        .arg("--config")
        .arg(node.dir.path().join("crictl.yaml"));
    if let Some(n) = node_name {
        cmd.args(["--node-name", n]);
    }
    let out = tokio::time::timeout(LIMIT, cmd.output())
        .await
        .expect("kruised version ended")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kruised_version_lists_both_runtimes_and_names_the_primary_one_and_why() {
    let node = TwoRuntimes::start(CRIO_KUBELET).await;
    let out = version(&node, Some(NODE)).await;
    assert!(out.contains("RuntimeName:  containerd\n"), "{out}");
    assert!(out.contains("RuntimeName:  cri-o\n"), "{out}");
    assert!(out.contains("PrimaryRuntime:  cri-o\n"), "{out}");
    assert!(
        out.contains(&format!(
            "PrimaryBecause:  the kubelet's: the Node reports {CRIO_KUBELET}"
        )),
        "{out}"
    );
    assert!(
        out.find("RuntimeName:  cri-o") < out.find("RuntimeName:  containerd"),
        "the primary first: {out}"
    );

    let out = version(&node, None).await;
    assert!(out.contains("PrimaryRuntime:  containerd\n"), "{out}");
    assert!(
        out.contains("no --node-name (NODE_NAME) to ask its Node with"),
        "{out}"
    );
}
