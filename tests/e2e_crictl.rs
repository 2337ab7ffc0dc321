//! End-to-end tests of `kruised crictl` against real containerd + runc and a real registry
//! (`tests/cri-lab.sh`): the golden scenario of `tests/golden/crictl/` rebuilt with the kubelet
//! driver, and every output compared with what the real crictl printed for it, after
//! normalising IDs, times, ages, paths, registry addresses and column widths.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use kruised::cri::{RuntimeService, StringMap};
use regex::Regex;
use support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use support::{Lab, unique, within};

const LIMIT: Duration = Duration::from_secs(60);
const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/crictl");
/// The label the test puts on its pods and containers, to list only them.
const RUN_LABEL: &str = "e2e.kruised.io/run";
/// The uids of the golden's pods.
const GOLDEN_UIDS: [&str; 2] = [
    "11111111-aaaa-4bbb-8ccc-000000000001",
    "22222222-aaaa-4bbb-8ccc-000000000002",
];

fn golden(name: &str) -> String {
    std::fs::read_to_string(Path::new(GOLDEN).join(name))
        .unwrap_or_else(|e| panic!("golden {name}: {e}"))
}

/// The golden's object IDs by symbol (`P1`, `A`, ...).
fn golden_ids() -> Vec<(String, String)> {
    golden("ids.env")
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What one side of a comparison substitutes before the common normalisation.
struct Side {
    /// (text, replacement), applied in order.
    subs: Vec<(String, String)>,
    /// Whether this is the golden (which ran its pods with a container PID namespace).
    golden: bool,
}

impl Side {
    fn new(ids: &[(String, String)], uids: [&str; 2], lab: &Path, reg: &str, auth: &str) -> Self {
        let mut subs = Vec::new();
        for (sym, id) in ids {
            subs.push((id.clone(), format!("<{sym}>")));
        }
        for (sym, id) in ids {
            subs.push((id[..13].to_string(), format!("<{sym}>")));
        }
        subs.push((uids[0].to_string(), "<UID1>".into()));
        subs.push((uids[1].to_string(), "<UID2>".into()));
        subs.push((format!("{}/pods", lab.display()), "<LOGS>".into()));
        subs.push((format!("{}/podlogs", lab.display()), "<LOGS>".into()));
        subs.push((lab.display().to_string(), "<LAB>".into()));
        subs.push((reg.to_string(), "<REG>".into()));
        subs.push((auth.to_string(), "<AUTHREG>".into()));
        Side {
            subs,
            golden: false,
        }
    }

    fn golden() -> Self {
        let mut s = Side::new(
            &golden_ids(),
            GOLDEN_UIDS,
            Path::new("/tmp/crictl-lab"),
            "127.0.0.1:5200",
            "127.0.0.1:5201",
        );
        s.golden = true;
        s
    }

    /// The text with everything that differs between runs replaced. `table`: column widths
    /// too (a run of two or more spaces becomes ` | `).
    fn norm(&self, text: &str, table: bool) -> String {
        let mut t = text.replace("\":  ", "\": ");
        for (from, to) in &self.subs {
            t = t.replace(from, to);
        }
        if self.golden {
            t = t
                .replace("\"pid\": \"CONTAINER\"", "\"pid\": \"POD\"")
                .replace("pid: CONTAINER", "pid: POD");
        }
        let patterns = [
            (
                r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
                "<TIME>",
            ),
            (
                r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d+)? [+-]\d{4} [A-Z]+",
                "<TIME>",
            ),
            (r#""\d{19}""#, "\"<NS>\""),
            (
                r"(\d+|About an?|Less than a) (second|minute|hour|day|week|month|year)s? ago",
                "<AGE>",
            ),
        ];
        for (re, to) in patterns {
            t = Regex::new(re).unwrap().replace_all(&t, to).into_owned();
        }
        // lines only one side has: the kubelet driver marks containers and sandboxes with
        // their type, as the kubelet does; the test labels its objects to list only them;
        // other tests may add tags to the shared busybox image
        let mut lines: Vec<&str> = t
            .lines()
            .filter(|l| {
                !l.contains("io.kubernetes.container.type")
                    && !l.contains(RUN_LABEL)
                    && !l.contains("secure/busybox")
            })
            .collect();
        if table {
            let cols = Regex::new(r"(\S) {2,}").unwrap();
            let joined: Vec<String> = lines
                .iter()
                .map(|l| cols.replace_all(l, "$1 | ").into_owned())
                .collect();
            return joined.join("\n") + "\n";
        }
        // a dropped last element of a JSON list leaves a comma behind
        let mut out: Vec<String> = Vec::new();
        for l in lines.drain(..) {
            if l.trim_start().starts_with(']')
                && let Some(prev) = out.last_mut()
                && prev.ends_with(',')
            {
                prev.pop();
            }
            out.push(l.to_string());
        }
        out.join("\n") + "\n"
    }
}

/// The golden scenario, rebuilt on the lab's containerd.
struct Scenario {
    lab: Lab,
    config: tempfile::TempDir,
    ours: Side,
    ids: Vec<(String, String)>,
    run: String,
}

impl Scenario {
    /// `kruised crictl -r <lab> ARGS`, with an empty crictl.yaml so the machine's does not
    /// interfere.
    async fn crictl(&self, args: &[&str]) -> Output {
        crictl_at(
            &self.lab,
            self.config.path(),
            env!("CARGO_BIN_EXE_kruised"),
            args,
        )
        .await
    }

    fn id(&self, sym: &str) -> &str {
        &self.ids.iter().find(|(s, _)| s == sym).unwrap().1
    }

    fn label(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    /// Runs ARGS and compares stdout with the golden `name`.
    async fn same(&self, name: &str, args: &[&str], table: bool) {
        let out = self.crictl(args).await;
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = self.ours.norm(&String::from_utf8_lossy(&out.stdout), table);
        let want = Side::golden().norm(&golden(name), table);
        assert_eq!(ours, want, "{args:?} differs from {name}");
    }
}

async fn crictl_at(lab: &Lab, config: &Path, program: &str, args: &[&str]) -> Output {
    let mut c = tokio::process::Command::new(program);
    if !program.ends_with("/crictl") {
        c.arg("crictl");
    }
    c.env_remove("CONTAINER_RUNTIME_ENDPOINT")
        .env_remove("IMAGE_SERVICE_ENDPOINT")
        .env_remove("RUST_LOG")
        .env("CRI_CONFIG_FILE", config.join("crictl.yaml"))
        .arg("-r")
        .arg(format!("unix://{}", lab.socket.display()))
        .args(args)
        .kill_on_drop(true);
    within(LIMIT, &format!("crictl {args:?}"), c.output())
        .await
        .unwrap()
}

fn map(pairs: &[(&str, &str)]) -> StringMap {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn container(lab: &Lab, name: &str, image: &str, script: &str, run: &str) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        image: lab.image(image),
        command: vec!["sh".into(), "-c".into(), script.into()],
        hash: "abcd1234".into(),
        labels: map(&[("example.com/role", name), (RUN_LABEL, run)]),
        ..Default::default()
    }
}

/// Builds the golden's pods and containers with the kubelet driver, in the golden's order, and
/// stops the logger once it has written its output.
async fn scenario(lab: Lab) -> Scenario {
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let run = unique("crictl");
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    let uids = [format!("{run}-uid1"), format!("{run}-uid2")];

    let mut p1 = PodSpec::new("web-0", vec![]);
    p1.uid = uids[0].clone();
    p1.labels = map(&[("app", "web"), ("tier", "frontend"), (RUN_LABEL, &run)]);
    p1.annotations = map(&[
        ("kubernetes.io/config.source", "api"),
        (
            "kubernetes.io/config.seen",
            "2026-11-30T17:00:00.000000000Z",
        ),
        ("example.com/note", "pod one"),
    ]);
    let mut p2 = PodSpec::new("db-0", vec![]);
    p2.namespace = "kube-system".into();
    p2.uid = uids[1].clone();
    p2.attempt = 1;
    p2.labels = map(&[("app", "db"), (RUN_LABEL, &run)]);
    p2.annotations = map(&[
        ("kubernetes.io/config.source", "api"),
        ("example.com/note", "pod two"),
    ]);
    let app = container(&lab, "app", "busybox:v1", "echo hello; sleep 3600", &run);
    let logger = container(
        &lab,
        "logger",
        "busybox:v1",
        // the golden's output, stderr first: the two streams reach the log file through
        // separate pipes, so stdout waits until the test has seen the stderr line there
        "echo to-stderr >&2; until [ -e /tmp/go ]; do sleep 0.05; done; echo hello; \
         for i in 1 2 3 4 5; do echo line $i; done; printf no-newline; touch /tmp/logged; \
         sleep 3600",
        &run,
    );
    let sidecar = container(
        &lab,
        "sidecar",
        "busybox:v2",
        "echo hello; sleep 3600",
        &run,
    );
    let created = container(&lab, "created", "busybox:v2", "echo never", &run);

    let ids = within(LIMIT, "the golden scenario", async {
        let p1_id = k.run_sandbox(&p1).await;
        let a = k.start(&p1, &p1_id, &app, 0).await;
        let l = k.start(&p1, &p1_id, &logger, 2).await;
        let p2_id = k.run_sandbox(&p2).await;
        let s = k.start(&p2, &p2_id, &sidecar, 0).await;
        let n = k.create(&p2, &p2_id, &created, 0).await;
        let log = lab
            .dir
            .join("pods")
            .join(format!("default_web-0_{}", p1.uid))
            .join("logger/2.log");
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(" stderr F to-stderr\n")
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let go = vec!["touch".into(), "/tmp/go".into()];
        let r = k.runtime().exec_sync(&l, go, LIMIT).await.unwrap();
        assert_eq!(r.exit_code, 0);
        // the logger's output is complete (the partial line waits in the runtime's buffer)
        loop {
            let r = k
                .runtime()
                .exec_sync(
                    &l,
                    vec!["test".into(), "-f".into(), "/tmp/logged".into()],
                    LIMIT,
                )
                .await
                .unwrap();
            if r.exit_code == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ids: Vec<(String, String)> = [
            ("P1", p1_id),
            ("A", a),
            ("L", l),
            ("P2", p2_id),
            ("S", s),
            ("N", n),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        ids
    })
    .await;
    let ours = Side::new(
        &ids,
        [&uids[0], &uids[1]],
        &lab.dir,
        &lab.registry,
        &lab.auth_registry,
    );
    Scenario {
        lab,
        config,
        ours,
        ids,
        run,
    }
}

impl Scenario {
    async fn remove(&self) {
        let rt = self.lab.runtime();
        for p in ["P1", "P2"] {
            rt.stop_pod_sandbox(self.id(p)).await.unwrap();
            rt.remove_pod_sandbox(self.id(p)).await.unwrap();
        }
    }
}

/// The top-level blocks of sorted Go JSON (`  "key": {` to `  }`) or YAML (`key:` to the next
/// key at column 0).
fn block(text: &str, key: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let json_start = format!("  \"{key}\": ");
    let yaml_start = format!("{key}:");
    let Some(start) = lines
        .iter()
        .position(|l| l.starts_with(&json_start) || *l == yaml_start)
    else {
        panic!("no {key} in {text}");
    };
    let json = lines[start].starts_with(&json_start);
    let end = lines[start + 1..]
        .iter()
        .position(|l| {
            if json {
                l.starts_with("  }")
            } else {
                !l.starts_with(' ') && !l.is_empty()
            }
        })
        .map_or(lines.len(), |i| start + 1 + i + usize::from(json));
    lines[start..end].join("\n")
}

/// The keys of the `info` block, one level down.
fn info_keys(text: &str) -> Vec<String> {
    let info = block(text, "info");
    let re = Regex::new(r#"^(?:    "([^"]+)":|  ([^ :][^:]*):)"#).unwrap();
    info.lines()
        .skip(1)
        .filter_map(|l| re.captures(l))
        .filter_map(|c| c.get(1).or(c.get(2)).map(|m| m.as_str().to_string()))
        .collect()
}

/// The items of a proto3-JSON (`    {` .. `    }`) or YAML (`- ...`) list whose text contains
/// `needle`.
fn items(text: &str, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Vec<&str> = Vec::new();
    let flush = |cur: &mut Vec<&str>, out: &mut Vec<String>| {
        let item = cur.join("\n");
        if item.contains(needle) {
            // the last item carries the document's end (a comma before it, a blank line
            // after it in YAML)
            out.push(item.trim_end().trim_end_matches(',').to_string());
        }
        cur.clear();
    };
    for l in text.lines() {
        if l == "    {" || l.starts_with("- ") {
            flush(&mut cur, &mut out);
        }
        if l == "  ]" {
            flush(&mut cur, &mut out);
        }
        cur.push(l);
        if l == "    }" || l == "    }," {
            flush(&mut cur, &mut out);
        }
    }
    flush(&mut cur, &mut out);
    out
}

#[tokio::test]
async fn listings_and_inspections_match_crictls_goldens() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = env!("CARGO_BIN_EXE_kruised");
    // the kubelet pulls before it creates; the outputs are the golden's (image IDs are
    // reproducible)
    for (image, name) in [("busybox:v1", "pull.txt"), ("busybox:v2", "pull-v2.txt")] {
        let out = crictl_at(&lab, config.path(), bin, &["pull", &lab.image(image)]).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), golden(name));
    }
    let sc = scenario(lab).await;

    // stop prints the ID as given
    let out = sc.crictl(&["stop", sc.id("L")]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sc.ours.norm(&String::from_utf8_lossy(&out.stdout), false),
        Side::golden().norm(&golden("stop.txt"), false)
    );

    let label = sc.label();
    let l = ["--label", label.as_str()];
    sc.same("ps.txt", &["ps", l[0], l[1]], true).await;
    sc.same("ps-a.txt", &["ps", "-a", l[0], l[1]], true).await;
    sc.same(
        "ps-a-json.json",
        &["ps", "-a", "-o", "json", l[0], l[1]],
        false,
    )
    .await;
    sc.same(
        "ps-a-yaml.yaml",
        &["ps", "-a", "-o", "yaml", l[0], l[1]],
        false,
    )
    .await;
    sc.same("ps-v.txt", &["ps", "-a", "-v", l[0], l[1]], false)
        .await;
    sc.same("pods.txt", &["pods", l[0], l[1]], true).await;
    sc.same("pods-json.json", &["pods", "-o", "json", l[0], l[1]], false)
        .await;
    sc.same("pods-yaml.yaml", &["pods", "-o", "yaml", l[0], l[1]], false)
        .await;
    sc.same("pods-v.txt", &["pods", "-v", l[0], l[1]], false)
        .await;

    // inspect: the status in full, the runtime's info by its keys (pids, paths, specs vary)
    for (sym, name) in [
        ("A", "inspect.json"),
        ("L", "inspect-exited.json"),
        ("N", "inspect-created.json"),
    ] {
        let out = sc.crictl(&["inspect", sc.id(sym)]).await;
        assert!(out.status.success());
        let ours = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            block(&sc.ours.norm(&ours, false), "status"),
            block(&Side::golden().norm(&golden(name), false), "status"),
            "inspect {sym}"
        );
        assert_eq!(info_keys(&ours), info_keys(&golden(name)), "inspect {sym}");
        assert!(ours.starts_with("{\n  \"info\": {\n"), "{ours}");
    }
    let out = sc.crictl(&["inspect", "-o", "yaml", sc.id("A")]).await;
    let ours = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        block(&sc.ours.norm(&ours, false), "status"),
        block(
            &Side::golden().norm(&golden("inspect-yaml.yaml"), false),
            "status"
        )
    );
    assert_eq!(info_keys(&ours), info_keys(&golden("inspect-yaml.yaml")));
    sc.same("inspect-q.json", &["inspect", "-q", sc.id("A")], false)
        .await;
    sc.same(
        "inspect-exited-table.txt",
        &["inspect", "-q", "-o", "table", sc.id("L")],
        false,
    )
    .await;
    sc.same(
        "inspect-created-table.txt",
        &["inspect", "-q", "-o", "table", sc.id("N")],
        false,
    )
    .await;

    let out = sc.crictl(&["inspectp", sc.id("P1")]).await;
    let ours = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        block(&sc.ours.norm(&ours, false), "status"),
        block(
            &Side::golden().norm(&golden("inspectp.json"), false),
            "status"
        )
    );
    assert_eq!(info_keys(&ours), info_keys(&golden("inspectp.json")));
    let out = sc.crictl(&["inspectp", "-o", "yaml", sc.id("P1")]).await;
    assert_eq!(
        block(
            &sc.ours.norm(&String::from_utf8_lossy(&out.stdout), false),
            "status"
        ),
        block(
            &Side::golden().norm(&golden("inspectp-yaml.yaml"), false),
            "status"
        )
    );
    sc.same("inspectp-q.json", &["inspectp", "-q", sc.id("P1")], false)
        .await;

    // images: the runtime's, with their reproducible IDs and digests
    let v1 = sc.lab.image("busybox:v1");
    sc.same("inspecti.json", &["inspecti", &v1], false).await;
    sc.same(
        "inspecti-yaml.yaml",
        &["inspecti", "-o", "yaml", &v1],
        false,
    )
    .await;
    sc.same("inspecti-q.json", &["inspecti", "-q", &v1], false)
        .await;
    sc.same(
        "inspecti-table.txt",
        &["inspecti", "-o", "table", &v1],
        false,
    )
    .await;
    for (args, name, table) in [
        (&["images"][..], "images.txt", true),
        (&["images", "--digests"], "images-digests.txt", true),
    ] {
        let out = sc.crictl(args).await;
        let ours = sc.ours.norm(&String::from_utf8_lossy(&out.stdout), table);
        let want = Side::golden().norm(&golden(name), table);
        let mut want_lines = want.lines();
        assert_eq!(ours.lines().next(), want_lines.next(), "{name} header");
        for row in want_lines.filter(|r| !r.contains("noenv")) {
            assert!(
                ours.lines().any(|l| l == row),
                "{name}: no row {row:?} in\n{ours}"
            );
        }
    }
    for (args, name) in [
        (&["images", "-o", "json"][..], "images-json.json"),
        (&["images", "-o", "yaml"], "images-yaml.yaml"),
    ] {
        let out = sc.crictl(args).await;
        let ours = sc.ours.norm(&String::from_utf8_lossy(&out.stdout), false);
        let want = Side::golden().norm(&golden(name), false);
        assert_eq!(ours.lines().next(), want.lines().next(), "{name}");
        for needle in [
            "<REG>/test/busybox:v1",
            "<REG>/test/busybox:v2",
            "<REG>/test/pause:v1",
        ] {
            assert_eq!(
                items(&ours, needle),
                items(&want, needle),
                "{name}: {needle}"
            );
        }
    }

    sc.same("version.txt", &["version"], false).await;
    sc.same("info.json", &["info"], false).await;
    sc.same("info-yaml.yaml", &["info", "-o", "yaml"], false)
        .await;
    sc.same("info-q.json", &["info", "-q"], false).await;
    let value = Regex::new(r#"value": "\d+""#).unwrap();
    let out = sc.crictl(&["imagefsinfo"]).await;
    assert_eq!(
        value
            .replace_all(
                &sc.ours.norm(&String::from_utf8_lossy(&out.stdout), false),
                "value\": N"
            )
            .into_owned(),
        value
            .replace_all(
                &Side::golden().norm(&golden("imagefsinfo.json"), false),
                "value\": N"
            )
            .into_owned()
    );

    // logs: the container's output, stdout to stdout and stderr to stderr
    let out = sc.crictl(&["logs", sc.id("L")]).await;
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden("logs.txt"));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-stderr\n");
    sc.same("logs-tail.txt", &["logs", "--tail", "2", sc.id("L")], false)
        .await;
    sc.same(
        "logs-timestamps.txt",
        &["logs", "--timestamps", sc.id("L")],
        false,
    )
    .await;
    sc.same(
        "logs-t-tail.txt",
        &["logs", "-t", "--tail=3", sc.id("L")],
        false,
    )
    .await;

    // kruised's own columns: the recorded kubelet hash and which container is current
    let out = sc.crictl(&["ps", "-a", "--kruise", l[0], l[1]]).await;
    let stdout = sc.ours.norm(&String::from_utf8_lossy(&out.stdout), true);
    let mut lines = stdout.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .ends_with("| NAMESPACE | KUBELET HASH | CURRENT"),
        "{stdout}"
    );
    assert!(
        lines.all(|l| l.ends_with("| abcd1234 | true")),
        "each container is the newest of its name: {stdout}"
    );

    // stats: containerd 1.6 serves ListContainerStats
    let out = sc.crictl(&["stats", "-o", "json", l[0], l[1]]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = v["stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["attributes"]["id"].as_str().unwrap())
        .collect();
    let mut want: Vec<&str> = ["A", "L", "S", "N"].iter().map(|s| sc.id(s)).collect();
    want.sort_unstable();
    assert_eq!(ids, want, "sorted by container ID");
    let out = sc.crictl(&["stats", "-s", "1", l[0], l[1]]).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let header: Vec<&str> = stdout
        .lines()
        .next()
        .unwrap()
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "CONTAINER",
            "NAME",
            "CPU %",
            "MEM",
            "DISK",
            "INODES",
            "SWAP"
        ]
    );

    // events: containerd 1.6 has no GetContainerEvents
    let out = sc.crictl(&["events"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("GetContainerEvents"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    sc.remove().await;
}

#[tokio::test]
async fn logs_follow_prints_until_the_container_exits() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = env!("CARGO_BIN_EXE_kruised");
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    crictl_at(
        &lab,
        config.path(),
        bin,
        &["pull", &lab.image("busybox:v1")],
    )
    .await;
    let mut c = ContainerSpec::sleeper("main", &lab.image("busybox:v1"));
    // runs a little while, so most of its output comes after `logs -f` started
    c.command = vec![
        "sh".into(),
        "-c".into(),
        "echo first; sleep 1; echo second >&2; sleep 1; printf last".into(),
    ];
    let pod = within(
        LIMIT,
        "pod start",
        k.run_pod(PodSpec::new(&unique("follow"), vec![c])),
    )
    .await;
    let out = crictl_at(
        &lab,
        config.path(),
        bin,
        &["logs", "-f", pod.container("main")],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\nlast");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "second\n");
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}

#[tokio::test]
async fn exec_sync_returns_the_output_and_the_commands_exit_status() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = env!("CARGO_BIN_EXE_kruised");
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    crictl_at(
        &lab,
        config.path(),
        bin,
        &["pull", &lab.image("busybox:v1")],
    )
    .await;
    let pod = within(
        LIMIT,
        "pod start",
        k.run_pod(PodSpec::new(
            &unique("exec"),
            vec![ContainerSpec::sleeper("main", &lab.image("busybox:v1"))],
        )),
    )
    .await;
    let id = pod.container("main").to_string();

    let out = crictl_at(
        &lab,
        config.path(),
        bin,
        &[
            "exec",
            "-s",
            &id,
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    let out = crictl_at(&lab, config.path(), bin, &["exec", "-s", &id[..12], "true"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty() && out.stderr.is_empty());

    let out = crictl_at(
        &lab,
        config.path(),
        bin,
        &["exec", "-s", "--timeout", "1", &id, "sleep", "5"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timed out after 1s"), "{stderr}");

    let out = crictl_at(
        &lab,
        config.path(),
        bin,
        &["exec", "-s", &id, "/nonexistent"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}

#[tokio::test]
async fn pull_with_credentials_and_rmi_of_one_of_two_tags() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = env!("CARGO_BIN_EXE_kruised");
    let run = |args: Vec<String>| {
        let lab = lab.clone();
        let dir = config.path().to_path_buf();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crictl_at(&lab, &dir, bin, &args).await
        }
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    // crictl/busybox is this test's own image (cri-lab.sh): nothing else uses its ID
    let v1 = format!("{}/crictl/busybox:v1", lab.registry);
    let alias = format!("{}/crictl/busybox:alias", lab.registry);
    let secure = format!("{}/crictl/busybox:v1", lab.auth_registry);

    let out = run(vec!["pull".into(), v1.clone()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pulled = text(&out.stdout);
    let re = Regex::new(r"^Image is up to date for sha256:[0-9a-f]{64}\n$").unwrap();
    assert!(re.is_match(&pulled), "{pulled}");
    let out = run(vec!["pull".into(), alias.clone()]).await;
    assert_eq!(text(&out.stdout), pulled, "one image, two tags");

    // without a login the registry refuses; with --creds it serves
    let out = run(vec!["pull".into(), secure.clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("401") || stderr.contains("nauthorized"),
        "{stderr}"
    );
    let (user, password) = lab.auth_credentials();
    let out = run(vec![
        "pull".into(),
        "--creds".into(),
        format!("{user}:{password}"),
        secure.clone(),
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), pulled);
    assert!(!text(&out.stderr).contains(&password));

    // removing by one tag removes the image and all its tags, with a warning naming them
    let out = run(vec!["rmi".into(), alias.clone()]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut deleted: Vec<&str> = stdout.lines().collect();
    deleted.sort_unstable();
    let mut want = vec![
        format!("Deleted: {alias}"),
        format!("Deleted: {secure}"),
        format!("Deleted: {v1}"),
    ];
    want.sort_unstable();
    assert_eq!(deleted, want);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("has multiple tags") && stderr.contains(&v1),
        "{stderr}"
    );
    // the golden shows the same shape
    assert!(
        golden("rmi-one-of-two-tags.txt")
            .lines()
            .all(|l| l.starts_with("Deleted: "))
    );

    let out = run(vec!["inspecti".into(), v1.clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no such image"),
        "{}",
        text(&out.stderr)
    );
    let out = run(vec!["rmi".into(), v1.clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("no such image {v1}")));
}

#[tokio::test]
async fn the_binary_run_as_crictl_answers_like_crictl() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let link: PathBuf = config.path().join("crictl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kruised"), &link).unwrap();
    let out = crictl_at(&lab, config.path(), link.to_str().unwrap(), &["version"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden("version.txt"));
    let out = crictl_at(&lab, config.path(), link.to_str().unwrap(), &["info", "-q"]).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), golden("info-q.json"));
}
