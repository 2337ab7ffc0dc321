//! The command line as an operator meets it: no runtime around, bad flags, and kruise's chart's
//! flags under the name `kruise-daemon`.

use std::process::Command;

fn kruised() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kruised"));
    c.env_remove("CONTAINER_RUNTIME_ENDPOINT")
        .env_remove("IMAGE_SERVICE_ENDPOINT")
        .env_remove("CRI_CONFIG_FILE");
    c
}

#[test]
fn version_without_a_reachable_runtime_exits_nonzero_and_lists_what_was_tried() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("crictl.yaml"), "").unwrap();
    let out = kruised()
        .args(["version", "--host-run-dir"])
        .arg(dir.path())
        .arg("--config")
        .arg(dir.path().join("crictl.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("Version:  "), "own version first: {stdout}");
    for socket in [
        "containerd/containerd.sock",
        "crio/crio.sock",
        "cri-dockerd.sock",
    ] {
        assert!(stderr.contains(socket), "{socket} missing from: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn version_with_an_endpoint_that_does_not_answer_names_it() {
    let dir = tempfile::tempdir().unwrap();
    // a socket file that nobody listens on
    let sock = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let endpoint = format!("unix://{}", sock.display());
    let out = kruised()
        .args([
            "version",
            "--timeout",
            "1s",
            "--runtime-endpoint",
            &endpoint,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&endpoint) && stderr.contains("unreachable"),
        "{stderr}"
    );
}

#[test]
fn contradictory_runtime_flags_are_refused_by_name() {
    let out = kruised()
        .args([
            "version",
            "--runtime-endpoint",
            "unix:///run/a.sock",
            "--socket-file",
            "b.sock",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--runtime-endpoint") && stderr.contains("--socket-file"),
        "{stderr}"
    );
}

#[test]
fn a_log_filter_with_target_levels_is_accepted_and_one_that_does_not_parse_is_refused_by_name() {
    let ok = kruised()
        .args(["version", "--client-only"])
        .env("RUST_LOG", "info,kruised=debug,kube=warn")
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for bad in ["kruised=loud", "kruised[{pod}]=debug"] {
        let out = kruised()
            .args(["version", "--client-only"])
            .env("RUST_LOG", bad)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {stderr}");
        assert!(
            stderr.contains(&format!("RUST_LOG={bad:?}")) && stderr.contains("kruised=debug"),
            "names the filter and the syntax: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "nothing run: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn client_only_version_prints_the_version_and_the_commit_and_needs_no_runtime() {
    let out = kruised()
        .args(["version", "--client-only"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], format!("Version:  {}", env!("CARGO_PKG_VERSION")));
    // a git checkout's commit (tests/run.sh checks the shipped binary's is HEAD), or `unknown`
    let commit = lines[1].strip_prefix("Commit:  ").expect("a Commit line");
    let sha = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        sha == "unknown" || (sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit())),
        "{stdout}"
    );
}

#[test]
fn hash_prints_the_kubelet_vectors_for_a_pod_on_stdin() {
    use std::io::Write;
    let pod = r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"test_container",
        "image":"foo/image:v1","args":["/bin/sh","-c","echo abc"],"ports":[{"containerPort":8001}]}]}}"#;
    let mut child = kruised()
        .args(["hash", "-o", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pod.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["kubeletHash"], "8e45cbd0");
    assert_eq!(v[0]["kubeletHashLegacy"], "3c42280f");
    assert_eq!(v[0]["envFromMetadataHash"], 86_995_377);
}

#[test]
fn hash_of_a_file_that_is_not_a_pod_says_which_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("junk.yaml");
    std::fs::write(&f, "- just\n- a list\n").unwrap();
    let out = kruised().arg("hash").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("junk.yaml"));
}

// === flags unknown to kruised (field report: kruise's chart gains daemon flags over time, open
// PR #2423 adds `--containermeta-workers` and `--containermeta-restart-workers`, and a kruised
// that refused them would crash-loop under the next chart that passes one) ===

/// The chart runs the image's `/kruise-daemon`, kruised under that name (tests/integration/
/// dropin.rs runs the chart's arguments the same way).
#[tokio::test]
async fn as_kruise_daemon_a_newer_charts_unknown_flags_start_the_daemon_with_a_warning_naming_them()
{
    use crate::support::daemon::{Daemon, free_addr, http_get, kruised_bin};
    use crate::support::node::{FakeNode, NODE};
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

    let node = FakeNode::start().await;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("kruise-daemon");
    std::os::unix::fs::symlink(kruised_bin(), &exe).unwrap();
    let addr = free_addr();
    let (addr_flag, kubeconfig, endpoint) = (
        format!("--addr={addr}"),
        format!("--kubeconfig={}", node.kubeconfig().display()),
        format!("--runtime-endpoint={}", node.endpoint()),
    );
    let mut d = Daemon::start_exe(
        &exe,
        &[
            &addr_flag,
            &kubeconfig,
            &endpoint,
            "--a-future-flag=on",
            "--another-future-flag",
            "its-value",
            "--containermeta-workers=2",
            "--containermeta-restart-workers=20",
        ],
        &[("NODE_NAME", NODE), ("KRUISED_LOG_FORMAT", "json")],
    );
    d.wait_for_log("daemon ready", LIMIT).await;
    let warning = d.wait_for_log("flags unknown to kruised", LIMIT).await;
    assert_eq!(warning["level"], "WARN", "{warning}");
    let unknown = warning["unknown"].as_str().unwrap_or_default();
    assert_eq!(
        unknown, r#"["--a-future-flag", "--another-future-flag"]"#,
        "named, without their values: {warning}"
    );
    let ignored = d.wait_for_log("no effect here", LIMIT).await["ignored"].to_string();
    assert!(
        ignored.contains("--containermeta-restart-workers") && !ignored.contains("its-value"),
        "PR #2423's restart workers named as without effect, the unknown flag's value taken \
         with it: {ignored}"
    );
    let (status, metrics) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("\nkruised_unknown_flags 2\n"), "{metrics}");
    // and what kruise-daemon's /metrics had for its queues is there under the same names
    // (client-go's work queue families, labelled by kruise-daemon's queue names: spec 6.2)
    for queue in ["crr", "runtime_container_meta"] {
        for family in [
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_retries_total",
        ] {
            let series = format!("\n{family}{{name=\"{queue}\",controller=\"{queue}\"}} ");
            assert!(metrics.contains(&series), "{series:?} in {metrics}");
        }
    }
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}

#[test]
fn kruised_run_refuses_an_unknown_flag_at_once_and_names_it() {
    // an operator's typo (`--adr` for `--addr`) fails fast where kruised runs under its own name
    let out = kruised()
        .args(["run", "--node-name", "n1", "--adr=:10221"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--adr"), "{stderr}");
}
