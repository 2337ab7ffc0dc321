//! Authentication as the kubeconfig's user gives it, through the real binary: `kruised explain`
//! against the API double with authentication on, so a request without the right bearer token
//! is answered `401` and the command fails. The rules are client-go's; the cases (refresh,
//! expiry, providers, answers in YAML) are in src/k8s/client/auth/tests.rs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use apiserver_double::UserInfo;
use serde_json::json;

use crate::support::node::FakeNode;

const LIMIT: Duration = Duration::from_secs(20);

/// A kubeconfig for the double whose user is `user` (YAML lines under `user:`).
fn kubeconfig(node: &FakeNode, name: &str, user: &str) -> std::path::PathBuf {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: double
  cluster:
    server: {url}
contexts:
- name: double
  context: {{cluster: double, user: me, namespace: default}}
current-context: double
users:
- name: me
  user:
{user}
",
        url = node.api.url()
    );
    let path = node.dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// An executable script in the node's directory.
fn script(node: &FakeNode, name: &str, body: &str) -> String {
    let path = node.dir.path().join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

async fn explain(node: &FakeNode, kubeconfig: &Path) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"));
    cmd.args(["explain", "default/web-0", "-o", "json", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--runtime-endpoint", &node.endpoint()])
        .env_remove("KUBECONFIG")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .kill_on_drop(true);
    tokio::time::timeout(LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("kruised explain did not exit within {LIMIT:?}"))
        .unwrap()
}

/// The fake node with one pod, its double answering only the bearer token `token`.
async fn node_accepting(token: &str) -> FakeNode {
    let mut node = FakeNode::start().await;
    node.add_pod(
        "web-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({}),
        true,
    );
    node.api.control().add_token(token, UserInfo::admin());
    node
}

#[tokio::test]
async fn explain_authenticates_with_the_token_an_exec_plugin_prints_and_fails_with_a_wrong_one() {
    let node = node_accepting("from-the-plugin").await;
    for (name, token, succeeds) in [
        ("right", "from-the-plugin", true),
        ("wrong", "guessed", false),
    ] {
        let plugin = script(
            &node,
            &format!("plugin-{name}"),
            &format!(
                "echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\
                 \"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\"}}}}'"
            ),
        );
        let user = format!(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {plugin}\n      interactiveMode: Never"
        );
        let out = explain(&node, &kubeconfig(&node, name, &user)).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // without credentials the request would be system:anonymous and let in: the wrong
        // token's refusal shows the plugin's token is what is sent
        assert_eq!(out.status.success(), succeeds, "{name} token: {stderr}");
        if !succeeds {
            assert!(
                stderr.contains("401") || stderr.contains("Unauthorized"),
                "{stderr}"
            );
        }
    }
}

#[tokio::test]
async fn explain_authenticates_with_a_token_file_and_names_one_that_is_missing() {
    let node = node_accepting("from-the-file").await;
    // a request without credentials would be let in as system:anonymous: the wrong token's
    // refusal shows the file's token is what is sent
    for (name, token, succeeds) in [
        ("right", "from-the-file\n", true),
        ("wrong", "guessed", false),
    ] {
        let path = node.dir.path().join(format!("token-{name}"));
        std::fs::write(&path, token).unwrap();
        let user = format!("    tokenFile: {}", path.display());
        let out = explain(&node, &kubeconfig(&node, name, &user)).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), succeeds, "{name} token: {stderr}");
    }

    let missing = node.dir.path().join("no-such-token");
    let user = format!("    tokenFile: {}", missing.display());
    let out = explain(&node, &kubeconfig(&node, "missing", &user)).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("token file {}", missing.display())),
        "{stderr}"
    );
}

/// The in-cluster configuration's CA: certificates read from the service account's file, the
/// file kept to be read again as the CA rotates (src/k8s/client/tls.rs). The server is the
/// double over TLS with `h2`, as kube-apiserver serves; a CA that did not sign its certificate
/// (its own leaf certificate taken as one) fails the handshake.
#[tokio::test]
async fn a_ca_file_kept_for_rereading_verifies_the_server_over_h2_and_a_foreign_ca_fails() {
    use apiserver_double::{ApiServer, Config, TEST_CA_PEM, Tls};
    use kruised::k8s::client::{connect, tls};
    use tower::ServiceExt;

    let api = ApiServer::start_with(Config {
        addr: "127.0.0.1:0".parse().unwrap(),
        tls: Some(Tls::test_ca()),
        ..Config::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let version = |config: kube::Config| async move {
        let transport = connect::transport(&config, None, None).unwrap();
        let request = http::Request::get(format!("{}version", config.cluster_url))
            .body(kube::client::Body::empty())
            .unwrap();
        tokio::time::timeout(LIMIT, transport.oneshot(request))
            .await
            .expect("an answer or an error within the limit")
    };
    let config_with = |pem: &str, name: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, pem).unwrap();
        let mut config = kube::Config::new(format!("{}/", api.url()).parse().unwrap());
        config.root_cert = Some(tls::pem_certificates(pem.as_bytes()).unwrap());
        config.root_cert_file = Some(file);
        config
    };

    let answer = version(config_with(TEST_CA_PEM, "ca.crt"))
        .await
        .expect("the server's certificate is signed by the file's CA");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.version(), http::Version::HTTP_2);

    let leaf = Tls::test_ca().cert_chain_pem;
    let err = version(config_with(&leaf, "foreign.crt"))
        .await
        .expect_err("a CA that did not sign the server's certificate");
    let chain = std::iter::successors(Some(&*err as &dyn std::error::Error), |e| e.source())
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    assert!(chain.contains("certificate"), "{chain}");
}
