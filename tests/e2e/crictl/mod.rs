//! End-to-end tests of `kruised crictl` against the real runtime under test (`tests/cri-lab.sh`:
//! containerd 1.6, containerd 2.x or CRI-O): a scenario built with the kubelet driver, and each
//! output compared with what the real crictl (cri-tools 1.36) prints for the same command: live,
//! at the same moment, where a crictl is provided (`KRUISED_RUNTIMES_ASSETS`, put in the lab; or
//! `KRUISED_CRICTL`), else as recorded for the runtime ([`reference`]: containerd 1.6 has a
//! recording, which CI compares with). Both sides are normalised for what may differ between two
//! calls a moment apart (ages, protojson's random spacing, table column widths, the rows of
//! images other tests pull meanwhile), and made canonical for what differs between runs.

mod reference;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::support::daemon::kruised_bin;
use crate::support::kubelet::{ContainerSpec, Kubelet, PodSpec};
use crate::support::{Lab, unique, wait, within};
use kruised::cri::{ImageService, KubeletService, RuntimeService, StringMap};
use reference::{Canon, Reference, Seen};
use regex_lite::Regex;

const LIMIT: Duration = Duration::from_secs(60);
/// The label the test puts on its pods and containers, to list only them.
const RUN_LABEL: &str = "e2e.kruised.io/run";
/// Images other tests pull and remove while these list: lines naming them are left out of a
/// comparison.
const MOVING_IMAGES: [&str; 4] = [
    "crictl/busybox",
    "secure/busybox",
    "secure/plugin",
    "imagepull/",
];

/// The text with what differs between two calls a moment apart made equal. `table`: column
/// widths too (a run of two or more spaces becomes ` | `).
fn norm(text: &str, table: bool) -> String {
    let mut t = text.replace("\":  ", "\": ");
    let age =
        Regex::new(r"(\d+|About an?|Less than a) (second|minute|hour|day|week|month|year)s? ago")
            .unwrap();
    t = age.replace_all(&t, "<AGE>").into_owned();
    let mut lines: Vec<String> = Vec::new();
    for l in t.lines() {
        if MOVING_IMAGES.iter().any(|m| l.contains(m)) {
            continue;
        }
        // a dropped last element of a JSON list leaves a comma behind
        if l.trim_start().starts_with(']')
            && let Some(prev) = lines.last_mut()
            && prev.ends_with(',')
        {
            prev.pop();
        }
        lines.push(l.to_string());
    }
    if table {
        let cols = Regex::new(r"(\S) {2,}").unwrap();
        let joined: Vec<String> = lines
            .iter()
            .map(|l| cols.replace_all(l, "$1 | ").into_owned())
            .collect();
        return joined.join("\n") + "\n";
    }
    lines.join("\n") + "\n"
}

/// Fails with the lines where `ours` (kruised crictl's) and `theirs` (crictl's) first differ,
/// three lines either side, rather than both texts whole.
#[track_caller]
fn assert_same_text(ours: &str, theirs: &str, what: &str) {
    if ours == theirs {
        return;
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), theirs.lines().collect());
    let first = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(0);
    let window = |l: &[&str]| -> String {
        let from = first.saturating_sub(3);
        let to = (first + 4).min(l.len());
        l.get(from..to).unwrap_or_default().iter().enumerate().fold(
            String::new(),
            |mut out, (i, line)| {
                let mark = if from + i == first { ">" } else { " " };
                out.push_str(&format!("{mark}{:4} {line}\n", from + i + 1));
                out
            },
        )
    };
    panic!(
        "{what}: kruised crictl and crictl differ from line {} on ({} and {} lines)\n\
         kruised crictl:\n{}crictl:\n{}",
        first + 1,
        a.len(),
        b.len(),
        window(&a),
        window(&b)
    );
}

/// Images no test removes: listings are compared on them alone.
const STABLE_IMAGES: [&str; 3] = ["/test/busybox:v1", "/test/busybox:v2", "/test/pause:v1"];

/// The items of a proto3-JSON list (`    {` .. `    }`) or a YAML one (`- ...`), or the rows
/// of a table, that name one of the [`STABLE_IMAGES`] (for a table with its repository and tag
/// in two columns, as [`norm`] leaves them), with the first line (a table's header, a document's opening).
fn stable_items(text: &str, table: bool) -> Vec<String> {
    let mut lines = text.lines();
    let mut out: Vec<String> = lines.next().map(String::from).into_iter().collect();
    if table {
        // normalised columns: `REPOSITORY | TAG | ...`
        out.extend(
            lines
                .filter(|l| {
                    let named = l.replacen(" | ", ":", 1);
                    STABLE_IMAGES.iter().any(|i| named.contains(i))
                })
                .map(String::from),
        );
        return out;
    }
    let mut cur: Vec<&str> = Vec::new();
    let mut flush = |cur: &mut Vec<&str>| {
        let item = cur.join("\n");
        let named = item.replace("\"\n", "\"").replace(['"', ' '], "");
        if STABLE_IMAGES.iter().any(|i| named.contains(i)) {
            out.push(item.trim_end().trim_end_matches(',').to_string());
        }
        cur.clear();
    };
    for l in text.lines().skip(1) {
        if l == "    {" || l.starts_with("- ") || l == "  ]" {
            flush(&mut cur);
        }
        cur.push(l);
    }
    flush(&mut cur);
    out
}

/// The message of a failed command: kruised's `error: ...` line, crictl's logrus
/// `level=fatal msg="..."` (unquoted).
fn failure(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    if let Some(m) = text.lines().find_map(|l| l.strip_prefix("error: ")) {
        return m.to_string();
    }
    let quoted = text
        .lines()
        .find_map(|l| l.split_once("level=fatal msg=").map(|(_, m)| m))
        .unwrap_or_else(|| panic!("no failure in {text}"));
    serde_json::from_str::<String>(quoted).unwrap_or_else(|_| quoted.to_string())
}

/// The scenario: two pods of the kubelet driver's, in the lab's runtime.
struct Scenario {
    lab: Lab,
    reference: Reference,
    canon: Canon,
    config: tempfile::TempDir,
    ids: Vec<(String, String)>,
    run: String,
}

/// What a command gave, as compared: `stdout` through `text` (normalising), then canonical.
fn seen(canon: &Canon, out: &Output, text: impl Fn(&str) -> String) -> Seen {
    Seen::lines(
        out.status.code(),
        canon.apply(&text(&String::from_utf8_lossy(&out.stdout))),
        None,
    )
}

impl Scenario {
    /// `kruised crictl -r <lab> ARGS`, with the scenario's crictl.yaml (only a time limit) so
    /// the machine's does not interfere.
    async fn crictl(&self, args: &[&str]) -> Output {
        crictl_at(&self.lab, self.config.path(), &ours(), args).await
    }

    fn id(&self, sym: &str) -> &str {
        &self.ids.iter().find(|(s, _)| s == sym).unwrap().1
    }

    fn label(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    /// Compares kruised's result for `args` with crictl's (live or recorded), both made
    /// comparable by `text` (applied to stdout) and then canonical. A live crictl is asked
    /// again where exactly one of the two failed: the runtime's error of a moment (CRI-O once
    /// failed one status call of the real crictl's on the busy CI machine), or a difference of
    /// the tools, which stays one.
    async fn compare(&mut self, args: &[&str], text: impl Fn(&str) -> String + Copy) {
        let key = self.canon.apply(&args.join(" "));
        for attempt in 0..3 {
            let out = self.crictl(args).await;
            let ours = seen(&self.canon, &out, text);
            let (lab, config, canon) = (&self.lab, self.config.path(), &self.canon);
            let Some(theirs) =
                self.reference
                    .expected(
                        &key,
                        &ours,
                        |crictl| async move {
                            crictl_at(lab, config, crictl.to_str().unwrap(), args).await
                        },
                        |o| seen(canon, o, text),
                    )
                    .await
            else {
                assert!(
                    out.status.success(),
                    "{args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return;
            };
            if ours.code != theirs.code && self.reference.live().is_some() && attempt < 2 {
                eprintln!(
                    "{args:?}: one failed, asking both again: ours {:?}, crictl {:?}",
                    ours.code, theirs.code
                );
                continue;
            }
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                ours.code,
                theirs.code,
                "{args:?}; ours' stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_same_text(&ours.stdout, &theirs.stdout, &format!("{args:?}"));
            return;
        }
    }

    /// [`Scenario::compare`] for image listings: the entries of the [`STABLE_IMAGES`].
    async fn same_images(&mut self, args: &[&str], table: bool) {
        let ours = self.crictl(args).await;
        let items = stable_items(&norm(&String::from_utf8_lossy(&ours.stdout), table), table);
        assert!(items.len() > STABLE_IMAGES.len(), "{args:?}: {items:?}");
        self.compare(args, |t| stable_items(&norm(t, table), table).join("\n"))
            .await;
    }

    /// Runs ARGS with both and compares their stdout (normalised) and exit status.
    async fn same(&mut self, args: &[&str], table: bool) {
        self.compare(args, |t| norm(t, table)).await;
    }
}

/// `kruised` as the tests run it ([`kruised_bin`]: in `tests/run.sh`, the shipped build).
fn ours() -> String {
    kruised_bin().to_string_lossy().into_owned()
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

/// Builds the scenario's pods and containers with the kubelet driver, and stops the logger
/// once it has written its output: pods `P1` (`web-0` in `default`) and `P2` (`db-0` in
/// `kube-system`, attempt 1); containers `A` (`app`, running), `L` (`logger`, attempt 2,
/// stopped), `S` (`sidecar`, busybox:v2, running), `N` (`created`, never started).
async fn scenario(lab: Lab, reference: Reference) -> Scenario {
    let config = tempfile::tempdir().unwrap();
    // both tools' time limit for one call, 2 s by default, is too short for CRI-O stopping a
    // container while CI keeps both cores busy (it once took more than 4 s)
    std::fs::write(config.path().join("crictl.yaml"), "timeout: 30\n").unwrap();
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
        // the output `logs` shows, stderr first: the two streams reach the log file through
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

    let ids = within(LIMIT, "the scenario", async {
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
    let version = lab.runtime().version().await.unwrap().runtime_version;
    Scenario {
        canon: Canon::new(&lab, &ids, &run, &version),
        lab,
        reference,
        config,
        ids,
        run,
    }
}

impl Scenario {
    /// Stops the containers, then the pods, as the kubelet does (a runtime stopping a pod
    /// waits out the grace of containers that ignore SIGTERM: CRI-O a minute), and removes
    /// the pods.
    async fn remove(&self) {
        let rt = self.lab.runtime();
        for c in ["A", "S"] {
            rt.stop_container(self.id(c), Duration::ZERO).await.unwrap();
        }
        for p in ["P1", "P2"] {
            rt.stop_pod_sandbox(self.id(p)).await.unwrap();
            rt.remove_pod_sandbox(self.id(p)).await.unwrap();
        }
    }
}

#[tokio::test]
async fn listings_and_inspections_are_crictls() {
    let Some(lab) = Lab::get() else { return };
    let reference = Reference::get(&lab, "listings_and_inspections_are_crictls");
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = &ours();
    // the kubelet pulls before it creates; pulling again says what crictl says
    let mut pulled = Vec::new();
    for image in ["busybox:v1", "busybox:v2"] {
        let args = ["pull", &lab.image(image)];
        let ours = crictl_at(&lab, config.path(), bin, &args).await;
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        pulled.push((args.map(String::from), ours));
    }
    let mut sc = scenario(lab, reference).await;
    for (args, ours) in pulled {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let key = sc.canon.apply(&args.join(" "));
        let canon = &sc.canon;
        let ours = seen(canon, &ours, str::to_string);
        let (lab, config) = (&sc.lab, config.path());
        let theirs = sc
            .reference
            .expected(
                &key,
                &ours,
                |c| async move { crictl_at(lab, config, c.to_str().unwrap(), &args).await },
                |o| seen(canon, o, str::to_string),
            )
            .await;
        if let Some(theirs) = theirs {
            assert_eq!(ours, theirs, "{key}");
        }
    }

    // stop prints the ID as given (kruised stops it, crictl finds it stopped)
    let stop = sc.id("L").to_string();
    sc.same(&["stop", &stop], false).await;

    let label = sc.label();
    let l = ["--label", label.as_str()];
    sc.same(&["ps", l[0], l[1]], true).await;
    sc.same(&["ps", "-a", l[0], l[1]], true).await;
    sc.same(&["ps", "-a", "--no-trunc", l[0], l[1]], true).await;
    sc.same(&["ps", "-a", "-o", "json", l[0], l[1]], false)
        .await;
    sc.same(&["ps", "-a", "-o", "yaml", l[0], l[1]], false)
        .await;
    sc.same(&["ps", "-a", "-v", l[0], l[1]], false).await;
    sc.same(&["pods", l[0], l[1]], true).await;
    sc.same(&["pods", "-o", "json", l[0], l[1]], false).await;
    sc.same(&["pods", "-o", "yaml", l[0], l[1]], false).await;
    sc.same(&["pods", "-v", l[0], l[1]], false).await;

    // inspect: the status and the runtime's info (its OCI spec, pids, paths) in full
    let id = |sym: &str| sc.id(sym).to_string();
    let (a, ll, n, p1) = (id("A"), id("L"), id("N"), id("P1"));
    for c in [&a, &ll, &n] {
        sc.same(&["inspect", c], false).await;
        sc.same(&["inspect", "-q", "-o", "table", c], false).await;
    }
    sc.same(&["inspect", "-o", "yaml", &a], false).await;
    sc.same(&["inspect", "-q", &a], false).await;
    sc.same(&["inspectp", &p1], false).await;
    sc.same(&["inspectp", "-o", "yaml", &p1], false).await;
    sc.same(&["inspectp", "-q", &p1], false).await;

    let v1 = sc.lab.image("busybox:v1");
    sc.same(&["inspecti", &v1], false).await;
    sc.same(&["inspecti", "-o", "yaml", &v1], false).await;
    sc.same(&["inspecti", "-q", &v1], false).await;
    sc.same(&["inspecti", "-o", "table", &v1], false).await;
    // other tests pull and remove images meanwhile: the images no test removes are compared
    sc.same_images(&["images"], true).await;
    sc.same_images(&["images", "--digests"], true).await;
    sc.same_images(&["images", "-o", "json"], false).await;
    sc.same_images(&["images", "-o", "yaml"], false).await;

    sc.same(&["version"], false).await;
    sc.same(&["info"], false).await;
    sc.same(&["info", "-o", "yaml"], false).await;
    sc.same(&["info", "-q"], false).await;
    // usage is sampled by the runtime in the background: it may change between two calls
    for args in [&["imagefsinfo"][..], &["imagefsinfo", "-o", "yaml"]] {
        sc.compare(args, |t| {
            static VALUE: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
                Regex::new(r#"(?m)^(\s*("value"|value|"timestamp"|timestamp):) .*$"#).unwrap()
            });
            VALUE.replace_all(&norm(t, false), "$1 N").into_owned()
        })
        .await;
    }

    // logs: the container's output, stdout to stdout and stderr to stderr, as written
    for args in [
        &["logs", &ll][..],
        &["logs", "--tail", "2", &ll],
        &["logs", "--timestamps", &ll],
        &["logs", "-t", "--tail=3", &ll],
    ] {
        let out = sc.crictl(args).await;
        assert!(out.status.success());
        let key = sc.canon.apply(&args.join(" "));
        let canon = &sc.canon;
        let both = |o: &Output| {
            Seen::lines(
                o.status.code(),
                canon.apply(&String::from_utf8_lossy(&o.stdout)),
                Some(canon.apply(&String::from_utf8_lossy(&o.stderr))),
            )
        };
        let ours = both(&out);
        let (lab, config) = (&sc.lab, sc.config.path());
        if let Some(theirs) = sc
            .reference
            .expected(
                &key,
                &ours,
                |c| async move { crictl_at(lab, config, c.to_str().unwrap(), args).await },
                both,
            )
            .await
        {
            assert_same_text(&ours.stdout, &theirs.stdout, &format!("{args:?}"));
            assert_eq!(ours.stderr, theirs.stderr, "{args:?}");
        }
    }
    let out = sc.crictl(&["logs", &ll]).await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello\nline 1\nline 2\nline 3\nline 4\nline 5\nno-newline"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "to-stderr\n");

    // kruised's own columns: the recorded kubelet hash and which container is current
    let out = sc.crictl(&["ps", "-a", "--kruise", l[0], l[1]]).await;
    let stdout = norm(&String::from_utf8_lossy(&out.stdout), true);
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

    // stats: crictl's columns; the figures move, the containers listed do not: the ones the
    // runtime has figures for (the running ones at least; CRI-O has none for an exited one),
    // sorted by ID
    let stats_ids = |o: &Output| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["attributes"]["id"].as_str().unwrap().to_string())
            .collect()
    };
    let stats = ["stats", "-o", "json", l[0], l[1]];
    let out = sc.crictl(&stats).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = stats_ids(&out);
    assert!(ids.is_sorted(), "sorted by container ID: {ids:?}");
    assert!(
        ["A", "S"].iter().all(|s| ids.iter().any(|i| i == sc.id(s))),
        "{ids:?}"
    );
    let canon = &sc.canon;
    let listed = |o: &Output| {
        let mut syms: Vec<String> = stats_ids(o).iter().map(|i| canon.apply(i)).collect();
        syms.sort_unstable();
        Seen::lines(o.status.code(), syms.join("\n"), None)
    };
    let key = sc.canon.apply(&stats.join(" "));
    let ours = listed(&out);
    let (lab, config) = (&sc.lab, sc.config.path());
    if let Some(theirs) = sc
        .reference
        .expected(
            &key,
            &ours,
            |c| async move { crictl_at(lab, config, c.to_str().unwrap(), &stats).await },
            listed,
        )
        .await
    {
        assert_eq!(ours, theirs, "the containers with figures");
    }
    // crictl clears the screen even when its output is no terminal; kruised only on one
    // (README, differences from crictl)
    sc.compare(&["stats", "-s", "1", l[0], l[1]], |t| {
        let first = t.lines().next().map(|l| norm(l, true)).unwrap_or_default();
        first
            .strip_prefix("\u{1b}[2J\u{1b}[H")
            .unwrap_or(&first)
            .to_string()
    })
    .await;

    // events: a runtime without them fails the command, as crictl does
    if !sc.lab.runtime.has_events() {
        let out = sc.crictl(&["events"]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(
            failure(&out.stderr).contains("GetContainerEvents"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let code = |o: &Output| Seen::lines(o.status.code(), String::new(), None);
        let ours = code(&out);
        let (lab, config) = (&sc.lab, sc.config.path());
        if let Some(theirs) = sc
            .reference
            .expected(
                "events",
                &ours,
                |c| async move { crictl_at(lab, config, c.to_str().unwrap(), &["events"]).await },
                code,
            )
            .await
        {
            assert_eq!(ours, theirs, "crictl events on a runtime without events");
        }
    }

    sc.remove().await;
    sc.reference.finish();
}

#[tokio::test]
async fn logs_follow_prints_until_the_container_exits() {
    let Some(lab) = Lab::get() else { return };
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let bin = &ours();
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
    let bin = &ours();
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
    // the same words on every runtime (containerd fails the call, CRI-O answers exit -1),
    // which are crictl's on containerd
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        failure(&out.stderr),
        format!(
            "execing command in container {id} synchronously: command timed out: \
             \"sleep 5\" timed out after 1s"
        )
    );

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
    let bin = &ours();
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
    let re = Regex::new(r"^Image is up to date for (sha256:)?[0-9a-f]{64}\n$").unwrap();
    assert!(re.is_match(&pulled), "{pulled}");
    let out = run(vec!["pull".into(), alias.clone()]).await;
    assert_eq!(text(&out.stdout), pulled, "one image, two tags");

    // without a login the registry refuses; with --creds it serves
    let out = run(vec!["pull".into(), secure.clone()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        lab.runtime.says_unauthorized(&failure(&out.stderr)),
        "{}",
        text(&out.stderr)
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
    // crictl says the same of the same image (live: the image pulled again under its three
    // names first)
    let mut reference = Reference::get(&lab, "pull_with_credentials_and_rmi_of_one_of_two_tags");
    let canon = Canon::new(&lab, &[], "", "");
    let sorted = |o: &Output| {
        let mut lines: Vec<String> = text(&o.stdout).lines().map(|l| canon.apply(l)).collect();
        lines.sort_unstable();
        Seen::lines(o.status.code(), lines.join("\n"), None)
    };
    let ours = sorted(&out);
    let key = canon.apply(&format!("rmi {alias}"));
    let theirs = reference
        .expected(
            &key,
            &ours,
            |real| {
                let (run, v1, alias, secure) = (&run, &v1, &alias, &secure);
                let (user, password, lab, config) = (&user, &password, &lab, &config);
                async move {
                    for image in [v1, alias] {
                        assert!(
                            run(vec!["pull".into(), image.clone()])
                                .await
                                .status
                                .success()
                        );
                    }
                    let out = run(vec![
                        "pull".into(),
                        "--creds".into(),
                        format!("{user}:{password}"),
                        secure.clone(),
                    ])
                    .await;
                    assert!(out.status.success(), "{}", text(&out.stderr));
                    crictl_at(lab, config.path(), real.to_str().unwrap(), &["rmi", alias]).await
                }
            },
            sorted,
        )
        .await;
    if let Some(theirs) = theirs {
        assert_eq!(ours, theirs, "rmi of one of two tags");
    }
    reference.finish();

    // what is left is the runtime's business (containerd removes the image with every tag,
    // CRI-O only the tag named): kruised answers what the runtime holds
    let rt = lab.runtime();
    if rt.image_status(&v1).await.unwrap().is_some() {
        let out = run(vec!["inspecti".into(), v1.clone()]).await;
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        for image in [&v1, &secure] {
            let out = run(vec!["rmi".into(), image.clone()]).await;
            assert!(out.status.success(), "{}", text(&out.stderr));
        }
    }
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
    std::os::unix::fs::symlink(kruised_bin(), &link).unwrap();
    let mut reference = Reference::get(&lab, "the_binary_run_as_crictl_answers_like_crictl");
    let version = lab.runtime().version().await.unwrap().runtime_version;
    let canon = Canon::new(&lab, &[], "", &version);
    for args in [&["version"][..], &["info", "-q"]] {
        let out = crictl_at(&lab, config.path(), link.to_str().unwrap(), args).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = seen(&canon, &out, |t| norm(t, false));
        let (lab, dir) = (&lab, config.path());
        let theirs = reference
            .expected(
                &args.join(" "),
                &ours,
                |real| async move { crictl_at(lab, dir, real.to_str().unwrap(), args).await },
                |o| seen(&canon, o, |t| norm(t, false)),
            )
            .await;
        if let Some(theirs) = theirs {
            assert_same_text(&ours.stdout, &theirs.stdout, &format!("{args:?}"));
            assert_eq!(ours.code, theirs.code, "{args:?}");
        }
    }
    reference.finish();
}

/// A `crictl events` process and what it printed so far.
struct Streaming {
    child: tokio::process::Child,
    out: tokio::sync::watch::Receiver<String>,
}

impl Streaming {
    fn start(lab: &Lab, config: &Path, program: &str) -> Streaming {
        let mut c = tokio::process::Command::new(program);
        if !program.ends_with("/crictl") {
            c.arg("crictl");
        }
        let mut child = c
            .env_remove("CONTAINER_RUNTIME_ENDPOINT")
            .env_remove("RUST_LOG")
            .env("CRI_CONFIG_FILE", config.join("crictl.yaml"))
            .arg("-r")
            .arg(format!("unix://{}", lab.socket.display()))
            .args(["events", "-o", "json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (tx, out) = tokio::sync::watch::channel(String::new());
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                tx.send_modify(|s| s.push_str(&String::from_utf8_lossy(&buf[..n])));
            }
        });
        Streaming { child, out }
    }

    /// The JSON documents printed so far that name container `id` with event `kind`.
    fn events_of(&self, id: &str, kind: &str) -> Vec<String> {
        events_in(&self.out.borrow(), id, kind)
    }
}

/// The JSON documents of `crictl events -o json` output `out` that name container `id` with
/// event `kind`.
fn events_in(out: &str, id: &str, kind: &str) -> Vec<String> {
    let text = norm(out, false);
    let mut docs = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        cur.push_str(l);
        cur.push('\n');
        if l == "}" {
            docs.push(std::mem::take(&mut cur));
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.contains(&format!("\"containerId\": \"{id}\""))
                && d.contains(&format!("\"containerEventType\": \"{kind}\""))
        })
        .collect()
}

#[tokio::test]
async fn events_stream_on_an_idle_node_as_crictls_do() {
    let Some(lab) = Lab::get() else { return };
    if !lab.runtime.has_events() {
        return; // containerd 1.6: listings_and_inspections_are_crictls checks the failure
    }
    // live only: a stream's output is no recording's (no runtime with events has one)
    let reference = Reference::get(&lab, "events_stream_on_an_idle_node_as_crictls_do");
    let real = reference.live().map(Path::to_path_buf);
    let config = tempfile::tempdir().unwrap();
    std::fs::write(config.path().join("crictl.yaml"), "").unwrap();
    let k = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
    k.pull(&[lab.image("busybox:v1")], LIMIT).await;
    let pod = within(
        LIMIT,
        "pod start",
        k.run_pod(PodSpec::new(
            &unique("events"),
            vec![ContainerSpec::sleeper("main", &lab.image("busybox:v1"))],
        )),
    )
    .await;
    let mut ours = Streaming::start(&lab, config.path(), &ours());
    let mut theirs = real
        .as_ref()
        .map(|real| Streaming::start(&lab, config.path(), real.to_str().unwrap()));
    // a quiet node sends nothing: neither gives up (kruised once did after its 2 s timeout)
    let quiet = Duration::from_secs(4);
    for (who, s) in [
        ("kruised crictl", Some(&mut ours)),
        ("crictl", theirs.as_mut()),
    ] {
        let Some(s) = s else { continue };
        let exited = tokio::time::timeout(quiet, s.child.wait()).await;
        assert!(
            exited.is_err(),
            "{who} events ended on a quiet node: {exited:?}"
        );
    }
    // then each prints the events of a container made now, the same way (a container is made
    // until both streams show one: a stream is known to be subscribed only by what it shows)
    let probe = ContainerSpec::sleeper("events-probe", &lab.image("busybox:v1"));
    let kind = "CONTAINER_CREATED_EVENT";
    let id = within(LIMIT, "an event in both streams", async {
        for attempt in 0.. {
            let id = k.create(&pod.spec, &pod.sandbox_id, &probe, attempt).await;
            let mut shown = true;
            for s in std::iter::once(&mut ours).chain(theirs.as_mut()) {
                let look = |out: &String| events_in(out, &id, kind).len();
                let limit = Duration::from_secs(3);
                shown = wait::try_watch(&mut s.out, limit, "the created event", look, |n| *n > 0)
                    .await
                    .is_ok();
                if !shown {
                    break;
                }
            }
            if shown {
                return id;
            }
        }
        unreachable!()
    })
    .await;
    assert_eq!(ours.events_of(&id, kind).len(), 1);
    if let Some(theirs) = &theirs {
        assert_eq!(ours.events_of(&id, kind), theirs.events_of(&id, kind));
    }
    within(LIMIT, "pod removal", k.remove_pod(&pod)).await;
}
