//! `kruised crictl` as an operator meets it, against the fake CRI runtime and against no
//! runtime at all: clear errors with exit status 1 within `--timeout`, crictl.yaml refusing
//! unknown keys by name, crictl's layouts, and `exec -s` returning the command's status.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use kruised::cri::fake::FakeRuntime;
use kruised::cri::{ContainerConfig, ContainerMetadata, SandboxMetadata, StringMap};

/// Longest any single command may take here (the binary's start included).
const LIMIT: Duration = Duration::from_secs(30);

/// The binary, with the caller's runtime settings removed from the environment.
fn kruised() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_kruised"));
    c.env_remove("CONTAINER_RUNTIME_ENDPOINT")
        .env_remove("IMAGE_SERVICE_ENDPOINT")
        .env_remove("CRI_CONFIG_FILE")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    c
}

async fn run(mut c: tokio::process::Command) -> (Output, Duration) {
    let start = Instant::now();
    let out = tokio::time::timeout(LIMIT, c.output())
        .await
        .expect("the command finished")
        .unwrap();
    (out, start.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every crictl command, with arguments that would be valid against a real runtime.
const COMMANDS: &[&[&str]] = &[
    &["ps"],
    &["ps", "-a", "-o", "json"],
    &["pods"],
    &["images"],
    &["inspect", "abc"],
    &["inspectp", "abc"],
    &["inspecti", "busybox:v1"],
    &["info"],
    &["version"],
    &["imagefsinfo"],
    &["pull", "busybox:v1"],
    &["rmi", "busybox:v1"],
    &["stop", "abc"],
    &["exec", "-s", "abc", "true"],
    &["logs", "abc"],
    &["stats"],
    &["events"],
];

#[tokio::test]
async fn every_command_without_a_runtime_fails_with_a_clear_message_and_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("nonexistent.sock").display());
    for cmd in COMMANDS {
        let mut c = kruised();
        c.args(["crictl", "-r", &endpoint, "-t", "2s"]).args(*cmd);
        let (out, took) = run(c).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ")
                && stderr.contains(&endpoint)
                && stderr.contains("unreachable"),
            "{cmd:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{cmd:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{cmd:?}: {}", text(&out.stdout));
        // a missing socket fails at once: no retries, no waiting for the timeout
        assert!(took < Duration::from_secs(2), "{cmd:?} took {took:?}");
    }
}

#[tokio::test]
async fn a_runtime_that_never_answers_fails_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("hung.sock");
    // accepts connections (the kernel's backlog) but never speaks HTTP/2
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let endpoint = format!("unix://{}", sock.display());
    for cmd in [
        &["ps"][..],
        &["images"],
        &["version"],
        &["exec", "-s", "abc", "true"],
    ] {
        let mut c = kruised();
        c.args(["crictl", "-r", &endpoint, "--timeout", "1s"])
            .args(cmd);
        let (out, took) = run(c).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains(&endpoint) && stderr.contains("timed out after 1s"),
            "{cmd:?}: {stderr}"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(4),
            "{cmd:?} took {took:?}: it must give up after the 1s timeout"
        );
    }
}

#[tokio::test]
async fn without_an_endpoint_the_well_known_sockets_are_tried_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crictl.yaml");
    std::fs::write(&config, "").unwrap();
    let mut c = kruised();
    c.args(["crictl", "--host-run-dir"])
        .arg(dir.path())
        .arg("-c")
        .arg(&config)
        .arg("ps");
    let (out, _) = run(c).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for socket in [
        "containerd/containerd.sock",
        "crio/crio.sock",
        "cri-dockerd.sock",
    ] {
        assert!(stderr.contains(socket), "{socket} missing from: {stderr}");
    }
}

#[tokio::test]
async fn an_unknown_key_in_crictl_yaml_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("x.yaml");
    std::fs::write(
        &config,
        "runtime-endpoint: unix:///run/containerd/containerd.sock\nbogus-key: 1\n",
    )
    .unwrap();
    // named by the flag
    let mut c = kruised();
    c.args(["crictl", "--config"]).arg(&config).arg("ps");
    let (out, _) = run(c).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("bogus-key") && stderr.contains("x.yaml"),
        "{stderr}"
    );
    // and by the environment
    let mut c = kruised();
    c.env("CRI_CONFIG_FILE", &config).args(["crictl", "images"]);
    let (out, _) = run(c).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bogus-key"));
    // a file named explicitly must exist
    let mut c = kruised();
    c.args(["crictl", "-c"])
        .arg(dir.path().join("missing.yaml"))
        .arg("ps");
    let (out, _) = run(c).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("missing.yaml"));
}

#[tokio::test]
async fn usage_errors_exit_1_as_crictl_does() {
    let mut c = kruised();
    c.args(["crictl", "ps", "--bogus"]);
    let (out, _) = run(c).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--bogus"));
    let mut c = kruised();
    c.args(["crictl", "ps", "-o", "xml"]);
    let (out, _) = run(c).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("xml"));
}

/// A fake runtime with one pod of two containers (one exited).
async fn fake(dir: &Path) -> (FakeRuntime, String, String, String) {
    let cri = FakeRuntime::start(&dir.join("cri.sock"), "fake")
        .await
        .unwrap();
    let labels = |c: Option<&str>| -> StringMap {
        let mut m = StringMap::new();
        m.insert("io.kubernetes.pod.name".into(), "web-0".into());
        m.insert("io.kubernetes.pod.namespace".into(), "default".into());
        m.insert("io.kubernetes.pod.uid".into(), "uid-1".into());
        if let Some(c) = c {
            m.insert("io.kubernetes.container.name".into(), c.into());
        }
        m
    };
    let pod = cri.add_sandbox(
        SandboxMetadata {
            name: "web-0".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        },
        labels(None),
        "10.0.0.5",
    );
    let container = |name: &str, attempt: u32| ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt,
        },
        image: "registry.example/app:v1".into(),
        labels: labels(Some(name)),
        annotations: [(
            "io.kubernetes.container.hash".to_string(),
            "1a2b3c4d".to_string(),
        )]
        .into_iter()
        .collect(),
        log_path: format!("{name}/{attempt}.log"),
        envs: vec![("GREETING".into(), "hello".into())],
        ..Default::default()
    };
    let app = cri.add_container(&pod, container("app", 0), true, true);
    let old = cri.add_container(&pod, container("logger", 1), false, true);
    cri.exit_container(&old, 137);
    (cri, pod, app, old)
}

/// The cells of a table line (columns are separated by at least 3 spaces).
fn cells(line: &str) -> Vec<&str> {
    line.split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

fn crictl(cri: &FakeRuntime, args: &[&str]) -> tokio::process::Command {
    let mut c = kruised();
    c.args(["crictl", "-r"])
        .arg(cri.endpoint().to_string())
        .args(args);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_have_crictls_headers_and_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let (cri, pod, app, old) = fake(dir.path()).await;

    let (out, _) = run(crictl(&cri, &["ps", "-a"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    // widths depend on the ages ("Less than a second ago"); the layout itself is unit-tested
    assert_eq!(
        cells(lines[0]),
        [
            "CONTAINER",
            "IMAGE",
            "CREATED",
            "STATE",
            "NAME",
            "ATTEMPT",
            "POD ID",
            "POD",
            "NAMESPACE"
        ]
    );
    assert_eq!(lines.len(), 3, "{stdout}");
    // the fake runs images by ID, as the kubelet does: shown as 13 hex digits
    let row = cells(lines[1]);
    assert_eq!(row[0], &old[..13], "newest first: {stdout}");
    assert_eq!(row[3], "Exited");
    assert_eq!(&row[5..], &["1", &pod[..13], "web-0", "default"]);
    assert!(lines[2].starts_with(&app[..13]), "{stdout}");
    assert!(!stdout.lines().any(|l| l.ends_with(' ')), "{stdout:?}");

    // running only by default, full IDs with -q
    let (out, _) = run(crictl(&cri, &["ps", "-q"])).await;
    assert_eq!(text(&out.stdout), format!("{app}\n"));

    // --kruise: the kubelet hash, and which container of each name is current
    let (out, _) = run(crictl(&cri, &["ps", "-a", "--kruise"])).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout
            .lines()
            .next()
            .unwrap()
            .ends_with("KUBELET HASH        CURRENT"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .all(|l| !l.contains("1a2b3c4d") || l.ends_with("1a2b3c4d            true")),
        "{stdout}"
    );

    let (out, _) = run(crictl(&cri, &["ps", "-a", "-o", "json"])).await;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["containers"][0];
    assert_eq!(c["id"], old.as_str());
    assert_eq!(c["podSandboxId"], pod.as_str());
    assert_eq!(c["state"], "CONTAINER_EXITED");
    assert!(c["createdAt"].is_string(), "int64 as a string: {c}");
    assert_eq!(c["metadata"]["attempt"], 1);

    let (out, _) = run(crictl(&cri, &["pods"])).await;
    let stdout = text(&out.stdout);
    assert_eq!(
        cells(stdout.lines().next().unwrap()),
        [
            "POD ID",
            "CREATED",
            "STATE",
            "NAME",
            "NAMESPACE",
            "ATTEMPT",
            "RUNTIME"
        ]
    );
    assert!(
        stdout.contains("Ready") && stdout.contains("(default)"),
        "{stdout}"
    );

    let (out, _) = run(crictl(&cri, &["pods", "-o", "yaml"])).await;
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("items:\n- annotations: {}\n"),
        "{stdout}"
    );
    assert!(stdout.contains("  state: SANDBOX_READY\n"), "{stdout}");

    let (out, _) = run(crictl(&cri, &["images"])).await;
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "IMAGE                  TAG                 IMAGE ID            SIZE",
            "registry.example/app   v1                  0000000000000       1.02kB"
        ]
    );

    let (out, _) = run(crictl(&cri, &["version"])).await;
    assert_eq!(
        text(&out.stdout),
        "Version:  0.1.0\nRuntimeName:  fake\nRuntimeVersion:  0.0.0-fake\nRuntimeApiVersion:  v1\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_prints_sorted_json_with_the_runtimes_info() {
    let dir = tempfile::tempdir().unwrap();
    let (cri, pod, app, _) = fake(dir.path()).await;
    let (out, _) = run(crictl(&cri, &["inspect", &app])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["status"]["id"], app.as_str());
    assert_eq!(v["status"]["state"], "CONTAINER_RUNNING");
    assert_eq!(v["status"]["user"], serde_json::Value::Null);
    assert_eq!(
        v["info"]["runtimeSpec"]["process"]["env"][0],
        "GREETING=hello"
    );
    // every object's keys sorted, two-space indent: what serde_json's sorted map prints too
    assert_eq!(
        stdout.trim_end(),
        serde_json::to_string_pretty(&v).unwrap(),
        "keys sorted at every level"
    );

    let (out, _) = run(crictl(&cri, &["inspectp", "-o", "table", &pod])).await;
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with(&format!("ID: {pod}\nName: web-0\nUID: uid-1\nNamespace: default\nAttempt: 0\nStatus: SANDBOX_READY\n")), "{stdout}");
    assert!(stdout.contains("IP Addresses: 10.0.0.5\n"), "{stdout}");

    let (out, _) = run(crictl(&cri, &["inspect", "nope"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sync_returns_the_commands_output_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let (cri, _, app, old) = fake(dir.path()).await;
    let (out, _) = run(crictl(&cri, &["exec", "-s", &app, "env"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "GREETING=hello\n");
    let (out, _) = run(crictl(&cri, &["exec", "-s", &app, "false"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    // a container that does not run: the runtime's error, status 1
    let (out, _) = run(crictl(&cri, &["exec", "-s", &old, "true"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("synchronously"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_named_crictl_is_crictl() {
    let dir = tempfile::tempdir().unwrap();
    let (cri, _, app, _) = fake(dir.path()).await;
    let link = dir.path().join("crictl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kruised"), &link).unwrap();
    let mut c = tokio::process::Command::new(&link);
    c.env_remove("CRI_CONFIG_FILE")
        .env_remove("RUST_LOG")
        .env("CONTAINER_RUNTIME_ENDPOINT", cri.endpoint().to_string())
        .args(["ps", "-q"]);
    let (out, _) = run(c).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{app}\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_each_container_event_as_proto3_json() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let (cri, pod, _, _) = fake(dir.path()).await;
    let mut child = crictl(&cri, &["events"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cri.wait_for(LIMIT, |s| s.call_count("GetContainerEvents") >= 1)
        .await
        .expect("events subscribed");
    let id = cri.add_container(
        &pod,
        ContainerConfig {
            metadata: ContainerMetadata {
                name: "late".into(),
                attempt: 0,
            },
            image: "registry.example/app:v1".into(),
            ..Default::default()
        },
        false,
        true,
    );
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 4096];
        while !seen.contains("CONTAINER_STARTED_EVENT") {
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "events ended early: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await
    .expect("the events were printed");
    child.kill().await.unwrap();
    assert!(
        seen.starts_with(&format!(
            "{{\n  \"containerId\": \"{id}\",\n  \"containerEventType\": \"CONTAINER_CREATED_EVENT\",\n  \"createdAt\": \""
        )),
        "{seen}"
    );
    assert!(seen.contains("\"containersStatuses\": []"), "{seen}");
}
