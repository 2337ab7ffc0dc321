//! The API client through proxies as kubectl takes them, and with no system CA certificates:
//! `kruised run` and `kruised explain` against the API double behind a small proxy on loopback
//! (tests/support/proxy.rs). The server is named `apiserver.test`, which only the proxy
//! resolves, so a request that went around the proxy could not have succeeded. For https the
//! double (plain HTTP) sits behind a TLS front with the test CA.
//!
//! The rules are client-go's: a kubeconfig `proxy-url` for every request (clientcmd
//! `client_config.go`), else `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` as Go's
//! `http.ProxyFromEnvironment` reads them (golang.org/x/net `http/httpproxy/proxy.go`); the
//! table of Go's own cases is in src/k8s/client/proxy/tests.rs.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::daemon::{Daemon, free_addr, kruised_bin};
use crate::support::node::{FakeNode, NODE};
use crate::support::proxy::{API_NAME, CA_PEM, Proxy, TlsFront, kubeconfig};

const LIMIT: Duration = Duration::from_secs(20);

/// Every proxy variable, set empty (which Go and kruised read as unset): the tests' own
/// environment must not decide.
const NO_PROXY_ENV: [(&str, &str); 6] = [
    ("HTTP_PROXY", ""),
    ("http_proxy", ""),
    ("HTTPS_PROXY", ""),
    ("https_proxy", ""),
    ("NO_PROXY", ""),
    ("no_proxy", ""),
];

/// The fake node, its double behind TLS, and a proxy that resolves [`API_NAME`] to the TLS
/// front.
struct Setup {
    node: FakeNode,
    tls: TlsFront,
    proxy: Proxy,
}

impl Setup {
    async fn start() -> Setup {
        let node = FakeNode::start().await;
        let tls = TlsFront::start(node.api.addr()).await;
        let proxy = Proxy::start(&[(API_NAME, tls.addr)]).await;
        Setup { node, tls, proxy }
    }

    /// `https://apiserver.test:<TLS front's port>`.
    fn https_url(&self) -> String {
        format!("https://{API_NAME}:{}", self.tls.addr.port())
    }

    /// The target the proxy must have been asked for.
    fn target(&self) -> String {
        format!("{API_NAME}:{}", self.tls.addr.port())
    }

    fn write_kubeconfig(&self, name: &str, text: &str) -> PathBuf {
        let path = self.node.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// `kruised explain default/<pod> -o json` with `kubeconfig` and exactly the proxy variables
/// of `env` (all others removed), at most [`LIMIT`].
async fn explain(node: &FakeNode, pod: &str, kubeconfig: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"));
    cmd.args([
        "explain",
        &format!("default/{pod}"),
        "-o",
        "json",
        "--kubeconfig",
    ])
    .arg(kubeconfig)
    .args(["--runtime-endpoint", &node.endpoint()])
    .env_remove("KUBECONFIG")
    .envs(NO_PROXY_ENV)
    .envs(env.iter().copied())
    .kill_on_drop(true);
    tokio::time::timeout(LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("kruised explain did not exit within {LIMIT:?}"))
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Starts `kruised run` on the fake node with `kubeconfig` and the proxy variables of `env`,
/// its admin server on a free port (returned), and waits until it is ready.
async fn run(node: &FakeNode, kubeconfig: &Path, env: &[(&str, &str)]) -> (Daemon, String) {
    let admin = free_addr().to_string();
    let kubeconfig = kubeconfig.display().to_string();
    let endpoint = node.endpoint();
    let args = [
        "--log-format",
        "json",
        "run",
        "--node-name",
        NODE,
        "--addr",
        &admin,
        "--kubeconfig",
        &kubeconfig,
        "--runtime-endpoint",
        &endpoint,
        "--drain-timeout",
        "3s",
    ];
    let mut envs: Vec<(&str, &str)> = NO_PROXY_ENV.to_vec();
    envs.extend_from_slice(env);
    let mut d = Daemon::start_exe(&kruised_bin(), &args, &envs);
    d.wait_for_log("daemon ready", LIMIT).await;
    (d, admin)
}

/// The body of `GET /metrics` on the admin server at `addr`.
async fn scrape(addr: &str) -> String {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        body
    };
    tokio::time::timeout(LIMIT, fetch)
        .await
        .unwrap_or_else(|_| panic!("/metrics did not answer within {LIMIT:?}"))
}

/// The value of the sample `series` (name and labels exactly as exposed) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// The field report: `HTTPS_PROXY` in a systemd unit, an https API server. kruised tunnels
/// with `CONNECT` as client-go does (Go's transport, `HTTPS_PROXY` for https URLs) and becomes
/// ready; every request got an answer through the tunnel (client-go's own
/// `rest_client_requests_total` has no `<error>`), and only the proxy can reach the name.
#[tokio::test]
async fn run_is_ready_through_https_proxy_from_the_environment_and_counts_its_requests() {
    let mut s = Setup::start().await;
    let path = s.write_kubeconfig("kc", &kubeconfig(&s.https_url(), Some(CA_PEM), None));
    let proxy_url = s.proxy.url("http");
    let (d, admin) = run(&s.node, &path, &[("HTTPS_PROXY", &proxy_url)]).await;

    s.proxy
        .wait_until("a CONNECT tunnel", LIMIT, |st| st.tunnels >= 1)
        .await;
    let stats = s.proxy.stats();
    assert_eq!(stats.forwarded, 0, "https goes through tunnels: {stats:?}");
    assert!(
        stats.targets.iter().all(|t| *t == s.target()),
        "every tunnel is to the API server: {stats:?}"
    );
    assert!(
        !s.node.api.requests().is_empty(),
        "the double served the daemon's requests"
    );

    let metrics = scrape(&admin).await;
    let host = s.target();
    let ok = sample(
        &metrics,
        &format!("rest_client_requests_total{{code=\"200\",method=\"GET\",host=\"{host}\"}}"),
    );
    assert!(ok.is_some_and(|n| n >= 1.0), "{metrics}");
    assert!(
        !metrics.contains("code=\"<error>\""),
        "a request got no answer: {metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "rest_client_request_duration_seconds_count{{verb=\"GET\",host=\"{host}\"}}"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("\nkruised_build_info{"), "{metrics}");
    drop(d);
}

/// The field report's own case: a kubeconfig with `proxy-url` made `explain` exit 1 ("requires
/// the disabled feature kube/http-proxy"). Now it goes through the proxy and exits 0; and the
/// kubeconfig's proxy wins over the environment (client-go sets `rest.Config.Proxy` from it),
/// even with `NO_PROXY=*`.
#[tokio::test]
async fn explain_exits_0_through_the_kubeconfig_proxy_url_which_wins_over_the_environment() {
    let mut s = Setup::start().await;
    s.node.add_pod(
        "web-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({}),
        true,
    );
    let kc = kubeconfig(&s.https_url(), Some(CA_PEM), Some(&s.proxy.url("http")));
    let path = s.write_kubeconfig("kc", &kc);
    let out = explain(
        &s.node,
        "web-0",
        &path,
        &[("HTTPS_PROXY", "http://127.0.0.1:9"), ("NO_PROXY", "*")],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["pod"], "default/web-0", "{view}");
    s.proxy
        .wait_until("the kubeconfig proxy's tunnel", LIMIT, |st| st.tunnels >= 1)
        .await;
    assert_eq!(s.proxy.stats().targets, vec![s.target()]);
}

/// An http API server: `HTTP_PROXY` applies, and Go's transport forwards absolute-form
/// requests to an HTTP proxy instead of tunnelling. `0.0.0.0` reaches the loopback listener on
/// Linux yet is no loopback address by Go's rules (`net.IP.IsLoopback`: 127/8 and ::1), so the
/// proxy applies to it; `NO_PROXY` naming it keeps `explain` direct: the proxy sees nothing.
#[tokio::test]
async fn no_proxy_keeps_explain_direct_where_http_proxy_otherwise_forwards_it() {
    let mut s = Setup::start().await;
    s.node.add_pod(
        "web-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({}),
        true,
    );
    let server = format!("http://0.0.0.0:{}", s.node.api.addr().port());
    let path = s.write_kubeconfig("kc", &kubeconfig(&server, None, None));
    let proxy_url = s.proxy.url("http");

    let out = explain(&s.node, "web-0", &path, &[("HTTP_PROXY", &proxy_url)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    s.proxy
        .wait_until("the forwarded requests", LIMIT, |st| st.forwarded >= 1)
        .await;
    let before = s.proxy.stats();
    assert_eq!(
        before.tunnels, 0,
        "http is forwarded, not tunnelled: {before:?}"
    );

    for no_proxy in [
        "0.0.0.0",
        "0.0.0.0/8",
        &format!("0.0.0.0:{}", s.node.api.addr().port()),
    ] {
        let out = explain(
            &s.node,
            "web-0",
            &path,
            &[("http_proxy", &proxy_url), ("no_proxy", no_proxy)],
        )
        .await;
        assert!(
            out.status.success(),
            "NO_PROXY={no_proxy}: {}",
            stderr(&out)
        );
        assert_eq!(
            s.proxy.stats(),
            before,
            "NO_PROXY={no_proxy} went through the proxy"
        );
    }
}

/// A SOCKS5 `proxy-url` with user and password (client-go accepts `socks5://`): the handshake
/// carries the credentials and the server's name, which the proxy resolves.
#[tokio::test]
async fn explain_exits_0_through_a_socks5_proxy_url_with_credentials() {
    let mut s = Setup::start().await;
    s.node.add_pod(
        "web-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({}),
        true,
    );
    let socks = format!("socks5://kruise:p%40ss@{}", s.proxy.addr);
    let path = s.write_kubeconfig(
        "kc",
        &kubeconfig(&s.https_url(), Some(CA_PEM), Some(&socks)),
    );
    let out = explain(&s.node, "web-0", &path, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    s.proxy
        .wait_until("a SOCKS5 tunnel", LIMIT, |st| st.tunnels >= 1)
        .await;
    let stats = s.proxy.stats();
    assert_eq!(stats.targets, vec![s.target()]);
    assert_eq!(
        stats.socks_credentials,
        vec![("kruise".to_string(), "p@ss".to_string())],
        "the user info, percent-decoded"
    );
}

/// A directory for `SSL_CERT_FILE` and `SSL_CERT_DIR`: kruised reads only these when they are
/// set (rustls-native-certs), and finds no certificate in it, as on a minimal node.
fn no_system_roots(dir: &Path) -> [(&'static str, String); 2] {
    let empty = dir.join("no-ca-certificates");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.display().to_string();
    [("SSL_CERT_FILE", empty.clone()), ("SSL_CERT_DIR", empty)]
}

/// Found by the systemd test: on a node without CA certificates kube's builder set up the
/// platform verifier for every cluster and failed. A plain-http server and an https one with
/// its own `certificate-authority-data` need no system roots, and now build without them.
#[tokio::test]
async fn kubeconfigs_that_need_no_system_ca_work_on_a_node_without_ca_certificates() {
    let mut s = Setup::start().await;
    s.node.add_pod(
        "web-0",
        json!([{"name": "main", "image": "busybox:v1"}]),
        json!({}),
        true,
    );
    let roots = no_system_roots(s.node.dir.path());
    let env: Vec<(&str, &str)> = roots.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let http = s.write_kubeconfig("http", &s.node.api.kubeconfig());
    let out = explain(&s.node, "web-0", &http, &env).await;
    assert!(out.status.success(), "plain http: {}", stderr(&out));

    let https = format!("https://127.0.0.1:{}", s.tls.addr.port());
    let with_ca = s.write_kubeconfig("with-ca", &kubeconfig(&https, Some(CA_PEM), None));
    let out = explain(&s.node, "web-0", &with_ca, &env).await;
    assert!(
        out.status.success(),
        "https with its own CA: {}",
        stderr(&out)
    );
}

/// Only an https server without a CA of its own needs the system's; without them kruised says
/// exactly that, and what to do.
#[tokio::test]
async fn an_https_kubeconfig_without_ca_on_a_node_without_ca_certificates_says_so() {
    let s = Setup::start().await;
    let roots = no_system_roots(s.node.dir.path());
    let env: Vec<(&str, &str)> = roots.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let https = format!("https://127.0.0.1:{}", s.tls.addr.port());
    let path = s.write_kubeconfig("no-ca", &kubeconfig(&https, None, None));
    let out = explain(&s.node, "web-0", &path, &env).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    for part in [
        &format!(
            "the API server {https}/ is reached over https and the kubeconfig gives no certificate-authority for it"
        ),
        "must be checked against the system's CA certificates, and none were found",
        "No CA certificates were loaded from the system",
        "give the cluster certificate-authority or certificate-authority-data",
    ] {
        assert!(err.contains(part), "missing {part:?} in {err}");
    }
}
