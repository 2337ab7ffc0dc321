//! kruise-daemon and kruised side by side, one after the other, on the cluster of the test layer
//! (real kube-apiserver, kubelet, containerd 2.3) with the same idle pods, each run as its
//! DaemonSet pod would run it: kruise-daemon with the RBAC of kruise's chart, its runtime socket
//! under `/hostvarrun` (a private mount namespace), `NODE_NAME`; kruised with `deploy/`'s RBAC.
//! Figures only, no assertion on them; both columns and their ratio:
//!
//! - resident memory when ready with the idle pods, and after the changes;
//! - CPU and API requests per minute while idle (the API server's `apiserver_request_total`,
//!   minus the cluster's own rate measured right before, with no daemon);
//! - start to ready (kruised: `/readyz`; kruise-daemon: `/healthz`, it has no readiness);
//! - env-from-metadata changes during in-place updates, a fresh pod each (two containers, exec
//!   and HTTP preStop hooks), in waves of 10 as kruise-manager makes them: restarts per
//!   container (exactly one is right) and change to both containers running with the new
//!   value, p50 and p99;
//! - one pod changed 10 times in a row (back-off carried over), each change given 60 s;
//! - NodeImage pulls of images the node lacks (the lab's bench images: busybox plus 16 MiB of
//!   random bytes each), as kruise-manager writes their tags, until the stored status has every
//!   tag Succeeded, next to a direct CRI `PullImage` of the same images in the same run (the
//!   images removed before each, the two ways alternating which goes first).
//!
//! Run:
//!
//!     # the cluster lab of tests/run.sh running (KRUISED_KUBE_LAB and friends exported), and
//!     # a kruise-daemon binary (no registry ships it; whoever runs the bench provides it):
//!     KRUISED_KRUISE_DAEMON=/path/to/kruise-daemon KRUISED_TEST_BIN=target/dist/kruised \
//!     cargo bench --bench versus
//!     # KRUISED_BENCH_IDLE_PODS (100), KRUISED_BENCH_CHANGES (50), KRUISED_BENCH_IDLE_SECS (60),
//!     # KRUISED_BENCH_PULL_ROUNDS (5; 4 images each)
//!
//! Under `cargo test` (no `--bench` argument) a smoke run (5 idle pods, 2 changes, 10 s idle,
//! 2 changes in a row, one round of one small image pulled) checks that the harness still works; without kruise-daemon it is skipped
//! with a message.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;
use kruised_test_support::pull as pull_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kruised::k8s::crd::{ImagePullPhase, NodeImage};
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};
use support::cluster::{self, KubeLab, Rbac, Scene};
use support::daemon::{Daemon, Resident};
use support::restarts::{self, ChangeResult, HookServer};

struct Sizes {
    idle_pods: usize,
    changes: usize,
    idle: Duration,
    in_a_row: usize,
    /// Rounds of NodeImage pulls, each of every image in `pull_repos` (their tag `v1`).
    pull_rounds: usize,
    pull_repos: Vec<String>,
}

#[derive(Default)]
struct Figures {
    ready_after: Duration,
    rss_ready: Option<Resident>,
    rss_after: Option<Resident>,
    cpu_per_min_idle: Duration,
    api_per_min_idle: f64,
    changes: Vec<ChangeResult>,
    /// Each change of the one pod, `None` from the first that did not finish within 60 s.
    in_a_row: Vec<Option<Duration>>,
    /// Each round's NodeImage pull through the daemon, from the write of the tags to every tag
    /// Succeeded in the stored status.
    through_daemon: Vec<Duration>,
    /// Each round's direct CRI pull of the same images, all at once.
    direct: Vec<Duration>,
}

/// The sum of the API server's `apiserver_request_total`, every series.
async fn api_requests(admin: &Client) -> f64 {
    let text = admin
        .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The cluster's own API requests per minute over `window`, with no node daemon.
async fn baseline_api_rate(admin: &Client, window: Duration) -> f64 {
    let before = api_requests(admin).await;
    tokio::time::sleep(window).await;
    (api_requests(admin).await - before) * 60.0 / window.as_secs_f64()
}

async fn start_kruised(lab: &KubeLab, scene: &Scene) -> (Daemon, Duration) {
    let identity = cluster::identity(lab, &scene.admin, Rbac::Deploy).await;
    let started = Instant::now();
    let mut d = cluster::start_daemon(lab, &identity, &[]);
    d.wait_for_log("daemon ready", Duration::from_secs(60))
        .await;
    (d, started.elapsed())
}

/// The NodeImage API at the version kruise's current CRDs store (a write through `v1alpha1`
/// would prune what it lacks).
fn node_images(admin: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apps.kruise.io", "v1beta1", "NodeImage");
    Api::all_with(admin.clone(), &kube::discovery::ApiResource::from_gvk(&gvk))
}

/// Sets the node's tags `v1` of `repos` at `version` as kruise-manager writes them (a fresh
/// `createdAt`, a TTL), or removes the repos with `None`; other images are left as they are.
async fn set_tags(lab: &KubeLab, admin: &Client, repos: &[String], version: Option<i64>) {
    let api = node_images(admin);
    if api.get_opt(&lab.node).await.unwrap().is_none() {
        // no kruise-manager made it
        cluster::apply_object(
            admin,
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
                   "metadata": {"name": lab.node, "labels": {"kubernetes.io/hostname": lab.node}},
                   "spec": {}}),
        )
        .await;
    }
    let created_at = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap()
        .to_string();
    let images: serde_json::Map<String, Value> = repos
        .iter()
        .map(|r| {
            let tags = version.map_or(Value::Null, |v| {
                json!({"tags": [{"tag": "v1", "version": v, "createdAt": created_at,
                                 "pullPolicy": {"timeoutSeconds": 300, "ttlSecondsAfterFinished": 600}}]})
            });
            (r.clone(), tags)
        })
        .collect();
    api.patch(
        &lab.node,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"images": images}})),
    )
    .await
    .unwrap();
}

/// The images pulled by the running daemon through the node's NodeImage, tags at `version`.
async fn pull_through_daemon(
    lab: &KubeLab,
    admin: &Client,
    repos: &[String],
    version: i64,
) -> Duration {
    let started = Instant::now();
    set_tags(lab, admin, repos, Some(version)).await;
    let want: Vec<String> = repos.to_vec();
    let done = move |o: Option<&NodeImage>| {
        let Some(status) = o.and_then(|o| o.status.as_ref()) else {
            return false;
        };
        want.iter().all(|r| {
            status.image_statuses.get(r).is_some_and(|i| {
                i.tags.iter().any(|t| {
                    t.tag == "v1" && t.version == version && t.phase == ImagePullPhase::Succeeded
                })
            })
        })
    };
    let typed: Api<NodeImage> = Api::all(admin.clone());
    cluster::wait_for(&typed, &lab.node, "every bench tag Succeeded", done).await;
    started.elapsed()
}

/// `rounds` NodeImage pulls through the running daemon and as many direct pulls, each of every
/// image after they were removed; which goes first alternates. Tag versions continue from
/// `version` (the NodeImage outlives a daemon).
async fn pulls(lab: &KubeLab, admin: &Client, sizes: &Sizes, version: &mut i64, f: &mut Figures) {
    let repos = &sizes.pull_repos;
    let images: Vec<String> = repos.iter().map(|r| format!("{r}:v1")).collect();
    for round in 0..sizes.pull_rounds {
        for direct_first in [round % 2 == 0, round % 2 == 1] {
            pull_support::remove_images(&lab.runtime(), &images).await;
            if direct_first {
                f.direct
                    .push(pull_support::pull_at_once(&lab.runtime(), &images).await);
            } else {
                *version += 1;
                f.through_daemon
                    .push(pull_through_daemon(lab, admin, repos, *version).await);
            }
        }
    }
    set_tags(lab, admin, repos, None).await;
}

/// One daemon's run: it starts beside the idle pods, idles, then the changes.
async fn run(
    lab: &KubeLab,
    idle: &Scene,
    which: Option<&std::path::Path>,
    sizes: &Sizes,
    version: &mut i64,
) -> Figures {
    // the cluster's own rate right before, with no daemon: what the daemon's adds to
    let baseline = baseline_api_rate(&idle.admin, sizes.idle).await;
    let dir = tempfile::tempdir().unwrap();
    let (mut d, ready_after) = match which {
        Some(exe) => cluster::start_kruise_daemon(lab, &idle.admin, exe, dir.path()).await,
        None => start_kruised(lab, idle).await,
    };
    let mut f = Figures {
        ready_after,
        ..Default::default()
    };
    // the idle pods are in its cache once it is ready (neither daemon annotates a pod it
    // found at start until the pod changes: no patch storm)
    f.rss_ready = d.resident();
    let (cpu, api) = (d.cpu_time().unwrap(), api_requests(&idle.admin).await);
    tokio::time::sleep(sizes.idle).await;
    let minutes = sizes.idle.as_secs_f64() / 60.0;
    f.cpu_per_min_idle = (d.cpu_time().unwrap() - cpu).div_f64(minutes);
    f.api_per_min_idle = (api_requests(&idle.admin).await - api) / minutes - baseline;

    let changes = Scene::new(lab, "versus-change").await;
    let hooks = HookServer::start().await;
    let mut left = sizes.changes;
    let mut wave = 0;
    while left > 0 {
        let n = left.min(10);
        let names = restarts::create_pods(&changes, &hooks, &format!("w{wave}"), n).await;
        f.changes
            .extend(restarts::change_wave(&changes, &hooks, &names, "v2").await);
        // gone before the next wave: 100 idle pods and a wave fill the node's 110
        for name in &names {
            let _ = changes.pods().delete(name, &Default::default()).await;
        }
        for name in &names {
            cluster::wait_deleted(&changes.pods(), name, "a changed pod deleted").await;
        }
        left -= n;
        wave += 1;
    }
    let row = restarts::create_pods(&changes, &hooks, "row", 1).await;
    for i in 0..sizes.in_a_row {
        let value = format!("r{i}");
        let change = restarts::change_wave(&changes, &hooks, &row, &value);
        match tokio::time::timeout(Duration::from_secs(60), change).await {
            Ok(r) => f.in_a_row.push(Some(r[0].took)),
            Err(_) => {
                f.in_a_row.push(None);
                break;
            }
        }
    }
    f.rss_after = d.resident();
    pulls(lab, &idle.admin, sizes, version, &mut f).await;
    d.terminate();
    d.wait_exit(Duration::from_secs(30)).await;
    // gone for good before the next daemon's idle window: its deletion is API traffic
    let ns = changes.ns.name.clone();
    changes.cleanup().await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(idle.admin.clone());
    cluster::wait_deleted(&namespaces, &ns, "the namespace of the changes deleted").await;
    f
}

/// All of it and by kind: `16.4 MiB (anon 4.5, file 11.9)`.
fn mib(r: Option<Resident>) -> String {
    r.map_or("n/a".into(), |r| r.to_string())
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

fn report(sizes: &Sizes, theirs: &mut Figures, ours: &mut Figures) {
    println!(
        "kruise-daemon vs kruised: {} idle pods, {} changes, {:?} idle; {}",
        sizes.idle_pods,
        sizes.changes,
        sizes.idle,
        support::machine()
    );
    println!("| | kruise-daemon | kruised | kruised / kruise-daemon |\n|---|---|---|---|");
    let b = |x: Option<Resident>| x.map_or(0.0, |r| r.total as f64);
    println!(
        "| resident memory, ready with the idle pods | {} | {} | {} |",
        mib(theirs.rss_ready),
        mib(ours.rss_ready),
        ratio(b(ours.rss_ready), b(theirs.rss_ready))
    );
    println!(
        "| resident memory after the changes | {} | {} | {} |",
        mib(theirs.rss_after),
        mib(ours.rss_after),
        ratio(b(ours.rss_after), b(theirs.rss_after))
    );
    println!(
        "| CPU a minute while idle | {:.0} ms | {:.0} ms | {} |",
        theirs.cpu_per_min_idle.as_secs_f64() * 1000.0,
        ours.cpu_per_min_idle.as_secs_f64() * 1000.0,
        ratio(
            ours.cpu_per_min_idle.as_secs_f64(),
            theirs.cpu_per_min_idle.as_secs_f64()
        )
    );
    println!(
        "| API requests a minute while idle (over the cluster's own) | {:.1} | {:.1} | {} |",
        theirs.api_per_min_idle,
        ours.api_per_min_idle,
        ratio(ours.api_per_min_idle, theirs.api_per_min_idle)
    );
    println!(
        "| start to ready | {:.2} s | {:.2} s | {} |",
        theirs.ready_after.as_secs_f64(),
        ours.ready_after.as_secs_f64(),
        ratio(
            ours.ready_after.as_secs_f64(),
            theirs.ready_after.as_secs_f64()
        )
    );
    let once = |f: &Figures| {
        let once = f.changes.iter().filter(|r| r.restarts == [1, 1]).count();
        format!("{once} of {}", f.changes.len())
    };
    println!(
        "| changes with exactly one restart per container | {} | {} | |",
        once(theirs),
        once(ours)
    );
    for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
        let mut t: Vec<Duration> = theirs.changes.iter().map(|r| r.took).collect();
        let mut o: Vec<Duration> = ours.changes.iter().map(|r| r.took).collect();
        let (t, o) = (
            restarts::percentile(&mut t, q).as_secs_f64(),
            restarts::percentile(&mut o, q).as_secs_f64(),
        );
        println!(
            "| change to running with the new value, {label} | {t:.2} s | {o:.2} s | {} |",
            ratio(o, t)
        );
    }
    let row = |f: &Figures| {
        f.in_a_row
            .iter()
            .map(|t| t.map_or("no (60 s)".into(), |t| format!("{:.1}", t.as_secs_f64())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| one pod changed {} times in a row, s each | {} | {} | |",
        sizes.in_a_row,
        row(theirs),
        row(ours)
    );
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        restarts::percentile(&mut v, 0.5).as_secs_f64()
    };
    let (tt, ot) = (median(&theirs.through_daemon), median(&ours.through_daemon));
    let (td, od) = (median(&theirs.direct), median(&ours.direct));
    println!(
        "| NodeImage pull of {} to Succeeded, median of {} | {tt:.2} s | {ot:.2} s | {} |",
        match sizes.pull_repos.len() {
            1 => "a new image".to_string(),
            n => format!("{n} new images at once"),
        },
        sizes.pull_rounds,
        ratio(ot, tt)
    );
    println!("| the same images pulled directly through CRI, median | {td:.2} s | {od:.2} s | |");
    println!(
        "| NodeImage pull / direct pull | {} | {} | |",
        ratio(tt, td),
        ratio(ot, od)
    );
}

/// The lab's bench images (`tests/cri-lab.sh bench-images`: the busybox base plus one 16 MiB
/// layer of random bytes each), built and pushed to the cluster's registry; their repos.
fn bench_images(lab: &KubeLab) -> Vec<String> {
    let status = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cri-lab.sh"))
        .arg("bench-images")
        .env("LAB", &lab.cri.dir)
        .env("REG_ADDR", &lab.registry)
        .env("REG_AUTH_ADDR", &lab.auth_registry)
        .status()
        .unwrap();
    assert!(status.success(), "cri-lab.sh bench-images failed");
    (1..=4)
        .map(|i| format!("{}/bench/img{i}", lab.registry))
        .collect()
}

#[tokio::main]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let Some(lab) = KubeLab::get() else { return };
    let Some(exe) = std::env::var_os("KRUISED_KRUISE_DAEMON").map(PathBuf::from) else {
        eprintln!("SKIPPED: no kruise-daemon (KRUISED_KRUISE_DAEMON=path of the unpacked binary)");
        return;
    };
    let num = support::env_or::<u64>;
    let sizes = if bench {
        Sizes {
            idle_pods: usize::try_from(num("KRUISED_BENCH_IDLE_PODS", 100)).unwrap(),
            changes: usize::try_from(num("KRUISED_BENCH_CHANGES", 50)).unwrap(),
            idle: Duration::from_secs(num("KRUISED_BENCH_IDLE_SECS", 60)),
            in_a_row: 10,
            pull_rounds: usize::try_from(num("KRUISED_BENCH_PULL_ROUNDS", 5))
                .unwrap()
                .max(1),
            pull_repos: bench_images(&lab),
        }
    } else {
        Sizes {
            idle_pods: 5,
            changes: 2,
            idle: Duration::from_secs(10),
            in_a_row: 2,
            pull_rounds: 1,
            pull_repos: vec![format!("{}/test/pull", lab.registry)],
        }
    };
    let _serial = KubeLab::serial().await;
    // what a run that panicked left on the lab (its pods would count against both daemons)
    let left = cluster::remove_leftover_namespaces(&lab, &["versus-idle", "versus-change"]).await;
    if !left.is_empty() {
        eprintln!("versus: removed namespaces an earlier run left behind: {left:?}");
    }
    let idle = Scene::new(&lab, "versus-idle").await;
    let image = lab.image("busybox:v1");
    for i in 0..sizes.idle_pods {
        let pod = idle.kruise_pod(&format!("idle-{i}"), &[("main", &image, &[])]);
        idle.pods()
            .create(&Default::default(), &serde_json::from_value(pod).unwrap())
            .await
            .unwrap();
    }
    for i in 0..sizes.idle_pods {
        cluster::wait_for(
            &idle.pods(),
            &format!("idle-{i}"),
            "an idle pod running",
            cluster::all_running,
        )
        .await;
    }
    let mut version = 0;
    let mut theirs = run(&lab, &idle, Some(&exe), &sizes, &mut version).await;
    let mut ours = run(&lab, &idle, None, &sizes, &mut version).await;
    report(&sizes, &mut theirs, &mut ours);
    idle.cleanup().await;
}
