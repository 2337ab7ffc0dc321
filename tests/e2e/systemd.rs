//! kruised on a bare-metal node: under a real systemd (Debian bookworm's systemd 252, booted in a
//! container of its own by `tests/systemd-lab.sh`), installed with `systemd/install.sh` and run by
//! `systemd/kruised.service` as shipped, against the API-server double and the lab's real
//! containerd (the container sees its socket at `/run/containerd/containerd.sock`, where
//! kruised's detection looks, and shares the host's network).
//!
//! `tests/run.sh` runs these alone (`e2e systemd::`, with `KRUISED_SYSTEMD_LAB` set), once, on the
//! containerd 1.6 lab. They share the one systemd: they take turns.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::support::daemon::{http_get, kruised_bin, kruised_test_build};
use crate::support::kubelet::status::{self, Report};
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::{Lab, Plane, unique, wait, within};
use kruised::cri::{ContainerState, RuntimeService};
use kruised::k8s::keys;
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);
/// Where the unit's `ExecStart` serves `/readyz` (`--addr 127.0.0.1:10221`): the container shares
/// the host's network.
const ADMIN: &str = "127.0.0.1:10221";
const NODE: &str = "systemd-node";
/// How often a wait on the unit looks at its properties (each look runs `systemctl`).
const UNIT_POLL: Duration = Duration::from_millis(200);
const UNIT: &str = "kruised.service";

/// The booted systemd of `tests/systemd-lab.sh`.
struct SystemdLab {
    /// The container's root, writable from here.
    root: PathBuf,
    /// The container's PID 1, on the host.
    leader: u32,
    /// Where this test's part of the journal starts.
    cursor: Option<String>,
}

impl SystemdLab {
    /// The lab named by `KRUISED_SYSTEMD_LAB`; skipped with a message without it, except with
    /// `KRUISED_REQUIRE_SYSTEMD=1` (`tests/run.sh`'s systemd part), where it fails.
    fn get() -> Option<SystemdLab> {
        let dir = std::env::var_os("KRUISED_SYSTEMD_LAB").map(PathBuf::from);
        let Some(dir) = dir else {
            assert!(
                std::env::var("KRUISED_REQUIRE_SYSTEMD").as_deref() != Ok("1"),
                "the systemd layer is required here but KRUISED_SYSTEMD_LAB is not set: run it \
                 with tests/run.sh"
            );
            eprintln!("SKIPPED: no systemd lab (KRUISED_SYSTEMD_LAB; tests/systemd-lab.sh)");
            return None;
        };
        let leader = std::fs::read_to_string(dir.join("leader.pid"))
            .unwrap_or_else(|e| panic!("{}/leader.pid: {e}: is the lab booted?", dir.display()));
        let mut lab = SystemdLab {
            root: dir.join("root"),
            leader: leader.trim().parse().expect("a pid"),
            cursor: None,
        };
        lab.mark();
        Some(lab)
    }

    /// `args` inside the container, in every namespace of its PID 1.
    fn run(&self, args: &[&str]) -> Output {
        std::process::Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a"])
            .args(args)
            .output()
            .expect("run nsenter")
    }

    /// `args` inside the container; fails the test unless they succeed. Their stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} in the systemd lab: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The unit's property `name` (`systemctl show -p`).
    fn property(&self, name: &str) -> String {
        self.ok(&["systemctl", "show", "--value", "-p", name, UNIT])
            .trim()
            .to_string()
    }

    /// The unit's properties `names`, in order (what a wait on the unit looks at).
    fn properties(&self, names: &[&str]) -> Vec<String> {
        names.iter().map(|n| self.property(n)).collect()
    }

    /// Fails the test for a wait on the unit's properties `names` that gave up, with the
    /// journal.
    fn fail(&self, names: &[&str], missed: &wait::Missed<Vec<String>>) -> ! {
        missed.fail_with(format_args!("(of {names:?})\njournal:\n{}", self.journal()))
    }

    /// The journal's position now: what the unit logs after it is [`SystemdLab::journal`]'s.
    fn mark(&mut self) {
        let out = self.ok(&["journalctl", "--no-pager", "-n", "0", "--show-cursor"]);
        self.cursor = out
            .lines()
            .find_map(|l| l.strip_prefix("-- cursor: "))
            .map(str::to_string);
    }

    /// What kruised and systemd (about kruised) logged since the last [`SystemdLab::mark`].
    fn journal(&self) -> String {
        let mut args = vec!["journalctl", "--no-pager", "-o", "cat", "-u", UNIT];
        let after;
        if let Some(c) = &self.cursor {
            after = format!("--after-cursor={c}");
            args.push(&after);
        }
        String::from_utf8_lossy(&self.run(&args).stdout).into_owned()
    }

    /// A file of the container's, written from the host.
    fn write(&self, path: &str, contents: &[u8]) {
        let at = self.root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&at, contents).unwrap_or_else(|e| panic!("{}: {e}", at.display()));
    }
}

/// The tests share one systemd and one admin port: one at a time.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Installs kruised in the container as a node's operator would (`systemd/install.sh` with the
/// static binary, a kubeconfig for `plane`), starts it and waits until its unit says it is ready.
async fn install(lab: &SystemdLab, plane: &Plane) {
    install_binary(lab, plane, &kruised_bin()).await;
}

/// [`install`] with the binary `exe`.
async fn install_binary(lab: &SystemdLab, plane: &Plane, exe: &Path) {
    // the port the unit binds must be free on the host (the container shares its network)
    assert!(
        std::net::TcpListener::bind(ADMIN).is_ok() || lab.property("ActiveState") == "active",
        "{ADMIN}, the unit's admin address, is taken on this machine"
    );
    lab.write(
        "/etc/kruised/kubeconfig",
        &std::fs::read(plane.kubeconfig()).expect("the plane's kubeconfig"),
    );
    lab.write(
        "/opt/kruised/kruised",
        &std::fs::read(exe).unwrap_or_else(|e| panic!("{}: {e}", exe.display())),
    );
    for file in [
        "systemd/install.sh",
        "systemd/kruised.service",
        "docs/systemd.md",
    ] {
        lab.write(
            &format!("/opt/kruised/src/{file}"),
            &std::fs::read(repo().join(file)).expect(file),
        );
    }
    lab.ok(&["chmod", "0755", "/opt/kruised/kruised"]);
    // a fresh install each time: the settings file is kept by install.sh when it exists
    lab.ok(&["rm", "-f", "/etc/default/kruised"]);
    lab.ok(&[
        "bash",
        "/opt/kruised/src/systemd/install.sh",
        "--binary",
        "/opt/kruised/kruised",
        "--kubeconfig",
        "/etc/kruised/kubeconfig",
        "--node-name",
        NODE,
    ]);
    // install.sh starts it (`enable --now`); a restart picks up a new binary or kubeconfig
    lab.ok(&["systemctl", "restart", UNIT]);
    let names = ["ActiveState", "StatusText"];
    let look = || std::future::ready(lab.properties(&names));
    wait::try_poll(
        LIMIT,
        UNIT_POLL,
        "kruised active and ready under systemd",
        look,
        |v| v[0] == "active" && v[1].starts_with("ready"),
    )
    .await
    .unwrap_or_else(|m| lab.fail(&names, &m));
}

/// A kruise-managed pod on the node whose container reads the annotation `role` (`blue`), run on
/// the lab's containerd; its status says an in-place update is pending (`InPlaceUpdateReady`
/// False) after `role` changed to `green`. Returns the container's ID.
async fn stale_pod(plane: &Plane, lab: &Lab) -> String {
    let name = unique("sd");
    let image = lab.image("busybox:v1");
    let kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    kubelet.pull(std::slice::from_ref(&image), LIMIT).await;
    let created = plane
        .api
        .create(
            "pods",
            json!({
                "metadata": {"name": name, "namespace": "default", "annotations": {"role": "blue"},
                    "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                         "name": "demo", "uid": "cs-1", "controller": true}]},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 2, "containers": [
                    {"name": "main", "image": image,
                     "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]}
                ]}
            }),
        )
        .expect("create the pod");
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(created).expect("a pod");
    let mut spec = PodSpec::new(&name, vec![ContainerSpec::of_pod(&pod, "main")]);
    spec.uid = pod.metadata.uid.clone().expect("a uid");
    spec.termination_grace_seconds = 2;
    let running = within(LIMIT, "pod start", kubelet.run_pod(spec)).await;
    let id = running.container("main").to_string();
    plane
        .api
        .modify("pods", "default", &name, |p| {
            p["metadata"]["annotations"]["role"] = json!("green");
            p["status"] = json!({"phase": "Running",
                "conditions": [{"type": keys::INPLACE_UPDATE_READY, "status": "False"}]});
            status::set_containers(p, &running.reports());
        })
        .expect("the in-place update");
    id
}

#[tokio::test]
async fn install_sh_runs_kruised_under_systemd_ready_and_doing_its_job() {
    let (Some(mut sd), Some(lab)) = (SystemdLab::get(), Lab::get()) else {
        return;
    };
    let _turn = serial().await;
    sd.mark();
    let plane = Plane::start().await;
    install(&sd, &plane).await;
    assert_eq!(sd.property("Type"), "notify");
    let (code, body) = http_get(ADMIN.parse().expect("addr"), "/readyz").await;
    assert_eq!((code, body.trim()), (200, "ok"), "{}", sd.journal());
    // the runtime was found where the kubelet's is, by detection (the unit names none)
    assert!(
        sd.journal().contains("/run/containerd/containerd.sock"),
        "journal:\n{}",
        sd.journal()
    );

    // its main job: a stale env restarted (the container stopped so the kubelet recreates it)
    let id = stale_pod(&plane, &lab).await;
    let runtime = lab.runtime();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let status = runtime.container_status(&id, false).await.expect("status");
        if status.state == ContainerState::Exited {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kruised under systemd did not stop the stale container within {LIMIT:?}; journal:\n{}",
            sd.journal()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        sd.journal().contains("stopping container"),
        "journal:\n{}",
        sd.journal()
    );
}

#[tokio::test]
async fn systemctl_stop_drains_kruised_and_it_exits_cleanly() {
    let Some(mut sd) = SystemdLab::get() else {
        return;
    };
    let _turn = serial().await;
    sd.mark();
    let plane = Plane::start().await;
    install(&sd, &plane).await;
    sd.ok(&["systemctl", "stop", UNIT]);
    // a drain that ran out of TimeoutStopSec= would be `Result=timeout` (SIGKILL); a crash a
    // non-zero status
    assert_eq!(sd.property("ActiveState"), "inactive");
    assert_eq!(sd.property("Result"), "success", "{}", sd.journal());
    assert_eq!(sd.property("ExecMainStatus"), "0", "{}", sd.journal());
    assert!(sd.journal().contains("drained"), "{}", sd.journal());
}

#[tokio::test]
async fn the_watchdog_restarts_a_kruised_that_stopped_answering() {
    let Some(mut sd) = SystemdLab::get() else {
        return;
    };
    let _turn = serial().await;
    sd.mark();
    let plane = Plane::start().await;
    // the unit's 60 s watchdog, shortened for the test by a drop-in, as an operator would
    sd.write(
        "/etc/systemd/system/kruised.service.d/50-test-watchdog.conf",
        b"[Service]\nWatchdogSec=4s\n",
    );
    sd.ok(&["systemctl", "daemon-reload"]);
    install(&sd, &plane).await;
    let before: u64 = sd.property("NRestarts").parse().expect("NRestarts");
    let pid = sd.property("MainPID");
    // a daemon that no longer runs at all: its watchdog pings stop with it
    sd.ok(&[
        "systemctl",
        "kill",
        "--kill-whom=main",
        "--signal=SIGSTOP",
        UNIT,
    ]);
    let names = ["NRestarts", "ActiveState", "StatusText", "MainPID"];
    let look = || std::future::ready(sd.properties(&names));
    let v = wait::try_poll(
        LIMIT,
        UNIT_POLL,
        "systemd's watchdog killed and restarted the stopped kruised",
        look,
        |v| v[0].parse::<u64>().is_ok_and(|n| n > before) && v[1] == "active" && v[3] != pid,
    )
    .await
    .unwrap_or_else(|m| sd.fail(&names, &m));
    assert!(
        sd.journal().contains("Watchdog timeout"),
        "restarted ({v:?}) but not by the watchdog:\n{}",
        sd.journal()
    );
    let names = ["StatusText"];
    let look = || std::future::ready(sd.properties(&names));
    wait::try_poll(
        LIMIT,
        UNIT_POLL,
        "the restarted kruised ready again",
        look,
        |v| v[0].starts_with("ready"),
    )
    .await
    .unwrap_or_else(|m| sd.fail(&names, &m));
    std::fs::remove_file(
        sd.root
            .join("etc/systemd/system/kruised.service.d/50-test-watchdog.conf"),
    )
    .expect("remove the drop-in");
    sd.ok(&["systemctl", "daemon-reload"]);
    sd.ok(&["systemctl", "stop", UNIT]);
}

/// A loop stuck in a running process, not a stopped one: container meta's pass over one pod
/// never ends (a failpoint of test builds, `kruised::controller::failpoint`), so `/healthz`
/// fails naming the queue once the pass is older than the stuck-pass limit (3 s here, by the
/// failpoint; 300 s as shipped), kruised's own watchdog task stops pinging, and systemd kills
/// and restarts it. The shipped binary has no failpoints: this test installs the test build
/// cargo made beside the test binary, never `KRUISED_TEST_BIN` (the shipped one under
/// `tests/run.sh`), and fails if the binary it installed says no failpoint is armed.
#[tokio::test]
async fn the_watchdog_restarts_a_kruised_whose_loop_is_stuck() {
    let Some(mut sd) = SystemdLab::get() else {
        return;
    };
    let _turn = serial().await;
    sd.mark();
    let plane = Plane::start().await;
    const STUCK: &str = "test.kruised.io/stuck";
    // the unit's 60 s watchdog shortened, and the failpoints, by a drop-in gone at the end
    let _drop_in = DropIn::write(
        &sd,
        "50-test-stuck-loop.conf",
        &format!(
            "[Service]\nWatchdogSec=4s\nEnvironment=KRUISED_FAILPOINT_STUCK_ANNOTATION={STUCK}\n\
             Environment=KRUISED_FAILPOINT_STUCK_PASS_SECS=3\n"
        ),
    );
    install_binary(&sd, &plane, &kruised_test_build()).await;
    assert!(
        sd.journal().contains("test failpoints armed"),
        "the installed kruised armed no failpoint (not a test build?):\n{}",
        sd.journal()
    );
    let before: u64 = sd.property("NRestarts").parse().expect("NRestarts");
    let pid = sd.property("MainPID");

    // a kruise-managed pod with a container, new to kruised: container meta takes it, and its
    // pass never ends (no real container needed: the failpoint comes before the runtime)
    let name = unique("stuck");
    let mut pod = json!({
        "metadata": {"name": name, "namespace": "default", "annotations": {STUCK: "yes"},
            "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                 "name": "demo", "uid": "cs-1", "controller": true}]},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"}
    });
    let main = crate::support::kubelet_id(&"0".repeat(64));
    status::set_containers(&mut pod, &[Report::ready("main", &main, 0)]);
    plane.api.create("pods", pod).expect("create the pod");
    let admin = ADMIN.parse().expect("addr");
    let deadline = tokio::time::Instant::now() + LIMIT;
    let body = loop {
        let (code, body) = http_get(admin, "/healthz").await;
        if code != 200 {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "/healthz still ok {LIMIT:?} after the stuck pod was created; journal:\n{}",
            sd.journal()
        );
        // liveness is asked, as the watchdog task asks it
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        body.starts_with("check containermeta failed, err: containermeta: ")
            && body.contains(&name)
            && body.contains("(limit 3s)"),
        "{body}"
    );
    // the process still runs (not stopped: its admin server just answered); the pod goes, so
    // the restarted kruised is not stuck on it again (the restart comes 5 s after the kill:
    // RestartSec=)
    plane
        .api
        .delete("pods", "default", &name)
        .expect("delete the pod");
    let names = ["NRestarts", "ActiveState", "MainPID"];
    let look = || std::future::ready(sd.properties(&names));
    let v = wait::try_poll(
        LIMIT,
        UNIT_POLL,
        "systemd's watchdog killed and restarted the stuck kruised",
        look,
        |v| v[0].parse::<u64>().is_ok_and(|n| n > before) && v[1] == "active" && v[2] != pid,
    )
    .await
    .unwrap_or_else(|m| sd.fail(&names, &m));
    let journal = sd.journal();
    assert!(
        journal.contains("Watchdog timeout"),
        "restarted ({v:?}) but not by the watchdog:\n{journal}"
    );
    assert!(
        journal.contains("a loop stalled; no watchdog ping until it beats"),
        "kruised said why it stopped pinging:\n{journal}"
    );
    let names = ["StatusText"];
    let look = || std::future::ready(sd.properties(&names));
    wait::try_poll(
        LIMIT,
        UNIT_POLL,
        "the restarted kruised ready again",
        look,
        |v| v[0].starts_with("ready"),
    )
    .await
    .unwrap_or_else(|m| sd.fail(&names, &m));
    let (code, body) = http_get(admin, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok"), "{}", sd.journal());
    sd.ok(&["systemctl", "stop", UNIT]);
}

/// A drop-in of the unit's, in force from [`DropIn::write`] until dropped (also when the test
/// fails, so the next test gets the unit as shipped).
struct DropIn<'a> {
    lab: &'a SystemdLab,
    path: PathBuf,
}

impl<'a> DropIn<'a> {
    fn write(lab: &'a SystemdLab, name: &str, contents: &str) -> DropIn<'a> {
        let rel = format!("/etc/systemd/system/{UNIT}.d/{name}");
        lab.write(&rel, contents.as_bytes());
        lab.ok(&["systemctl", "daemon-reload"]);
        DropIn {
            lab,
            path: lab.root.join(rel.trim_start_matches('/')),
        }
    }
}

impl Drop for DropIn<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = self.lab.run(&["systemctl", "daemon-reload"]);
    }
}
