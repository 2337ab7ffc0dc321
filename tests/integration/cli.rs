//! The command line as an operator meets it: no runtime around, bad flags.

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
fn client_only_version_needs_no_runtime() {
    let out = kruised()
        .args(["version", "--client-only"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("Version:  {}", env!("CARGO_PKG_VERSION"))
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
